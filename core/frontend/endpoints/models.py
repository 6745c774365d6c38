"""``GET /v1/models``: the served model, as an OpenAI model list (with vLLM's ``root`` and
``max_model_len``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from dyn.core.frontend.endpoints.base import ReadEndpoint, Reply
from dyn.core.protocol.openai import ModelCard, ModelList

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp


def _models(app: FrontendApp) -> Reply:
    service = app.service
    info = service.preprocessor.info
    card = ModelCard(service.model_name, app.started, root=str(info.path), max_model_len=info.context_length)
    return 200, msgspec.json.encode(ModelList([card])), b"application/json"


ENDPOINT = ReadEndpoint("/v1/models", _models)
