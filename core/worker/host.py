"""``WorkerHost``: serves one engine on the request plane and announces it in discovery.

Contract:
- Every ``GenerateRequest`` received gets exactly one terminal reply: a ``Finish`` or an
  ``ErrorReply`` (malformed frames get an ``ErrorReply`` too, with the request id when known).
- A ``CancelRequest`` aborts the request in the engine; its stream then ends with
  ``Finish(reason="cancelled")``.
- Malformed frames are answered, counted (``frames_rejected``) and logged at most once per
  ``REJECT_LOG_INTERVAL_S`` with a count; the receive loop yields to the event loop after every
  message (a message already queued does not make pyzmq yield), so no flood of frames can starve
  the discovery heartbeat, the replies or the engine.
- A control call (``SessionControlRequest``, ``PinPrefixRequest``) gets one ``ControlReply``, or
  an ``ErrorReply``: ``unsupported`` when the engine does not list the feature, else the
  engine's error. Control calls run as their own tasks, never blocking generation. An
  ``EmbedRequest`` is served the same way and answered by one ``EmbedReply``.
- The worker is registered in discovery only once its sockets are bound and the engine is ready,
  and is deregistered first on shutdown, so routers stop sending before requests are cut off.
- Load metrics go out every ``metrics_interval_s`` when they changed, and at least every second.
- KV events: an engine that hands its events over (the mocker) writes to ``kv_publisher``; one
  that publishes them itself (vLLM, SGLang) reports its sockets in ``info``, which the record
  advertises as they are (``kv_events_plain``) without plane keys. Under ``--plane-keys`` the
  host relays them instead (``dyn.core.worker.kv_relay``) and advertises the relay's CurveZMQ
  sockets, so no record of a dyn worker asks subscribers for plain ZMQ.
- Replies are batched per client: each engine output is queued in its client's outbox and one
  flusher task sends each outbox as one message (a ``ReplyBatch``, or the plain kind for a lone
  reply) once the engine pass that produced it has queued all its outputs. An engine's outputs
  are read by a task per request from ``generate``, or, from a ``PushingEngine`` (the mocker),
  handed to a callback by the engine's own loop; such a request is admitted at once
  (``start_now``) or, when admitting it means waiting, in a task (``start``). A request's replies
  keep their order; its ``Finish`` never overtakes its chunks.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import aclosing
from typing import Any, cast

import anyio
import msgspec

import dyn.core as core_pkg
from dyn.core.discovery.services import new_instance_id
from dyn.core.discovery.store import DiscoveryStore
from dyn.core.engine import (
    FEATURE_CLASSIFY,
    FEATURE_EMBED,
    FEATURE_PIN_PREFIX,
    FEATURE_STREAMING_SESSIONS,
    Embedder,
    Engine,
    EngineError,
    PrefixPinning,
    PushingEngine,
    ReplySink,
    StreamingSessions,
    pooling_feature,
)
from dyn.core.messages import (
    CancelRequest,
    ControlReply,
    EmbedReply,
    EmbedRequest,
    ErrorReply,
    Finish,
    GenerateRequest,
    PinPrefixRequest,
    SessionControlRequest,
    TokenChunk,
    WorkerEndpoints,
    WorkerRecord,
)
from dyn.core.service import LoopHttpServer, bind_http
from dyn.core.transport.event_plane import KvEventPublisher, MetricsPublisher
from dyn.core.transport.request_plane import RequestServer
from dyn.core.transport.sockets import plane_keys
from dyn.core.worker.kv_relay import KvEventRelay
from dyn.core.worker.settings import WorkerSettings
from dyn.core.worker.system import WorkerSystemApp

log = logging.getLogger(__name__)


class WorkerHost:
    """Hosts ``engine`` as one worker instance. ``kv_publisher`` is the publisher the engine's
    event sink writes to (mocker); engines that publish themselves report endpoints in ``info``."""

    def __init__(
        self,
        engine: Engine,
        *,
        engine_name: str,
        model_name: str,
        store: DiscoveryStore,
        settings: WorkerSettings,
        kv_publisher: KvEventPublisher | None = None,
        instance_id: int | None = None,
        model_path: str | None = None,
        aliases: tuple[str, ...] = (),
        tokenizer_path: str | None = None,
    ) -> None:
        """``model_path``, ``tokenizer_path`` and ``aliases`` go in the discovery record (``WorkerRecord``)."""
        self.engine = engine
        self.model_path = model_path
        self.tokenizer_path = tokenizer_path
        self.aliases = aliases
        self.engine_name = engine_name
        self.model_name = model_name
        self.store = store
        self.settings = settings
        self.kv_publisher = kv_publisher
        self.kv_relay: KvEventRelay | None = None
        """Under plane keys, the relay of an engine that publishes its KV events itself."""
        self.instance_id = instance_id if instance_id is not None else new_instance_id()
        self._server = RequestServer(settings.host, logger=log)
        self._metrics = MetricsPublisher(settings.host)
        self._inflight: dict[str, bytes] = {}
        self._idle = anyio.Event()
        self._idle.set()
        self._pushes = isinstance(engine, PushingEngine)
        """The engine hands outputs to ``_start``'s callback, not through an iterator per request."""
        self._outbox: dict[bytes, list[TokenChunk | Finish | ErrorReply]] = {}
        self._flush_wanted = anyio.Event()
        self.messages_sent = 0
        self._system: LoopHttpServer | None = None
        """The ``--system-port`` server, once started."""
        """Reply messages sent on the request plane (a batch counts once)."""
        self.replies_sent = 0
        """Replies sent (every ``TokenChunk``, ``Finish`` and ``ErrorReply`` in them)."""

    @property
    def frames_rejected(self) -> int:
        """Malformed request-plane messages received so far."""
        return self._server.rejected.total

    @property
    def record(self) -> WorkerRecord:
        info = self.engine.info
        kv_events: str | None
        kv_replay: str | None
        publisher = self.kv_relay.publisher if self.kv_relay is not None else self.kv_publisher
        if publisher is not None:
            kv_events, kv_replay, topic = publisher.endpoint, publisher.replay_endpoint, publisher.topic
        else:
            kv_events, kv_replay, topic = (
                info.kv_events_endpoint,
                info.kv_replay_endpoint,
                info.kv_events_topic,
            )
        return WorkerRecord(
            instance_id=self.instance_id,
            namespace=self.settings.discovery.namespace,
            model_name=self.model_name,
            engine=self.engine_name,
            endpoints=WorkerEndpoints(
                request=self._server.endpoint,
                kv_events=kv_events,
                kv_replay=kv_replay,
                metrics=self._metrics.endpoint,
                kv_events_plain=publisher is None and kv_events is not None,
            ),
            block_size=info.block_size,
            total_kv_blocks=info.total_kv_blocks,
            max_num_batched_tokens=info.max_num_batched_tokens,
            dp_size=info.dp_size,
            kv_events_topic=topic,
            context_length=info.context_length,
            priority_order=info.priority_order,
            features=list(info.features),
            tool_call_parser=self.settings.tool_call_parser,
            reasoning_parser=self.settings.reasoning_parser,
            model_path=self.model_path,
            tokenizer_path=self.tokenizer_path,
            aliases=list(self.aliases),
            loras=dict(info.loras),
            disaggregation_mode=self.settings.disaggregation_mode,
            device=info.device,
            pid=os.getpid(),
            started_at=time.time(),
            version=core_pkg.__version__,
        )

    async def run(self, stop: anyio.Event, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until ``stop`` is set, then deregister, drain, and close every socket."""
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(self.engine.run)
                info = self.engine.info
                if (
                    self.kv_publisher is None
                    and info.kv_events_endpoint is not None
                    and plane_keys() is not None
                ):
                    self.kv_relay = KvEventRelay(info, self.settings.host, self.instance_id)
                    await tg.start(self.kv_relay.run)
                tg.start_soon(self._flush_replies)
                tg.start_soon(self._serve_requests, tg)
                tg.start_soon(self._publish_metrics)
                if self.kv_publisher is not None:
                    tg.start_soon(self.kv_publisher.serve_replay)
                system = self._system = await self._start_system_port(tg)
                async with self.store.lease(self.record, self.settings.lease_ttl_s):
                    log.info(
                        "worker %d (%s, model %s) serving on %s%s",
                        self.instance_id,
                        self.engine_name,
                        self.model_name,
                        self._server.endpoint,
                        f", metrics at {system.url}" if system is not None else "",
                    )
                    task_status.started(self)
                    await stop.wait()
                log.info(
                    "worker %d left discovery; draining %d request(s)", self.instance_id, len(self._inflight)
                )
                with anyio.move_on_after(self.settings.drain_timeout_s):
                    await self._idle.wait()
                for rid, identity in list(self._inflight.items()):
                    self._reply(
                        identity,
                        ErrorReply(
                            rid,
                            "worker_shutdown",
                            "the worker shut down before the request finished; retry it",
                        ),
                    )
                self._flush()  # what the drained requests queued last, and the errors above
                tg.cancel_scope.cancel()
        finally:
            try:
                self._flush()
            except Exception:
                log.exception("could not flush the last replies")
            # a short linger lets the replies flushed just now leave the process
            self._server.close(linger_ms=1000)
            self._metrics.close()
            if self.kv_publisher is not None:
                self.kv_publisher.close()
            if self.kv_relay is not None:
                self.kv_relay.close()
            if self._system is not None:
                self._system.sock.close()

    def _reply(self, identity: bytes, message: TokenChunk | Finish | ErrorReply) -> None:
        """Queue a reply for the client ``identity``; the flusher sends it."""
        box = self._outbox.get(identity)
        if box is None:
            self._outbox[identity] = [message]
            self._flush_wanted.set()
        else:
            box.append(message)

    async def _flush_replies(self) -> None:
        while True:
            await self._flush_wanted.wait()
            if not self._pushes:
                # The first reply of a pass woke us: yield once, so that every stream task the
                # same pass woke queues its output first, and their replies go out together (a
                # pushing engine queued its whole pass before we woke).
                await anyio.lowlevel.checkpoint()
            self._flush_wanted = anyio.Event()
            self._flush()

    def _flush(self) -> None:
        """Send every queued reply now, one batch per client (never blocks)."""
        while self._outbox:
            outbox, self._outbox = self._outbox, {}
            for identity, replies in outbox.items():
                try:
                    self.messages_sent += self._server.send_replies(identity, replies)
                    self.replies_sent += len(replies)
                except Exception:  # one bad client must not stop the replies to the others
                    log.exception("could not send %d replies to a client", len(replies))

    async def _serve_requests(self, tg: anyio.abc.TaskGroup) -> None:
        """Serve the request plane: one handler per message type (see ``RpcServer``)."""
        server = self._server
        server.handle(GenerateRequest, lambda identity, request: self._on_generate(tg, identity, request))
        server.handle(CancelRequest, self._on_cancel)
        control = lambda identity, call: tg.start_soon(self._control, identity, call)  # noqa: E731
        server.handle(SessionControlRequest, control)
        server.handle(PinPrefixRequest, control)
        server.handle(EmbedRequest, control)
        server.on_malformed = lambda identity, body, exc: self._reply(
            identity, ErrorReply("", "bad_request", str(exc))
        )
        await server.serve()

    def _on_generate(self, tg: anyio.abc.TaskGroup, identity: bytes, request: GenerateRequest) -> None:
        rid = request.request_id
        if rid in self._inflight:
            self._reply(
                identity,
                ErrorReply(
                    rid, "duplicate_request", f"request id {rid!r} is already in flight on this worker"
                ),
            )
            return
        self._inflight[rid] = identity
        if self._idle.is_set():  # busy again (an event per request cost more than this check)
            self._idle = anyio.Event()
        if not self._pushes:
            tg.start_soon(self._stream, identity, request)
        elif not self._start_now(identity, request):
            tg.start_soon(self._start, identity, request)

    async def _on_cancel(self, identity: bytes, cancel: CancelRequest) -> None:
        if self._inflight.get(cancel.request_id) == identity:
            aborted = await self.engine.abort(cancel.request_id)
            log.debug(
                "request %s cancelled by its client (%s)",
                cancel.request_id,
                "aborted" if aborted else "already finished",
            )

    def _start_now(self, identity: bytes, request: GenerateRequest) -> bool:
        """Admit ``request`` in a ``PushingEngine`` at once if it can be (True: admitted or
        answered with its error); False when it needs ``_start``'s task."""
        rid = request.request_id
        try:
            return cast(PushingEngine, self.engine).start_now(request, self._emitter(identity, rid))
        except Exception as exc:
            self._refused(identity, rid, exc)
            return True

    async def _start(self, identity: bytes, request: GenerateRequest) -> None:
        """Admit ``request`` in a ``PushingEngine``, whose outputs then go straight to the reply
        queue from the engine's loop."""
        rid = request.request_id
        try:
            await cast(PushingEngine, self.engine).start(request, self._emitter(identity, rid))
        except Exception as exc:
            self._refused(identity, rid, exc)

    def _emitter(self, identity: bytes, rid: str) -> ReplySink:
        """Where a pushing engine puts request ``rid``'s outputs: the reply queue of ``identity``."""
        reply = self._reply

        def emit(out: TokenChunk | Finish | EngineError) -> None:
            if isinstance(out, TokenChunk):
                reply(identity, out)
                return
            if isinstance(out, Finish):
                reply(identity, self._named_source(out))
            else:
                reply(identity, ErrorReply(rid, out.code, str(out)))
            self._ended(rid)

        return emit

    def _refused(self, identity: bytes, rid: str, exc: Exception) -> None:
        """Answer a request the engine did not admit with its error."""
        if isinstance(exc, EngineError):
            self._reply(identity, ErrorReply(rid, exc.code, str(exc)))
        else:  # an engine bug must not take the worker down
            log.error("engine failed to start request %s", rid, exc_info=exc)
            self._reply(identity, ErrorReply(rid, "engine_error", f"{type(exc).__name__}: {exc}"))
        self._ended(rid)

    def _named_source(self, finish: Finish) -> Finish:
        """``finish`` with this worker's instance id in its KV transfer descriptor, which the
        engine does not know."""
        transfer = finish.kv_transfer
        if transfer is None or transfer.source_instance_id:
            return finish
        transfer = msgspec.structs.replace(transfer, source_instance_id=self.instance_id)
        return msgspec.structs.replace(finish, kv_transfer=transfer)

    def _ended(self, rid: str) -> None:
        self._inflight.pop(rid, None)
        if not self._inflight:
            self._idle.set()

    async def _stream(self, identity: bytes, request: GenerateRequest) -> None:
        rid = request.request_id
        reply = self._reply
        try:
            async with aclosing(self.engine.generate(request)) as outputs:
                async for out in outputs:
                    cls = type(out)
                    if cls is TokenChunk:
                        reply(identity, out)
                    elif cls is Finish:
                        reply(identity, self._named_source(cast(Finish, out)))
                        return
                    else:  # caught here, it cannot spoil the batch it would have gone out in
                        raise TypeError(f"the engine yielded a {cls.__name__}, not a TokenChunk or Finish")
            reply(identity, ErrorReply(rid, "engine_error", "the engine ended the stream without finishing"))
        except EngineError as exc:
            reply(identity, ErrorReply(rid, exc.code, str(exc)))
        except Exception as exc:  # an engine bug must not take the worker down
            log.exception("engine failed on request %s", rid)
            reply(identity, ErrorReply(rid, "engine_error", f"{type(exc).__name__}: {exc}"))
        finally:
            self._ended(rid)

    async def _control(
        self, identity: bytes, call: SessionControlRequest | PinPrefixRequest | EmbedRequest
    ) -> None:
        """Serve one control call with the engine's optional method (see ``Engine``)."""
        engine, rid = self.engine, call.request_id
        features = engine.info.features
        reply: ControlReply | EmbedReply | ErrorReply
        try:
            if isinstance(call, EmbedRequest):
                if pooling_feature(call.task) not in features:
                    pools = FEATURE_EMBED in features or FEATURE_CLASSIFY in features
                    raise EngineError(
                        f"model {self.model_name} does not pool with the {call.task} task: an "
                        "embedding model embeds (embed, token_embed), a classification model "
                        "classifies (classify, token_classify)"
                        if pools
                        else f"model {self.model_name} is served by a generate-only {self.engine_name} "
                        "engine; start a worker that pools (dyn worker vllm|mocker --runner pooling)",
                        code="unsupported",
                    )
                vectors = await cast(Embedder, engine).embed(call.prompts, call.task, call.activation)
                reply = EmbedReply(rid, vectors, sum(len(p) for p in call.prompts))
            elif isinstance(call, PinPrefixRequest):
                if FEATURE_PIN_PREFIX not in features:
                    raise EngineError(
                        f"the {self.engine_name} engine does not pin prefixes", code="unsupported"
                    )
                pinned = await cast(PrefixPinning, engine).pin_prefix(call.token_ids, call.ttl_s)
                reply = ControlReply(rid, pinned, f"pinned {pinned} blocks")
            else:
                if FEATURE_STREAMING_SESSIONS not in features:
                    raise EngineError(
                        f"the {self.engine_name} engine has no streaming sessions "
                        "(the mocker needs --enable-streaming-session)",
                        code="unsupported",
                    )
                sessions = cast(StreamingSessions, engine)  # the feature says it has them
                if call.action == "open":
                    changed = await sessions.open_session(call.session_id, call.timeout_s)
                elif call.action == "close":
                    changed = await sessions.close_session(call.session_id)
                else:
                    raise EngineError(
                        f"unknown session action {call.action!r}: open or close", code="bad_request"
                    )
                reply = ControlReply(rid, int(changed))
        except EngineError as exc:
            reply = ErrorReply(rid, exc.code, str(exc))
        except Exception as exc:  # an engine bug must not take the worker down
            log.exception("engine failed on control call %s", rid)
            reply = ErrorReply(rid, "engine_error", f"{type(exc).__name__}: {exc}")
        try:
            self._server.send(identity, reply)
            self.messages_sent += 1
        except Exception:
            log.exception("could not answer control call %s", rid)

    async def _start_system_port(self, tg: Any) -> LoopHttpServer | None:
        """Serve ``--system-port`` (``dyn.core.worker.system``) in ``tg``, if it is set; it
        stops with the task group. ``ConfigError`` when the port cannot be bound."""
        if self.settings.system_port is None:
            return None
        sock = bind_http(self.settings.host, self.settings.system_port, "--system-port")
        server = LoopHttpServer(WorkerSystemApp(self.engine, self.instance_id), sock, self.settings.host)
        await server.start(tg)
        return server

    async def _publish_metrics(self) -> None:
        last: list | None = None
        last_sent = 0.0
        failing = False
        while True:
            await anyio.sleep(self.settings.metrics_interval_s)
            try:
                snapshots = self.engine.load_metrics()
            except Exception:  # metrics are best effort; serving goes on
                if not failing:
                    log.exception("engine load metrics failed; will keep trying")
                failing = True
                continue
            failing = False
            key = [msgspec.structs.replace(m, ts=0.0) for m in snapshots]
            now = time.monotonic()
            if key != last or now - last_sent >= 1.0:
                for m in snapshots:
                    self._metrics.publish(msgspec.structs.replace(m, instance_id=self.instance_id))
                last, last_sent = key, now
