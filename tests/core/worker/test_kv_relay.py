"""Under ``--plane-keys`` a worker relays the KV events its engine publishes itself (vLLM, SGLang):
its record names the relay's CurveZMQ sockets (``kv_events_plain`` false), a keyed router follows
them, batches the engine's live stream dropped come back through the engine's replay, and an
engine socket other hosts could reach is refused. Without keys nothing changes.

The engine is a small fake with vLLM's publisher protocol (``vllm/distributed/kv_events.py``):
a plain PUB and replay ROUTER on its own ZMQ context, bound where dyn tells vLLM to bind them under
the keys (``sockets.private_endpoint``); real discovery files, sockets and ``RadixIndexer``.
"""

from __future__ import annotations

import time

import anyio
import pytest
import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry

from dyn.core.config import DiscoveryConfig
from dyn.core.engine import EngineInfo, EngineStartError
from dyn.core.kv.convert import KvEventMetrics
from dyn.core.kv.events import REPLAY_END_SEQ, BlockStored, KvEventBatch, encode_event_batch, encode_seq
from dyn.core.kv.indexer import radix_indexer
from dyn.core.kv.ingest import KvEventIngestor
from dyn.core.messages import LoadMetrics
from dyn.core.transport.sockets import private_endpoint, use_plane_keys, write_plane_keys
from dyn.core.worker.host import WorkerHost
from dyn.core.worker.runner import run_hosts
from dyn.core.worker.settings import WorkerSettings
from tests.memory_discovery import memory_store
from tests.waiting import wait_until

pytestmark = pytest.mark.anyio
BS = 4


class PlainPublishingEngine:
    """Publishes KV events itself, in plain ZMQ, as vLLM does; ``publish(k, live=False)`` keeps a
    batch for replay without sending it (a batch the PUB dropped)."""

    def __init__(self, events: str | None = None, replay: str | None = None) -> None:
        self.events = events or private_endpoint("kv-events")
        self.replay = replay or private_endpoint("kv-replay")
        self.info = EngineInfo(block_size=BS, total_kv_blocks=1000, max_num_batched_tokens=64)
        self.sent: list[tuple[int, bytes]] = []
        self.next_seq = 0
        self.context = zmq.asyncio.Context()
        self.pub: zmq.asyncio.Socket | None = None

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED):
        self.pub = self.context.socket(zmq.PUB)
        router = self.context.socket(zmq.ROUTER)
        try:
            if self.events.startswith("ipc://"):
                self.pub.bind(self.events)
                router.bind(self.replay)
            self.info.kv_events_endpoint, self.info.kv_replay_endpoint = self.events, self.replay
            self.info.kv_events_topic = "kv-events"
            task_status.started()
            while True:
                identity, _, start = await router.recv_multipart()
                for seq, payload in self.sent:
                    if seq >= int.from_bytes(start, "big"):
                        await router.send_multipart([identity, b"", encode_seq(seq), payload])
                await router.send_multipart([identity, b"", REPLAY_END_SEQ, b""])
        finally:
            self.pub.close(linger=0)
            router.close(linger=0)

    def publish(self, k: int, *, live: bool = True) -> None:
        event = BlockStored([7000 + k], None, [k] * BS, BS)
        seq, payload = self.next_seq, encode_event_batch(KvEventBatch(time.time(), [event], 0))
        self.next_seq += 1
        self.sent.append((seq, payload))
        if live:
            assert self.pub is not None
            self.pub.send_multipart([b"kv-events", encode_seq(seq), payload])

    async def generate(self, request):
        yield  # pragma: no cover - no requests here

    async def abort(self, request_id):
        return False

    def load_metrics(self):
        return [LoadMetrics(0, 0, 0.0, 0, 0, 0, 1000, 0.0)]


def worker_host(tmp_path, engine) -> WorkerHost:
    return WorkerHost(
        engine,
        engine_name="vllm",
        model_name="m",
        store=memory_store(tmp_path / "discovery", "t"),
        settings=WorkerSettings(discovery=DiscoveryConfig(namespace="t")),
    )


@pytest.fixture
def keys(tmp_path):
    use_plane_keys(write_plane_keys(tmp_path / "keys"))
    yield
    use_plane_keys(None)


async def test_a_keyed_router_follows_an_engines_plain_events_through_the_relay(tmp_path, keys):
    engine = PlainPublishingEngine()
    host = worker_host(tmp_path, engine)
    index, registry = radix_indexer(), CollectorRegistry()
    ingestor = KvEventIngestor(index, KvEventMetrics(registry), block_size=BS, event_threads=1)

    def lost() -> float | None:
        labels = {"reason": "replay_incomplete"}
        return registry.get_sample_value("dynamo_component_kv_events_rejected_total", labels)

    stop = anyio.Event()
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(host.run, stop)
            (record,) = await host.store.list()
            endpoints = record.endpoints
            assert endpoints.kv_events_plain is False and record.kv_events_topic == "kv-events"
            assert endpoints.kv_events.startswith("tcp://127.0.0.1:") and endpoints.kv_replay
            assert engine.events not in (endpoints.kv_events, endpoints.kv_replay)

            # events the engine stored before the router came are replayed by the relay
            for k in range(3):
                engine.publish(k)
            await wait_until(lambda: host.kv_relay.publisher.next_seq == 3, 10, "the relay to take 3")
            ingestor.add_worker(record)
            await tg.start(ingestor.run)
            await wait_until(lambda: index.blocks_held((record.instance_id, 0)) == 3, 10, "3 blocks")

            # two batches the engine's PUB dropped reach the router through the engine's replay
            engine.publish(3, live=False)
            engine.publish(4, live=False)
            engine.publish(5)
            await wait_until(lambda: index.blocks_held((record.instance_id, 0)) == 6, 10, "6 blocks")
            assert [seq for seq, _ in host.kv_relay.publisher.replay_from(0)] == list(range(6))

            # a batch the engine lost for good (gone from its replay too) is a gap the router counts
            engine.publish(6, live=False)
            del engine.sent[6]
            engine.publish(7)
            await wait_until(lambda: lost() == 1, 10, "the lost batch counted by the router")
            assert [seq for seq, _ in host.kv_relay.publisher.replay_from(0)] == [0, 1, 2, 3, 4, 5, 7]
            await wait_until(lambda: index.blocks_held((record.instance_id, 0)) == 7, 10, "7 blocks")

            # the relay's PUB is CurveZMQ: a subscriber without the keys hears nothing
            bare = zmq.asyncio.Context().socket(zmq.SUB)
            bare.linger = 0
            bare.subscribe(b"")
            bare.connect(endpoints.kv_events)
            for k in range(8, 12):
                engine.publish(k)
                await anyio.sleep(0.05)
            assert await bare.poll(500) == 0
            bare.close()
            await wait_until(lambda: index.blocks_held((record.instance_id, 0)) == 11, 10, "11 blocks")
            stop.set()
            tg.cancel_scope.cancel()


async def test_without_plane_keys_the_engines_own_sockets_are_advertised_as_before(tmp_path):
    engine = PlainPublishingEngine(*(f"tcp://127.0.0.1:{port}" for port in (5, 6)))
    host = worker_host(tmp_path, engine)
    stop = anyio.Event()
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(host.run, stop)
            (record,) = await host.store.list()
            assert getattr(host, "kv_relay", None) is None
            assert (record.endpoints.kv_events, record.endpoints.kv_replay) == (engine.events, engine.replay)
            assert record.endpoints.kv_events_plain is True
            stop.set()


@pytest.mark.parametrize("events", ["tcp://*:5557", "tcp://0.0.0.0:5557", "tcp://10.0.0.5:5557"])
async def test_under_plane_keys_an_engine_socket_other_hosts_can_reach_is_refused(tmp_path, keys, events):
    host = worker_host(tmp_path, PlainPublishingEngine(events, "ipc:///nowhere"))
    with pytest.raises(EngineStartError, match="--plane-keys") as refused:
        with anyio.fail_after(20):
            await run_hosts([host])
    assert events in str(refused.value)
    assert await host.store.list() == []
