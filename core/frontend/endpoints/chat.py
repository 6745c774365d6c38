"""``POST /v1/chat/completions``: OpenAI chat completions, streamed or not (seed 004; the work is
``OpenAIService.prepare_chat``)."""

from __future__ import annotations

from dyn.core.frontend.endpoints.generate import GenerateEndpoint
from dyn.core.protocol.openai import ChatCompletionRequest

ENDPOINT = GenerateEndpoint(
    "/v1/chat/completions", ChatCompletionRequest, lambda service, req, ctx: service.prepare_chat(req, ctx)
)
