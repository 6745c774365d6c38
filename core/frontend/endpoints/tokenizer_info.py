"""``GET /tokenizer_info``: the served model's tokenizer configuration, as vLLM serves it behind
``--enable-tokenizer-info-endpoint`` (off by default: a 404, as the route is then absent).

The body is the model's ``tokenizer_config.json`` as transformers loads it into the tokenizer's
init arguments, with vLLM's changes: no file paths (``vocab_file``, ``merges_file``), each added
token as its text, ``tokenizer_class`` naming the class the frontend's tokenizer stands for, and
``chat_template`` the template the server was given with ``--chat-template`` when it was. The
file is read once per model; a model without one answers its ``tokenizer_class`` alone.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import msgspec

from dyn.core.frontend.endpoints.base import ReadEndpoint, Reply
from dyn.core.model.info import ModelInfo, read_model_json

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp

PATHS = frozenset({"/tokenizer_info"})
"""The paths ``--enable-tokenizer-info-endpoint`` turns on."""
_FILE_KEYS = ("vocab_file", "merges_file")


@functools.lru_cache(maxsize=16)
def _config(info: ModelInfo) -> dict[str, Any]:
    """The tokenizer's configuration as vLLM answers it (see the module docstring)."""
    config = read_model_json(str(info.path), info.path / "tokenizer_config.json", required=False) or {}
    config = {k: _plain(v) for k, v in config.items() if k not in _FILE_KEYS}
    config["tokenizer_class"] = config.get("tokenizer_class") or "PreTrainedTokenizerFast"
    return config


def _plain(value: Any) -> Any:
    """An added token (a dict with its ``content``) as its text, in whatever holds it."""
    if isinstance(value, dict):
        if isinstance(value.get("content"), str) and "special" in value:
            return value["content"]
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _tokenizer_info(app: FrontendApp) -> Reply:
    preprocessor = app.models.resolve(None).preprocessor
    config = dict(_config(preprocessor.info))
    if preprocessor.template_given and preprocessor.chat_template is not None:
        config["chat_template"] = preprocessor.chat_template.source
    return 200, msgspec.json.encode(config), b"application/json"


ENDPOINT = ReadEndpoint("/tokenizer_info", _tokenizer_info)
