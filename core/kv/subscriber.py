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
  over, or no answer within ``replay_timeout`` seconds per message), a warning is logged,
  ``replay_incomplete`` is counted and the stream goes on from what it has.
- Bad frames and bad payloads are counted and skipped (a bad payload still uses up its seq);
  nothing a worker sends stops the task.

The subscriber runs on whichever event loop calls ``run`` (the router's, or an event thread's);
``deliver`` is called on that loop, and ``cancel`` must be called from it too.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
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
from dyn.core.transport.sockets import async_context, configure

log = logging.getLogger(__name__)

DEFAULT_REPLAY_TIMEOUT = 2.0

Deliver = Callable[[list[IndexOp]], object]


class ReplayUnavailable(Exception):
    """The worker's replay socket is missing or did not answer in time."""


class KvEventSubscriber:
    """Follows the KV events of one worker (all its dp ranks) until cancelled."""

    def __init__(
        self, record: WorkerRecord, deliver: Deliver, metrics: KvEventMetrics, *,
        block_size: int | None = None, dp_rank: int = 0,
        replay_timeout: float = DEFAULT_REPLAY_TIMEOUT,
    ) -> None:
        self.record = record
        self.instance_id = record.instance_id
        self._deliver = deliver
        self._metrics = metrics
        self._converter = BatchConverter(
            record.instance_id, block_size or record.block_size, metrics, dp_rank
        )
        self._replay_timeout = replay_timeout
        self._last: int | None = None
        self._dealer: zmq.asyncio.Socket | None = None
        self._scope: anyio.CancelScope | None = None
        self._cancelled = False
        self._warned_bad = False

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
        sub: zmq.asyncio.Socket | None = None
        started = False
        with anyio.CancelScope() as self._scope:
            try:
                sub = configure(async_context().socket(zmq.SUB))
                sub.setsockopt(zmq.SUBSCRIBE, b"")
                sub.connect(endpoint)
                await self._catch_up()
                started = True
                task_status.started()
                while True:
                    frames = await sub.recv_multipart(copy=True)
                    try:
                        await self._on_frames(frames)
                    except Exception:
                        log.exception("KV events of worker %d: a batch failed to apply",
                                      self.instance_id)
                    await anyio.lowlevel.checkpoint()  # a ready socket never yields by itself
            except Exception:
                log.exception("KV events of worker %d: subscription failed", self.instance_id)
            finally:
                if sub is not None:
                    sub.close(linger=0)
                self._close_dealer()
        if not started:
            task_status.started()

    # ----------------------------------------------------------------- stream handling

    async def _on_frames(self, frames: list[bytes]) -> None:
        try:
            _topic, seq, payload = split_frames(frames)
            if seq < 0:
                raise KvEventDecodeError("a live message cannot carry the replay end marker as seq")
        except KvEventDecodeError as exc:
            self._metrics.count_rejected(RejectReason.BAD_FRAMES)
            self._log_bad("frames", exc)
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
        try:
            batch, unknown = decode_known_events(payload)
        except KvEventDecodeError as exc:
            self._metrics.count_rejected(RejectReason.BAD_PAYLOAD)
            self._log_bad(f"payload at seq {seq}", exc)
            return
        self._metrics.count_rejected(RejectReason.UNKNOWN_EVENT, unknown)
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
                log.info("worker %d offers no KV replay endpoint; following live events only",
                         self.instance_id)
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
                        self._incomplete(
                            f"seq {self._last + 1}..{rseq - 1} rolled out of its replay buffer")
                    self._apply(rseq, payload)
        except ReplayUnavailable as exc:
            reason = str(exc)
        else:
            reason = "its replay did not reach the gap"
        if self._last < seq - 1 and not counted:
            self._incomplete(f"seq {self._last + 1}..{seq - 1} are lost: {reason}")

    def _log_bad(self, what: str, exc: Exception) -> None:
        """The first bad message of a worker is a warning, later ones are debug lines."""
        level = logging.DEBUG if self._warned_bad else logging.WARNING
        self._warned_bad = True
        log.log(level, "worker %d sent a bad KV-event %s (skipped; later ones are counted in "
                "dynamo_component_kv_events_rejected_total): %s", self.instance_id, what, exc)

    def _incomplete(self, what: str) -> None:
        self._metrics.count_rejected(RejectReason.REPLAY_INCOMPLETE)
        log.warning("KV events of worker %d are incomplete: %s; continuing", self.instance_id, what)

    # ----------------------------------------------------------------- replay socket

    async def _replay(self, start_seq: int) -> AsyncIterator[tuple[int, bytes]]:
        """Yield ``(seq, payload)`` from the worker's replay socket until its end marker.

        Raises ``ReplayUnavailable`` when there is no endpoint, or a message takes longer than
        ``replay_timeout``; a stream left unfinished closes the DEALER so that no stale answer is
        read by the next request.
        """
        endpoint = self.record.endpoints.kv_replay
        if endpoint is None:
            raise ReplayUnavailable("the worker has no replay endpoint")
        if self._dealer is None:
            self._dealer = configure(async_context().socket(zmq.DEALER))
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
                    self._metrics.count_rejected(RejectReason.BAD_FRAMES)
                    continue
                try:
                    seq = decode_seq(frames[1])
                except KvEventDecodeError:
                    self._metrics.count_rejected(RejectReason.BAD_FRAMES)
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
