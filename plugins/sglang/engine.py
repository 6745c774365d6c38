"""``SglangEngine``: one SGLang ``Engine`` behind dyn's ``Engine`` protocol.

Followed: SGLang 0.5.23 (the wheel on PyPI), in particular
``python/sglang/srt/entrypoints/engine.py`` (``Engine(server_args=...)``, ``async_generate``,
``shutdown``, ``_scheduler_init_result``), ``srt/server_args.py`` (``ServerArgs.add_cli_args``,
``from_cli_args``, ``resolved_dict``), ``srt/managers/tokenizer_manager.py`` (streamed output dicts,
``abort_request``, ``context_len``), ``srt/managers/tokenizer_control_mixin.py`` (``open_session``,
``close_session``, ``get_loads``), ``srt/managers/io_struct.py`` (``OpenSessionReqInput``,
``CloseSessionReqInput``), ``srt/session/session_controller.py`` and
``srt/disaggregation/kv_events.py``; and Dynamo's SGLang worker (``components/src/dynamo/sglang/``:
``register.py``, ``request_handlers/handler_base.py``) for what it registers and how it drives
sessions. It runs live on SGLang's CPU engine (``--device cpu``, the venv of
scripts/provision_sglang_cpu.sh) in tests/integration/test_sglang_serve.py; the unit tests use a
fake engine with these signatures.

- **Start** (``run``): imports SGLang lazily (importing this module never does), parses the flags
  with SGLang's parser (``config``), builds the KV-events config (``kv_events``) and constructs
  ``sglang.Engine`` in a worker thread (it loads the model for minutes; SGLang supports a
  non-main thread, without its SIGQUIT handler). Every failure is an ``EngineStartError`` with a
  sentence. ``--dp-size`` above 1 is refused: dyn advertises one KV-event endpoint per worker,
  SGLang publishes one per rank.
- **info**: ``block_size`` = the resolved ``page_size``; ``total_kv_blocks`` =
  ``max_total_num_tokens // page_size`` from the scheduler's start-up info;
  ``max_num_batched_tokens`` = ``--max-prefill-tokens`` when the user gave it, else
  ``max_total_num_tokens`` (Dynamo's registration, seed 001's note: that inflates a router queue
  threshold's denominator, so the worker logs a warning); ``priority_order`` = ``lower_first``
  with ``--schedule-low-priority-values-first``, else ``higher_first``; ``features`` =
  ``streaming_sessions`` with ``--enable-streaming-session``. SGLang 0.5.23 has no prefix-pinning
  call, so ``pin_prefix`` is not offered. With ``--radix-eviction-policy priority`` and
  ``--schedule-low-priority-values-first`` a start-up warning says that SGLang's
  ``PriorityStrategy`` evicts the smallest values, i.e. the most important requests' prefixes, first.
- **generate**: ``async_generate(input_ids=..., sampling_params=..., stream=True, rid=...,
  priority=..., lora_path=..., session_params={"id": ...})``; the SGLang ``rid`` is a fresh
  32-hex id per request, because SGLang aborts by rid *prefix* and dyn's request ids are only
  unique per client. ``priority`` is sent only where SGLang uses it (the resolved server args):
  with ``--enable-priority-scheduling``, or with ``--radix-eviction-policy priority`` (the radix
  tree keeps each prefix's highest priority) unless ``--abort-on-priority-when-disabled`` is set,
  which makes SGLang's scheduler abort (503) every request carrying a priority while priority
  scheduling is off (``Scheduler._set_or_validate_priority``). Output conversion: ``output``. ``max_thinking_tokens`` is not forwarded
  (``async_generate`` takes no such argument). Timing: measured here (received, first token,
  finish), with ``queue_ms`` from meta_info's ``queue_time`` when SGLang runs with
  ``--enable-metrics``, else 0 (the time to first token is then all ``prefill_ms``).
- **Structured outputs** (``GenerateRequest.constraint``): SGLang's ``json_schema`` / ``regex`` /
  ``ebnf`` sampling keys (``constraints``), compiled by the server's ``--grammar-backend``; a
  constraint SGLang cannot compile comes back as its abort with status 400, a ``bad_request``.
- **Logprobs**: ``async_generate(return_logprob=True, top_logprobs_num=k)``, k the larger of the
  two counts (SGLang takes one for both sides), and ``logprob_start_len=0`` for prompt logprobs
  (SGLang then scores the whole prompt, which also keeps that request from reusing cached
  prefixes); converted in ``output``. SGLang ignores ``logprob_start_len`` on a streaming-session
  turn, so a turn asking for prompt logprobs goes as an ordinary request (whole prompt, no
  session; the session keeps its history for the next turn).
- **abort**: ``tokenizer_manager.abort_request(rid)``; the stream ends with
  ``Finish(cancelled)`` when SGLang's abort comes back, or after ``abort_grace_s`` if it does not
  (an abort that reaches SGLang's scheduler before the request itself, a narrow window, is lost
  there: SGLang then runs the request to its end unobserved).
- **Sessions** (``--enable-streaming-session``): ``tokenizer_manager.open_session`` /
  ``close_session`` with ``OpenSessionReqInput(capacity_of_str_len, session_id, streaming=True,
  timeout)`` as Dynamo sends them (``Engine.open_session`` is synchronous, ``run_until_complete``
  on SGLang's loop, so unusable inside dyn's); turns as ``sessions`` describes. SGLang cannot change an open
  session's timeout, so re-opening one returns False and keeps the first timeout. An open SGLang
  refuses (it still holds that id, e.g. a close it deferred behind a running turn) returns False
  and is not recorded: the session's turns then go as ordinary requests. A turn SGLang aborts for
  a session reason before any token (``Scheduler`` / ``Session.create_req``: the session does not
  exist, its close was requested, or it already has a turn running; status 400 like a bad
  request) is resent once with the whole prompt as an ordinary request, and dyn forgets the
  session (keeps it with an unknown history when only busy); after tokens it is an
  ``engine_error``. Open sessions stay below SGLang's ``max_running_requests`` (it keeps a
  running slot per idle session; ``_session_slots``): an open beyond returns False.
- **prometheus_text** (the worker's ``--system-port`` ``/metrics``): with ``--enable-metrics``,
  SGLang's own gauges and histograms (``sglang:num_streaming_sessions``,
  ``sglang:streaming_session_held_tokens``, queue and cache figures) from the Prometheus
  multiprocess directory SGLang's engine writes them to.
- **load_metrics**: polls ``tokenizer_manager.get_loads()`` every ``LOAD_POLL_S`` (a shared-memory
  read in 0.5.23) for running/waiting requests and used KV tokens; without it, dyn's own count of
  live streams. Preemptions and forward passes are not reported (0).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio

from dyn.core.engine import (
    FEATURE_STREAMING_SESSIONS,
    EngineError,
    EngineInfo,
    EngineStartError,
)
from dyn.core.messages import (
    EngineTiming,
    Finish,
    GenerateRequest,
    LoadMetrics,
    TokenChunk,
    TokenLogprobs,
    Usage,
)
from dyn.core.transport.sockets import plane_keys
from dyn.plugins.sglang.config import SglangConfig, on_cpu, parse_server_args, to_server_args
from dyn.plugins.sglang.constraints import constraint_params
from dyn.plugins.sglang.kv_events import KvEventsPlan, plan_kv_events
from dyn.plugins.sglang.output import Outcome, OutputDecoder
from dyn.plugins.sglang.sampling import sampling_params
from dyn.plugins.sglang.sessions import CAPACITY_OF_STR_LEN, DEFAULT_TIMEOUT_S, SessionTable, TurnPlan

log = logging.getLogger(__name__)

LOAD_POLL_S = 0.25
LOAD_CALL_TIMEOUT_S = 5.0
ABORT_GRACE_S = 5.0
SHUTDOWN_TIMEOUT_S = 90.0
NOT_INSTALLED = (
    "SGLang is not installed or cannot be imported ({error}): pip install 'dyn[sglang]' "
    "on a machine with a supported GPU (see SGLang's install guide), or on a CPU use the venv "
    "scripts/provision_sglang_cpu.sh makes, with --device cpu"
)


class _Stream:
    """One live request: its SGLang rid, timing, and the abort in progress, if any."""

    __slots__ = (
        "rid",
        "received",
        "first_token",
        "delivered",
        "done",
        "cancel_requested",
        "abort_deadline",
        "scope",
    )

    def __init__(self, rid: str, received: float) -> None:
        self.rid = rid
        self.received = received
        self.first_token: float | None = None
        self.delivered = 0
        self.done = False
        self.cancel_requested = False
        self.abort_deadline = float("inf")
        self.scope: anyio.CancelScope | None = None


class SglangEngine:
    """An SGLang engine for one worker (data-parallel size 1)."""

    def __init__(
        self,
        config: SglangConfig,
        *,
        model_path: str,
        tokenizer_path: str | None = None,
        host: str = "127.0.0.1",
        context_length: int | None = None,
        abort_grace_s: float = ABORT_GRACE_S,
    ) -> None:
        self.config = config.validate()
        self.model_path = model_path
        self.tokenizer_path = tokenizer_path
        self.host = host
        self.abort_grace_s = abort_grace_s
        self._context_length = context_length
        self._engine: Any = None
        """The running SGLang engine, while ``generate`` may use it."""
        self._owned: Any = None
        """The started SGLang engine this object must shut down."""
        self._streams: dict[str, _Stream] = {}
        self._sessions = SessionTable()
        self._incremental = True
        self._grammar_backend = "xgrammar"
        self._send_priority = False
        self._loads: list[Any] | None = None
        self._running_slots: int | None = None
        """``max_running_requests`` when given (``_session_slots``)."""
        self.server_args: Any = None
        """SGLang's ``ServerArgs`` the engine was built with (set by ``run``)."""
        self.info = EngineInfo(
            block_size=config.page_size or 1,
            total_kv_blocks=0,
            max_num_batched_tokens=config.max_prefill_tokens or 0,
        )
        """Placeholder until ``run`` has read the started engine."""

    # ------------------------------------------------------------------ start and stop

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        try:
            # not abandoned on cancel: a cancelled start waits for SGLang, then shuts it down
            await anyio.to_thread.run_sync(self._start)
            self._engine = self._owned
            # SGLang starts its output loop on the first request, taking SIGTERM for itself on
            # this loop then; started now, before the worker runner takes SIGTERM back
            self._engine.tokenizer_manager.auto_create_handle_loop()
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._poll_loads, self._engine)
                task_status.started()
                await anyio.sleep_forever()
        finally:
            engine, self._engine, self._owned = self._owned, None, None
            if engine is not None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_TIMEOUT_S):
                    await anyio.to_thread.run_sync(engine.shutdown, abandon_on_cancel=True)

    def _start(self) -> None:
        """Build and start SGLang's engine (blocking); fill ``info`` and ``_owned``."""
        if on_cpu(self.config):
            # SGLang picks its CPU platform from this variable, read when its modules load
            os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        try:
            import sglang
            from sglang.srt.server_args import ServerArgs

            engine_cls = sglang.Engine
        except ImportError as exc:
            raise EngineStartError(NOT_INSTALLED.format(error=exc)) from None
        namespace, given = parse_server_args(ServerArgs, self.config, self.model_path, self.tokenizer_path)
        if (getattr(namespace, "dp_size", 1) or 1) > 1:
            raise EngineStartError(
                "--dp-size above 1 is not supported by dyn worker sglang (dyn advertises "
                "one KV-event endpoint per worker): run one worker per GPU group instead"
            )
        if on_cpu(self.config) and getattr(namespace, "enable_hierarchical_cache", False):
            raise EngineStartError(
                "--enable-hierarchical-cache needs a CUDA or ROCm GPU: SGLang 0.5.23 registers its "
                "host KV pool with cudaHostRegister (srt/mem_cache/pool_host/common.py), which its CPU "
                "engine cannot do; drop the flag with --device cpu"
            )
        try:
            plan = plan_kv_events(
                self.config,
                self.host,
                can_bind_host=_kv_events_can_bind(),
                radix_cache_disabled=bool(getattr(namespace, "disable_radix_cache", False)),
                relayed=plane_keys() is not None,
            )
        except OSError as exc:
            raise EngineStartError(
                f"cannot pick free ports for SGLang's KV events on {self.host}: {exc}; "
                "check --host (or --kv-events-endpoint)"
            ) from None
        # dyn sends token ids and reads output ids either way; SGLang's grammar backends need its
        # tokenizer, so skipping it (--skip-tokenizer-init) is the user's choice, not dyn's
        fixed: dict[str, Any] = {"incremental_streaming_output": True}
        if plan.config_json is not None:
            fixed["kv_events_config"] = plan.config_json
        self.server_args = to_server_args(ServerArgs, namespace, fixed)
        try:
            engine = engine_cls(server_args=self.server_args)
        except EngineStartError:
            raise
        except ImportError as exc:  # sglang.Engine is a lazy import: torch or a kernel package missing
            raise EngineStartError(NOT_INSTALLED.format(error=exc)) from None
        except Exception as exc:
            raise EngineStartError(
                f"SGLang could not start: {type(exc).__name__}: {exc}. Check that a supported GPU is "
                "visible (nvidia-smi), that SGLang loads the model directory, and the SGLang "
                "arguments passed through"
            ) from exc
        try:
            self.info = self._read_info(engine, given, plan)
        except BaseException:
            engine.shutdown()
            raise
        self._owned = engine

    def _read_info(self, engine: Any, given: set[str], plan: KvEventsPlan) -> EngineInfo:
        values = resolved_server_args(engine)
        page_size = int(values.get("page_size") or 1)
        max_total = scheduler_info(engine).get("max_total_num_tokens")
        if not isinstance(max_total, int) or max_total <= 0:
            raise EngineStartError(
                "SGLang did not report its KV cache size (max_total_num_tokens); "
                "dyn worker sglang needs SGLang 0.5.11 or newer"
            )
        if "max_prefill_tokens" in given and values.get("max_prefill_tokens"):
            batched = int(values["max_prefill_tokens"])
        else:
            batched = max_total
            log.warning(
                "--max-prefill-tokens is not set: registering SGLang's whole KV pool (%d tokens) "
                "as max_num_batched_tokens, as Dynamo does; a router --router-queue-threshold is a "
                "fraction of it. Set --max-prefill-tokens to register the per-step prefill window.",
                max_total,
            )
        if page_size == 1 and plan.endpoint is not None:
            log.warning(
                "--page-size is 1 (SGLang's default): KV events and the router then count one "
                "block per token; set --page-size 16 or more for KV-aware routing"
            )
        context = (
            getattr(getattr(engine, "tokenizer_manager", None), "context_len", None)
            or values.get("context_length")
            or self._context_length
        )
        self._incremental = bool(values.get("incremental_streaming_output", True))
        self._grammar_backend = str(values.get("grammar_backend") or "xgrammar")
        self._send_priority = self._priority_settings(values)
        self._running_slots = (
            int(values["max_running_requests"]) if values.get("max_running_requests") else None
        )
        if values.get("enable_streaming_session") and self._running_slots == 1:
            log.warning(
                "--enable-streaming-session with --max-running-requests 1: SGLang keeps a running-"
                "request slot for each open streaming session, so no session can be opened here "
                "(its turns run as ordinary requests); give --max-running-requests 2 or more"
            )
        return EngineInfo(
            block_size=page_size,
            total_kv_blocks=max_total // page_size,
            max_num_batched_tokens=batched,
            dp_size=1,
            context_length=int(context) if context else None,
            kv_events_endpoint=plan.endpoint,
            kv_replay_endpoint=plan.replay_endpoint,
            kv_events_topic=plan.topic,
            priority_order="lower_first"
            if values.get("schedule_low_priority_values_first")
            else "higher_first",
            features=[FEATURE_STREAMING_SESSIONS] if values.get("enable_streaming_session") else [],
            device=str(values.get("device") or "cuda"),
        )

    @staticmethod
    def _priority_settings(values: dict[str, Any]) -> bool:
        """Whether requests carry their priority to SGLang; warns of priority settings that work
        against dyn's conversion."""
        scheduling = bool(values.get("enable_priority_scheduling"))
        eviction = values.get("radix_eviction_policy") == "priority"
        refused = bool(values.get("abort_on_priority_when_disabled")) and not scheduling
        if eviction and refused:
            log.warning(
                "--radix-eviction-policy priority with --abort-on-priority-when-disabled and without "
                "--enable-priority-scheduling: SGLang would abort every request that carries a "
                "priority, so none is sent and the radix cache sees every prefix at priority 0"
            )
        if eviction and values.get("schedule_low_priority_values_first"):
            log.warning(
                "--radix-eviction-policy priority with --schedule-low-priority-values-first: SGLang "
                "evicts cached prefixes with the smallest priority values first, and dyn sends the "
                "most important requests as the smallest values, so their prefixes are evicted "
                "first. Drop --schedule-low-priority-values-first (or use --radix-eviction-policy "
                "lru) to keep important prefixes cached longest."
            )
        return scheduling or (eviction and not refused)

    def _require_engine(self) -> Any:
        if self._engine is None:
            raise EngineError("the SGLang engine is not running", code="engine_error")
        return self._engine

    # ------------------------------------------------------------------ Engine protocol

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | Finish]:
        engine = self._require_engine()
        rid = request.request_id
        if rid in self._streams:
            raise EngineError(f"request id {rid!r} is already running", code="duplicate_request")
        if request.max_thinking_tokens is not None:
            log.debug(
                "max_thinking_tokens of %s is not forwarded: SGLang's async_generate has no such argument",
                rid,
            )
        sampling = self._sampling_params(request)
        stream = self._streams[rid] = _Stream(uuid.uuid4().hex, time.monotonic())
        if request.session_id is not None and request.prompt_logprobs is not None:
            log.debug(
                "request %s asks for prompt logprobs, which SGLang does not give on a session turn: "
                "serving it as an ordinary request",
                rid,
            )
            plan = TurnPlan("ordinary", request.token_ids)
        else:
            plan = self._sessions.plan(request.session_id, request.token_ids)
            if request.session_id is not None and plan.session_id is None:
                log.debug(
                    "request %s names session %s, which is not open here or is busy: serving it as an "
                    "ordinary request",
                    rid,
                    request.session_id,
                )
        decoder = self._decoder(request)
        outputs: Any = None
        history: list[int] | None = None
        try:
            if plan.kind == "restart":
                plan = await self._restart_session(engine, plan)
            if stream.cancel_requested:
                yield self._cancelled(request, stream, decoder)
                return
            kwargs = self._generate_kwargs(request, plan, stream.rid, sampling)
            outputs = await engine.async_generate(**kwargs)
            resent = False
            while True:
                out = await self._next_output(stream, outputs)
                if out is None:
                    if stream.cancel_requested:
                        yield self._cancelled(request, stream, decoder)
                        return
                    raise EngineError("SGLang ended the stream without finishing it", code="engine_error")
                step = decoder.feed(out)
                if stream.cancel_requested:
                    if step.outcome is not None:
                        stream.done = True
                        yield self._cancelled(request, stream, decoder)
                        return
                    continue
                if step.tokens:
                    if stream.first_token is None:
                        stream.first_token = time.monotonic()
                    stream.delivered += len(step.tokens)
                    yield TokenChunk(rid, step.tokens, step.logprobs)
                outcome = step.outcome
                if outcome is None:
                    continue
                refusal = _session_refusal(plan, outcome)
                if refusal is not None and not resent:
                    assert plan.session_id is not None
                    if stream.delivered:
                        stream.done = True
                        raise EngineError(
                            f"SGLang aborted session {plan.session_id}'s turn after it had "
                            f"streamed {stream.delivered} tokens: {outcome.message}",
                            code="engine_error",
                        )
                    log.info(
                        "SGLang refused session %s's turn (%s); resending request %s as an ordinary request",
                        plan.session_id,
                        outcome.message,
                        rid,
                    )
                    self._sessions.finished(plan, request.token_ids, None)
                    if refusal == "gone":
                        self._sessions.closed(plan.session_id)
                    plan, resent = TurnPlan("ordinary", request.token_ids), True
                    with anyio.CancelScope(shield=True):
                        await outputs.aclose()
                    outputs = None
                    if stream.cancel_requested:
                        yield self._cancelled(request, stream, decoder)
                        return
                    stream.rid = uuid.uuid4().hex
                    decoder = self._decoder(request)
                    outputs = await engine.async_generate(
                        **self._generate_kwargs(request, plan, stream.rid, sampling)
                    )
                    continue
                stream.done = True
                if outcome.reason == "abort":
                    code = "bad_request" if outcome.status_code == 400 else "engine_error"
                    raise EngineError(f"SGLang aborted the request: {outcome.message}", code=code)
                history = decoder.output_ids
                prompt, completion, cached = decoder.usage_counts(len(request.token_ids), stream.delivered)
                yield Finish(
                    rid,
                    outcome.reason,
                    Usage(prompt, completion, cached),
                    timing=_timing(stream, decoder, time.monotonic()),
                    stop_token_id=outcome.stop_token_id,
                    prompt_logprobs=_prompt_logprobs(request, decoder),
                )
                return
        except ValueError as exc:  # SGLang's request validation: prompt too long, bad sampling values
            raise EngineError(f"SGLang refused the request: {exc}", code="bad_request") from None
        finally:
            if outputs is not None:
                with anyio.CancelScope(shield=True):
                    if not stream.done:  # closed early by its consumer, or failed
                        engine.tokenizer_manager.abort_request(stream.rid)
                    await outputs.aclose()
            stream.done = True
            self._sessions.finished(plan, request.token_ids, history)
            del self._streams[rid]

    async def abort(self, request_id: str) -> bool:
        stream = self._streams.get(request_id)
        if stream is None or stream.done or stream.cancel_requested or self._engine is None:
            return False
        stream.cancel_requested = True
        self._engine.tokenizer_manager.abort_request(stream.rid)
        stream.abort_deadline = anyio.current_time() + self.abort_grace_s
        if stream.scope is not None:
            stream.scope.deadline = stream.abort_deadline
        return True

    def prometheus_text(self) -> bytes:
        """SGLang's own metrics (``sglang:*``, ``--enable-metrics``), which its scheduler and
        tokenizer manager write to the Prometheus multiprocess directory SGLang's engine sets up
        in this process (``PROMETHEUS_MULTIPROC_DIR``); empty without ``--enable-metrics``."""
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if (
            self.server_args is None
            or not getattr(self.server_args, "enable_metrics", False)
            or not directory
        ):
            return b""
        from prometheus_client import CollectorRegistry, generate_latest, multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=directory)
        return generate_latest(registry)

    def load_metrics(self) -> list[LoadMetrics]:
        info = self.info
        sessions, held = len(self._sessions), self._sessions.held_tokens()
        snapshot = next((s for s in self._loads or () if getattr(s, "dp_rank", 0) == 0), None)
        if snapshot is None:
            return [
                LoadMetrics(
                    instance_id=0,
                    dp_rank=0,
                    ts=time.time(),
                    num_running=len(self._streams),
                    num_waiting=0,
                    active_kv_blocks=0,
                    total_kv_blocks=info.total_kv_blocks,
                    kv_usage=0.0,
                    num_streaming_sessions=sessions,
                    streaming_session_held_tokens=held,
                )
            ]
        page = info.block_size or 1
        used = int(getattr(snapshot, "num_used_tokens", 0) or 0)
        usage = getattr(snapshot, "token_usage", None)
        if not isinstance(usage, int | float):
            usage = used / (info.total_kv_blocks * page) if info.total_kv_blocks else 0.0
        return [
            LoadMetrics(
                instance_id=0,
                dp_rank=0,
                ts=time.time(),
                num_running=int(getattr(snapshot, "num_running_reqs", 0) or 0),
                num_waiting=int(getattr(snapshot, "num_waiting_reqs", 0) or 0),
                active_kv_blocks=-(-used // page),
                total_kv_blocks=info.total_kv_blocks,
                kv_usage=float(usage),
                num_streaming_sessions=sessions,
                streaming_session_held_tokens=held,
            )
        ]

    # ------------------------------------------------------------------ optional calls

    async def open_session(self, session_id: str, timeout_s: float) -> bool:
        """Open a streaming session idle-closed ``timeout_s`` after it was opened or its last turn
        started (<= 0: 300 s); False when it is already open (SGLang keeps its first timeout), when
        it would hold SGLang's last free running-request slot (``_session_slots``), or SGLang
        refused it (it still holds the id): its turns then go as ordinary requests."""
        engine = self._sessions_engine()
        if not session_id:
            raise EngineError("a session needs a non-empty session_id", code="bad_request")
        if self._sessions.get(session_id) is not None:
            return False
        slots = self._session_slots()
        if slots is not None and len(self._sessions) >= slots - 1:
            log.warning(
                "not opening session %s: %d session(s) are open and SGLang keeps one of its %d "
                "running-request slots for each while it idles, so another would leave none for "
                "the next turn; its turns go as ordinary requests (raise --max-running-requests)",
                session_id,
                len(self._sessions),
                slots,
            )
            return False
        timeout = timeout_s if timeout_s > 0 else DEFAULT_TIMEOUT_S
        since = self._sessions.now()
        if not await self._open_in_sglang(engine, session_id, timeout):
            log.warning(
                "SGLang refused to open session %s (it still holds that id); its turns go as "
                "ordinary requests",
                session_id,
            )
            return False
        self._sessions.opened(session_id, timeout, since)
        return True

    async def close_session(self, session_id: str) -> bool:
        """Close a streaming session; SGLang frees its KV (after its running turn, if any)."""
        from sglang.srt.managers.io_struct import CloseSessionReqInput

        engine = self._sessions_engine()
        was_open = self._sessions.closed(session_id)
        await engine.tokenizer_manager.close_session(CloseSessionReqInput(session_id=session_id), None)
        return was_open

    def _session_slots(self) -> int | None:
        """SGLang's ``max_running_requests``: given, or as its load snapshot reports it (None:
        not known yet). SGLang 0.5.23 keeps a slot per open streaming session while it idles
        (its request-to-token row holds the session's KV) and a session's next turn needs a free
        one, so open sessions are kept below it: at the limit every request waits until a
        session's idle timeout frees a slot."""
        if self._running_slots is not None:
            return self._running_slots
        snapshot = next((s for s in self._loads or () if getattr(s, "dp_rank", 0) == 0), None)
        reported = getattr(snapshot, "max_running_requests", 0)
        return int(reported) if reported else None

    def _sessions_engine(self) -> Any:
        engine = self._require_engine()
        if FEATURE_STREAMING_SESSIONS not in self.info.features:
            raise EngineError(
                "streaming sessions are off: start the worker with --enable-streaming-session",
                code="unsupported",
            )
        return engine

    async def _open_in_sglang(self, engine: Any, session_id: str, timeout_s: float) -> bool:
        from sglang.srt.managers.io_struct import OpenSessionReqInput

        request = OpenSessionReqInput(
            capacity_of_str_len=CAPACITY_OF_STR_LEN,
            session_id=session_id,
            streaming=True,
            timeout=float(timeout_s),
        )
        try:
            return await engine.tokenizer_manager.open_session(request, None) is not None
        except ValueError as exc:
            raise EngineError(f"SGLang could not open the session: {exc}", code="unsupported") from None

    async def _restart_session(self, engine: Any, plan: TurnPlan) -> TurnPlan:
        """Close and reopen ``plan``'s session so it holds nothing; the turn then sends its whole
        prompt. If SGLang will not reopen it, the turn goes as an ordinary request."""
        from sglang.srt.managers.io_struct import CloseSessionReqInput

        assert plan.session_id is not None
        entry = self._sessions.get(plan.session_id)
        timeout = entry.timeout_s if entry is not None else DEFAULT_TIMEOUT_S
        await engine.tokenizer_manager.close_session(CloseSessionReqInput(session_id=plan.session_id), None)
        if await self._open_in_sglang(engine, plan.session_id, timeout):
            return plan  # the entry's idle clock started when the turn was planned, before the reopen
        log.warning("SGLang did not reopen session %s; its turn goes as an ordinary request", plan.session_id)
        self._sessions.closed(plan.session_id)
        return TurnPlan("ordinary", plan.input_ids)

    # ------------------------------------------------------------------ helpers

    def _sampling_params(self, request: GenerateRequest) -> dict[str, Any]:
        """SGLang's sampling parameters for ``request``, its constraint included (a Lark grammar
        the worker cannot convert raises ``EngineError(bad_request)``)."""
        params = sampling_params(request)
        if request.constraint is not None:
            params.update(constraint_params(request.constraint, self._grammar_backend))
        return params

    def _decoder(self, request: GenerateRequest) -> OutputDecoder:
        return OutputDecoder(
            incremental=self._incremental, logprobs=request.logprobs, prompt_logprobs=request.prompt_logprobs
        )

    def _generate_kwargs(
        self, request: GenerateRequest, plan: TurnPlan, rid: str, sampling: dict[str, Any]
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "input_ids": plan.input_ids,
            "sampling_params": sampling,
            "stream": True,
            "rid": rid,
        }
        if request.logprobs is not None or request.prompt_logprobs is not None:
            kwargs["return_logprob"] = True
            kwargs["top_logprobs_num"] = max(request.logprobs or 0, request.prompt_logprobs or 0)
            if request.prompt_logprobs is not None:
                kwargs["logprob_start_len"] = 0
        if request.priority is not None and self._send_priority:
            kwargs["priority"] = request.priority
        if request.lora_name:
            kwargs["lora_path"] = request.lora_name
        if plan.session_id is not None:
            kwargs["session_params"] = {"id": plan.session_id}
        return kwargs

    @staticmethod
    async def _next_output(stream: _Stream, outputs: Any) -> dict[str, Any] | None:
        """The next streamed dict; ``None`` when the stream ended or the abort grace ran out."""
        with anyio.CancelScope(deadline=stream.abort_deadline) as scope:
            stream.scope = scope
            try:
                return await outputs.__anext__()
            except StopAsyncIteration:
                return None
            finally:
                stream.scope = None
        return None

    def _cancelled(self, request: GenerateRequest, stream: _Stream, decoder: OutputDecoder) -> Finish:
        prompt, _, cached = decoder.usage_counts(len(request.token_ids), stream.delivered)
        return Finish(
            request.request_id,
            "cancelled",
            Usage(prompt, stream.delivered, cached),
            timing=_timing(stream, decoder, time.monotonic()),
        )

    async def _poll_loads(self, engine: Any) -> None:
        get_loads = getattr(engine.tokenizer_manager, "get_loads", None)
        if get_loads is None:
            log.info("this SGLang has no get_loads(); load metrics count dyn's own live requests")
            return
        failing = False
        while True:
            try:
                with anyio.fail_after(LOAD_CALL_TIMEOUT_S):
                    self._loads = list(await get_loads())
                failing = False
            except Exception:
                if not failing:
                    log.warning(
                        "SGLang's get_loads() failed; load metrics count dyn's own live requests "
                        "until it works again",
                        exc_info=True,
                    )
                failing, self._loads = True, None
            await anyio.sleep(LOAD_POLL_S)


def resolved_server_args(engine: Any) -> dict[str, Any]:
    """The engine's effective server arguments: ``ServerArgs.resolved_dict()`` (0.5.19+, where the
    record keeps the raw input), else the record's own fields (older releases resolve in place)."""
    server_args = engine.server_args
    resolved = getattr(server_args, "resolved_dict", None)
    if callable(resolved):
        return dict(resolved())
    fields = getattr(type(server_args), "__struct_fields__", None)
    if fields is not None:
        return {name: getattr(server_args, name) for name in fields}
    return dict(vars(server_args))


def scheduler_info(engine: Any) -> dict[str, Any]:
    """Rank 0's scheduler start-up info (``max_total_num_tokens``, ``max_req_input_len``): SGLang
    0.5.10+ keeps it in ``Engine._scheduler_init_result.scheduler_infos[0]`` (what its own
    ``get_server_info`` reads; Dynamo reads it there too), older releases in ``scheduler_info``."""
    infos = getattr(getattr(engine, "_scheduler_init_result", None), "scheduler_infos", None)
    if infos:
        return dict(infos[0])
    legacy = getattr(engine, "scheduler_info", None)
    return dict(legacy) if isinstance(legacy, dict) else {}


SESSION_GONE = (
    "Invalid request: session id {sid} does not exist",
    "Invalid request: close was requested for session {sid}",
)
SESSION_BUSY = "Streaming session already has an active request."
"""SGLang 0.5.23's abort messages for a session turn it will not run (``Scheduler``'s session
lookup, ``Session.create_req``)."""


def _session_refusal(plan: TurnPlan, outcome: Outcome) -> str | None:
    """``gone`` / ``busy`` when ``outcome`` is SGLang refusing ``plan``'s session turn, else None."""
    if plan.session_id is None or outcome.reason != "abort":
        return None
    if outcome.message in (m.format(sid=plan.session_id) for m in SESSION_GONE):
        return "gone"
    if outcome.message == SESSION_BUSY:
        return "busy"
    return None


def _prompt_logprobs(request: GenerateRequest, decoder: OutputDecoder) -> list[TokenLogprobs | None] | None:
    """The finished request's prompt logprobs, one per prompt token (``None``: not asked for)."""
    found = decoder.prompt_logprobs()
    if found is not None and len(found) != len(request.token_ids):
        raise EngineError(
            f"SGLang returned {len(found)} prompt logprobs for a prompt of {len(request.token_ids)} tokens",
            code="engine_error",
        )
    return found


def _kv_events_can_bind() -> bool:
    """Whether SGLang's ``KVEventsConfig`` has the ``bind`` field (bind a concrete host)."""
    try:
        from sglang.srt.disaggregation.kv_events import KVEventsConfig
    except ImportError:
        return False
    return "bind" in (getattr(KVEventsConfig, "model_fields", None) or {})


def _timing(stream: _Stream, decoder: OutputDecoder, now: float) -> EngineTiming:
    first = stream.first_token if stream.first_token is not None else now
    to_first_ms = (first - stream.received) * 1000
    queue = decoder.meta.get("queue_time")
    queue_ms = min(to_first_ms, queue * 1000) if isinstance(queue, int | float) and queue >= 0 else 0.0
    return EngineTiming(
        queue_ms=round(queue_ms, 3),
        prefill_ms=round(to_first_ms - queue_ms, 3),
        decode_ms=round((now - first) * 1000, 3),
    )
