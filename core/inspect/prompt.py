"""The token ids of the request ``dyn inspect-kv`` asks the index about, made as a frontend makes
them, so the overlap shown is the one the router would see.

- ``--prompt TEXT``: the text tokenized raw, with the tokenizer's special tokens, as
  ``/v1/completions`` tokenizes a text prompt.
- ``--messages FILE``: a JSON list of OpenAI chat messages, or an object with ``"messages"`` (a
  whole ``/v1/chat/completions`` body also works: its ``tools``, ``chat_template_kwargs``, ...
  apply), rendered with the model's chat template and the generation prompt, as
  ``/v1/chat/completions`` renders it (``dyn.core.frontend.preprocessor``).

The tokenizer and template are the model's at ``model_path`` (None: the embedded dyn-tiny).
Anything wrong with the file, its JSON or the model raises ``ConfigError`` saying what to fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from dyn.core.errors import ConfigError


class PromptTokens(msgspec.Struct):
    token_ids: list[int]
    model_name: str
    """The model whose tokenizer made them."""


def prompt_tokens(
    model_path: str | None, *, prompt: str | None = None, messages_file: str | None = None
) -> PromptTokens:
    """Tokenize ``prompt`` or the chat in ``messages_file`` (exactly one of them)."""
    if (prompt is None) == (messages_file is None):
        raise ConfigError("give one of --prompt TEXT or --messages FILE, not both")
    body = _read_messages(messages_file) if messages_file is not None else None
    from dyn.core.frontend.preprocessor import Preprocessor
    from dyn.core.model.info import ModelError, load_model_info
    from dyn.core.protocol.errors import ApiError
    from dyn.core.protocol.openai import ChatCompletionRequest

    try:
        preprocessor = Preprocessor(load_model_info(model_path))
    except ModelError as exc:
        raise ConfigError(str(exc)) from None
    name = preprocessor.info.name
    if prompt is not None:
        if not prompt:
            raise ConfigError("--prompt is empty; give the text to look up")
        return PromptTokens(preprocessor.tokenizer.encode(prompt, add_special_tokens=True), name)
    try:
        request = msgspec.convert(body, ChatCompletionRequest)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"--messages {messages_file}: {exc}") from None
    try:
        tokens = preprocessor.chat(request).token_ids
    except ApiError as exc:
        raise ConfigError(f"--messages {messages_file}: {exc.message}") from None
    return PromptTokens(tokens, name)


def _read_messages(path: str) -> dict[str, Any]:
    """The chat request body in ``path``, with its messages checked for shape."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read --messages {path}: {exc.strerror or exc}") from None
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise ConfigError(
            f"--messages {path} is not valid JSON ({exc}); give a JSON list of "
            'chat messages or an object with "messages"'
        ) from None
    body = {"messages": value} if isinstance(value, list) else value
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        raise ConfigError(
            f'--messages {path} must hold a JSON list of chat messages or an object with a "messages" list'
        )
    messages = body["messages"]
    if not messages:
        raise ConfigError(f"--messages {path} holds no messages; give at least one")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ConfigError(
                f'--messages {path}: message {i} must be an object with a string "role" (and "content")'
            )
    return body
