"""``POST /tokenize`` and ``POST /detokenize``: vLLM's request and response shapes.

``/tokenize`` takes either a text ``prompt`` (``TokenizeCompletionRequest``) or chat ``messages``
(``TokenizeChatRequest``), told apart by which of the two the body holds (``tokenize_request``);
messages are rendered with the same chat template, options and bounds as a chat completion, so
the ``tokens`` are exactly the prompt a chat request with the same fields would send. The
response carries ``count``, ``max_model_len`` and ``tokens``, and ``token_strs`` (the vocabulary
entries) when ``return_token_strs`` is true, null otherwise, as vLLM's does. ``/detokenize``
turns ``tokens`` back into text with special tokens kept. Unknown fields are ignored, as vLLM
ignores them.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from dyn.core.protocol.errors import bad_request
from dyn.core.protocol.openai import TokenId, decode_request

MAX_DETOKENIZE_TOKENS = 1 << 20
"""Most token ids one ``/detokenize`` request may send (the model's context length bounds it
further, see ``check_detokenize``)."""

DetokenizeIds = Annotated[list[TokenId], msgspec.Meta(max_length=MAX_DETOKENIZE_TOKENS)]


class TokenizeCompletionRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """A text to tokenize; ``add_special_tokens`` (default true, as for a completion) adds what
    the tokenizer adds (BOS)."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Messages to render with the chat template and tokenize, with a chat completion's template
    options (and its defaults: a generation prompt, no special tokens beyond the template's)."""

    model: str | None = None
    messages: list[dict[str, Any]]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool | None = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    documents: list[dict[str, str]] | None = None


class TokenizeResponse(msgspec.Struct):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Token ids to turn into text (each below the vocabulary size)."""

    model: str | None = None
    tokens: DetokenizeIds


class DetokenizeResponse(msgspec.Struct):
    prompt: str


class _Shape(msgspec.Struct, forbid_unknown_fields=False):
    """Which ``/tokenize`` request a body is: the fields are kept raw, nothing else is parsed."""

    prompt: msgspec.Raw = msgspec.Raw(b"")
    messages: msgspec.Raw = msgspec.Raw(b"")


def tokenize_request(body: bytes) -> TokenizeCompletionRequest | TokenizeChatRequest:
    """Decode a ``/tokenize`` body: with ``messages`` a chat request, with ``prompt`` a text one;
    both or neither is a 400 (as is anything ``decode_request`` refuses)."""
    shape = decode_request(body, _Shape)
    has_prompt, has_messages = bool(shape.prompt), bool(shape.messages)
    if has_prompt and has_messages:
        raise bad_request("send either 'prompt' or 'messages', not both", param="messages")
    if has_messages:
        return decode_request(body, TokenizeChatRequest)
    if not has_prompt:
        raise bad_request(
            "missing required field 'prompt' (or 'messages' to tokenize a chat)", param="prompt"
        )
    return decode_request(body, TokenizeCompletionRequest)


def check_detokenize(req: DetokenizeRequest, vocab_size: int, context_length: int) -> None:
    """Every id below ``vocab_size`` and at most ``context_length`` of them: a 400 otherwise."""
    if len(req.tokens) > context_length:
        raise bad_request(
            f"tokens holds {len(req.tokens)} token ids; this model's context is {context_length} tokens, "
            f"send at most that many",
            param="tokens",
        )
    for i, token in enumerate(req.tokens):
        if token >= vocab_size:
            raise bad_request(
                f"tokens[{i}] is {token}, not in the vocabulary: token ids must be in [0, {vocab_size})",
                param=f"tokens[{i}]",
            )
