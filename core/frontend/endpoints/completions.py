"""``POST /v1/completions``: OpenAI text completions of one prompt or a batch, streamed or not
(the work is ``OpenAIService.prepare_completion``)."""

from __future__ import annotations

from dyn.core.frontend.endpoints.generate import GenerateEndpoint
from dyn.core.protocol.openai import CompletionRequest

ENDPOINT = GenerateEndpoint(
    "/v1/completions", CompletionRequest, lambda service, req, ctx: service.prepare_completion(req, ctx)
)
