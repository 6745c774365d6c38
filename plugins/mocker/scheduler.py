"""Continuous batching over simulated passes (reference 7.1); pure, time only through an injected clock.

``Scheduler.step()`` runs one forward pass and says how long it took in simulated milliseconds;
the caller decides whether to sleep that long (live engine) or advance a virtual clock (replay).
The clock (default ``time.monotonic``) only dates pins and streaming-session deadlines. The time
comes from Dynamo's polynomials (``timing``: the pass's new prompt tokens, and KV utilization
when some request decodes) or, with ``--timing-model aic``, from AIConfigurator's tables
(``aic_timing``: each prefilling request's new and computed tokens, and the decoding requests'
count and mean context).

Both engine flavours (``--engine-type vllm|sglang``) run this vLLM-style pass loop; the SGLang
flavour differs in its flags and priority conventions (``priorities``), its priority radix
eviction (``kv_cache.PriorityKvBlockManager``) and its streaming sessions (``sessions``). SGLang's
own scheduler details (the adaptive ``new_token_ratio``, the ``lpm`` policy) are not simulated.
Policies are picked once at construction, so the default path (fcfs, lru) pays nothing for them.

One pass:

1. The token budget is ``max_num_batched_tokens``. Running requests are scheduled first, in
   admission order: a prefilling one takes its remaining prompt chunk (as much as fits with
   chunked prefill, otherwise all of it or nothing), a decoding one 1 token. When KV blocks run
   out, a running request is preempted (``lifo``: the most recently admitted, ``fifo``: the
   oldest; vLLM's ``--scheduling-policy priority``: the largest ``(priority, arrival)``): it
   releases its blocks (full ones stay cached; a session turn keeps its slot's KV), keeps its
   generated tokens and goes back to the waiting queue (in front, or by its priority), to
   recompute prompt + generated tokens when readmitted.
2. Unless something was preempted in this pass, waiting requests are admitted in queue order
   (arrival, or priority then arrival) while fewer than ``max_num_seqs`` run, budget remains and
   their blocks can be allocated (admission never preempts; it stops at the first request that
   does not fit). Admission looks up the prefix cache (a session turn resumes on its slot's KV
   instead); cached tokens are not recomputed, but at least one token is. With a host tier
   (``--num-host-kv-blocks``) the prefix continuing there past the device match is onboarded
   (``KvBlockManager.allocate_onboarding``): those tokens count as cached too, and the pass takes
   ``--host-kv-transfer-ms-per-block`` (divided by ``speedup_ratio``) longer per block copied.
3. Scheduled tokens are computed: their full blocks enter the prefix cache. A request whose
   sequence is now fully computed samples one token, uniformly from the vocabulary with its own
   RNG seeded by ``seed`` (the boundaries of a ``--reasoning`` thinking section are forced, see
   ``reasoning``), or, for a request with a ``source`` (a constraint's grammar, a scripted reply:
   see ``sources``), from that source, which may also end the request (``"stop"``) or fail it
   (``"error"``). Finished requests release their blocks in the same pass (a session turn hands
   them to its slot).

Disaggregated decode (``SimRequest.remote``, vLLM's ``WAITING_FOR_REMOTE_KVS``): when such a
request reaches admission (under the same ``max_num_seqs`` and budget gates, but taking neither),
its locally cached prefix is matched, blocks are allocated for its whole prompt and it leaves the
queue to receive the rest: ``prompt - cached`` tokens' KV, arriving ``transfer.transfer_seconds``
later on the scheduler's clock while other requests keep running. At the first pass after that
the received blocks enter the prefix cache (``BlockStored`` for those new to it) and the request
goes back to the queue's front with all but its last prompt token computed, so its first
admission computes one token (timed as a decode step, not a prefill pass) and samples its first
output token as an aggregated run would.
``cached_tokens`` counts the local prefix only. When nothing runs and the queue head does not fit,
received requests waiting behind it give their blocks back and will prefill locally.

Stop rules (vLLM): a token in ``eos_token_ids`` (unless ``ignore_eos``) or in ``stop_token_ids``
ends the request with reason ``"stop"``, but only once at least ``min_tokens`` tokens were
output; the stopping token is not output (it is reported as ``stop_token_id``) but counts as a
completion token, as in vLLM's usage. Reaching ``max_tokens`` ends it with ``"length"``.
``max_tokens`` (``None``: unlimited) is capped so the sequence fits the context length and the
KV cache (and, without chunked prefill, so a recompute fits one pass's token budget).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass

from dyn.core.kv.events import KvEvent
from dyn.core.messages import StopConditions
from dyn.plugins.mocker import priorities, reasoning
from dyn.plugins.mocker.aic_timing import AicPassTiming, aic_pass_timing
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.kv_cache import KvBlockManager, KvSequence, PriorityKvBlockManager
from dyn.plugins.mocker.queue import FifoQueue, PriorityQueue
from dyn.plugins.mocker.sessions import SessionSlot, StreamingSessions
from dyn.plugins.mocker.sources import FAIL, STOP, TokenSource
from dyn.plugins.mocker.timing import pass_ms
from dyn.plugins.mocker.transfer import transfer_seconds

_NO_STOP = StopConditions()


@dataclass(frozen=True, slots=True)
class SimModel:
    """What the simulated model looks like to the scheduler."""

    vocab_size: int
    context_length: int
    eos_token_ids: frozenset[int] = frozenset()
    kv_bytes_per_token: int = 0
    """KV bytes of one token, for the time a disaggregated request's KV takes to arrive
    (``transfer``); 0: it arrives at once."""


class SimRequest:
    """A request inside the scheduler: the caller's fields plus its simulation state.

    ``tokens`` is the prompt followed by the output tokens emitted so far. A streaming-session
    turn has ``slot`` set; ``held`` tokens of its KV (``base_blocks`` blocks) came from the slot.
    ``source`` (``sources.TokenSource``), when set, writes the output instead of uniform draws.
    ``remote``: a disaggregated decode request whose prompt KV is received (see ``Scheduler``)
    before it is admitted; ``received`` once it arrived and the request waits to run on it.
    """

    __slots__ = (
        "request_id",
        "tokens",
        "prompt_len",
        "stop",
        "seed",
        "priority",
        "lora_name",
        "kv",
        "num_computed",
        "num_scheduled",
        "decoding",
        "num_output",
        "max_tokens",
        "min_tokens",
        "stop_set",
        "cached_tokens",
        "started",
        "num_preemptions",
        "rand",
        "session_id",
        "max_thinking_tokens",
        "arrival",
        "slot",
        "held",
        "base_blocks",
        "source",
        "remote",
        "received",
        "transfer_due",
        "media",
    )

    def __init__(
        self,
        request_id: Hashable,
        token_ids: list[int],
        stop: StopConditions = _NO_STOP,
        seed: int = 0,
        priority: int | None = None,
        lora_name: str | None = None,
        session_id: str | None = None,
        max_thinking_tokens: int | None = None,
        source: TokenSource | None = None,
        remote: bool = False,
        media: tuple[tuple[int, int, str], ...] = (),
    ) -> None:
        self.request_id = request_id
        self.tokens = list(token_ids)
        self.prompt_len = len(self.tokens)
        self.stop = stop
        self.seed = seed
        self.priority = priority
        self.lora_name = lora_name
        self.media = media
        self.kv = KvSequence(self.tokens, lora_name, media=media)
        self.num_computed = 0
        self.num_scheduled = 0
        self.decoding = False
        self.num_output = 0
        self.max_tokens = 0
        self.min_tokens = stop.min_tokens
        self.stop_set: frozenset[int] = frozenset()
        self.cached_tokens = 0
        self.started = False
        self.num_preemptions = 0
        self.rand = random.Random(seed).random
        self.session_id = session_id
        self.max_thinking_tokens = max_thinking_tokens
        self.arrival = 0
        self.slot: SessionSlot | None = None
        self.held = 0
        self.base_blocks = 0
        self.source = source
        self.remote = remote
        self.received = False
        self.transfer_due = 0.0

    @property
    def output_token_ids(self) -> list[int]:
        """Tokens output so far (a copy)."""
        return self.tokens[self.prompt_len :]


@dataclass(slots=True)
class Finished:
    """A request that ended in this pass."""

    request_id: Hashable
    reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    stop_token_id: int | None = None
    error: str = ""
    """Why a request finished with reason ``"error"``."""


@dataclass(slots=True, init=False)
class StepResult:
    """What one pass did.

    ``tokens``: ``(request_id, token_id)`` in emission order. ``started``: requests scheduled
    for the first time. ``events``: the KV events of this pass, in order. ``prefill_tokens``:
    new prompt (or recompute) tokens computed. ``batch_size``: requests scheduled.
    ``onboarded_blocks``: blocks copied back from the host tier (their time is in ``duration_ms``).
    """

    duration_ms: float
    tokens: list[tuple[Hashable, int]]
    finished: list[Finished]
    started: list[Hashable]
    preempted: list[Hashable]
    events: list[KvEvent]
    prefill_tokens: int
    batch_size: int
    onboarded_blocks: int

    def __init__(self) -> None:  # one per pass: cheaper than the dataclass's factory calls
        self.duration_ms = 0.0
        self.tokens = []
        self.finished = []
        self.started = []
        self.preempted = []
        self.events = []
        self.prefill_tokens = 0
        self.batch_size = 0
        self.onboarded_blocks = 0


@dataclass(frozen=True, slots=True)
class SchedulerLoad:
    """A snapshot of the scheduler's load, as published to the router."""

    num_running: int
    num_waiting: int
    active_blocks: int
    total_blocks: int
    kv_usage: float
    num_preemptions: int
    num_sessions: int = 0
    session_held_tokens: int = 0


def _vllm_victim_rank(req: SimRequest) -> tuple:
    return (0 if req.priority is None else req.priority, req.arrival)


class Scheduler:
    """One simulated engine: queues, KV cache and the pass loop (see the module docstring)."""

    def __init__(
        self,
        config: MockerConfig,
        model: SimModel,
        clock: Callable[[], float] = time.monotonic,
        timing: AicPassTiming | None = None,
    ) -> None:
        """``timing``: AIConfigurator's pass timing to use whatever ``config.timing_model`` says;
        default: ``aic_pass_timing(config)`` (which waits for its tables, ``ConfigError`` when
        they cannot be built) with ``--timing-model aic``, else the polynomials."""
        config.validate()
        if model.vocab_size <= 0 or model.context_length <= 1:
            raise ValueError("vocab_size must be positive and context_length at least 2")
        self.config = config
        self.model = model
        self._importance = priorities.importance(config)
        kv_class = KvBlockManager if self._importance is None else PriorityKvBlockManager
        self.kv = kv_class(
            config.num_gpu_blocks,
            config.block_size,
            config.enable_prefix_caching,
            clock,
            host_blocks=config.num_host_kv_blocks,
        )
        self._host = config.num_host_kv_blocks > 0
        self._host_ms = config.host_transfer_ms_per_block
        self.sessions = StreamingSessions(self.kv, clock) if config.enable_streaming_session else None
        self._reasoning = config.reasoning
        self._priority_victim = priorities.uses_priority_victim(config)
        self._budget = config.max_num_batched_tokens
        self._max_seqs = config.max_num_seqs
        self._chunked = config.enable_chunked_prefill
        self._lifo = config.preemption_mode == "lifo"
        self._sr = config.speedup_ratio
        self._dsr = config.decode_speedup_ratio
        if timing is None and config.uses_aic:
            timing = aic_pass_timing(config)
        self._aic = timing
        kv_tokens = config.num_gpu_blocks * config.block_size
        if not self._chunked:
            kv_tokens = min(kv_tokens, config.max_num_batched_tokens)
        self._kv_tokens = kv_tokens  # the most tokens one sequence may ever need computed at once
        self._running: list[SimRequest] = []
        key = priorities.waiting_key(config)
        self._waiting: FifoQueue | PriorityQueue = FifoQueue() if key is None else PriorityQueue(key)
        self._waiting_items = self._waiting.items
        self._requests: dict[Hashable, SimRequest] = {}
        self._preemptions = 0
        self._arrivals = 0
        self._now = clock
        self._receiving: list[SimRequest] = []
        self._decode_pass_ms: dict[float, float] = {}
        self._block_size = config.block_size

    # ------------------------------------------------------------------ queue management

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Requests queued, and disaggregated ones receiving their KV."""
        return len(self._waiting) + len(self._receiving)

    @property
    def num_receiving(self) -> int:
        """Disaggregated requests whose prompt KV is in transfer."""
        return len(self._receiving)

    @property
    def transfer_due(self) -> float | None:
        """When the next KV transfer completes, on the scheduler's clock; None when none runs."""
        return min((r.transfer_due for r in self._receiving), default=None)

    def transfer_time(self, tokens: int) -> float:
        """Seconds ``tokens`` tokens' KV take to arrive (``transfer.transfer_seconds``)."""
        cfg = self.config
        return transfer_seconds(
            tokens, self.model.kv_bytes_per_token, cfg.kv_transfer_bandwidth, cfg.speedup_ratio
        )

    @property
    def has_work(self) -> bool:
        return bool(self._requests)

    @property
    def num_preemptions(self) -> int:
        return self._preemptions

    def load(self) -> SchedulerLoad:
        kv = self.kv
        sessions = self.sessions
        return SchedulerLoad(
            num_running=len(self._running),
            num_waiting=len(self._waiting) + len(self._receiving),
            active_blocks=kv.num_active_blocks,
            total_blocks=kv.num_blocks,
            kv_usage=kv.usage,
            num_preemptions=self._preemptions,
            num_sessions=len(sessions) if sessions is not None else 0,
            session_held_tokens=sessions.held_tokens if sessions is not None else 0,
        )

    def add(self, req: SimRequest) -> None:
        """Queue a request. Raises ``ValueError`` for a duplicate id, an empty prompt, a
        ``max_tokens`` below 1, a negative ``max_thinking_tokens``, or a prompt leaving no room
        for one output token. A request naming an open streaming session becomes its turn."""
        if req.request_id in self._requests:
            raise ValueError(f"request {req.request_id!r} is already in the engine")
        n = req.prompt_len
        if n == 0:
            raise ValueError("the prompt is empty")
        room = min(self.model.context_length - n, self._kv_tokens + 1 - n)
        if room < 1:
            raise ValueError(
                f"a prompt of {n} tokens leaves no room for output "
                f"(context length {self.model.context_length}, KV capacity {self._kv_tokens} tokens)"
            )
        stop = req.stop
        if stop.max_tokens is not None:
            if stop.max_tokens < 1:
                raise ValueError("max_tokens must be at least 1")
            room = min(room, stop.max_tokens)
        if req.max_thinking_tokens is not None and req.max_thinking_tokens < 0:
            raise ValueError("max_thinking_tokens must be at least 0")
        req.max_tokens = room
        req.min_tokens = stop.min_tokens
        ends = set(stop.stop_token_ids)
        if not stop.ignore_eos:
            ends.update(self.model.eos_token_ids)
        req.stop_set = frozenset(ends)
        if self._reasoning is not None:
            cfg = self._reasoning
            end = reasoning.end_index(cfg, room, req.max_thinking_tokens)
            if end:
                req.rand = reasoning.forced_draws(
                    req.rand,
                    self.model.vocab_size,
                    cfg.start_thinking_token_id,
                    cfg.end_thinking_token_id,
                    end,
                )
                if req.source is not None and req.source.thinks:
                    req.source = reasoning.ThinkingFirst(req.source, end, self.model.vocab_size)
        if self._importance is not None:
            req.kv.importance = self._importance(req.priority)
        req.arrival = self._arrivals
        self._arrivals += 1
        if req.session_id is not None and self.sessions is not None:
            if req.remote:
                raise ValueError("a disaggregated decode request cannot be a streaming-session turn")
            self.sessions.attach(req)
        self._requests[req.request_id] = req
        self._waiting.push(req)

    def abort(self, request_id: Hashable) -> bool:
        """Drop a request and free its blocks; False if it is not here."""
        req = self._requests.pop(request_id, None)
        if req is None:
            return False
        if req in self._running:
            self._running.remove(req)
        elif req in self._receiving:
            self._receiving.remove(req)
        else:
            self._waiting.remove(req)
        if req.slot is not None:
            self.sessions.turn_ended(req, finished=False)  # type: ignore[union-attr]
        else:
            self.kv.release(req.kv)
        return True

    def waiting(self) -> Iterator[SimRequest]:
        """Waiting requests in admission order."""
        return iter(self._waiting)

    def running(self) -> Iterator[SimRequest]:
        """Running requests in admission order."""
        return iter(self._running)

    # ------------------------------------------------------------------ the pass

    def _victim_index(self, running: list[SimRequest]) -> int:
        if self._priority_victim:
            return running.index(max(running, key=_vllm_victim_rank))
        return len(running) - 1 if self._lifo else 0

    def _preempt(self, req: SimRequest, result: StepResult) -> None:
        self._running.remove(req)
        if req.base_blocks:
            self.kv.truncate(req.kv, req.base_blocks)  # the slot's KV stays held
        else:
            self.kv.release(req.kv)
        req.num_computed = 0
        req.num_scheduled = 0
        req.decoding = False
        req.num_preemptions += 1
        self._preemptions += 1
        self._waiting.push_preempted(req)
        result.preempted.append(req.request_id)

    def _give_back_lent_kv(self) -> None:
        """Nothing runs and the queue head does not fit: waiting session turns return the KV
        their slots lent them (each restarts on the turn-1 path), so turns that hold KV while
        waiting cannot block one another forever."""
        for req in self._waiting:
            if req.base_blocks:
                self.kv.release(req.kv)
                req.kv = KvSequence(req.tokens, req.lora_name, media=req.media)
                req.held = 0
                req.base_blocks = 0
                if req.slot is not None:
                    req.slot.held_len = 0

    def _start_transfer(self, req: SimRequest, result: StepResult) -> bool:
        """Take the queue head's prompt blocks and start receiving what is not cached; False,
        changing nothing, when its blocks do not fit."""
        kv = self.kv
        hit = kv.match_prefix(req.kv)
        if not kv.allocate(req.kv, req.prompt_len, hit):
            return False
        self._waiting.pop()
        cached = hit * kv.block_size
        req.remote = False
        req.started = True
        req.cached_tokens = cached
        req.num_computed = cached
        result.started.append(req.request_id)
        wait = self.transfer_time(req.prompt_len - cached)
        if wait > 0:
            req.transfer_due = self._now() + wait
            self._receiving.append(req)
        else:
            self._receive(req)
        return True

    def _receive(self, req: SimRequest) -> None:
        """The transfer is done: store the received blocks and queue the request to run."""
        req.num_computed = req.prompt_len - 1
        self.kv.commit(req.kv, req.num_computed)
        req.received = True
        self._waiting.push_preempted(req)

    def _finish_transfers(self) -> None:
        now = self._now()
        arrived = [r for r in self._receiving if r.transfer_due <= now]
        if arrived:
            self._receiving = [r for r in self._receiving if r.transfer_due > now]
            for req in sorted(arrived, key=lambda r: r.transfer_due, reverse=True):
                self._receive(req)  # pushed to the front: the earliest lands first

    def _give_back_received_kv(self) -> None:
        """Nothing runs and the queue head does not fit: received requests behind it (a priority
        queue can put one there) release their blocks and will prefill locally, from the prefix
        cache the received blocks entered, so the head cannot wait on them forever."""
        for req in self._waiting:
            if req.received:
                self.kv.release(req.kv)
                req.received = False
                req.num_computed = 0

    def _end_requests(self, finished: list[Finished]) -> None:
        """Release the blocks of requests that finished in this pass and drop them."""
        requests = self._requests
        kv = self.kv
        done = set()
        for f in finished:
            req = requests.pop(f.request_id)
            if req.slot is not None:
                self.sessions.turn_ended(req, finished=True)  # type: ignore[union-attr]
            else:
                kv.release(req.kv)
            done.add(f.request_id)
        self._running = [r for r in self._running if r.request_id not in done]

    def _decode_pass(self, result: StepResult) -> bool:
        """Run this pass into ``result`` if it is decode only, else return False having changed
        nothing the general pass would not do first.

        Decode only: every running request decodes one token with no source, holding (or now
        allocating, in admission order, as the general pass would) the block that token needs.
        When one does not, or its allocation fails, the general pass runs: it finds the earlier
        allocations done and repeats the failing one, which changed nothing, so the outcome is
        the same. Otherwise each running request computes its last token and samples the next,
        in admission order, exactly as the general pass would."""
        kv = self.kv
        bs = self._block_size
        running = self._running
        for req in running:
            if not req.decoding or req.source is not None:
                return False
            target = req.num_computed + 1
            if len(req.tokens) != target:
                return False
            seq = req.kv
            if target > (seq.num_registered + seq.num_private) * bs and not kv.allocate(seq, target):
                return False
        usage = kv.usage
        commit = kv.commit
        vocab = self.model.vocab_size
        out = result.tokens
        finished = result.finished
        aic = self._aic
        context = sum(req.num_computed for req in running) if aic is not None else 0
        for req in running:
            computed = req.num_computed + 1
            req.num_computed = computed
            if computed // bs > req.kv.num_registered:  # a block filled up: commit registers it
                commit(req.kv, computed)
            tok = int(req.rand() * vocab)
            if tok in req.stop_set and req.num_output >= req.min_tokens:
                finished.append(
                    Finished(
                        req.request_id, "stop", req.prompt_len, req.num_output + 1, req.cached_tokens, tok
                    )
                )
                continue
            req.tokens.append(tok)
            n = req.num_output = req.num_output + 1
            out.append((req.request_id, tok))
            if n >= req.max_tokens:
                finished.append(Finished(req.request_id, "length", req.prompt_len, n, req.cached_tokens))
        if finished:
            self._end_requests(finished)
        result.batch_size = len(running)
        if aic is not None:
            result.duration_ms = aic.pass_ms(0.0, len(running), context, self._sr, self._dsr)
        else:
            ms = self._decode_pass_ms.get(usage)
            if ms is None:
                ms = self._decode_pass_ms[usage] = pass_ms(0, True, usage, self._sr, self._dsr)
            result.duration_ms = ms
        result.events = kv.drain_events()
        return True

    def quiet_passes(self) -> tuple[int, float]:
        """How many of the next passes are quiet, and how long each takes (ms); ``(0, 0.0)`` when
        the next one is not.

        A quiet pass is a decode-only pass (see ``_decode_pass``) that changes nothing but the
        running requests' token counts: every running request samples one token from its own RNG
        with no source and no stop token to watch, none fills or allocates a block (so no KV event
        and a constant KV usage, hence a constant duration), none finishes, nothing waits and no
        session or transfer is open. The count holds while nothing is added; the caller may then
        run those passes in one ``skip_quiet`` call, later, with the same outcome, since each
        request's draws depend on its RNG alone."""
        running = self._running
        if (
            not running
            or self._waiting_items
            or len(running) > self._budget
            or self.sessions is not None
            or self._receiving
            or self._aic is not None
        ):
            return 0, 0.0
        bs = self._block_size
        passes = 1 << 62
        for req in running:
            computed = req.num_computed
            if not req.decoding or req.source is not None or req.stop_set or len(req.tokens) != computed + 1:
                return 0, 0.0
            seq = req.kv
            registered = seq.num_registered
            # pass j computes token computed + j: it must neither fill block `registered` (a
            # commit) nor need a block beyond those held (an allocation), nor output the last token
            room = min((registered + 1) * bs - 1, (registered + seq.num_private) * bs) - computed
            room = min(room, req.max_tokens - req.num_output - 1)
            if room < passes:
                if room <= 0:
                    return 0, 0.0
                passes = room
        usage = self.kv.usage
        ms = self._decode_pass_ms.get(usage)
        if ms is None:
            ms = self._decode_pass_ms[usage] = pass_ms(0, True, usage, self._sr, self._dsr)
        return passes, ms

    def skip_quiet(self, passes: int) -> list[Hashable]:
        """Run ``passes`` quiet passes at once (at most what ``quiet_passes`` counted, with
        nothing added since) and return the running requests' ids, each of which output
        ``passes`` more tokens."""
        vocab = self.model.vocab_size
        for req in self._running:
            rand = req.rand
            req.tokens.extend([int(rand() * vocab) for _ in range(passes)])
            req.num_computed += passes
            req.num_output += passes
        return [req.request_id for req in self._running]

    def step(self) -> StepResult:
        """Run one pass (see the module docstring) and return what it did."""
        result = StepResult()
        if self.sessions is not None:
            self.sessions.reap_due()
        if self._receiving:
            self._finish_transfers()
        kv = self.kv
        running = self._running
        budget = self._budget
        if running and not self._waiting_items and len(running) <= budget and self.sessions is None:
            if self._decode_pass(result):
                return result
        chunked = self._chunked

        bs = kv.block_size
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            remaining = len(req.tokens) - req.num_computed
            if remaining > budget:
                if not chunked:
                    i += 1
                    continue
                n = budget
            else:
                n = remaining
            target = req.num_computed + n
            seq = req.kv
            if target <= (seq.num_registered + seq.num_private) * bs:  # holds its blocks already
                req.num_scheduled = n
                budget -= n
                i += 1
                continue
            while not kv.allocate(seq, target):
                vi = self._victim_index(running)
                victim = running[vi]
                budget += victim.num_scheduled
                self._preempt(victim, result)
                if victim is req:
                    break
                if vi < i:
                    i -= 1
            else:
                req.num_scheduled = n
                budget -= n
                i += 1

        if not result.preempted and len(self._waiting):
            waiting = self._waiting
            max_seqs = self._max_seqs
            while budget > 0 and len(running) < max_seqs:
                peeked = waiting.peek()
                if peeked is None:
                    break
                req = peeked
                if req.remote:
                    if not self._start_transfer(req, result):
                        break
                    continue
                onboard = 0
                if req.received:  # holds its prompt's blocks, all but the last token computed
                    hit = 0
                    computed = req.num_computed
                elif req.held:  # a session turn resumes on its slot's KV
                    hit = 0
                    computed = req.held
                else:
                    hit = kv.match_prefix(req.kv)
                    onboard = kv.match_host(req.kv, hit) if self._host else 0
                    computed = (hit + onboard) * bs
                remaining = len(req.tokens) - computed
                if remaining > budget:
                    if not chunked:
                        break
                    n = budget
                else:
                    n = remaining
                if onboard:
                    if not kv.allocate_onboarding(req.kv, computed + n, hit, onboard):
                        break
                    result.onboarded_blocks += onboard
                elif not kv.allocate(req.kv, computed + n, hit):
                    break
                waiting.pop()
                if req.received:
                    # its one recomputed prompt token rides in the decode batch, as a decode step
                    # does (a prefill pass would charge the timing model's constant for one token)
                    req.decoding = n == 1
                    req.received = False
                req.num_computed = computed
                req.num_scheduled = n
                budget -= n
                running.append(req)
                if not req.started:
                    req.started = True
                    req.cached_tokens = computed
                    result.started.append(req.request_id)
            if not running and len(waiting):
                if self.sessions is not None:
                    self._give_back_lent_kv()
                self._give_back_received_kv()

        usage = kv.usage
        prefill = 0
        decoding = False
        batch = 0
        aic = self._aic
        aic_prefill_ms = 0.0
        decode_batch = 0
        decode_context = 0
        out = result.tokens
        finished = result.finished
        commit = kv.commit
        vocab = self.model.vocab_size
        for req in running:
            n = req.num_scheduled
            if not n:
                continue
            req.num_scheduled = 0
            batch += 1
            if req.decoding:
                decoding = True
                decode_batch += 1
                decode_context += req.num_computed
            else:
                prefill += n
                if aic is not None:
                    aic_prefill_ms += aic.prefill_ms(n, req.num_computed)
            computed = req.num_computed + n
            req.num_computed = computed
            if computed // bs > req.kv.num_registered:  # a block filled up: commit registers it
                commit(req.kv, computed)
            tokens = req.tokens
            if computed < len(tokens):
                continue
            req.decoding = True
            source = req.source
            if source is None:
                tok = int(req.rand() * vocab)
            else:
                try:
                    tok = source.next_token(req)
                    error = source.error
                except Exception as exc:  # a source's bug fails its request, never the pass
                    tok, error = FAIL, f"{type(exc).__name__}: {exc}"
                if tok < 0:  # the source ended the output (sources.STOP) or failed (sources.FAIL)
                    if tok == STOP:
                        finished.append(
                            Finished(
                                req.request_id,
                                "stop",
                                req.prompt_len,
                                req.num_output + 1,
                                req.cached_tokens,
                                source.end_token_id,
                            )
                        )
                    else:
                        finished.append(
                            Finished(
                                req.request_id,
                                "error",
                                req.prompt_len,
                                req.num_output,
                                req.cached_tokens,
                                error=error,
                            )
                        )
                    continue
            if tok in req.stop_set and req.num_output >= req.min_tokens:
                finished.append(
                    Finished(
                        req.request_id, "stop", req.prompt_len, req.num_output + 1, req.cached_tokens, tok
                    )
                )
                continue
            tokens.append(tok)
            req.num_output += 1
            out.append((req.request_id, tok))
            if req.num_output >= req.max_tokens:
                finished.append(
                    Finished(req.request_id, "length", req.prompt_len, req.num_output, req.cached_tokens)
                )

        if finished:
            self._end_requests(finished)

        result.batch_size = batch
        result.prefill_tokens = prefill
        if batch:
            if aic is not None:
                result.duration_ms = aic.pass_ms(
                    aic_prefill_ms, decode_batch, decode_context, self._sr, self._dsr
                )
            elif prefill:
                result.duration_ms = pass_ms(prefill, decoding, usage, self._sr, self._dsr)
            else:  # a decode-only pass: its time depends on the KV usage alone
                ms = self._decode_pass_ms.get(usage)
                if ms is None:
                    ms = self._decode_pass_ms[usage] = pass_ms(0, decoding, usage, self._sr, self._dsr)
                result.duration_ms = ms
        if result.onboarded_blocks:
            result.duration_ms += self._onboard_ms(result.onboarded_blocks)
        result.events = kv.drain_events()
        return result

    def _onboard_ms(self, blocks: int) -> float:
        """Simulated time to copy ``blocks`` blocks back from the host tier, scaled as prefill."""
        sr = self._sr if self._sr > 0 else 1.0
        return blocks * self._host_ms / sr
