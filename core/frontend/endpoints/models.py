"""``GET /v1/models``: every served model under each of its names (``ModelCatalog.listed``), as an
OpenAI model list with vLLM's ``root`` (the model directory; an adapter's path), ``parent`` (a LoRA
adapter's base model) and ``max_model_len``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from dyn.core.frontend.endpoints.base import ReadEndpoint, Reply
from dyn.core.protocol.openai import ModelCard, ModelList

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp


def _models(app: FrontendApp) -> Reply:
    cards = [
        ModelCard(
            name,
            app.started,
            root=model.root or str(model.info.path),
            parent=model.parent,
            max_model_len=model.info.context_length,
        )
        for name, model in app.models.listed()
    ]
    return 200, msgspec.json.encode(ModelList(cards)), b"application/json"


ENDPOINT = ReadEndpoint("/v1/models", _models)
