"""``POST /detokenize``: token ids of the served model back to text, special tokens kept (vLLM's
endpoint; the shapes are in ``dyn.core.protocol.tokenize``). Every id must be in the vocabulary
and there may be at most the model's context length of them (400s naming the field)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dyn.core.frontend.endpoints.generate import warn_ignored
from dyn.core.frontend.endpoints.json_post import JsonEndpoint
from dyn.core.protocol.openai import decode_request
from dyn.core.protocol.tokenize import DetokenizeRequest, DetokenizeResponse, check_detokenize

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp


async def _detokenize(app: FrontendApp, body: bytes) -> DetokenizeResponse:
    req = decode_request(body, DetokenizeRequest)
    warn_ignored(body, DetokenizeRequest, "to /detokenize")
    service = app.models.resolve(req.model)
    preprocessor = service.preprocessor
    info = preprocessor.info
    check_detokenize(req, info.vocab_size, info.context_length)
    return DetokenizeResponse(await preprocessor.detokenize_async(req.tokens))


ENDPOINT = JsonEndpoint("/detokenize", _detokenize)
