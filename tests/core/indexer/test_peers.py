"""A starting ``dyn indexer`` copies a peer's index (``dyn.core.indexer.peers``), and its peer list
over HTTP (``/peers``, ``/register_peer``, ``/deregister_peer``)."""

from __future__ import annotations

import httpx
import msgspec
import pytest

from dyn.core.errors import ConfigError
from dyn.core.indexer import peers
from dyn.core.indexer.peers import MAX_PEERS, PeerList, recover
from dyn.core.indexer.registration import RegisteringHttpApp
from dyn.core.indexer.service import IndexerService
from dyn.core.kv.hashing import block_hashes
from dyn.core.kv.indexer import radix_indexer
from dyn.core.kv.views import dump_body

pytestmark = pytest.mark.anyio

BS = 4
MODEL = "tiny"
TOKENS = list(range(1, 25))  # 6 blocks
LOCAL = block_hashes(TOKENS, BS)


def filled(store) -> IndexerService:
    service = IndexerService(store, MODEL, block_size=BS, static_workers=[], event_threads=1)
    service.indexer.store((11, 0), None, [100 + i for i in range(6)], LOCAL)
    service.indexer.store((22, 1), None, [200, 201], LOCAL[:2])
    service.indexer.store((22, 1), 201, [202], [LOCAL[5]])  # a branch off the shared prefix
    return service


def peers_answering(answers: dict[str, object]) -> httpx.MockTransport:
    """Each host answers its ``/dump`` with the given JSON (an int: that status; absent: refused)."""

    def handle(request: httpx.Request) -> httpx.Response:
        answer = answers.get(request.url.host)
        if answer is None:
            raise httpx.ConnectError("connection refused", request=request)
        if isinstance(answer, int):
            return httpx.Response(answer, json={"error": "no"})
        return httpx.Response(200, content=msgspec.json.encode(answer))

    return httpx.MockTransport(handle)


async def test_a_new_index_gets_every_block_of_the_first_usable_peer(store, caplog):
    source = filled(store)
    other_model = {"another": {"block_size": BS, "events": []}}
    other_size = {MODEL: {"block_size": BS * 2, "events": []}}
    transport = peers_answering(
        {"broken": 500, "other": other_model, "sized": other_size, "good": dump_body(source)}
    )
    index = radix_indexer()
    urls = [f"http://{host}:8090" for host in ("down", "broken", "other", "sized", "good")]
    recovered = await recover(index, MODEL, BS, urls, transport=transport)
    assert recovered == ("http://good:8090", BS, 9)
    # an index that knows no block size takes the first dump's
    assert await recover(radix_indexer(), MODEL, None, urls[3:], transport=transport) == (
        "http://sized:8090",
        8,
        0,
    )
    assert index.find_matches(LOCAL) == source.indexer.find_matches(LOCAL) == {(11, 0): 6, (22, 1): 2}
    assert index.find_matches(LOCAL[:2] + [LOCAL[5]]) == {(11, 0): 2, (22, 1): 3}
    assert sorted(index.dump(), key=repr) == sorted(source.indexer.dump(), key=repr)
    said = caplog.text
    assert "peer http://down:8090: not recovered from" in said
    assert "answered 500" in said and "not 'tiny'" in said and "its block size is 8" in said


async def test_an_oversized_dump_is_not_read(store, monkeypatch):
    monkeypatch.setattr(peers, "MAX_DUMP_BYTES", 100)
    transport = peers_answering({"big": dump_body(filled(store))})
    index = radix_indexer()
    assert await recover(index, MODEL, BS, ["http://big:1"], transport=transport) is None
    assert index.size == 0


async def test_the_peer_list_over_http(store):
    service = IndexerService(store, MODEL, block_size=BS, peers=["http://a:1/"], event_threads=1)
    app = RegisteringHttpApp(service)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://i") as http:
        assert (await http.get("/peers")).json() == ["http://a:1"]
        assert (await http.post("/register_peer", json={"url": "http://b:2"})).status_code == 201
        assert (await http.post("/register_peer", json={"url": "http://b:2"})).status_code == 201  # again
        bad = await http.post("/register_peer", json={"url": "b:2"})
        assert bad.status_code == 409 and "is not an indexer's HTTP base URL" in bad.json()["error"]
        assert (await http.get("/peers")).json() == ["http://a:1", "http://b:2"]
        assert (await http.post("/deregister_peer", json={"url": "http://a:1"})).status_code == 200
        missing = await http.post("/deregister_peer", json={"url": "http://a:1"})
        assert missing.status_code == 404 and missing.json() == {"error": "peer not found"}
        assert (await http.get("/peers")).json() == ["http://b:2"]


def test_peers_are_bounded_and_checked_at_start(store):
    full = PeerList([f"http://p{i}:1" for i in range(MAX_PEERS)])
    with pytest.raises(ValueError, match=f"{MAX_PEERS} peers are known already"):
        full.add("http://one-more:1")
    with pytest.raises(ConfigError, match="--peers: 'ftp://x' is not"):
        IndexerService(store, MODEL, block_size=BS, peers=["ftp://x"], event_threads=1)
