"""``ReplicaSync``: router replicas share their booking changes (``--router-replica-sync``).

Each replica of a model's KV router sees only the requests routed through it; with sync on, every
booking change (add, prefill_done, output, free) is published as an ``ActiveSequenceEvent`` on a
PUB socket (topic ``ACTIVE_SEQUENCES_TOPIC``) and applied by every peer with
``KvRouter.apply_remote``, so each replica's load model (and, in approximate mode, its prefix
index) counts the others' requests too (reference 3.7).

Peers find each other in the ``{namespace}.routers`` discovery namespace: the replica registers a
record whose ``endpoints.kv_events`` is its PUB (``endpoints.request`` the query socket of a
``dyn router``, if any), watches that namespace and connects one SUB to the PUB of every other
router of the same model. Events carrying its own ``router_id`` are skipped; malformed messages
are logged and skipped.

The booking changes of one event-loop pass go out as one message, ``[topic, event, event, ...]``
(a receiver applies every event frame, so a message of one event is the same format): a ZMQ send
costs as much as routing the request, and a busy router books, starts and frees several requests
a pass. Published outside a running event loop, an event is sent at once. A message carries at
most ``MAX_EVENTS_PER_MESSAGE`` events (a pass that books more sends more messages); a receiver
skips a longer one whole, with a warning, so one peer's message cannot hold its event loop.

PUB/SUB delivers only what is published after a subscription is live: events a replica published
before a peer connected are lost to that peer, and nothing is replayed. Peers converge as those
bookings end (a ``free`` for an unknown booking is ignored), and bookings a peer never hears the
end of expire with the router's stale-request timeout.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
import zmq
import zmq.asyncio

from dyn.core.discovery.services import new_instance_id
from dyn.core.discovery.store import (
    DEFAULT_TTL_S,
    DiscoveryStore,
    WorkerAdded,
    WorkerRemoved,
)
from dyn.core.messages import ACTIVE_SEQUENCES_TOPIC, ActiveSequenceEvent, WorkerRecord
from dyn.core.router.registry import (
    ROUTER_ENGINE,
    router_record,
    routers_store,
)
from dyn.core.transport.sockets import (
    async_context,
    bind_random,
    configure,
    sync_context,
)

if TYPE_CHECKING:
    from dyn.core.router.kv import KvRouter

log = logging.getLogger("dyn.router.sync")

MAX_EVENTS_PER_MESSAGE = 1024
"""The most booking changes one replica-sync message carries (and a receiver takes)."""

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ActiveSequenceEvent)


def peer_router_id(instance_id: int) -> str:
    """The router id a replica with discovery ``instance_id`` puts in its events."""
    return f"{instance_id:x}"


class ReplicaSync:
    """Publishes ``router``'s booking changes and applies its peers' (see the module docstring).

    ``store`` is the workers' discovery store (the routers' namespace is derived from it);
    ``request_endpoint`` is advertised in the record when this replica is a ``dyn router``.
    Construction binds the PUB and hooks ``router.on_booking``; ``run`` registers, follows the
    peers and applies their events until cancelled.
    """

    def __init__(
        self,
        router: KvRouter,
        store: DiscoveryStore,
        *,
        model_name: str | None,
        host: str = "127.0.0.1",
        request_endpoint: str | None = None,
        lease_ttl_s: float = DEFAULT_TTL_S,
    ) -> None:
        self.router = router
        self.instance_id = new_instance_id()
        # the router id is the discovery instance id, so a peer whose record goes away can be
        # told apart and its bookings freed
        router.router_id = self.router_id = peer_router_id(self.instance_id)
        self.model_name = model_name
        self.store = routers_store(store)
        self.request_endpoint = request_endpoint
        self.lease_ttl_s = lease_ttl_s
        self._pub = configure(sync_context().socket(zmq.PUB), hwm=100_000)
        self.endpoint = bind_random(self._pub, host)
        self.peers: dict[int, str] = {}
        """Peer instance id -> the PUB endpoint this replica's SUB is connected to."""
        self.heard: set[str] = set()
        """Router ids of the peers an event was received from."""
        self.published = 0
        self.applied = 0
        self.dropped = 0
        self._pending: list[bytes] = [ACTIVE_SEQUENCES_TOPIC]
        router.on_booking = self.publish

    @property
    def record(self) -> WorkerRecord:
        return router_record(
            self.store,
            self.model_name,
            self.instance_id,
            request=self.request_endpoint,
            kv_events=self.endpoint,
        )

    def publish(self, event: ActiveSequenceEvent) -> None:
        """Send one booking change to the peers at the end of this event-loop pass (at once
        outside a loop); never blocks or raises."""
        if not event.router_id:
            event.router_id = self.router_id
        self._pending.append(_encoder.encode(event))
        if len(self._pending) > MAX_EVENTS_PER_MESSAGE:  # a full message goes now
            self._flush()
        elif len(self._pending) == 2:  # the first of this pass
            try:
                asyncio.get_running_loop().call_soon(self._flush)
            except RuntimeError:
                self._flush()

    def _flush(self) -> None:
        events, self._pending = self._pending, [ACTIVE_SEQUENCES_TOPIC]
        if len(events) == 1 or self._pub.closed:
            return
        try:
            self._pub.send_multipart(events, flags=zmq.NOBLOCK)
            self.published += len(events) - 1
        except zmq.ZMQError as exc:
            self.dropped += len(events) - 1
            if self.dropped == len(events) - 1 or self.dropped % 1000 < len(events) - 1:
                log.warning("replica sync dropped %d event(s): %s", self.dropped, exc)

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Register, follow the peers and apply their events until cancelled; then unregister
        and close the sockets."""
        sub = configure(async_context().socket(zmq.SUB))
        sub.setsockopt(zmq.SUBSCRIBE, ACTIVE_SEQUENCES_TOPIC)
        try:
            # the lease is left last: the record stays until the tasks stopped
            async with self.store.lease(self.record, self.lease_ttl_s), anyio.create_task_group() as tg:
                tg.start_soon(self._receive, sub)
                await tg.start(self._follow_peers, sub)
                log.info("replica sync: router %s publishes on %s", self.router_id, self.endpoint)
                task_status.started()
        finally:
            sub.close(linger=0)
            self._pub.close(linger=0)
            self.router.on_booking = None

    async def _follow_peers(self, sub: zmq.asyncio.Socket, *, task_status: Any) -> None:
        for record in await self.store.list():
            self._on_peer(sub, record)
        task_status.started()
        async with aclosing(self.store.watch()) as events:
            async for event in events:
                if isinstance(event, WorkerAdded):
                    self._on_peer(sub, event.record)
                elif isinstance(event, WorkerRemoved):
                    self._drop_peer(sub, event.instance_id)

    def _on_peer(self, sub: zmq.asyncio.Socket, record: WorkerRecord) -> None:
        if record.instance_id == self.instance_id or record.engine != ROUTER_ENGINE:
            return
        endpoint = record.endpoints.kv_events
        same_model = self.model_name is None or record.model_name in (self.model_name, "")
        if not endpoint or not same_model:
            self._drop_peer(sub, record.instance_id)
            return
        if self.peers.get(record.instance_id) == endpoint:
            return
        self._drop_peer(sub, record.instance_id)
        try:
            sub.connect(endpoint)
        except zmq.ZMQError as exc:
            log.warning(
                "replica sync: cannot connect to router %d at %s: %s", record.instance_id, endpoint, exc
            )
            return
        self.peers[record.instance_id] = endpoint
        log.info("replica sync: following router %d at %s", record.instance_id, endpoint)

    def _drop_peer(self, sub: zmq.asyncio.Socket, instance_id: int) -> None:
        endpoint = self.peers.pop(instance_id, None)
        if endpoint is None:
            return
        try:
            sub.disconnect(endpoint)
        except zmq.ZMQError:
            pass
        log.info("replica sync: router %d at %s left", instance_id, endpoint)
        self.router.forget_peer(peer_router_id(instance_id))

    async def _receive(self, sub: zmq.asyncio.Socket) -> None:
        while True:
            frames = await sub.recv_multipart(copy=True)
            if len(frames) > MAX_EVENTS_PER_MESSAGE + 1:
                log.warning(
                    "replica sync: skipping a message of %d events (at most %d)",
                    len(frames) - 1,
                    MAX_EVENTS_PER_MESSAGE,
                )
                continue
            if len(frames) < 2:
                log.warning(
                    "replica sync: skipping a message of %d frame(s), not [topic, event, ...]", len(frames)
                )
                continue
            for frame in frames[1:]:
                self._apply(frame)

    def _apply(self, frame: bytes) -> None:
        try:
            event = _decoder.decode(frame)
        except msgspec.DecodeError as exc:
            log.warning("replica sync: skipping a malformed event: %s", exc)
            return
        if event.router_id == self.router_id:
            return
        if event.router_id not in self.heard:
            self.heard.add(event.router_id)
            log.info("replica sync: first event from router %s", event.router_id)
        try:
            self.router.apply_remote(event)
            self.applied += 1
        except Exception:
            log.exception("replica sync: could not apply %s from router %s", event.event, event.router_id)
