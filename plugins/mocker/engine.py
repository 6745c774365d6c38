"""``MockerEngine``: drives the simulated scheduler in real time behind the ``Engine`` protocol.

One engine is one simulated worker rank. Its loop runs a scheduler pass, sleeps until the pass's
simulated end (``duration / speedup``; passes are scheduled back to back against a deadline so
Python overhead does not add up), then delivers the pass's tokens to the request streams and hands
the pass's KV events to the event sink. The event loop's timers wake at millisecond granularity
(epoll rounds a 0.57 ms sleep up to 1 ms), so a pass that ends late is made up by the next ones:
the deadline runs on from the last one while the loop is at most ``CATCH_UP_S`` behind, and the
pace of sub-millisecond passes is the model's on average. When the process cannot keep up with
the simulated clock, passes run as fast as the CPU allows. A pass that could schedule nothing (KV held by
streaming sessions or pins) waits for a new request, a cancel or a closed session, retrying at
least every ``STALL_RETRY_S``.

The context is the model's, or ``--max-model-len`` (at most the model's; ``EngineInfo.context_length``
advertises it): a request whose prompt plus ``max_tokens`` exceeds it is refused (``bad_request``,
vLLM's sentence); without ``max_tokens`` the output is capped to fit.

Optional calls (``EngineInfo.features``): ``pin_prefix`` in both flavours when prefix caching is on;
``open_session`` / ``close_session`` with ``--enable-streaming-session``, whose idle slots are
reaped every pass and at least every ``REAP_INTERVAL_S``; ``FEATURE_TOOL_HINTS`` with
``--tool-call-rate`` above 0; with ``--runner pooling`` ``embed`` (``FEATURE_EMBED``) and no
``generate`` (``FEATURE_POOLING_ONLY``): each input is prefilled through the scheduler as a
one-token request (its time, its bounds, its prefix cache), then answered with its deterministic
vector (``embeddings``).

Disaggregated serving (``GenerateRequest.kv_transfer``, ``dyn.core.messages.KvTransfer``): a
``prefill`` request runs like any other but outputs at most one token and finishes with the
descriptor a decode worker needs (``phase="decode"``, ``prompt_tokens``; ``source_instance_id``
0, which ``dyn.core.worker.host.WorkerHost`` replaces with the worker's instance id). A
``decode`` request receives the prompt's KV it does not hold (``--kv-transfer-bandwidth``;
``transfer``) without holding up the other requests, then generates exactly what an aggregated
worker would; ``EngineTiming.prefill_ms`` includes the transfer. A request without
``kv_transfer`` is served whole whatever the worker's role; a phase contradicting the role (a
decode request to a prefill worker, or the reverse) and a descriptor whose ``prompt_tokens`` is
not the prompt's length are refused (``bad_request``).

What a request's tokens are (random, a constraint's grammar, a scripted reply, a tool call) is
chosen by ``answers.Answers`` before the request is queued. ``GenerateRequest.logprobs`` and
``prompt_logprobs`` are answered with synthetic values (``logprobs``), never from the sampling
RNG: a pass's chunks get theirs as they are emitted; large prompt logprobs are computed in a
worker thread before the ``Finish`` goes out.

The engine is a ``PushingEngine``: the pass loop hands each request's chunks and ``Finish`` to
the callback ``start`` was given (the worker host's reply queue), so a token costs no task
switch; ``generate`` is the same through an iterator.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from array import array
from collections.abc import AsyncIterator, Hashable

import anyio
import anyio.to_thread
import msgspec
import xxhash

from dyn.core.engine import (
    FEATURE_CLASSIFY,
    FEATURE_EMBED,
    FEATURE_MEDIA,
    FEATURE_PIN_PREFIX,
    FEATURE_POOLING_ONLY,
    FEATURE_STREAMING_SESSIONS,
    FEATURE_TOOL_HINTS,
    EngineError,
    EngineInfo,
    KvEventSink,
    ReplySink,
    pooling_feature,
)
from dyn.core.messages import (
    DisaggregationMode,
    EngineTiming,
    Finish,
    GenerateRequest,
    KvTransfer,
    LoadMetrics,
    PoolingTask,
    StopConditions,
    TokenChunk,
    Usage,
)
from dyn.core.model import ModelInfo
from dyn.core.model.classes import class_labels
from dyn.core.model.lora import parse_lora_modules
from dyn.core.model.multimodal import placeholder_rules
from dyn.core.model.pooler import RANKING_TOKEN_IDS, listwise_ranker, per_token_task, vector_width
from dyn.core.protocol.grammar import is_refusal
from dyn.plugins.mocker import embeddings, logprobs
from dyn.plugins.mocker.answers import Answers
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.loras import SimulatedLoras
from dyn.plugins.mocker.priorities import priority_order
from dyn.plugins.mocker.scheduler import Scheduler, SimModel, SimRequest
from dyn.plugins.mocker.sessions import StreamingSessions
from dyn.plugins.mocker.sources import TokenSource
from dyn.plugins.mocker.transfer import kv_bytes_per_token

log = logging.getLogger(__name__)

REAP_INTERVAL_S = 0.5
STALL_RETRY_S = 0.5
CATCH_UP_S = 0.002
"""How far behind its simulated clock the pass loop may run and still make the lag up (two timer ticks)."""


def next_deadline(deadline: float, start: float, duration_s: float) -> float:
    """When a pass that started at ``start`` ends, the previous pass having been due at ``deadline``.

    A pass runs on from the previous deadline, so a late wake is made up by the passes after it,
    but never from more than ``CATCH_UP_S`` before ``start``: a loop that fell further behind (an
    idle wait, a starved CPU) does not burst to catch up.
    """
    return max(deadline, start - CATCH_UP_S) + duration_s


PROMPT_LOGPROBS_INLINE = 2048
"""Prompt positions x (alternatives + 1) computed in the pass loop; more go to a worker thread."""


def request_seed(request: GenerateRequest) -> int:
    """What the request's output is drawn from. Greedy (``temperature`` 0, which
    ``nvext.greed_sampling`` arrives as): the prompt alone, as a greedy engine's output is a
    function of its input; else the sampling seed if given, else one derived from the request id
    (stable across runs)."""
    if request.sampling.temperature == 0:
        return xxhash.xxh64_intdigest(array("q", request.token_ids).tobytes())
    if request.sampling.seed is not None:
        return request.sampling.seed
    return xxhash.xxh64_intdigest(request.request_id.encode())


class _Stream:
    """One admitted request: where its outputs go (``emit``) and the clock readings of its
    ``EngineTiming``. Logprobs, when asked for, are computed as its tokens are emitted."""

    __slots__ = (
        "sim",
        "request",
        "emit",
        "seed",
        "received",
        "scheduled",
        "first_token",
        "position",
    )

    def __init__(
        self, sim: SimRequest, request: GenerateRequest, emit: ReplySink, seed: int, received: float
    ) -> None:
        self.sim = sim
        self.request = request
        self.emit = emit
        self.seed = seed
        self.position = 0
        self.received = received
        self.scheduled: float | None = None
        self.first_token: float | None = None


class _Inbox:
    """The outputs of one ``generate`` call, waiting for its iterator."""

    __slots__ = ("items", "ready")

    def __init__(self) -> None:
        self.items: list[TokenChunk | Finish | EngineError] = []
        self.ready = anyio.Event()

    def put(self, item: TokenChunk | Finish | EngineError) -> None:
        self.items.append(item)
        if len(self.items) == 1:
            self.ready.set()

    async def take(self) -> list[TokenChunk | Finish | EngineError]:
        while not self.items:
            await self.ready.wait()
            self.ready = anyio.Event()
        items, self.items = self.items, []
        return items


class MockerEngine:
    """A simulated vLLM- or SGLang-flavour engine for one worker rank.

    ``answers`` may be shared by the engines of one process; without it the engine builds its own
    from ``config`` (``--replies``, ``--tool-call-rate``) and ``tool_call_parser`` (the worker's
    ``--dyn-tool-call-parser``). ``ValueError`` says what to fix in either.
    ``disaggregation_mode`` is the worker's role (``--disaggregation-mode``).
    """

    def __init__(
        self,
        config: MockerConfig,
        model: ModelInfo,
        event_sink: KvEventSink | None = None,
        dp_rank: int = 0,
        *,
        answers: Answers | None = None,
        tool_call_parser: str | None = None,
        disaggregation_mode: DisaggregationMode = "agg",
    ) -> None:
        self.config = config.validate()
        self.disaggregation_mode = disaggregation_mode
        context = config.context_length(model.context_length, model.name)
        if context != model.context_length:
            model = dataclasses.replace(model, context_length=context)
        self.model = model
        if answers is None:
            answers = answers_for(config, model, tool_call_parser)
        self._answers = answers
        self.dp_rank = dp_rank
        self._sink = event_sink
        self._scheduler = Scheduler(
            config,
            SimModel(
                vocab_size=model.vocab_size,
                eos_token_ids=frozenset(model.eos_token_ids),
                context_length=model.context_length,
                kv_bytes_per_token=kv_bytes_per_token(config, model),
            ),
        )
        # keyed by request id: a str here, handed back by the scheduler as a Hashable
        self._streams: dict[Hashable, _Stream] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._wake = anyio.Event()
        self.passes = 0
        features = []
        if config.enable_prefix_caching:
            features.append(FEATURE_PIN_PREFIX)
        if config.enable_streaming_session:
            features.append(FEATURE_STREAMING_SESSIONS)
        if config.tool_call_rate > 0:
            features.append(FEATURE_TOOL_HINTS)
        if placeholder_rules(model):
            features.append(FEATURE_MEDIA)
        self._embed_size = 0
        self._labels: list[str | None] = []
        if config.is_pooling:  # a classification model classifies, any other embeds (as vLLM's)
            self._embed_size = vector_width(model, "embed")
            self._labels = class_labels(model) or []
            features += [FEATURE_CLASSIFY if self._labels else FEATURE_EMBED, FEATURE_POOLING_ONLY]
        self._embed_seq = 0
        modules = parse_lora_modules(config.lora_modules, reserved_names=[model.name], on_disk=False)
        self.loras = SimulatedLoras(
            modules, config.max_loras, config.lora_load_time_ms / 1000 / config.speedup_ratio
        )
        self.info = EngineInfo(
            block_size=config.block_size,
            total_kv_blocks=config.num_gpu_blocks,
            max_num_batched_tokens=config.max_num_batched_tokens,
            context_length=model.context_length,
            priority_order=priority_order(config),
            features=features,
            loras=dict(self.loras.paths),
            device=config.device,
        )

    # ------------------------------------------------------------------ engine loop

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Run passes while there is work; idle without spinning. Runs until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            if self._scheduler.sessions is not None:
                tg.start_soon(self._reap_sessions, self._scheduler.sessions)
            task_status.started()
            await self._pass_loop()

    async def _reap_sessions(self, sessions: StreamingSessions) -> None:
        while True:
            await anyio.sleep(REAP_INTERVAL_S)
            if sessions.reap_due():
                self._wake.set()

    async def _wait_for_wake(self, timeout: float | None = None) -> None:
        with anyio.move_on_after(timeout):
            await self._wake.wait()
        self._wake = anyio.Event()

    async def _pass_loop(self) -> None:
        scheduler = self._scheduler
        deadline = time.monotonic()
        while True:
            if not scheduler.has_work:
                while not scheduler.has_work:
                    await self._wait_for_wake()
                deadline = time.monotonic()
            start = time.monotonic()
            result = scheduler.step()
            self.passes += 1
            for rid in result.started:
                stream = self._streams.get(rid)
                if stream is not None and stream.scheduled is None:
                    stream.scheduled = start
            if not result.batch_size and not result.preempted:
                self._deliver(result)
                # nothing fits until KV is given back, or nothing runs until a transfer lands
                await self._wait_for_wake(self._stall_timeout())
                deadline = time.monotonic()
                continue
            deadline = next_deadline(deadline, start, result.duration_ms / 1000.0)
            delay = deadline - time.monotonic()
            # always yield once so new requests and cancels get in between passes
            await anyio.sleep(delay if delay > 0 else 0)
            self._deliver(result)

    def _stall_timeout(self) -> float:
        due = self._scheduler.transfer_due
        if due is None:
            return STALL_RETRY_S
        return min(STALL_RETRY_S, max(0.0, due - time.monotonic()))

    def _deliver(self, result) -> None:
        """Emit a pass's tokens (one chunk per request), then the requests it finished."""
        now = time.monotonic()
        streams = self._streams
        tokens: dict[str, list[int]] = {}
        for rid, token in result.tokens:
            got = tokens.get(rid)
            if got is None:
                tokens[rid] = [token]
            else:
                got.append(token)
        vocab = self.model.vocab_size
        for rid, ids in tokens.items():
            stream = streams.get(rid)
            if stream is None:  # aborted during the pass
                continue
            if stream.first_token is None:
                stream.first_token = now
            top = stream.request.logprobs
            if top is None:
                stream.emit(TokenChunk(rid, ids))
            else:
                values = logprobs.output_logprobs(stream.seed, stream.position, ids, top, vocab)
                stream.position += len(ids)
                stream.emit(TokenChunk(rid, ids, values))
        for fin in result.finished:
            stream = streams.pop(fin.request_id, None)
            if stream is None:
                continue
            if fin.error:
                log.warning("request %s failed in the grammar engine: %s", fin.request_id, fin.error)
                if is_refusal(fin.error):  # a budget exceeded mid-output: the constraint's fault
                    stream.emit(EngineError(fin.error, code="bad_request"))
                else:
                    stream.emit(EngineError(f"the grammar engine failed: {fin.error}"))
                continue
            finish = Finish(
                request_id=fin.request_id,
                reason=fin.reason,
                usage=Usage(fin.prompt_tokens, fin.completion_tokens, fin.cached_tokens),
                timing=_timing(stream, now),
                stop_token_id=fin.stop_token_id,
            )
            request = stream.request
            transfer = request.kv_transfer
            if transfer is not None and transfer.phase == "prefill":
                finish.kv_transfer = self._descriptor(request, finish)
            if request.prompt_logprobs is None:
                stream.emit(finish)
            elif _prompt_logprobs_inline(request):
                finish.prompt_logprobs = logprobs.prompt_logprobs(*_prompt_logprobs_args(stream, vocab))
                stream.emit(finish)
            else:
                assert self._tg is not None  # passes run inside ``run``
                self._tg.start_soon(self._finish_with_prompt_logprobs, stream, finish)
        if result.events and self._sink is not None:
            self._sink(result.events, self.dp_rank)

    async def _finish_with_prompt_logprobs(self, stream: _Stream, finish: Finish) -> None:
        args = _prompt_logprobs_args(stream, self.model.vocab_size)
        finish.prompt_logprobs = await anyio.to_thread.run_sync(logprobs.prompt_logprobs, *args)
        stream.emit(finish)

    # ------------------------------------------------------------------ Engine protocol

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | Finish]:
        self._check_generates()
        async for out in self._generate(request):
            yield out

    async def start(self, request: GenerateRequest, emit: ReplySink) -> None:
        """``PushingEngine.start``: outputs go to ``emit`` from the pass loop (see ``_deliver``)."""
        self._check_generates()
        await self._start(request, emit)

    def start_now(self, request: GenerateRequest, emit: ReplySink) -> bool:
        """``PushingEngine.start_now``: everything but a LoRA adapter (which may have to load) and
        an answer source (a grammar to compile, a script) is admitted at once."""
        self._check_generates()
        if request.lora_name or self._answers.wants(request):
            return False
        request = self._checked(request)
        self._admit(request, emit, request_seed(request), None)
        return True

    def _check_generates(self) -> None:
        if self._embed_size:
            raise EngineError(
                f"model {self.model.name} is served by a pooling worker (--runner pooling): it embeds "
                "(/v1/embeddings) and does not generate; start a worker without --runner pooling",
                code="unsupported",
            )

    async def _generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | Finish]:
        inbox = _Inbox()
        await self._start(request, inbox.put)
        rid = request.request_id
        ended = False
        try:
            while True:
                for item in await inbox.take():
                    if isinstance(item, EngineError):
                        ended = True
                        raise item
                    if type(item) is Finish:
                        ended = True
                        yield item
                        return
                    yield item
        finally:
            if not ended and self._streams.pop(rid, None) is not None and self._scheduler.abort(rid):
                self._wake.set()

    async def _start(self, request: GenerateRequest, emit: ReplySink) -> None:
        request = self._checked(request)
        await self.loras.ensure(request.lora_name)
        seed = request_seed(request)
        source = None
        if self._answers.wants(request):
            source = await self._answers.source_for(request, seed)
        self._admit(request, emit, seed, source)

    def _checked(self, request: GenerateRequest) -> GenerateRequest:
        """``request`` as this worker runs it (a disaggregated phase checked against its role), or
        ``EngineError`` for one it refuses."""
        rid = request.request_id
        if rid in self._streams:
            raise EngineError(f"request id {rid!r} is already running", code="duplicate_request")
        if request.session_id is not None and self._scheduler.sessions is None:
            log.debug(
                "streaming sessions are off; serving %s of session %s as an ordinary request",
                rid,
                request.session_id,
            )
        transfer = request.kv_transfer
        if transfer is not None:
            request = self._disaggregated(request, transfer)
        self._check_context(request)
        if request.media:
            self._check_media(request)
        return request

    def _check_media(self, request: GenerateRequest) -> None:
        """Refuse media for a model that takes none, or placed outside the prompt."""
        if FEATURE_MEDIA not in self.info.features:
            raise EngineError(
                f"the model {self.model.name} takes no images, audio or video; send text", code="bad_request"
            )
        size = len(request.token_ids)
        for item in request.media:
            if not (0 <= item.offset and 0 < item.length and item.offset + item.length <= size):
                raise EngineError(
                    f"a {item.modality}'s placeholder tokens ({item.offset}+{item.length}) lie "
                    f"outside the {size}-token prompt",
                    code="bad_request",
                )

    def _check_context(self, request: GenerateRequest) -> None:
        """Refuse a request whose prompt plus ``max_tokens`` exceeds the context (the model's, or
        ``--max-model-len``) as vLLM's server does, in its words; a prompt that leaves no room at
        all without ``max_tokens`` is refused by the scheduler."""
        max_tokens = request.stop.max_tokens
        prompt = len(request.token_ids)
        context = self.model.context_length
        if max_tokens is not None and prompt + max_tokens > context:
            raise EngineError(
                f"This model's maximum context length is {context} tokens. However, you requested "
                f"{prompt + max_tokens} tokens ({prompt} in the messages, {max_tokens} in the "
                "completion). Please reduce the length of the messages or completion.",
                code="bad_request",
            )

    def _admit(
        self, request: GenerateRequest, emit: ReplySink, seed: int, source: TokenSource | None
    ) -> None:
        """Queue ``request`` in the scheduler; its outputs go to ``emit`` from the pass loop."""
        rid = request.request_id
        if rid in self._streams:  # admitted meanwhile, while this one waited for its source
            raise EngineError(f"request id {rid!r} is already running", code="duplicate_request")
        transfer = request.kv_transfer
        sim = SimRequest(
            rid,
            request.token_ids,
            stop=request.stop,
            seed=seed,
            priority=request.priority,
            lora_name=request.lora_name,
            session_id=request.session_id,
            max_thinking_tokens=request.max_thinking_tokens,
            source=source,
            remote=transfer is not None and transfer.phase == "decode",
            media=tuple((m.offset, m.length, m.mm_hash) for m in request.media),
        )
        try:
            self._scheduler.add(sim)
        except ValueError as exc:
            raise EngineError(str(exc), code="bad_request") from None
        self._streams[rid] = _Stream(sim, request, emit, seed, time.monotonic())
        self._wake.set()

    def _disaggregated(self, request: GenerateRequest, transfer: KvTransfer) -> GenerateRequest:
        """Check a phase of a disaggregated request against this worker's role; a prefill
        request is capped to one output token. ``EngineError`` ``bad_request`` says what is wrong."""
        role = self.disaggregation_mode
        if transfer.phase == "decode":
            if role == "prefill":
                raise EngineError(
                    "this worker is a prefill worker (--disaggregation-mode prefill): it cannot "
                    "receive KV for a decode request; send it to a decode worker",
                    code="bad_request",
                )
            if transfer.prompt_tokens != len(request.token_ids):
                raise EngineError(
                    f"the KV transfer descriptor holds {transfer.prompt_tokens} prompt tokens but the "
                    f"request's prompt has {len(request.token_ids)}: send the prompt the prefill "
                    "worker computed",
                    code="bad_request",
                )
            return request
        if role == "decode":
            raise EngineError(
                "this worker is a decode worker (--disaggregation-mode decode): send prefill "
                "requests to a prefill worker",
                code="bad_request",
            )
        stop = request.stop
        if stop.max_tokens is None or stop.max_tokens > 1:
            stop = msgspec.structs.replace(stop, max_tokens=1, min_tokens=min(stop.min_tokens, 1))
            request = msgspec.structs.replace(request, stop=stop)
        return request

    def _descriptor(self, request: GenerateRequest, finish: Finish) -> KvTransfer | None:
        """What a decode worker needs after a prefill request; None when it did not complete."""
        if finish.reason in ("cancelled", "error"):
            return None
        return KvTransfer(phase="decode", prompt_tokens=len(request.token_ids))

    async def abort(self, request_id: str) -> bool:
        stream = self._streams.get(request_id)
        if stream is None or not self._scheduler.abort(request_id):
            return False
        del self._streams[request_id]
        sim = stream.sim
        stream.emit(
            Finish(
                request_id=request_id,
                reason="cancelled",
                usage=Usage(sim.prompt_len, sim.num_output, sim.cached_tokens),
                timing=_timing(stream, time.monotonic()),
            )
        )
        self._wake.set()  # its blocks are free: a stalled pass may fit now
        return True

    def load_metrics(self) -> list[LoadMetrics]:
        load = self._scheduler.load()
        return [
            LoadMetrics(
                instance_id=0,
                dp_rank=self.dp_rank,
                ts=time.time(),
                num_running=load.num_running,
                num_waiting=load.num_waiting,
                active_kv_blocks=load.active_blocks,
                total_kv_blocks=load.total_blocks,
                kv_usage=load.kv_usage,
                num_preempted=load.num_preemptions,
                num_passes=self.passes,
                num_streaming_sessions=load.num_sessions,
                streaming_session_held_tokens=load.session_held_tokens,
            )
        ]

    # ------------------------------------------------------------------ optional calls

    def _sessions(self) -> StreamingSessions:
        sessions = self._scheduler.sessions
        if sessions is None:
            raise EngineError(
                "streaming sessions are off: start the mocker with --engine-type sglang "
                "--enable-streaming-session",
                code="unsupported",
            )
        return sessions

    async def open_session(self, session_id: str, timeout_s: float) -> bool:
        """Open a streaming session idle-closed ``timeout_s`` after its last use (<= 0: the
        default 300 s); False, with the timeout refreshed, when it is already open."""
        if not session_id:
            raise EngineError("a session needs a non-empty session_id", code="bad_request")
        return self._sessions().open(session_id, timeout_s)

    async def close_session(self, session_id: str) -> bool:
        """Close a streaming session and free its KV (after its running turn, if any)."""
        closed = self._sessions().close(session_id)
        if closed:
            self._wake.set()
        return closed

    async def embed(
        self, prompts: list[list[int]], task: PoolingTask = "embed", activation: bool = True
    ) -> list[list[float]]:
        """What ``embeddings.pooled`` gives each prompt for ``task`` (a unit vector, a
        classifier's class probabilities, or either per token; without ``activation`` the
        vectors before their normalization, the classes' logits), once every prompt was
        prefilled by the scheduler as a request of one output token (so pooling costs what a
        prompt costs; a prompt the scheduler cannot take is an ``EngineError`` ``bad_request``).
        The vectors are computed in a thread: a token task's are one row per token."""
        if not self._embed_size:
            raise EngineError(
                "this mocker does not embed: start it with --runner pooling", code="unsupported"
            )
        classify = pooling_feature(task) == FEATURE_CLASSIFY
        if task in ("embed", "classify") and per_token_task(self.model) is not None:
            raise EngineError(
                f"the model {self.model.name} pools per token only (the {per_token_task(self.model)} task)",
                code="unsupported",
            )
        if classify != bool(self._labels):
            raise EngineError(
                f"the model {self.model.name} is not a classification model (its config.json names "
                "no *ForSequenceClassification architecture)"
                if classify
                else f"the model {self.model.name} is a classification model: it classifies, it does not embed",
                code="unsupported",
            )
        self._embed_seq += 1
        base = f"embed-{self._embed_seq}"
        one_token = StopConditions(max_tokens=1, ignore_eos=True)

        room = self.model.context_length - 1  # the one sampled token needs a position too

        async def prefill(i: int) -> None:
            request = GenerateRequest(f"{base}-{i}", prompts[i][:room], stop=one_token)
            async for _ in self._generate(request):
                pass

        try:
            async with anyio.create_task_group() as tg:
                for i in range(len(prompts)):
                    tg.start_soon(prefill, i)
        except BaseExceptionGroup as group:  # the first prompt refused says why, as one error
            refused = [e for e in group.exceptions if isinstance(e, EngineError)]
            if refused:
                raise refused[0] from None
            raise
        width = len(self._labels) if classify else self._embed_size
        markers = RANKING_TOKEN_IDS if listwise_ranker(self.model) else None
        return await anyio.to_thread.run_sync(
            lambda: [embeddings.pooled(ids, task, width, activation, markers) for ids in prompts]
        )

    async def pin_prefix(self, token_ids: list[int], ttl_s: float) -> int:
        """Pin the cached full blocks leading ``token_ids`` for ``ttl_s`` seconds; returns how many."""
        if not ttl_s > 0:
            raise EngineError("ttl_s must be a positive number of seconds", code="bad_request")
        return self._scheduler.kv.pin_prefix(token_ids, ttl_s)


def _prompt_logprobs_inline(request: GenerateRequest) -> bool:
    """Whether ``request``'s prompt logprobs are cheap enough to compute in the pass loop."""
    return len(request.token_ids) * (1 + (request.prompt_logprobs or 0)) <= PROMPT_LOGPROBS_INLINE


def _prompt_logprobs_args(stream: _Stream, vocab: int) -> tuple:
    request = stream.request
    return (stream.seed, request.token_ids, request.prompt_logprobs, vocab)


def answers_for(config: MockerConfig, model: ModelInfo, tool_call_parser: str | None) -> Answers:
    """The ``Answers`` of ``config``'s ``--replies`` / ``--tool-call-rate`` for ``model``; reads the
    replies file. ``ValueError`` says what to fix."""
    from dyn.plugins.mocker.replies import Replies

    replies = Replies.load(config.replies) if config.replies is not None else None
    return Answers(
        model, replies=replies, tool_call_rate=config.tool_call_rate, tool_call_parser=tool_call_parser
    )


def _timing(stream: _Stream, now: float) -> EngineTiming:
    scheduled = stream.scheduled if stream.scheduled is not None else now
    first = stream.first_token if stream.first_token is not None else now
    return EngineTiming(
        queue_ms=round((scheduled - stream.received) * 1000, 3),
        prefill_ms=round((first - scheduled) * 1000, 3),
        decode_ms=round((now - first) * 1000, 3),
    )
