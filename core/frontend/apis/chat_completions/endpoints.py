"""``POST /v1/chat/completions`` and ``POST /v1/completions``: OpenAI chat and text completions,
streamed or not (seed 004). The work is ``OpenAIService.prepare_chat`` / ``prepare_completion``;
``ChunkWire`` writes the answer."""

from __future__ import annotations

from dyn.core.frontend.apis.chat_completions.wire import ChunkWire
from dyn.core.frontend.endpoints.generate import GenerateEndpoint
from dyn.core.protocol.openai import ChatCompletionRequest, CompletionRequest

CHAT = GenerateEndpoint(
    "/v1/chat/completions",
    ChatCompletionRequest,
    lambda app, service, req, ctx: service.prepare_chat(req, ctx, ChunkWire, "chat_completions"),
)
COMPLETIONS = GenerateEndpoint(
    "/v1/completions",
    CompletionRequest,
    lambda app, service, req, ctx: service.prepare_completion(req, ctx, ChunkWire),
)
