"""``POST /register`` and ``POST /unregister`` of ``dyn indexer`` (``RegisteringHttpApp`` over an
``IndexerService``), over real KV-event PUB sockets: what a registered rank publishes is indexed
under it, unregistering drops exactly its blocks, and every refusal says what to fix."""

from __future__ import annotations

from contextlib import asynccontextmanager

import anyio
import httpx
import pytest

from dyn.core.indexer.registration import RegisteringHttpApp
from dyn.core.indexer.service import IndexerService
from dyn.core.indexer.workers import StaticWorker
from dyn.core.kv.events import BlockStored
from dyn.core.kv.hashing import block_hashes
from dyn.core.messages import WorkerEndpoints, WorkerRecord
from dyn.core.transport.event_plane import KvEventPublisher

pytestmark = pytest.mark.anyio

BS = 4
MODEL = "tiny"
TOKENS = list(range(1, 25))  # 6 blocks
LOCAL = block_hashes(TOKENS, BS)


@pytest.fixture
def publishers():
    made = [KvEventPublisher() for _ in range(3)]
    yield made
    for publisher in made:
        publisher.close()


@asynccontextmanager
async def serving(service: IndexerService, publishers):
    """The service running, its replay sockets served, and an HTTP client of its app."""
    app = RegisteringHttpApp(service)
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            for publisher in publishers:
                tg.start_soon(publisher.serve_replay)
            await tg.start(service.run)
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://i"
            ) as client:
                yield client
            tg.cancel_scope.cancel()


async def until(condition, timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.01)


def stored(tokens: list[int], first_hash: int) -> BlockStored:
    return BlockStored([first_hash + i for i in range(len(tokens) // BS)], None, tokens, BS)


def entry(instance_id: int, publisher: KvEventPublisher, **more) -> dict:
    return {
        "instance_id": instance_id,
        "endpoint": publisher.endpoint,
        "replay_endpoint": publisher.replay_endpoint,
        **more,
    }


async def test_registered_ranks_are_indexed_and_unregistering_one_drops_only_its_blocks(store, publishers):
    rank0, rank1, _ = publishers
    rank0.publish([stored(TOKENS, 100)])  # before registration: caught up through the replay socket
    rank1.publish([stored(TOKENS[:8], 200)])
    service = IndexerService(store, MODEL, block_size=BS, static_workers=[], event_threads=1)
    async with serving(service, publishers) as http:
        # Dynamo's body, model_name and block_size included; dyn needs neither
        first = await http.post("/register", json=entry(7, rank0, model_name=MODEL, block_size=BS))
        second = await http.post("/register", json=entry(7, rank1, dp_rank=1))
        assert (first.status_code, first.json()) == (201, {"status": "ok"})
        assert second.status_code == 201
        await until(lambda: service.find_matches(LOCAL) == {(7, 0): 6, (7, 1): 2})
        listed = (await http.get("/workers")).json()
        assert [(w["instance_id"], w["dp_rank"], w["endpoint"]) for w in listed] == [
            (7, 0, rank0.endpoint),
            (7, 1, rank1.endpoint),
        ]

        gone = await http.post("/unregister", json={"instance_id": 7, "dp_rank": 1, "model_name": MODEL})
        assert (gone.status_code, gone.json()) == (200, {"status": "ok"})
        assert service.find_matches(LOCAL) == {(7, 0): 6}
        rank1.publish([stored(TOKENS[:8], 300)])  # no longer followed
        rank0.publish([stored(list(range(100, 112)), 400)])  # 3 blocks of another prompt
        await until(lambda: service.blocks_per_worker() == {(7, 0): 9})

        everything = await http.post("/unregister", json={"instance_id": 7})
        assert everything.status_code == 200
        assert service.blocks_per_worker() == {} and (await http.get("/workers")).json() == []
        again = await http.post("/unregister", json={"instance_id": 7})
        assert again.status_code == 404 and "instance 7 is not registered" in again.json()["error"]

        # registered anew, the rank is followed from scratch
        assert (await http.post("/register", json=entry(7, rank0))).status_code == 201
        await until(lambda: service.blocks_per_worker() == {(7, 0): 9})


async def test_the_first_registration_gives_an_index_without_one_its_block_size(store, publishers):
    publisher = publishers[0]
    publisher.publish([stored(TOKENS, 100)])
    service = IndexerService(store, MODEL, event_threads=1)  # discovery, no worker yet
    async with serving(service, publishers) as http:
        assert (await http.get("/health")).status_code == 503
        unknown = await http.post("/register", json=entry(3, publisher))
        assert unknown.status_code == 409 and "give block_size" in unknown.json()["error"]
        assert (await http.post("/register", json=entry(3, publisher, block_size=BS))).status_code == 201
        assert service.block_size == BS
        await until(lambda: service.blocks_per_worker() == {(3, 0): 6})
        answer = (await http.post("/query", json={"token_ids": TOKENS})).json()
        assert answer["scores"] == {"3": {"0": 6 * BS}}
        assert (await http.get("/health")).json()["status"] == "healthy"


def worker_record(instance_id: int, publisher: KvEventPublisher) -> WorkerRecord:
    return WorkerRecord(
        instance_id=instance_id,
        namespace="ns",
        model_name=MODEL,
        engine="mocker",
        endpoints=WorkerEndpoints(request="tcp://127.0.0.1:1", kv_events=publisher.endpoint),
        block_size=BS,
        total_kv_blocks=100,
        max_num_batched_tokens=100,
    )


async def test_an_instance_is_followed_through_discovery_or_registration_never_both(store, publishers):
    discovered, registered, _ = publishers
    service = IndexerService(store, MODEL, block_size=BS, event_threads=1)
    async with serving(service, publishers) as http:
        await store.put(worker_record(1, discovered), 30)
        await until(lambda: 1 in {key[0] for key in service.worker_endpoints()})
        refused = await http.post("/register", json=entry(1, registered))
        assert refused.status_code == 409 and "followed through discovery" in refused.json()["error"]

        assert (await http.post("/register", json=entry(2, registered))).status_code == 201
        await store.put(worker_record(2, discovered), 30)  # a worker under a registered id
        await anyio.sleep(0.1)
        assert service.worker_endpoints()[(2, 0)] == registered.endpoint
        assert service.ingestor.subscriber(2) is None  # no second subscription


@pytest.mark.parametrize(
    ("body", "status", "complaint"),
    [
        ({"model_name": "another"}, 409, "model_name 'another' is not indexed here"),
        ({"block_size": BS * 2}, 409, f"block_size {BS * 2} differs from this index's {BS}"),
        ({"tenant_id": "team-a"}, 409, "tenants are not built"),
        ({"endpoint": "127.0.0.1:5557"}, 409, "is not a ZMQ address"),
        ({"replay_endpoint": "nowhere"}, 409, "the replay_endpoint 'nowhere' is not a ZMQ address"),
        ({"instance_id": -1}, 400, "instance_id"),
        ({"instance_id": 1 << 64}, 400, "instance_id"),
        ({"dp_rank": "one"}, 400, "dp_rank"),
        ({"endpoint": "tcp://" + "h" * 2000}, 400, "endpoint"),
    ],
)
async def test_a_refused_registration_says_what_to_fix(store, publishers, body, status, complaint):
    service = IndexerService(store, MODEL, block_size=BS, static_workers=[], event_threads=1)
    async with serving(service, publishers) as http:
        answer = await http.post("/register", json={**entry(5, publishers[0]), **body})
        assert answer.status_code == status, answer.text
        assert complaint in answer.json()["error"]
        assert (await http.get("/workers")).json() == []


async def test_a_second_registration_of_a_rank_and_too_many_sockets_are_refused(
    store, publishers, monkeypatch
):
    service = IndexerService(store, MODEL, block_size=BS, static_workers=[], event_threads=1)
    monkeypatch.setattr("dyn.core.indexer.service.MAX_REGISTERED", 2)
    async with serving(service, publishers) as http:
        assert (await http.post("/register", json=entry(5, publishers[0]))).status_code == 201
        twice = await http.post("/register", json=entry(5, publishers[1]))
        assert twice.status_code == 409 and "already registered" in twice.json()["error"]
        assert (await http.post("/register", json=entry(5, publishers[1], dp_rank=1))).status_code == 201
        full = await http.post("/register", json=entry(6, publishers[2]))
        assert full.status_code == 409 and "2 sockets are followed already" in full.json()["error"]
        unknown_tenant = await http.post("/unregister", json={"instance_id": 5, "tenant_id": "team-a"})
        assert unknown_tenant.status_code == 404 and "tenants are not built" in unknown_tenant.json()["error"]
        metrics = (await http.get("/metrics")).text
    # a 201 is a success, the refusals are errors
    assert 'dynamo_kvindexer_errors_total{endpoint="register"} 2.0' in metrics
    assert 'dynamo_kvindexer_requests_total{endpoint="register"} 4.0' in metrics


def test_static_workers_over_the_limit_are_refused_at_start(store, monkeypatch):
    from dyn.core.errors import ConfigError

    monkeypatch.setattr("dyn.core.indexer.service.MAX_REGISTERED", 1)
    many = [StaticWorker(i, 0, f"tcp://127.0.0.1:{5000 + i}") for i in range(2)]
    with pytest.raises(ConfigError, match="over 1 sockets"):
        IndexerService(store, MODEL, block_size=BS, static_workers=many, event_threads=1)
