"""``IndexerService`` over real loopback sockets: the ZMQ query plane, the ``RemoteIndexer``
client, static ``--workers`` and discovery-fed membership, and its discovery record."""

from __future__ import annotations

from contextlib import asynccontextmanager

import anyio
import msgspec
import pytest
import zmq

from dyn.core.indexer.client import (
    IndexerQueryError,
    RemoteIndexer,
    indexers_namespace,
    resolve_indexer_address,
)
from dyn.core.indexer.service import IndexerService
from dyn.core.indexer.workers import StaticWorker
from dyn.core.kv.events import BlockStored, StorageTier
from dyn.core.kv.hashing import block_hashes
from dyn.core.kv.tiers import TierHits
from dyn.core.messages import (
    OverlapAnswer,
    OverlapQuery,
    OverlapRefused,
    WorkerEndpoints,
    WorkerRecord,
)
from dyn.core.transport.codec import decode_indexer_message, encode
from dyn.core.transport.event_plane import KvEventPublisher
from dyn.core.transport.sockets import async_context, bind_random, configure

pytestmark = pytest.mark.anyio

BS = 4
MODEL = "tiny"
TOKENS = list(range(1, 25))  # 6 blocks
LOCAL = block_hashes(TOKENS, BS)


@asynccontextmanager
async def running(service: IndexerService):
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(service.run)
            yield service
            tg.cancel_scope.cancel()


async def until(condition, timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.01)


def filled_service(store, **kwargs) -> IndexerService:
    service = IndexerService(store, MODEL, block_size=BS, static_workers=[], event_threads=1, **kwargs)
    service.indexer.store((11, 0), None, [100 + i for i in range(6)], LOCAL)
    service.indexer.store((22, 1), None, [200, 201], LOCAL[:2])
    return service


def stored(tokens: list[int], parent: int | None, first_hash: int) -> BlockStored:
    n = len(tokens) // BS
    return BlockStored([first_hash + i for i in range(n)], parent, tokens, BS)


# --------------------------------------------------------------------------- queries


async def test_remote_indexer_gets_the_indexers_scores_by_hash_and_by_tokens(store):
    async with running(filled_service(store)) as service:
        async with RemoteIndexer(service.endpoint) as remote:
            by_hash = await remote.find_matches(LOCAL + [999])
            by_tokens = await remote.find_matches_for_tokens(TOKENS)
            nothing = await remote.find_matches([12345])
            assert remote.block_size == BS
    assert by_hash == by_tokens == {(11, 0): 6, (22, 1): 2}
    assert nothing == {}


async def test_lower_tier_hits_are_answered_over_zmq_and_http_beside_the_device_scores(store):
    """Worker 11 holds 2 blocks on device, the next 2 in host memory and 1 more on disk; worker
    33 holds the first 3 in host memory only."""
    import httpx

    from dyn.core.kv.views import IndexerHttpApp

    service = IndexerService(store, MODEL, block_size=BS, static_workers=[], event_threads=1)
    assert service.lower is not None
    host, disk = (service.lower.by_tier[t] for t in (StorageTier.HOST_PINNED, StorageTier.DISK))
    service.indexer.store((11, 0), None, [100, 101], LOCAL[:2])
    host.store((11, 0), 101, [102, 103], LOCAL[2:4])
    disk.store((11, 0), 103, [104], LOCAL[4:5])
    host.store((33, 0), None, [300, 301, 302], LOCAL[:3])
    async with running(service):
        async with RemoteIndexer(service.endpoint) as remote:
            scores, tiers = await remote.find_tiered_matches(LOCAL)
            assert await remote.find_matches(LOCAL) == scores
        app = IndexerHttpApp(service, service.metrics)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://i") as c:
            body = (await c.post("/query", json={"token_ids": TOKENS})).json()
    assert scores == {(11, 0): 2}
    assert tiers == {(11, 0): TierHits(2, 1), (33, 0): TierHits(3, 0)}
    assert body["scores"] == {"11": {"0": 2 * BS}}
    assert body["instances"] == {
        "11": {"longest_matched": 2 * BS, "dp": {"0": 2 * BS}, "cpu": 4 * BS, "disk": 5 * BS},
        "33": {"longest_matched": 0, "dp": {}, "cpu": 3 * BS, "disk": 3 * BS},
    }


async def test_static_workers_lower_tier_events_are_indexed_under_their_registered_rank(store):
    publisher = KvEventPublisher()
    device = stored(TOKENS[:8], None, 500)
    offloaded = stored(TOKENS[8:16], 501, 502)
    offloaded.medium = "CPU_PINNED"
    publisher.publish([device, offloaded])
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.serve_replay)
            service = IndexerService(
                store,
                MODEL,
                block_size=BS,
                event_threads=1,
                static_workers=[StaticWorker(5, 2, publisher.endpoint, publisher.replay_endpoint)],
            )
            assert service.lower is not None
            host = service.lower.by_tier[StorageTier.HOST_PINNED]
            async with running(service):
                await until(lambda: host.blocks_per_worker() == {(5, 2): 2})
                answer = service.answer(OverlapQuery(1, block_hashes=LOCAL))
            tg.cancel_scope.cancel()
    finally:
        publisher.close()
    assert isinstance(answer, OverlapAnswer)
    assert answer.scores == [(5, 2, 2)] and answer.tiers == [(5, 2, 2, 0)]


async def test_malformed_frames_are_refused_with_a_reason_and_the_service_keeps_answering(store):
    async with running(filled_service(store)) as service:
        dealer = configure(async_context().socket(zmq.DEALER))
        dealer.connect(service.endpoint)
        try:

            async def ask(frames: list[bytes]):
                await dealer.send_multipart(frames)
                with anyio.fail_after(5):
                    return decode_indexer_message(await dealer.recv_multipart())

            garbage = await ask([b"q", b"\xc1not msgpack"])
            typed = await ask([b"q", msgspec.msgpack.encode([7, "not a list"])])
            one_frame = await ask([b"q"])
            wrong_kind = await ask(encode(OverlapAnswer(3, BS, [])))
            both = await ask(encode(OverlapQuery(8, token_ids=[1], block_hashes=[1])))
            negative = await ask(encode(OverlapQuery(9, block_hashes=[-1])))
            good = await ask(encode(OverlapQuery(10, block_hashes=LOCAL[:1])))
            # the three that could not be decoded are counted (the refusals of readable queries are not)
            assert service._rpc.rejected.total == 3
        finally:
            dealer.close(linger=0)
    assert isinstance(garbage, OverlapRefused) and garbage.query_id == -1
    assert isinstance(typed, OverlapRefused) and typed.query_id == 7 and "token_ids" in typed.message
    assert isinstance(one_frame, OverlapRefused) and "2 frames" in one_frame.message
    assert isinstance(wrong_kind, OverlapRefused) and "OverlapQuery" in wrong_kind.message
    assert isinstance(both, OverlapRefused) and both.query_id == 8 and "exactly one" in both.message
    assert isinstance(negative, OverlapRefused) and "block_hashes" in negative.message
    assert good == OverlapAnswer(10, BS, [(11, 0, 1), (22, 1, 1)])


async def test_token_query_before_the_block_size_is_known_is_refused(store):
    service = IndexerService(store, MODEL, event_threads=1)
    async with running(service):
        async with RemoteIndexer(service.endpoint) as remote:
            with pytest.raises(IndexerQueryError, match="block size is not known"):
                await remote.find_matches_for_tokens(TOKENS)
            assert await remote.find_matches(LOCAL) == {}


async def test_remote_indexer_times_out_on_a_silent_indexer_and_refuses_when_not_running():
    silent = configure(async_context().socket(zmq.ROUTER))
    endpoint = bind_random(silent, "127.0.0.1")
    try:
        remote = RemoteIndexer(endpoint, timeout_s=0.2)
        with pytest.raises(IndexerQueryError, match="not running"):
            await remote.find_matches(LOCAL)
        async with remote:
            with pytest.raises(TimeoutError, match="did not answer"):
                await remote.find_matches(LOCAL)
            assert remote._rpc.pending == 0
    finally:
        silent.close(linger=0)


def test_remote_indexer_wants_a_zmq_address():
    with pytest.raises(ValueError, match="not a ZMQ address"):
        RemoteIndexer("localhost:5555")


# --------------------------------------------------------------------------- membership


async def test_static_workers_are_indexed_under_their_registered_rank(store):
    publisher = KvEventPublisher()
    publisher.publish([stored(TOKENS, None, 500)])  # before the indexer: caught up by replay
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.serve_replay)
            service = IndexerService(
                store,
                MODEL,
                block_size=BS,
                event_threads=1,
                static_workers=[StaticWorker(5, 2, publisher.endpoint, publisher.replay_endpoint)],
            )
            async with running(service):
                await until(lambda: service.blocks_per_worker().get((5, 2)) == 6)
                publisher.publish([stored(TOKENS[:8], None, 700)], dp_rank=3)  # batch rank wins
                await until(lambda: service.blocks_per_worker().get((5, 3)) == 2)
                assert service.find_matches(LOCAL) == {(5, 2): 6, (5, 3): 2}
                assert service.worker_endpoints() == {(5, 2): publisher.endpoint, (5, 3): publisher.endpoint}
            tg.cancel_scope.cancel()
    finally:
        publisher.close()


def worker_record(
    instance_id: int, publisher: KvEventPublisher, *, model: str = MODEL, block_size: int = BS
) -> WorkerRecord:
    return WorkerRecord(
        instance_id=instance_id,
        namespace="ns",
        model_name=model,
        engine="mocker",
        endpoints=WorkerEndpoints(
            request="tcp://127.0.0.1:1", kv_events=publisher.endpoint, kv_replay=publisher.replay_endpoint
        ),
        block_size=block_size,
        total_kv_blocks=100,
        max_num_batched_tokens=100,
    )


async def test_discovered_workers_are_followed_and_dropped_when_they_leave(store):
    ours, other = KvEventPublisher(), KvEventPublisher()
    ours.publish([stored(TOKENS, None, 500)])
    other.publish([stored(TOKENS, None, 900)])
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ours.serve_replay)
            tg.start_soon(other.serve_replay)
            service = IndexerService(store, MODEL, event_threads=1)
            async with running(service):
                await store.put(worker_record(1, ours), 30)
                await store.put(worker_record(2, other, model="another-model"), 30)
                await until(lambda: service.blocks_per_worker().get((1, 0)) == 6)
                assert service.block_size == BS  # learnt from the first worker
                assert service.worker_endpoints() == {(1, 0): ours.endpoint}
                await store.delete(1)
                await until(lambda: not service.worker_endpoints())
                assert service.blocks_per_worker() == {} and service.find_matches(LOCAL) == {}
            tg.cancel_scope.cancel()
    finally:
        ours.close()
        other.close()


async def test_announce_registers_the_indexer_where_routers_resolve_it(store):
    service = filled_service(store)
    args = ("ns", "memory", store.hub.name)
    async with running(service):
        async with service.announce("http://127.0.0.1:1") as record:
            assert record.namespace == indexers_namespace("ns") and record.block_size == BS
            assert await resolve_indexer_address(*args, MODEL) == service.endpoint
            assert await resolve_indexer_address(*args, None) == service.endpoint
            assert await resolve_indexer_address(*args, "another-model") is None
        assert await resolve_indexer_address(*args, MODEL) is None


async def test_a_block_size_learnt_after_announcing_is_put_into_the_record(store):
    publisher = KvEventPublisher()
    service = IndexerService(store, MODEL, event_threads=1)
    registry = store.for_namespace(indexers_namespace("ns"))
    try:
        async with running(service), service.announce("http://127.0.0.1:1"):
            assert [r.block_size for r in await registry.list()] == [0]
            await store.put(worker_record(1, publisher), 30)
            with anyio.fail_after(5):
                while [r.block_size for r in await registry.list()] != [BS]:
                    await anyio.sleep(0.01)
    finally:
        publisher.close()
