"""SGLang's streamed output of one request -> new token ids and one final outcome.

What ``Engine.async_generate(..., stream=True)`` yields (SGLang 0.5.23,
``TokenizerManager._handle_batch_output`` / ``_wait_one_response`` / ``_handle_abort_req`` in
``python/sglang/srt/managers/tokenizer_manager.py``) is a dict per wake-up:
``{"output_ids": [...], "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens",
"cached_tokens", ...}}`` (plus ``"text"`` unless ``--skip-tokenizer-init``).

- ``output_ids`` are **incremental** (only the ids new since the last dict, several when chunks
  were coalesced) with ``--incremental-streaming-output``, which dyn always sets; without it they
  are **cumulative** (every id so far; the live list itself while unfinished). Both are handled.
- The ids run *through* the stop token: a request ended by EOS or a stop token has it last, and
  ``finish_reason`` is ``{"type": "stop", "matched": <token id>}``. dyn's contract (the mocker's,
  vLLM's usage) leaves it out of the output and reports it as ``stop_token_id``, while
  ``completion_tokens`` (SGLang's count) still includes it.
- ``finish_reason`` ``{"type": "length", ...}`` -> ``length``; ``{"type": "abort", "message",
  "status_code"?}`` -> an abort, whose dict carries no new ids (with incremental output
  ``_handle_abort_req`` repeats the last id; it is ignored) and no prompt/cached counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Outcome:
    """How the request ended: ``reason`` is stop, length or abort."""

    reason: str
    stop_token_id: int | None = None
    message: str = ""
    status_code: int | None = None


@dataclass(frozen=True)
class Step:
    """What one streamed dict adds: ``tokens`` to deliver, and the ``outcome`` once finished."""

    tokens: list[int] = field(default_factory=list)
    outcome: Outcome | None = None


class OutputDecoder:
    """Reads one request's stream. ``output_ids`` holds every id SGLang generated (stop token
    included, as SGLang's session history holds them); ``meta`` the latest meta_info values."""

    def __init__(self, *, incremental: bool) -> None:
        self.incremental = incremental
        self.output_ids: list[int] = []
        self.meta: dict[str, Any] = {}

    def feed(self, out: dict[str, Any]) -> Step:
        meta = out.get("meta_info") or {}
        self.meta.update(meta)
        finish = meta.get("finish_reason")
        if isinstance(finish, dict) and finish.get("type") == "abort":
            return Step([], Outcome("abort", message=str(finish.get("message") or "aborted"),
                                    status_code=finish.get("status_code")))
        ids = out.get("output_ids") or []
        new = list(ids) if self.incremental else list(ids[len(self.output_ids):])
        self.output_ids.extend(new)
        if not finish:
            return Step(new)
        if not isinstance(finish, dict):
            return Step(new, Outcome("stop"))
        if finish.get("type") == "length":
            return Step(new, Outcome("length"))
        matched = finish.get("matched")
        if type(matched) is int and new and new[-1] == matched:
            return Step(new[:-1], Outcome("stop", stop_token_id=matched))
        return Step(new, Outcome("stop"))

    def usage_counts(self, prompt_tokens: int, delivered: int) -> tuple[int, int, int]:
        """``(prompt, completion, cached)`` tokens: SGLang's counts where it sent them, else
        ``prompt_tokens`` and ``delivered``."""
        prompt = self.meta.get("prompt_tokens")
        completion = self.meta.get("completion_tokens")
        cached = self.meta.get("cached_tokens")
        return (prompt if isinstance(prompt, int) else prompt_tokens,
                completion if isinstance(completion, int) else delivered,
                cached if isinstance(cached, int) else 0)
