"""``truncation: "auto"``: a conversation longer than the model's context loses its oldest turns.

OpenAI's rule: when the input (with the conversation a ``previous_response_id`` continues) and
the output do not fit the context window, items are dropped from the beginning of the
conversation. Here the system and developer messages at its head (the instructions) stay, and so
does the last message; the conversation is cut only just before a user message, so that a tool
call never loses its output and the template still sees a user turn first. (vLLM instead keeps
the prompt's last tokens, system prompt or not.)

The cut is the earliest that fits: found by bisection over the cut points, each tried by its
prompt's token count (the template rendered and tokenized, as ``/tokenize`` counts), then
confirmed by preparing the request, which also counts media placeholders: while that still
does not fit, the next cut is tried. A conversation that does not fit with every droppable turn
gone fails as it would without truncation. Only a request over the context pays for any of it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import msgspec

from dyn.core.frontend.generation import Generation
from dyn.core.frontend.preprocessor import Preprocessor
from dyn.core.protocol.errors import ApiError
from dyn.core.protocol.openai import ChatCompletionRequest

log = logging.getLogger(__name__)

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
_HEAD_ROLES = ("system", "developer")


def too_long(exc: ApiError) -> bool:
    """The error a prompt over the context gets."""
    return exc.code == CONTEXT_LENGTH_EXCEEDED


async def prepare_truncated(
    chat: ChatCompletionRequest,
    preprocessor: Preprocessor,
    prepare: Callable[[ChatCompletionRequest], Awaitable[Generation]],
    error: ApiError,
    request_id: str,
) -> Generation:
    """``chat`` (whose preparation failed with ``error``, too long) prepared with its oldest turns
    dropped, the fewest that fit (see the module docstring); ``error`` again when none does."""
    messages = chat.messages
    head = 0
    while head < len(messages) and messages[head].get("role") in _HEAD_ROLES:
        head += 1
    cuts = [i for i in range(head + 1, len(messages)) if messages[i].get("role") == "user"]
    context = preprocessor.info.context_length
    room = chat.max_completion_tokens or chat.max_tokens or 1

    def cut_at(i: int) -> ChatCompletionRequest:
        return msgspec.structs.replace(chat, messages=[*messages[:head], *messages[i:]])

    lo, hi = 0, len(cuts)
    while lo < hi:
        mid = (lo + hi) // 2
        tokens = await preprocessor.tokenize_chat_async(cut_at(cuts[mid]))
        if len(tokens) + room <= context:
            hi = mid
        else:
            lo = mid + 1
    for cut in cuts[lo:]:
        try:
            generation = await prepare(cut_at(cut))
        except ApiError as exc:
            if not too_long(exc):
                raise
            continue
        log.info(
            "request %s: truncation auto dropped the conversation's %d oldest messages to fit the "
            "context of %d tokens",
            request_id,
            cut - head,
            context,
        )
        return generation
    raise error
