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
- Logprobs (``async_generate(return_logprob=True, top_logprobs_num=k, logprob_start_len=...)``;
  ``TokenizerManager.convert_logprob_style`` / ``add_logprob_to_meta_info``): ``meta_info``'s
  ``output_token_logprobs`` holds one ``(logprob, token_id, text)`` per output id (``text`` is
  ``None`` with ``--skip-tokenizer-init``) and ``output_top_logprobs`` one list of such tuples per
  id (only when k > 0). With incremental output both are sliced to the chunk's ids
  (``_slice_streaming_output_meta_info``); otherwise they are cumulative like the ids. The
  prompt's ``input_token_logprobs`` / ``input_top_logprobs`` (from ``logprob_start_len``; the first
  position's logprob and top list are ``None``) are never sliced: every dict repeats them whole.
  SGLang takes one k for both sides, so each side is cut to its own count here. A chosen token
  found in its top list gets its rank from there; otherwise the rank is unknown (0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from dyn.core.engine import EngineError
from dyn.core.messages import TokenLogprobs


@dataclass(frozen=True)
class Outcome:
    """How the request ended: ``reason`` is stop, length or abort."""

    reason: Literal["stop", "length", "abort"]
    stop_token_id: int | None = None
    message: str = ""
    status_code: int | None = None


@dataclass(frozen=True)
class Step:
    """What one streamed dict adds: ``tokens`` to deliver, the ``outcome`` once finished, and the
    tokens' ``logprobs`` (one each when the request asked for them, else empty)."""

    tokens: list[int] = field(default_factory=list)
    outcome: Outcome | None = None
    logprobs: list[TokenLogprobs] = field(default_factory=list)


class OutputDecoder:
    """Reads one request's stream. ``output_ids`` holds every id SGLang generated (stop token
    included, as SGLang's session history holds them); ``meta`` the latest meta_info values.
    ``logprobs`` / ``prompt_logprobs``: the request's top-k counts (``None``: not asked for)."""

    def __init__(
        self, *, incremental: bool, logprobs: int | None = None, prompt_logprobs: int | None = None
    ) -> None:
        self.incremental = incremental
        self.logprobs = logprobs
        self.prompt_logprobs_top = prompt_logprobs
        self.output_ids: list[int] = []
        self.meta: dict[str, Any] = {}

    def feed(self, out: dict[str, Any]) -> Step:
        meta = out.get("meta_info") or {}
        self.meta.update(meta)
        finish = meta.get("finish_reason")
        if isinstance(finish, dict) and finish.get("type") == "abort":
            return Step(
                [],
                Outcome(
                    "abort",
                    message=str(finish.get("message") or "aborted"),
                    status_code=finish.get("status_code"),
                ),
            )
        ids = out.get("output_ids") or []
        before = len(self.output_ids)
        new = list(ids) if self.incremental else list(ids[before:])
        self.output_ids.extend(new)
        logprobs = self._output_logprobs(meta, 0 if self.incremental else before, len(new))
        if not finish:
            return Step(new, None, logprobs)
        if not isinstance(finish, dict):
            return Step(new, Outcome("stop"), logprobs)
        if finish.get("type") == "length":
            return Step(new, Outcome("length"), logprobs)
        matched = finish.get("matched")
        if type(matched) is int and new and new[-1] == matched:
            return Step(new[:-1], Outcome("stop", stop_token_id=matched), logprobs[:-1])
        return Step(new, Outcome("stop"), logprobs)

    def _output_logprobs(self, meta: dict[str, Any], offset: int, count: int) -> list[TokenLogprobs]:
        """The logprobs of the ``count`` new ids, at ``offset`` in meta_info's output lists."""
        top = self.logprobs
        if top is None or not count:
            return []
        chosen = (meta.get("output_token_logprobs") or [])[offset : offset + count]
        if len(chosen) != count:
            raise EngineError(f"SGLang sent {len(chosen)} output logprobs for {count} new tokens")
        rows = ((meta.get("output_top_logprobs") or [])[offset : offset + count]) if top else []
        return [
            token_logprobs(entry, rows[i] if i < len(rows) else None, top) for i, entry in enumerate(chosen)
        ]

    def prompt_logprobs(self) -> list[TokenLogprobs | None] | None:
        """The prompt's logprobs from the latest meta_info (``None`` when not asked for): one
        per position from ``logprob_start_len``, ``None`` where SGLang has no logprob (the first)."""
        top = self.prompt_logprobs_top
        if top is None:
            return None
        chosen = self.meta.get("input_token_logprobs") or []
        rows = (self.meta.get("input_top_logprobs") or []) if top else []
        return [
            None if entry[0] is None else token_logprobs(entry, rows[i] if i < len(rows) else None, top)
            for i, entry in enumerate(chosen)
        ]

    def usage_counts(self, prompt_tokens: int, delivered: int) -> tuple[int, int, int]:
        """``(prompt, completion, cached)`` tokens: SGLang's counts where it sent them, else
        ``prompt_tokens`` and ``delivered``."""
        prompt = self.meta.get("prompt_tokens")
        completion = self.meta.get("completion_tokens")
        cached = self.meta.get("cached_tokens")
        return (
            prompt if isinstance(prompt, int) else prompt_tokens,
            completion if isinstance(completion, int) else delivered,
            cached if isinstance(cached, int) else 0,
        )


def token_logprobs(entry: Any, row: Any, top: int) -> TokenLogprobs:
    """One position: SGLang's ``(logprob, token_id, text)`` for the chosen token and its top row
    (a list of such tuples, or ``None``), cut to the ``top`` most likely."""
    logprob, token_id = float(entry[0]), entry[1]
    best = sorted(row or (), key=lambda item: -item[0])[:top]
    ids = [item[1] for item in best]
    rank = ids.index(token_id) + 1 if token_id in ids else 0
    return TokenLogprobs(logprob, ids, [float(item[0]) for item in best], rank=rank)
