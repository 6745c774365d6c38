"""``KvEventRelay``: an engine's own KV events, republished on the worker's CurveZMQ publisher.

vLLM and SGLang bind their KV-event sockets themselves, in plain ZMQ. Under ``--plane-keys`` no
subscriber connects to a plain socket (``dyn.core.kv.subscriber``), so the worker has its engine
bind them where no other user or host can connect (``sockets.private_endpoint``: a Unix socket in
a directory only this user may enter) and relays them:

- the relay follows the engine's stream as a router does (``KvEventSubscriber``: catch-up from
  seq 0, duplicates skipped, gaps filled from the engine's replay socket; a gap the engine cannot
  fill is logged and the stream goes on);
- it republishes every batch once, in order, its payload as the engine encoded it (not decoded
  here; the subscribers check it), on its own ``KvEventPublisher``: CurveZMQ, on the worker's
  ``--host``, under the engine's topic and sequence numbers, with its own replay buffer. A batch
  the engine's replay could not give back is thus missing from the relay's numbering and replay
  too, and the routers count it lost (``replay_incomplete``) as they would without the relay;
- the worker's record names the relay's sockets, with ``kv_events_plain`` false.

An engine socket another host could reach is refused at start (``EngineStartError``): under the
keys it would be a door left open beside the relay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import zmq.asyncio
from prometheus_client import CollectorRegistry

from dyn.core.engine import EngineInfo, EngineStartError
from dyn.core.kv.convert import KvEventMetrics
from dyn.core.kv.subscriber import KvEventSubscriber
from dyn.core.messages import WorkerEndpoints, WorkerRecord
from dyn.core.transport.event_plane import KvEventPublisher
from dyn.core.transport.sockets import is_local_endpoint, plain


class KvEventRelay:
    """Relays the KV events of the engine ``info`` describes (see the module docstring).
    Construction binds the publisher on ``host``; ``close`` closes it."""

    def __init__(self, info: EngineInfo, host: str, instance_id: int = 0) -> None:
        events, replay = info.kv_events_endpoint, info.kv_replay_endpoint
        for endpoint in (events, replay):
            if endpoint is not None and not is_local_endpoint(endpoint):
                raise EngineStartError(
                    f"the engine's own KV-event socket {endpoint} can be reached from other hosts "
                    "and is not encrypted; under --plane-keys it must listen on ipc:// or 127.0.0.1 "
                    "(leave the engine's KV-events config to dyn, which relays it over CurveZMQ)"
                )
        self.publisher = KvEventPublisher(host, topic=info.kv_events_topic)
        record = WorkerRecord(
            instance_id=instance_id,
            namespace="",
            model_name="",
            engine="relayed",
            endpoints=WorkerEndpoints(request="", kv_events=events, kv_replay=replay),
            block_size=info.block_size,
            total_kv_blocks=0,
            max_num_batched_tokens=0,
        )
        self._stream = _EngineStream(record, self.publisher.publish_payload)

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve the relay's replay socket and follow the engine until cancelled;
        ``started()`` once the engine's stream is caught up."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.publisher.serve_replay)
            await tg.start(self._stream.run)
            task_status.started()

    def close(self) -> None:
        self.publisher.close()


class _EngineStream(KvEventSubscriber):
    """The engine's stream, in order and gap-filled, each batch handed to ``forward`` undecoded
    with its seq. Its sockets are plain: the engine's never have keys, and only this user can
    reach them."""

    def __init__(self, record: WorkerRecord, forward: Callable[[bytes, int], object]) -> None:
        super().__init__(record, lambda ops: None, KvEventMetrics(CollectorRegistry()))
        self._forward = forward

    def _socket(self, kind: int) -> zmq.asyncio.Socket:
        return plain(super()._socket(kind))

    def _apply(self, seq: int, payload: bytes) -> None:
        self._last = seq
        self._forward(payload, seq)
