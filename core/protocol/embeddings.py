"""``POST /v1/embeddings``: OpenAI's request and response, with vLLM's extra parameters; and
vLLM's ``POST /pooling`` (the same request with a ``task``, answered as ``pooling`` objects) and
``POST /classify`` (the same inputs, answered with each input's class probabilities and label).

A request embeds either ``input`` (OpenAI's: a string, a list of strings, a list of token ids, or
a list of lists of token ids; vLLM also takes one chat conversation there, a list of messages) or
``messages`` (vLLM's chat form: one conversation rendered with the chat template, as a chat
completion renders it, but without a generation prompt by default, and embedded as one input).
``embedding_inputs`` tells the shapes apart and checks them; the frontend's endpoint
(``dyn.core.frontend.endpoints.embeddings``) tokenizes, bounds and embeds them.

The response is OpenAI's ``list`` of ``embedding`` objects with ``usage`` (``prompt_tokens``,
``total_tokens``); with ``encoding_format: "base64"`` each vector is the base64 of its float32
values in ``endianness`` byte order (``native``, vLLM's default, is little-endian on every
platform dyn runs on; it is what the openai client decodes). ``dimensions`` is refused: no model
dyn serves declares Matryoshka embeddings. Unknown fields are ignored, as vLLM ignores them.
"""

from __future__ import annotations

import base64
import sys
import time
import uuid
from array import array
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from dyn.core.protocol.errors import bad_request
from dyn.core.protocol.openai import I32, decode_request

MAX_EMBED_TOKENS = 300_000
"""Most tokens one embeddings request may embed, all its inputs together (OpenAI's limit per
request): a larger batch is a 400 that asks to split it."""

Endianness = Literal["native", "little", "big"]


class EmbeddingRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Either ``input`` or ``messages`` (``embedding_inputs`` checks which). ``add_special_tokens``
    defaults to true for ``input`` text (as a completion prompt) and false for ``messages`` (the
    template writes them), as vLLM's; ``truncate_prompt_tokens`` keeps that many tokens of each
    input (-1: the context length) from the end ``truncation_side`` does not cut (default left:
    the last tokens are kept)."""

    model: str | None = None
    input: str | list[Any] | None = None
    messages: list[dict[str, Any]] | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: I32 | None = None
    user: str | None = None
    # vLLM's extras
    truncate_prompt_tokens: Annotated[int, msgspec.Meta(ge=-1, le=2**31 - 1)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    add_special_tokens: bool | None = None
    embed_dtype: Literal["float32"] = "float32"
    endianness: Endianness = "native"
    use_activation: bool | None = None
    request_id: str | None = None
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    documents: list[dict[str, str]] | None = None


class PoolingRequest(EmbeddingRequest, kw_only=True, forbid_unknown_fields=False):
    """vLLM's ``/pooling`` request: an embeddings request with the pooling ``task`` to run."""

    task: str | None = None


class EmbeddingData(msgspec.Struct):
    index: int
    embedding: list[float] | str
    object: str = "embedding"


class EmbeddingUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


class ClassificationData(msgspec.Struct):
    index: int
    label: str | None
    """The most probable class's name (None when the model's config names none)."""
    probs: list[float]
    num_classes: int


class ClassificationResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    data: list[ClassificationData]
    usage: EmbeddingUsage
    object: str = "list"


class EmbeddingResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    data: list[EmbeddingData]
    usage: EmbeddingUsage
    object: str = "list"


class PoolingData(msgspec.Struct):
    index: int
    data: list[Any] | str
    """The vector's floats, for a token task its rows (lists of floats), or base64 of them all."""
    object: str = "pooling"


class PoolingResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    data: list[PoolingData]
    usage: EmbeddingUsage
    object: str = "list"


R = TypeVar("R", bound=EmbeddingRequest)

Inputs = list[str] | list[list[int]]
"""What to embed: texts to tokenize, or token ids as sent (never mixed)."""


def embedding_request(body: bytes, kind: type[R]) -> R:
    """Decode a ``/v1/embeddings`` (or ``/pooling``: ``kind``) body (a 400 for what
    ``decode_request`` refuses) and apply the value rules that do not depend on the served model."""
    req: R = decode_request(body, kind)
    if req.dimensions is not None:
        raise bad_request(
            f"This model does not support Matryoshka embeddings; dimensions must be unset "
            f"(received dimensions={req.dimensions}). No model dyn serves declares Matryoshka "
            "dimensions: remove 'dimensions' and shorten the vectors yourself if you must.",
            param="dimensions",
        )
    if req.continue_final_message and req.add_generation_prompt:
        raise bad_request(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            param="continue_final_message",
        )
    value = req.input
    if req.messages is None and isinstance(value, list) and value and all(_is_message(m) for m in value):
        req.messages, req.input = value, None
    if (req.input is None) == (req.messages is None):
        raise bad_request(
            "send either 'input' (text or token ids) or 'messages' (one chat conversation), "
            "exactly one of the two",
            param="input",
        )
    return req


def embedding_inputs(req: EmbeddingRequest) -> Inputs:
    """``req.input`` as a list of texts or a list of token-id lists (a 400 naming the item for
    any other shape, an empty list, an empty string or an empty list of ids). Call it only for
    a request with ``input``."""
    value = req.input
    if isinstance(value, str):
        items: list[Any] = [value]
    elif not value:
        raise bad_request("input must not be an empty list", param="input")
    elif all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        items = [value]
    else:
        items = value
    kind = str if isinstance(items[0], str) else list
    for i, item in enumerate(items):
        where = "input" if len(items) == 1 and items[0] is value else f"input[{i}]"
        if kind is str:
            if not isinstance(item, str):
                raise _shape(where)
            if not item:
                raise bad_request(f"{where} is an empty string; send some text", param=where)
        elif not isinstance(item, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in item
        ):
            raise _shape(where)
        elif not item:
            raise bad_request(f"{where} holds no token ids; send at least one", param=where)
    return items


def _shape(where: str) -> Exception:
    return bad_request(
        f"{where} has the wrong shape: input is a string, a list of strings, a list of token ids, "
        "or a list of lists of token ids (not mixed)",
        param=where,
    )


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("role"), str)


def encode_vector(vector: list[float], fmt: str, endianness: Endianness) -> list[float] | str:
    """``vector`` as the response carries it: the floats, or base64 of their float32 bytes."""
    if fmt == "float":
        return vector
    values = array("f", vector)
    if endianness != "native" and endianness != sys.byteorder:
        values.byteswap()
    return base64.b64encode(values.tobytes()).decode("ascii")


def _listed(prefix: str, model: str, prompt_tokens: int) -> dict[str, Any]:
    """The fields every ``list`` response of the pooling endpoints shares."""
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": model,
        "usage": EmbeddingUsage(prompt_tokens, prompt_tokens),
    }


def embedding_response(
    model: str, vectors: list[list[float]], prompt_tokens: int, fmt: str, endianness: Endianness
) -> EmbeddingResponse:
    data = [EmbeddingData(i, encode_vector(v, fmt, endianness)) for i, v in enumerate(vectors)]
    return EmbeddingResponse(data=data, **_listed("embd", model, prompt_tokens))


def pooling_response(
    model: str,
    vectors: list[list[float]],
    prompt_tokens: int,
    fmt: str,
    endianness: Endianness,
    rows: list[int] | None = None,
) -> PoolingResponse:
    """``rows``: for a token task, how many rows each vector holds end to end (one per token):
    in ``float`` format each input's data is then its rows; base64 encodes all the values."""
    data = []
    for i, vector in enumerate(vectors):
        if rows is not None and fmt == "float":
            width = len(vector) // rows[i]
            data.append(PoolingData(i, [vector[at : at + width] for at in range(0, len(vector), width)]))
        else:
            data.append(PoolingData(i, encode_vector(vector, fmt, endianness)))
    return PoolingResponse(data=data, **_listed("pool", model, prompt_tokens))


def classification_response(
    model: str, probabilities: list[list[float]], labels: list[str | None], prompt_tokens: int
) -> ClassificationResponse:
    """Each input's probabilities with the name of the likeliest class (vLLM's argmax: the first
    of equal ones)."""
    data = []
    for i, probs in enumerate(probabilities):
        best = max(range(len(probs)), key=probs.__getitem__) if probs else 0
        data.append(ClassificationData(i, labels[best] if best < len(labels) else None, probs, len(probs)))
    return ClassificationResponse(data=data, **_listed("classify", model, prompt_tokens))
