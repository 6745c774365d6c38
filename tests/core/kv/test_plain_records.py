"""Under ``--plane-keys`` no worker record can opt out of encryption: a record saying
``kv_events_plain`` is never subscribed to, is counted (``plain_events``) and logged once, so a
forged record (anyone who can write the discovery store) cannot feed KV events to the index.
Without keys such a record is followed as before.

Real sockets: the forger's PUB is plain ZMQ on its own context (as an engine's own publisher is),
feeding vLLM-format batches; the index is the real ``RadixIndexer``.
"""

from __future__ import annotations

import logging
import time

import anyio
import pytest
import zmq
from prometheus_client import CollectorRegistry

from dyn.core.kv import subscriber as subscriber_module
from dyn.core.kv.convert import KvEventMetrics
from dyn.core.kv.events import BlockStored, KvEventBatch, encode_event_batch, encode_seq
from dyn.core.kv.indexer import RadixIndexer, radix_indexer
from dyn.core.kv.ingest import KvEventIngestor
from dyn.core.messages import WorkerEndpoints, WorkerRecord
from dyn.core.transport.codec import RejectedFrames
from dyn.core.transport.sockets import use_plane_keys, write_plane_keys

pytestmark = pytest.mark.anyio
BS = 4


class PlainForger:
    """A plain PUB on loopback and the worker records that point at it."""

    def __init__(self) -> None:
        self.context = zmq.Context()
        self.pub = self.context.socket(zmq.PUB)
        self.pub.linger = 0
        self.endpoint = f"tcp://127.0.0.1:{self.pub.bind_to_random_port('tcp://127.0.0.1')}"
        self.seq = 0

    def record(self, instance_id: int) -> WorkerRecord:
        return WorkerRecord(
            instance_id=instance_id,
            namespace="ns",
            model_name="m",
            engine="vllm",
            endpoints=WorkerEndpoints(
                request="tcp://127.0.0.1:9", kv_events=self.endpoint, kv_events_plain=True
            ),
            block_size=BS,
            total_kv_blocks=1000,
            max_num_batched_tokens=64,
        )

    def publish(self) -> None:
        block = 5000 + self.seq
        event = BlockStored([block], None, [self.seq % 100] * BS, BS)
        payload = encode_event_batch(KvEventBatch(time.time(), [event], 0))
        self.pub.send_multipart([b"kv-events", encode_seq(self.seq), payload])
        self.seq += 1

    def close(self) -> None:
        self.pub.close()
        self.context.term()


async def fed(ingestor: KvEventIngestor, index: RadixIndexer, forger: PlainForger, keys_on: bool) -> int:
    """Run the ingestor on the forger's records while it publishes for up to 2 s (until the index
    holds something, when it follows them); the blocks indexed."""
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            ingestor.add_worker(forger.record(1))
            ingestor.add_worker(forger.record(2))
            await tg.start(ingestor.run)
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and not (not keys_on and index.workers()):
                forger.publish()
                await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
    return sum(index.blocks_held(worker) for worker in index.workers())


def rejected(registry: CollectorRegistry, labels: dict[str, str], by_worker: bool = False) -> float | None:
    name = "dynamo_component_kv_events_rejected" + ("_by_worker" if by_worker else "") + "_total"
    return registry.get_sample_value(name, labels)


async def test_under_plane_keys_a_plain_record_is_refused_counted_and_logged_once(
    tmp_path, caplog, monkeypatch
):
    monkeypatch.setattr(
        subscriber_module, "_plain_records", RejectedFrames(subscriber_module.log, "record"), raising=False
    )
    use_plane_keys(write_plane_keys(tmp_path / "keys"))
    forger = PlainForger()
    registry, index = CollectorRegistry(), radix_indexer()
    ingestor = KvEventIngestor(index, KvEventMetrics(registry), block_size=BS, event_threads=1)
    try:
        with caplog.at_level(logging.WARNING, logger="dyn.core.kv.subscriber"):
            blocks = await fed(ingestor, index, forger, keys_on=True)
    finally:
        use_plane_keys(None)
        forger.close()
    assert forger.seq > 50  # it published the whole time
    assert blocks == 0 and index.workers() == []
    assert rejected(registry, {"reason": "plain_events"}) == 2
    for worker in ("1", "2"):
        assert rejected(registry, {"worker_id": worker, "reason": "plain_events"}, by_worker=True) == 1
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, lines
    assert "--plane-keys" in lines[0] and "worker 1" in lines[0] and forger.endpoint in lines[0]


async def test_without_plane_keys_a_plain_record_is_followed_as_before():
    forger = PlainForger()
    registry, index = CollectorRegistry(), radix_indexer()
    ingestor = KvEventIngestor(index, KvEventMetrics(registry), block_size=BS, event_threads=1)
    try:
        blocks = await fed(ingestor, index, forger, keys_on=False)
    finally:
        forger.close()
    assert blocks > 0
    assert not rejected(registry, {"reason": "plain_events"})
