"""The event plane a worker publishes: KV events (vLLM wire format) with replay, and load metrics.

``KvEventPublisher`` binds a PUB socket that sends ``[topic, seq (8-byte BE), payload]`` per
batch, keeps the last ``buffer_size`` batches, and binds a ROUTER replay socket: a request
``[identity, b"", start_seq (8-byte BE)]`` is answered with ``[identity, b"", seq, payload]`` for
every buffered batch with ``seq >= start_seq``, then ``[identity, b"", -1 (8-byte BE), b""]``.
That is vLLM's ``ZmqEventPublisher`` protocol, so any subscriber written for vLLM works.
``publish_payload`` sends a batch already encoded: an engine's own, which the worker relays under
``--plane-keys`` (``dyn.core.worker.kv_relay``).
Malformed replay requests are answered with the end marker alone, counted and logged at most once
per few seconds; the replay loop yields to the event loop after every request and every
``REPLAY_YIELD_EVERY`` batches sent, so a flood of requests cannot starve the worker.

``MetricsPublisher`` binds a PUB that sends ``[LOAD_METRICS_TOPIC, msgpack(LoadMetrics)]``.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import anyio.lowlevel
import msgspec
import zmq

from dyn.core.kv.events import (
    DEFAULT_TOPIC,
    REPLAY_END_SEQ,
    KvEvent,
    KvEventBatch,
    KvEventDecodeError,
    decode_seq,
    encode_event_batch,
    encode_seq,
)
from dyn.core.messages import LOAD_METRICS_TOPIC, LoadMetrics
from dyn.core.transport.codec import RejectedFrames
from dyn.core.transport.sockets import async_context, bind_random, configure, sync_context

log = logging.getLogger(__name__)

DEFAULT_REPLAY_BUFFER = 10_000
REPLAY_YIELD_EVERY = 64


class KvEventPublisher:
    """Publishes KV-event batches of one worker (all its dp ranks) and serves replay."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        topic: str = DEFAULT_TOPIC,
        buffer_size: int = DEFAULT_REPLAY_BUFFER,
    ) -> None:
        self.topic = topic
        self._topic = topic.encode()
        self._pub = configure(sync_context().socket(zmq.PUB), hwm=100_000)
        self.endpoint = bind_random(self._pub, host)
        self._replay = configure(async_context().socket(zmq.ROUTER))
        self.replay_endpoint = bind_random(self._replay, host)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_size)
        self._next_seq = 0
        self.rejected = RejectedFrames(log, "malformed KV replay request")

    @property
    def next_seq(self) -> int:
        """The sequence number the next batch will carry."""
        return self._next_seq

    def publish(self, events: list[KvEvent], dp_rank: int = 0) -> int:
        """Send one batch now (never blocks; a slow subscriber drops at the high-water mark and
        recovers through replay). Returns the batch's sequence number."""
        return self.publish_payload(encode_event_batch(KvEventBatch(time.time(), events, dp_rank)))

    def publish_payload(self, payload: bytes, seq: int | None = None) -> int:
        """``publish`` for a batch already encoded (an engine's own, relayed as it came), under
        ``seq`` if given: the relayed engine's own number, never below ``next_seq`` (a number
        skipped is a batch lost, which subscribers then find missing from the replay too)."""
        if seq is None:
            seq = self._next_seq
        elif seq < self._next_seq:
            raise ValueError(f"seq {seq} was published already (next is {self._next_seq})")
        self._next_seq = seq + 1
        self._buffer.append((seq, payload))
        try:
            self._pub.send_multipart((self._topic, encode_seq(seq), payload), flags=zmq.NOBLOCK)
        except zmq.Again:  # pragma: no cover - PUB drops instead of blocking; kept for safety
            pass
        return seq

    def replay_from(self, start_seq: int) -> list[tuple[int, bytes]]:
        """Buffered ``(seq, payload)`` pairs with ``seq >= start_seq``, oldest first."""
        if not self._buffer:
            return []
        first = self._buffer[0][0]
        skip = max(0, start_seq - first)
        return list(self._buffer)[skip:]

    async def serve_replay(self) -> None:
        """Answer replay requests until cancelled."""
        while True:
            await anyio.lowlevel.checkpoint()
            frames = await self._replay.recv_multipart()
            identity = frames[0]
            try:
                if len(frames) != 3 or frames[1] != b"":
                    raise KvEventDecodeError(
                        f"a replay request is [b'', start_seq], got {len(frames) - 1} frames"
                    )
                start = decode_seq(frames[2])
            except KvEventDecodeError as exc:
                self.rejected.reject(exc)
                await self._replay.send_multipart([identity, b"", REPLAY_END_SEQ, b""])
                continue
            for i, (seq, payload) in enumerate(self.replay_from(start), 1):
                await self._replay.send_multipart([identity, b"", encode_seq(seq), payload])
                if i % REPLAY_YIELD_EVERY == 0:
                    await anyio.lowlevel.checkpoint()
            await self._replay.send_multipart([identity, b"", REPLAY_END_SEQ, b""])

    def close(self) -> None:
        self._pub.close(linger=0)
        self._replay.close(linger=0)


class MetricsPublisher:
    """Publishes ``LoadMetrics`` snapshots under ``LOAD_METRICS_TOPIC``."""

    _encoder = msgspec.msgpack.Encoder()

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._pub = configure(sync_context().socket(zmq.PUB), hwm=1_000)
        self.endpoint = bind_random(self._pub, host)

    def publish(self, metrics: LoadMetrics) -> None:
        try:
            self._pub.send_multipart((LOAD_METRICS_TOPIC, self._encoder.encode(metrics)), flags=zmq.NOBLOCK)
        except zmq.Again:  # pragma: no cover
            pass

    def close(self) -> None:
        self._pub.close(linger=0)


decode_load_metrics = msgspec.msgpack.Decoder(LoadMetrics).decode
