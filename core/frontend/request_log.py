"""Per-request logging (vLLM's ``--enable-log-requests`` and ``--max-log-len``).

Each engine prompt of a request is logged when it is routed, as vLLM's ``RequestLogger`` does:
at info ``Received request ID: params: ...`` (the sampling and stop settings), and at debug
``Request ID details: prompt: ..., prompt_token_ids: ...``, the prompt text and its token ids
cut to ``max_log_len`` characters and ids. In JSON logs the same values are fields of the line:
``request_id``, ``params`` (an object), and at debug ``prompt`` and ``prompt_token_ids``. A
batched completions request logs each prompt as ``ID-INDEX``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from dyn.core.frontend.preprocessor import Prompt

log = logging.getLogger(__name__)


class RequestLog:
    """Logs requests as they are routed; ``max_log_len``: most prompt characters and token ids
    shown (None: all)."""

    __slots__ = ("max_log_len",)

    def __init__(self, max_log_len: int | None = None) -> None:
        self.max_log_len = max_log_len
        if not log.isEnabledFor(logging.INFO):
            log.warning("--enable-log-requests is set but the log level is above info: no request is logged")

    def received(
        self,
        request_id: str,
        prompts: Sequence[Prompt],
        n: int,
        session_id: str | None = None,
        parent_session_id: str | None = None,
    ) -> None:
        """Log ``prompts``, the engine prompts of request ``request_id`` (``n`` choices each), with
        the agent session (and its parent) the client named."""
        if not log.isEnabledFor(logging.INFO):
            return
        cut = self.max_log_len
        for index, prompt in enumerate(prompts):
            rid = request_id if len(prompts) == 1 else f"{request_id}-{index}"
            if log.isEnabledFor(logging.DEBUG):
                text = prompt.text
                ids = prompt.token_ids
                if cut is not None:
                    text = text[:cut] if text is not None else None
                    ids = ids[:cut]
                log.debug(
                    "Request %s details: prompt: %r, prompt_token_ids: %s",
                    rid,
                    text,
                    ids,
                    extra={"request_id": rid, "prompt": text, "prompt_token_ids": ids},
                )
            params = {"n": n, **_fields(prompt.sampling), **_fields(prompt.stop)}
            if prompt.stop_strings:
                params["stop"] = prompt.stop_strings
            if session_id is not None:
                params["session_id"] = session_id
            if parent_session_id is not None:
                params["parent_session_id"] = parent_session_id
            log.info(
                "Received request %s: params: %s, num_prompt_tokens: %d",
                rid,
                params,
                len(prompt.token_ids),
                extra={"request_id": rid, "params": params, "num_prompt_tokens": len(prompt.token_ids)},
            )


def _fields(struct: msgspec.Struct) -> dict:
    """The fields of ``struct`` that are set (not None, not empty), by name."""
    return {
        name: value
        for name in struct.__struct_fields__
        if (value := getattr(struct, name)) is not None and value != []
    }
