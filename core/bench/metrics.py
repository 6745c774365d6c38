"""What one benchmark request measured, and the run's summary (the ``--output`` JSON schema).

``RequestRecord`` is filled by the live load client and by the offline replay alike; times are
seconds from the run's start (wall clock live, virtual time offline). ``summarize`` turns the
records of a run into a ``Summary``:

- ``ttft_s``, ``itl_s``, ``e2e_s``, ``tpot_s``, ``queue_s``: ``Distribution`` (count, mean, min, p50, p90,
  p95, p99, max; percentiles by linear interpolation between closest ranks, numpy's default);
  ITL over every gap between consecutive output chunks of every request (``vllm bench serve``'s
  definition; servers that batch tokens into chunks give fewer, longer gaps, so compare
  ``tpot_s`` across servers: (e2e - TTFT) / (output tokens - 1) per request); queue time from the server's
  ``nvext.timing.prefill_wait_time_ms`` where it reports it.
- ``request_throughput`` (successful requests / duration) and ``output_throughput`` (output
  tokens / duration), where duration runs from the first request's start to the last one's end.
- ``cached_token_ratio``: cached prompt tokens / prompt tokens over requests whose usage reported
  both (``usage.prompt_tokens_details.cached_tokens``).
- ``history_cached_ratio`` (with a block size, for workloads whose conversations have several
  requests): of each request's previous conversation, the share served from cache. For each
  pair of consecutive requests of a conversation, ``history`` is the full KV blocks of the
  earlier one's prompt and output (``(prompt + output) // block * block`` tokens: what a worker
  can hold of it); the ratio is ``sum(min(later's cached tokens, history)) / sum(history)``. A
  turn routed away from the worker holding its conversation, or whose history is tokenized
  differently the second time, lowers it. ``history_moves``: pairs whose two requests ran on
  different workers (None without worker ids).
- ``workers``: requests per worker (from ``nvext.worker_id``) and the spread (max/min share).
- ``duplicate_prefills``: for workloads whose requests come in groups sharing a prefix (parallel
  sampling), the number of extra workers a group's shared prefix was prefilled on:
  sum over groups of (distinct workers serving the group - 1).
- ``errors``: failed requests by kind (``http_503``, ``timeout``, ``connect``, ...).
- ``ttft_by_class``: TTFT per request class (``RequestRecord.cls``: e.g. ``lead/high``,
  ``subagent/normal`` in the multi-turn workload, ``lead/high/tool-round`` for its tool rounds),
  when the workload labels its requests.
- ``tool_calls``, ``invalid_tool_calls``, ``tool_rounds``: tool calls in complete replies, those
  whose arguments were not a JSON object (each such request also counts as an error of kind
  ``tool_arguments``), and requests that were tool rounds (``RequestRecord.tool_round`` > 0: the
  request after a reply's calls were answered, within the same turn).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

import msgspec


class RequestRecord(msgspec.Struct, kw_only=True):
    """One request's measurements; ``error`` set means it failed (its timings may be partial)."""

    conversation: str
    group: str
    turn: int = 0
    cls: str | None = None
    start_s: float
    end_s: float
    ttft_s: float | None = None
    itl_s: list[float] = msgspec.field(default_factory=list)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int = 0
    queue_s: float | None = None
    worker: str | None = None
    error: str | None = None
    detail: str | None = None
    tool_round: int = 0
    """0 for a scripted turn; k for the k-th tool round of turn ``turn``."""
    tool_calls: int = 0
    invalid_tool_calls: int = 0

    @property
    def e2e_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first; None with fewer than 2 tokens or no TTFT."""
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


class Distribution(msgspec.Struct, kw_only=True):
    count: int
    mean: float | None = None
    min: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None


class WorkerSpread(msgspec.Struct, kw_only=True):
    requests: dict[str, int]
    max_share: float | None
    min_share: float | None


class Summary(msgspec.Struct, kw_only=True):
    requests: int
    succeeded: int
    failed: int
    duration_s: float
    request_throughput: float
    output_throughput: float
    output_tokens: int
    prompt_tokens: int
    cached_tokens: int
    cached_token_ratio: float | None
    ttft_s: Distribution
    itl_s: Distribution
    e2e_s: Distribution
    tpot_s: Distribution
    queue_s: Distribution
    workers: WorkerSpread
    duplicate_prefills: int | None
    errors: dict[str, int]
    ttft_by_class: dict[str, Distribution] = {}
    tool_calls: int = 0
    invalid_tool_calls: int = 0
    tool_rounds: int = 0
    history_cached_ratio: float | None = None
    history_moves: int | None = None


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ascending ``sorted_values`` by linear interpolation."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    position = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = position - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


def distribution(values: Iterable[float]) -> Distribution:
    ordered = sorted(values)
    if not ordered:
        return Distribution(count=0)
    return Distribution(
        count=len(ordered),
        mean=sum(ordered) / len(ordered),
        min=ordered[0],
        p50=percentile(ordered, 50),
        p90=percentile(ordered, 90),
        p95=percentile(ordered, 95),
        p99=percentile(ordered, 99),
        max=ordered[-1],
    )


def worker_spread(records: Sequence[RequestRecord]) -> WorkerSpread:
    counts = Counter(r.worker for r in records if r.worker is not None)
    total = sum(counts.values())
    if not total:
        return WorkerSpread(requests={}, max_share=None, min_share=None)
    return WorkerSpread(
        requests=dict(sorted(counts.items())),
        max_share=max(counts.values()) / total,
        min_share=min(counts.values()) / total,
    )


def duplicate_prefills(records: Sequence[RequestRecord]) -> int | None:
    """Extra workers each group's shared prefix was prefilled on; None without worker ids."""
    workers: dict[str, set[str]] = defaultdict(set)
    for r in records:
        if r.worker is not None and r.error is None:
            workers[r.group].add(r.worker)
    if not workers:
        return None
    return sum(len(w) - 1 for w in workers.values())


def history_cached(records: Sequence[RequestRecord], block_size: int) -> tuple[float | None, int | None]:
    """``(history_cached_ratio, history_moves)`` of successful ``records`` (see the module
    docstring); ``(None, None)`` when no conversation has two requests with usage."""
    by_conversation: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        if r.error is None and r.prompt_tokens is not None and r.cached_tokens is not None:
            by_conversation[r.conversation].append(r)
    served = history = moves = 0
    workers_known = True
    for turns in by_conversation.values():
        turns.sort(key=lambda r: (r.turn, r.tool_round, r.start_s))
        for before, after in zip(turns, turns[1:], strict=False):
            full = (before.prompt_tokens or 0) + before.output_tokens
            full -= full % block_size
            history += full
            served += min(after.cached_tokens or 0, full)
            if before.worker is None or after.worker is None:
                workers_known = False
            elif before.worker != after.worker:
                moves += 1
    if not history:
        return None, None
    return served / history, moves if workers_known else None


def summarize(
    records: Sequence[RequestRecord], *, grouped: bool = False, block_size: int | None = None
) -> Summary:
    """The run's summary; ``grouped`` reports duplicate prefills (groups share a prefix);
    ``block_size`` the history cached ratio."""
    ok = [r for r in records if r.error is None]
    if records:
        duration = max(r.end_s for r in records) - min(r.start_s for r in records)
    else:
        duration = 0.0
    output_tokens = sum(r.output_tokens for r in ok)
    with_usage = [r for r in ok if r.prompt_tokens is not None and r.cached_tokens is not None]
    prompt_tokens = sum(r.prompt_tokens or 0 for r in with_usage)
    cached_tokens = sum(r.cached_tokens or 0 for r in with_usage)
    history_ratio, moves = history_cached(ok, block_size) if block_size else (None, None)
    return Summary(
        requests=len(records),
        succeeded=len(ok),
        failed=len(records) - len(ok),
        duration_s=duration,
        request_throughput=len(ok) / duration if duration > 0 else 0.0,
        output_throughput=output_tokens / duration if duration > 0 else 0.0,
        output_tokens=output_tokens,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        cached_token_ratio=cached_tokens / prompt_tokens if prompt_tokens else None,
        ttft_s=distribution(r.ttft_s for r in ok if r.ttft_s is not None),
        itl_s=distribution(gap for r in ok for gap in r.itl_s),
        e2e_s=distribution(r.e2e_s for r in ok),
        tpot_s=distribution(r.tpot_s for r in ok if r.tpot_s is not None),
        queue_s=distribution(r.queue_s for r in ok if r.queue_s is not None),
        workers=worker_spread(ok),
        duplicate_prefills=duplicate_prefills(ok) if grouped else None,
        errors=dict(Counter(r.error for r in records if r.error is not None)),
        ttft_by_class=_by_class(ok),
        tool_calls=sum(r.tool_calls for r in records),
        invalid_tool_calls=sum(r.invalid_tool_calls for r in records),
        tool_rounds=sum(1 for r in records if r.tool_round > 0),
        history_cached_ratio=history_ratio,
        history_moves=moves,
    )


def _by_class(records: Sequence[RequestRecord]) -> dict[str, Distribution]:
    ttfts: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if r.cls is not None and r.ttft_s is not None:
            ttfts[r.cls].append(r.ttft_s)
    return {cls: distribution(values) for cls, values in sorted(ttfts.items())}
