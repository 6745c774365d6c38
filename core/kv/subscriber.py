"""One worker's KV-event stream, in sequence order, with gaps filled from its replay socket.

``KvEventSubscriber.run`` connects a SUB (topic ``b""``: any topic, as vLLM publishes under
``""``) to the worker's ``kv_events`` endpoint and reads ``[topic, seq (8-byte BE), payload]``.
It hands each batch, converted to ``IndexOp``s, to ``deliver`` exactly once and in ``seq``
order:

- **catch-up**: before reading live messages it replays from seq 0 through the worker's
  ``kv_replay`` ROUTER (``[b"", start_seq]`` on a DEALER; answers ``[b"", seq, payload]`` ...
  then seq -1; vLLM 0.32 puts its topic before seq, ``[b"", topic, seq, payload]``), so blocks
  stored before the router subscribed are known. Live messages that arrive
  meanwhile wait in the SUB queue and are then deduplicated by seq.
- ``seq == last + 1``: applied. ``seq <= last``: a duplicate, skipped.
- ``seq > last + 1``: a gap. The missing batches are replayed from ``last + 1``, then the current
  one is applied. If replay cannot supply them (no replay endpoint, the worker's buffer rolled
  over, or no answer within ``replay_timeout`` seconds per message), a warning is logged (at
  most one per few seconds), ``replay_incomplete`` is counted and the stream goes on.
- Bad frames and bad payloads are counted and skipped (a bad payload still uses up its seq);
  nothing a worker sends stops the task. A payload larger than the worker's record allows
  (``KvEventBounds``) is counted as ``too_large`` without being decoded, so no single message
  costs more CPU than the worker's advertised cache could justify; ZMQ itself drops (and
  reconnects) messages over ``MAX_MESSAGE_BYTES``. Rejections are logged at most once per
  few seconds per worker, with a count (``rejects``, shared with the ingestor's checks).
- The loop reads what is queued, at most ``DRAIN_BATCH`` messages, then yields to the event loop
  (a queued message does not make pyzmq yield), so a flood from one worker cannot starve the
  rest of the process, and a busy process's turns (milliseconds each under load) do not leave
  the stream behind its worker.
- Under ``--plane-keys`` the sockets are CurveZMQ clients, always: no record can opt out of
  encryption. A record whose ``kv_events_plain`` asks for plain ZMQ (a worker started without the
  keys; a dyn worker under them relays its engine's events, ``dyn.core.worker.kv_relay``) is never
  connected to: it is counted (``plain_events``) and logged, at most one line per few seconds
  for all such records, saying what to do. Anyone who can write a discovery record could
  otherwise feed KV events to every router and indexer.

The subscriber runs on whichever event loop calls ``run`` (the router's, or an event thread's);
``deliver`` is called on that loop, and ``cancel`` must be called from it too.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
import zmq
import zmq.asyncio

from dyn.core.kv.convert import BatchConverter, IndexOp, KvEventMetrics, RejectReason
from dyn.core.kv.events import (
    KvEventDecodeError,
    decode_known_events,
    decode_seq,
    encode_seq,
    split_frames,
)
from dyn.core.messages import WorkerRecord
from dyn.core.transport.codec import RejectedFrames
from dyn.core.transport.sockets import (
    DRAIN_BATCH,
    async_context,
    configure,
    plain_view,
    plane_keys,
    receive_queued,
)

log = logging.getLogger(__name__)

DEFAULT_REPLAY_TIMEOUT = 2.0
MAX_MESSAGE_BYTES = 256 << 20
"""Messages above this never reach Python: ZMQ drops them and the connection (it reconnects)."""
UNKNOWN_CAPACITY_MESSAGE_BYTES = 64 << 20
CAPACITY_SLACK_FRACTION = 32
LOWER_TIER_BLOCK_LIMIT = 1 << 21
"""The blocks one rank may hold in each lower tier (host, disk, external): workers do not
advertise those tiers' sizes, and a host or disk cache can be far larger than the device one,
so the bound is fixed (2M blocks, about 0.5 GB of index per rank and tier at most)."""
MIN_CAPACITY_SLACK = 64
_MESSAGE_OVERHEAD_BYTES = 64 << 10
_BYTES_PER_BLOCK = 96  # a hash (vLLM's sha256 form: 34 bytes), its event's framing, a parent hash
_BYTES_PER_TOKEN = 12  # a token id (5 bytes), or an Eagle pair of them (11)

Deliver = Callable[[list[IndexOp]], object]

SubscriptionKey = int | tuple[int, int]
"""A subscription's key: the instance id, or ``(instance_id, dp_rank)`` for one rank's own socket."""


def subscription_key(instance_id: int, dp_rank: int | None) -> SubscriptionKey:
    return instance_id if dp_rank is None else (instance_id, dp_rank)


_plain_records = RejectedFrames(
    log,
    "worker record asking for unencrypted KV events under --plane-keys",
    "worker records asking for unencrypted KV events under --plane-keys",
)
"""Refused records of every worker: one line per few seconds however many a forger writes."""


@dataclass(frozen=True, slots=True)
class KvEventBounds:
    """What one worker's KV events may claim, from its discovery record.

    A record that states a KV capacity (``total_kv_blocks`` > 0, per dp rank) bounds:
    - ``block_limit``: the blocks one rank may hold in the index: the capacity plus a slack of
      1/``CAPACITY_SLACK_FRACTION`` of it (at least ``MIN_CAPACITY_SLACK``) for a stale index
      (removes lost with a replay gap) that the engine's next events put right;
    - ``dp_size``: ranks beyond it are refused;
    - ``max_message_bytes``: one batch can at most remove and store a whole cache, so its
      payload cannot be larger than twice the capacity times a block's encoded size.
    A record without a capacity (``dyn indexer --workers``) bounds only the message size.
    Every record bounds each lower tier of each rank to ``lower_tier_limit`` blocks.
    """

    dp_size: int | None
    block_limit: int | None
    max_message_bytes: int
    lower_tier_limit: int = LOWER_TIER_BLOCK_LIMIT

    @classmethod
    def of(cls, record: WorkerRecord) -> KvEventBounds:
        capacity = record.total_kv_blocks
        if capacity <= 0:
            return cls(None, None, UNKNOWN_CAPACITY_MESSAGE_BYTES, LOWER_TIER_BLOCK_LIMIT)
        slack = max(MIN_CAPACITY_SLACK, capacity // CAPACITY_SLACK_FRACTION)
        per_block = _BYTES_PER_BLOCK + _BYTES_PER_TOKEN * max(record.block_size, 1)
        size = _MESSAGE_OVERHEAD_BYTES + 2 * capacity * per_block
        return cls(
            max(record.dp_size, 1), capacity + slack, min(size, MAX_MESSAGE_BYTES), LOWER_TIER_BLOCK_LIMIT
        )


class ReplayUnavailable(Exception):
    """The worker's replay socket is missing or did not answer in time."""


class KvEventSubscriber:
    """Follows the KV events of one worker (all its dp ranks) until cancelled."""

    def __init__(
        self,
        record: WorkerRecord,
        deliver: Deliver,
        metrics: KvEventMetrics,
        *,
        block_size: int | None = None,
        dp_rank: int | None = None,
        replay_timeout: float = DEFAULT_REPLAY_TIMEOUT,
    ) -> None:
        self.record = record
        self.instance_id = record.instance_id
        self.key = subscription_key(record.instance_id, dp_rank)
        """What the subscription follows: the instance (all its ranks on one socket), or, given a
        ``dp_rank``, that rank's own socket (its events default to the rank)."""
        self.bounds = KvEventBounds.of(record)
        self.rejects = RejectedFrames(
            log,
            f"KV-event message of worker {record.instance_id}",
            f"KV-event messages of worker {record.instance_id}",
        )
        """Rejections of this worker's events, by this subscriber or its ingestor's checks."""
        self._gaps = RejectedFrames(
            log,
            f"part of the KV events of worker {record.instance_id}",
            f"parts of the KV events of worker {record.instance_id}",
            verb="lost",
        )
        self._deliver = deliver
        self._metrics = metrics
        self._converter = BatchConverter(
            record.instance_id, block_size or record.block_size, metrics, dp_rank or 0
        )
        self._replay_timeout = replay_timeout
        self._last: int | None = None
        self._dealer: zmq.asyncio.Socket | None = None
        self._scope: anyio.CancelScope | None = None
        self._cancelled = False

    @property
    def last_seq(self) -> int | None:
        """The last seq applied; -1 after a catch-up that found nothing; None before a baseline."""
        return self._last

    def cancel(self) -> None:
        """Stop ``run`` (now, or as soon as it starts). Call on the loop that runs it."""
        self._cancelled = True
        if self._scope is not None:
            self._scope.cancel()

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Subscribe, catch up, follow; ``task_status.started()`` once the catch-up is applied."""
        endpoint = self.record.endpoints.kv_events
        if endpoint is None or self._cancelled:
            task_status.started()
            return
        if self.record.endpoints.kv_events_plain and plane_keys() is not None:
            self._refuse_plain(endpoint)
            task_status.started()
            return
        sub: zmq.asyncio.Socket | None = None
        started = False
        with anyio.CancelScope() as self._scope:
            try:
                sub = self._socket(zmq.SUB)
                sub.setsockopt(zmq.SUBSCRIBE, b"")
                sub.connect(endpoint)
                await self._catch_up()
                started = True
                task_status.started()
                queued = plain_view(sub)
                while True:
                    await self._on_frames_logged(await sub.recv_multipart(copy=True))
                    # what else is queued now, up to a bound, then the rest of the process's turn
                    for frames in receive_queued(queued, DRAIN_BATCH - 1):
                        await self._on_frames_logged(frames)
                    await anyio.lowlevel.checkpoint()  # a ready socket never yields by itself
            except Exception:
                log.exception("KV events of worker %d: subscription failed", self.instance_id)
            finally:
                if sub is not None:
                    sub.close(linger=0)
                self._close_dealer()
        if not started:
            task_status.started()

    def _socket(self, kind: int) -> zmq.asyncio.Socket:
        socket = configure(async_context().socket(kind))
        socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        return socket

    def _refuse_plain(self, endpoint: str) -> None:
        self._metrics.count_rejected(RejectReason.PLAIN_EVENTS, 1, self.instance_id)
        _plain_records.reject(
            f"worker {self.instance_id} ({self.record.engine}, {endpoint}) is not followed: start it "
            "with this --plane-keys directory too (dyn then relays its engine's events over "
            "CurveZMQ); if no such worker is yours, someone else can write your discovery store"
        )

    def reject(self, reason: RejectReason, why: object, amount: int = 1) -> None:
        """Count ``amount`` rejections of this worker's events and log them (rate-limited)."""
        self._metrics.count_rejected(reason, amount, self.instance_id)
        self.rejects.reject(why)

    # ----------------------------------------------------------------- stream handling

    async def _on_frames_logged(self, frames: list[bytes]) -> None:
        try:
            await self._on_frames(frames)
        except Exception:
            log.exception("KV events of worker %d: a batch failed to apply", self.instance_id)

    async def _on_frames(self, frames: list[bytes]) -> None:
        try:
            _topic, seq, payload = split_frames(frames)
            if seq < 0:
                raise KvEventDecodeError("a live message cannot carry the replay end marker as seq")
        except KvEventDecodeError as exc:
            self.reject(RejectReason.BAD_FRAMES, f"bad frames: {exc}")
            return
        last = self._last
        if last is not None and seq <= last:
            return
        if last is not None and seq > last + 1:
            await self._fill_gap(seq)
            if self._last is not None and seq <= self._last:
                return
        self._apply(seq, payload)

    def _apply(self, seq: int, payload: bytes) -> None:
        """Decode, convert and deliver one batch; its seq is used up even if it is bad."""
        self._last = seq
        limit = self.bounds.max_message_bytes
        if len(payload) > limit:
            self.reject(
                RejectReason.TOO_LARGE,
                f"the payload at seq {seq} has {len(payload)} bytes, "
                f"more than the {limit} its advertised KV cache could fill (not decoded)",
            )
            return
        try:
            batch, unknown = decode_known_events(payload)
        except KvEventDecodeError as exc:
            self.reject(RejectReason.BAD_PAYLOAD, f"bad payload at seq {seq}: {exc}")
            return
        self._metrics.count_rejected(RejectReason.UNKNOWN_EVENT, unknown, self.instance_id)
        ops = self._converter.convert(batch)
        if ops:
            self._deliver(ops)

    async def _catch_up(self) -> None:
        """Replay from seq 0; sets the baseline ``last`` (stays None if replay failed)."""
        applied_any = False
        try:
            async with aclosing(self._replay(0)) as replayed:
                async for seq, payload in replayed:
                    if not applied_any and seq != 0:
                        self._incomplete(f"its replay buffer starts at seq {seq}; older blocks are unknown")
                    applied_any = True
                    if self._last is None or seq > self._last:
                        self._apply(seq, payload)
        except ReplayUnavailable as exc:
            if self.record.endpoints.kv_replay is not None:
                self._incomplete(f"catch-up replay failed ({exc}); blocks stored before now are unknown")
            else:
                log.info(
                    "worker %d offers no KV replay endpoint; following live events only", self.instance_id
                )
            return
        if not applied_any:
            self._last = -1

    async def _fill_gap(self, seq: int) -> None:
        """Replay what is missing before ``seq``; counts one ``replay_incomplete`` if it can't."""
        assert self._last is not None
        counted = False
        try:
            async with aclosing(self._replay(self._last + 1)) as replayed:
                async for rseq, payload in replayed:
                    if rseq <= self._last:
                        continue
                    if rseq != self._last + 1 and not counted:
                        counted = True
                        self._incomplete(f"seq {self._last + 1}..{rseq - 1} rolled out of its replay buffer")
                    self._apply(rseq, payload)
        except ReplayUnavailable as exc:
            reason = str(exc)
        else:
            reason = "its replay did not reach the gap"
        if self._last < seq - 1 and not counted:
            self._incomplete(f"seq {self._last + 1}..{seq - 1} are lost: {reason}")

    def _incomplete(self, what: str) -> None:
        self._metrics.count_rejected(RejectReason.REPLAY_INCOMPLETE, 1, self.instance_id)
        self._gaps.reject(f"{what}; continuing")

    # ----------------------------------------------------------------- replay socket

    async def _replay(self, start_seq: int) -> AsyncGenerator[tuple[int, bytes], None]:
        """Yield ``(seq, payload)`` from the worker's replay socket until its end marker.

        Raises ``ReplayUnavailable`` when there is no endpoint, or a message takes longer than
        ``replay_timeout``; a stream left unfinished closes the DEALER so that no stale answer is
        read by the next request.
        """
        endpoint = self.record.endpoints.kv_replay
        if endpoint is None:
            raise ReplayUnavailable("the worker has no replay endpoint")
        if self._dealer is None:
            self._dealer = self._socket(zmq.DEALER)
            self._dealer.connect(endpoint)
        dealer = self._dealer
        finished = False
        try:
            await dealer.send_multipart([b"", encode_seq(start_seq)])
            while True:
                with anyio.move_on_after(self._replay_timeout) as waited:
                    frames = await dealer.recv_multipart(copy=True)
                if waited.cancelled_caught:
                    raise ReplayUnavailable(f"no replay answer within {self._replay_timeout:g} s")
                if len(frames) == 4:  # vLLM's form, topic before seq
                    frames = [frames[0], frames[2], frames[3]]
                if len(frames) != 3 or frames[0] != b"":
                    self.reject(RejectReason.BAD_FRAMES, f"a replay answer of {len(frames)} frames")
                    continue
                try:
                    seq = decode_seq(frames[1])
                except KvEventDecodeError as exc:
                    self.reject(RejectReason.BAD_FRAMES, f"a replay answer with {exc}")
                    continue
                if seq < 0:
                    finished = True
                    return
                yield seq, frames[2]
                await anyio.lowlevel.checkpoint()
        finally:
            if not finished and self._dealer is dealer:
                self._close_dealer()

    def _close_dealer(self) -> None:
        if self._dealer is not None:
            self._dealer.close(linger=0)
            self._dealer = None
