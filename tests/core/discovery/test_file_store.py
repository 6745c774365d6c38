"""The file discovery backend: registration, namespaces, watching, expiry, leases, bad files."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from contextlib import aclosing
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from dyn.core.discovery import (
    EtcdDiscoveryStore,
    FileDiscoveryStore,
    LeaseExpired,
    WorkerAdded,
    WorkerRemoved,
    default_root,
    file_store,
    open_store,
)
from dyn.core.discovery.file_store import DiscoveryDirError
from dyn.core.messages import WorkerRecord
from tests.core.discovery import conformance

pytestmark = pytest.mark.anyio

NS = "test-ns"


def make_record(instance_id: int, namespace: str = NS, **changes) -> WorkerRecord:
    return conformance.make_record(instance_id, namespace, **changes)


def backdate(path: Path, seconds: float) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


class ManualClock:
    """A store clock that moves only when ``advance`` is called; sleepers wake when it passes
    their deadline (the store's expiry timer, the lease heartbeat)."""

    def __init__(self) -> None:
        self.now = time.time()
        self._sleepers: list[tuple[float, anyio.Event]] = []

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        wake = anyio.Event()
        entry = (self.now + seconds, wake)
        if seconds <= 0:
            await anyio.lowlevel.checkpoint()
            return
        self._sleepers.append(entry)
        try:
            await wake.wait()
        finally:
            self._sleepers.remove(entry)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for deadline, wake in self._sleepers:
            if deadline <= self.now:
                wake.set()

    async def sleeping(self) -> None:
        """Return once some task sleeps on this clock (so an ``advance`` wakes it)."""
        while not self._sleepers:
            await anyio.sleep(0.005)


async def next_event(events, timeout: float = 10.0):
    with anyio.fail_after(timeout):
        return await anext(events)


async def test_put_then_list_sorted(tmp_path: Path) -> None:
    store = FileDiscoveryStore(tmp_path, NS)
    assert await store.list() == []
    with anyio.fail_after(10):
        await store.put(make_record(7), ttl_s=30)
        await store.put(make_record(3), ttl_s=30)
        assert await store.list() == [make_record(3), make_record(7)]
        assert store.path_of(7) == tmp_path / NS / "instances" / "7.json"
        assert store.path_of(7).is_file()
        await store.put(make_record(7, total_kv_blocks=2048), ttl_s=30)
        assert await store.list() == [make_record(3), make_record(7, total_kv_blocks=2048)]
        # another store instance (another process, in real life) sees the same records
        assert await FileDiscoveryStore(tmp_path, NS).list() == await store.list()


async def test_namespaces_are_isolated(tmp_path: Path) -> None:
    a = FileDiscoveryStore(tmp_path, "stack-a")
    b = FileDiscoveryStore(tmp_path, "stack-b")
    with anyio.fail_after(10):
        await a.put(make_record(1, "stack-a"), ttl_s=30)
        await b.put(make_record(2, "stack-b"), ttl_s=30)
        assert [r.instance_id for r in await a.list()] == [1]
        assert [r.instance_id for r in await b.list()] == [2]


async def test_put_rejects_record_of_other_namespace_and_bad_ttl(tmp_path: Path) -> None:
    store = FileDiscoveryStore(tmp_path, NS)
    with pytest.raises(ValueError, match="namespace"):
        await store.put(make_record(1, "other"), ttl_s=30)
    for ttl in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="ttl_s"):
            await store.put(make_record(1), ttl_s=ttl)
    assert await store.list() == []


@pytest.mark.parametrize("namespace", ["", ".", "..", "a/b", "a\\b", "a b", "ns:1", "x" * 129, "é"])
def test_invalid_namespace_rejected(tmp_path: Path, namespace: str) -> None:
    with pytest.raises(ValueError, match="invalid namespace"):
        FileDiscoveryStore(tmp_path, namespace)
    with pytest.raises(ValueError, match="invalid namespace"):
        open_store("file", namespace, tmp_path)


def test_valid_namespaces_accepted(tmp_path: Path) -> None:
    for namespace in ("dynamo", "my-stack_2", "v1.2", "..a", "A"):
        assert FileDiscoveryStore(tmp_path, namespace).namespace == namespace


def test_open_store(tmp_path: Path) -> None:
    store = open_store("file", NS, str(tmp_path))
    assert isinstance(store, FileDiscoveryStore)
    assert store.directory == tmp_path / NS / "instances"
    etcd = open_store("etcd", NS, etcd_endpoints="127.0.0.1:2379,http://etcd-1:2379", check=False)
    assert isinstance(etcd, EtcdDiscoveryStore)
    assert etcd.endpoints == ("http://127.0.0.1:2379", "http://etcd-1:2379")
    with pytest.raises(ValueError, match="invalid etcd endpoint 'ftp://x'"):
        open_store("etcd", NS, etcd_endpoints="ftp://x")
    with pytest.raises(ValueError, match="unknown discovery backend 'consul'.*file"):
        open_store("consul", NS)


def test_default_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DYN_DISCOVERY_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    assert default_root() == tmp_path / "explicit"
    monkeypatch.delenv("DYN_DISCOVERY_DIR")
    assert default_root() == tmp_path / "xdg" / "dyn"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    assert default_root() == tmp_path / "tmp" / f"dyn-{os.getuid()}"
    assert open_store("file", NS).root == default_root()
    assert os.stat(default_root()).st_mode & 0o777 == 0o700  # made private


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722, 0o1777])
def test_a_root_other_users_may_write_to_is_refused(tmp_path: Path, mode: int) -> None:
    root = tmp_path / "root"
    root.mkdir()
    root.chmod(mode)
    with pytest.raises(
        DiscoveryDirError,
        match=rf"{root} is writable by other users \(mode {mode:o}\).*"
        rf"chmod 700 {root}.*--discovery-dir",
    ):
        FileDiscoveryStore(root, NS)
    with pytest.raises(ValueError):  # what every caller of open_store turns into its own error
        open_store("file", NS, root)
    assert list(root.iterdir()) == []
    root.chmod(0o755)  # readable by others is allowed; writable is not
    assert FileDiscoveryStore(root, NS).root == root


def test_a_root_owned_by_someone_else_or_reached_through_their_link_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        with pytest.raises(DiscoveryDirError, match="belongs to user id 0, not to you"):
            FileDiscoveryStore("/", NS)
        return
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(DiscoveryDirError, match=f"{theirs} belongs to user id 65534, not to you"):
        FileDiscoveryStore(theirs, NS)
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(ours)
    assert FileDiscoveryStore(link, NS).root == link  # our own link to our own directory
    os.lchown(link, 65534, 65534)  # their link could be re-pointed at any time
    with pytest.raises(DiscoveryDirError, match="belongs to user id 65534"):
        FileDiscoveryStore(link, NS)


def test_a_missing_root_is_created_private_and_a_file_is_refused(tmp_path: Path) -> None:
    store = FileDiscoveryStore(tmp_path / "a" / "b", NS)
    assert os.stat(store.root).st_mode & 0o777 == 0o700
    (tmp_path / "file").write_text("x")
    with pytest.raises(DiscoveryDirError, match="cannot create the discovery directory"):
        FileDiscoveryStore(tmp_path / "file", NS)


async def test_expired_record_is_not_listed_and_is_collected(tmp_path: Path) -> None:
    clock = ManualClock()
    store = FileDiscoveryStore(tmp_path, NS, clock=clock)
    with anyio.fail_after(10):
        await store.put(make_record(1), ttl_s=5)
        clock.advance(6)
        await store.put(make_record(2), ttl_s=5)
        assert store.path_of(2).stat().st_mtime == clock.time()  # the mtime written is the clock's
        assert [r.instance_id for r in await store.list()] == [2]
        assert not store.path_of(1).exists()
        assert store.path_of(2).exists()


async def test_collection_spares_a_refreshed_record(tmp_path: Path) -> None:
    clock = ManualClock()
    store = FileDiscoveryStore(tmp_path, NS, clock=clock)
    with anyio.fail_after(10):
        await store.put(make_record(1), ttl_s=5)
        # a scan saw it stale, then its worker refreshed it before the re-check
        assert store._remove_if_stale(store.path_of(1), 5) is False
        assert store.path_of(1).exists()
        clock.advance(6)
        assert store._remove_if_stale(store.path_of(1), 5) is True
        assert not store.path_of(1).exists()


async def test_keepalive_refreshes_or_reports_lost_lease(tmp_path: Path) -> None:
    clock = ManualClock()
    store = FileDiscoveryStore(tmp_path, NS, clock=clock)
    with anyio.fail_after(10):
        with pytest.raises(LeaseExpired):
            await store.keepalive(1)
        await store.put(make_record(1), ttl_s=5)
        clock.advance(3)
        await store.keepalive(1)
        assert store.path_of(1).stat().st_mtime == clock.time()
        clock.advance(6)
        with pytest.raises(LeaseExpired):
            await store.keepalive(1)
        await store.delete(1)
        await store.delete(1)  # absent: not an error
        with pytest.raises(LeaseExpired):
            await store.keepalive(1)


async def test_watch_sees_add_change_deregister_and_expiry(tmp_path: Path) -> None:
    clock = ManualClock()
    store = FileDiscoveryStore(tmp_path, NS, poll_interval_s=0.05, clock=clock)
    other = FileDiscoveryStore(tmp_path, NS, clock=clock)  # the workers' side
    await other.put(make_record(2), ttl_s=30)
    await other.put(make_record(1), ttl_s=30)
    async with aclosing(store.watch()) as events:
        assert await next_event(events) == WorkerAdded(make_record(1))
        assert await next_event(events) == WorkerAdded(make_record(2))

        await other.put(make_record(3), ttl_s=60)
        assert await next_event(events) == WorkerAdded(make_record(3))

        await other.put(make_record(3, total_kv_blocks=9), ttl_s=60)
        assert await next_event(events) == WorkerAdded(make_record(3, total_kv_blocks=9))

        await other.delete(1)
        assert await next_event(events) == WorkerRemoved(1, "deregistered")

        clock.advance(31)  # the watcher's expiry timer runs on the clock: no waiting out the ttl
        assert await next_event(events) == WorkerRemoved(2, "expired")
        assert not other.path_of(2).exists()
        assert await other.list() == [make_record(3, total_kv_blocks=9)]


async def test_watch_reports_expiry_noticed_by_someone_else(tmp_path: Path) -> None:
    clock = ManualClock()
    watcher = FileDiscoveryStore(tmp_path, NS, poll_interval_s=0.05, clock=clock)
    other = FileDiscoveryStore(tmp_path, NS, clock=clock)
    await other.put(make_record(1), ttl_s=1.0)
    async with aclosing(watcher.watch()) as events:
        assert await next_event(events) == WorkerAdded(make_record(1))
        # the watcher is suspended; the record expires and another reader collects it
        clock.advance(1.2)
        assert await other.list() == []
        assert not other.path_of(1).exists()
        assert await next_event(events) == WorkerRemoved(1, "expired")


async def test_watch_hears_changes_from_the_kernel_not_by_polling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(file_store, "_SETTLE_S", 0.0)  # no start-up polling either
    store = FileDiscoveryStore(tmp_path, NS, poll_interval_s=3600)
    other = FileDiscoveryStore(tmp_path, NS)
    seen: list = []

    async def collect() -> None:
        async with aclosing(store.watch()) as events:
            async for event in events:
                seen.append(event)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(collect)
            # until the watcher's inotify watch is in place, a put may go unseen: put again
            while not seen:
                await other.put(make_record(1), ttl_s=3600)
                await anyio.sleep(0.05)
            started = time.monotonic()
            await other.put(make_record(2), ttl_s=3600)
            while len(seen) < 2:
                await anyio.sleep(0.01)
            await other.delete(1)
            while len(seen) < 3:
                await anyio.sleep(0.01)
            assert time.monotonic() - started < 10  # an hour's poll interval: only inotify explains it
            tg.cancel_scope.cancel()
    assert seen == [
        WorkerAdded(make_record(1)),
        WorkerAdded(make_record(2)),
        WorkerRemoved(1, "deregistered"),
    ]


async def test_watch_survives_its_directory_being_removed(tmp_path: Path) -> None:
    store = FileDiscoveryStore(tmp_path, NS, poll_interval_s=3600)
    other = FileDiscoveryStore(tmp_path, NS)
    await other.put(make_record(1), ttl_s=3600)
    with anyio.fail_after(20):
        async with aclosing(store.watch()) as events:
            assert await next_event(events) == WorkerAdded(make_record(1))
            shutil.rmtree(tmp_path / NS)
            assert await next_event(events) == WorkerRemoved(1, "deregistered")
            await other.put(make_record(2), ttl_s=3600)
            assert await next_event(events) == WorkerAdded(make_record(2))


async def test_watch_polls_where_the_kernel_cannot_watch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*args, **kwargs):
        raise OSError("OS file watch limit reached")

    monkeypatch.setattr(file_store.watchfiles, "watch", refuse)
    monkeypatch.setattr(file_store, "_SETTLE_S", 0.0)
    store = FileDiscoveryStore(tmp_path, NS, poll_interval_s=0.05)
    with caplog.at_level(logging.INFO, logger="dyn.core.discovery"), anyio.fail_after(10):
        async with aclosing(store.watch()) as events:
            await store.put(make_record(1), ttl_s=30)
            assert await next_event(events) == WorkerAdded(make_record(1))
            await store.put(make_record(2), ttl_s=30)
            assert await next_event(events) == WorkerAdded(make_record(2))
    assert any("polling it instead" in r.getMessage() for r in caplog.records)


async def test_lease_heartbeat_runs_on_the_store_clock(tmp_path: Path) -> None:
    clock = ManualClock()
    store = FileDiscoveryStore(tmp_path, NS, clock=clock)
    with anyio.fail_after(10):
        async with store.lease(make_record(1), ttl_s=3):
            for _ in range(10):  # ten ttls of the clock, kept alive by the heartbeat every ttl/3
                await clock.sleeping()
                clock.advance(1.0)
                while store.path_of(1).stat().st_mtime != clock.time():
                    await anyio.sleep(0.01)
                assert await store.list() == [make_record(1)]
        assert await store.list() == []


async def test_watch_starts_before_directory_exists_and_is_cancellable(tmp_path: Path) -> None:
    store = FileDiscoveryStore(tmp_path / "not-yet", NS, poll_interval_s=0.05)
    seen: list = []

    async def collect() -> None:
        async with aclosing(store.watch()) as events:
            async for event in events:
                seen.append(event)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(collect)
            await anyio.sleep(0.2)
            assert seen == []
            await store.put(make_record(4), ttl_s=30)
            while not seen:
                await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
    assert seen == [WorkerAdded(make_record(4))]


async def test_corrupt_files_are_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileDiscoveryStore(tmp_path, NS, poll_interval_s=0.05)
    await store.put(make_record(1), ttl_s=30)
    (store.directory / "2.json").write_text('{"ttl_s": 30, "record": {"instance_')  # half-written
    wrong_shape = '{"ttl_s": 30, "record": {"instance_id": 3}}'
    (store.directory / "3.json").write_text(wrong_shape)
    (store.directory / "4.json").write_bytes(b"\xff\xfe\x00garbage")
    (store.directory / "5.json").write_bytes((store.path_of(1)).read_bytes())  # holds instance 1
    (store.directory / "notes.txt").write_text("not a record")
    (store.directory / "abc.json").write_text("{}")
    with caplog.at_level(logging.WARNING, logger="dyn.core.discovery"):
        with anyio.fail_after(10):
            assert await store.list() == [make_record(1)]
            assert await store.list() == [make_record(1)]
            async with aclosing(store.watch()) as events:
                assert await next_event(events) == WorkerAdded(make_record(1))
                await store.put(make_record(6), ttl_s=30)
                assert await next_event(events) == WorkerAdded(make_record(6))
    warned = {r.getMessage().split()[4] for r in caplog.records if r.levelno == logging.WARNING}
    assert warned == {str(store.directory / f"{i}.json") + ":" for i in (2, 3, 4, 5)}
    # warned once per file version, not on every read
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 4
    assert (store.directory / "2.json").exists()  # not ours to delete


async def test_orphan_temp_files_are_collected(tmp_path: Path) -> None:
    store = FileDiscoveryStore(tmp_path, NS)
    await store.put(make_record(1), ttl_s=30)
    old = store.directory / ".9.json.abc.tmp"
    new = store.directory / ".8.json.abc.tmp"
    old.write_text("{")
    new.write_text("{")
    backdate(old, 120)
    assert await store.list() == [make_record(1)]
    assert not old.exists()
    assert new.exists()
    assert [p.name for p in store.directory.iterdir() if not p.name.startswith(".")] == ["1.json"]


async def test_lease_keeps_record_alive_and_deletes_on_exit(tmp_path: Path) -> None:
    store = FileDiscoveryStore(tmp_path, NS)
    reader = FileDiscoveryStore(tmp_path, NS)
    with anyio.fail_after(20):
        async with store.lease(make_record(1), ttl_s=1.0):
            deadline = time.monotonic() + 2.5
            while time.monotonic() < deadline:
                assert await reader.list() == [make_record(1)]
                await anyio.sleep(0.1)
        assert await reader.list() == []
        assert not store.path_of(1).exists()


async def test_lease_deletes_on_error_and_cancellation(tmp_path: Path) -> None:
    store = FileDiscoveryStore(tmp_path, NS)
    with anyio.fail_after(10):
        with pytest.raises(KeyError):  # the body's error comes out unwrapped
            async with store.lease(make_record(1), ttl_s=5):
                assert store.path_of(1).exists()
                raise KeyError("boom")
        assert not store.path_of(1).exists()

        with anyio.move_on_after(0.3) as scope:
            async with store.lease(make_record(2), ttl_s=5):
                assert await store.list() == [make_record(2)]
                await anyio.sleep(30)
        assert scope.cancelled_caught
        assert await store.list() == []


async def test_lease_registers_again_after_losing_its_record(tmp_path: Path) -> None:
    store = FileDiscoveryStore(tmp_path, NS)
    with anyio.fail_after(10):
        async with store.lease(make_record(1), ttl_s=0.9):
            store.path_of(1).unlink()  # e.g. collected while this process was suspended
            while not store.path_of(1).exists():
                await anyio.sleep(0.05)
            assert await store.list() == [make_record(1)]


WORKER = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import anyio

    from dyn.core.discovery import FileDiscoveryStore
    from dyn.core.messages import WorkerEndpoints, WorkerRecord

    async def main() -> None:
        store = FileDiscoveryStore(Path(sys.argv[1]), sys.argv[2])
        record = WorkerRecord(
            instance_id=int(sys.argv[3]), namespace=sys.argv[2], model_name="dyn-tiny",
            engine="mocker", endpoints=WorkerEndpoints(request="tcp://127.0.0.1:5555"),
            block_size=16, total_kv_blocks=1024, max_num_batched_tokens=8192,
        )
        async with store.lease(record, ttl_s=float(sys.argv[4])):
            await anyio.sleep(3600)

    anyio.run(main)
    """
)


async def test_killed_worker_record_expires(tmp_path: Path) -> None:
    ttl_s = 1.0
    store = FileDiscoveryStore(tmp_path, NS, poll_interval_s=0.05)
    proc = subprocess.Popen(  # noqa: ASYNC220 (a start that does not block; it is reaped after a kill)
        [sys.executable, "-c", WORKER, str(tmp_path), NS, "42", str(ttl_s)],
        stdout=subprocess.DEVNULL,
    )
    try:
        with anyio.fail_after(60):  # interpreter start-up on a loaded machine
            while [r.instance_id for r in await store.list()] != [42]:
                assert proc.poll() is None, "worker exited early"
                await anyio.sleep(0.05)
        async with aclosing(store.watch()) as events:
            event = await next_event(events)
            assert isinstance(event, WorkerAdded) and event.record.instance_id == 42
            # heartbeats keep it alive past its ttl
            await anyio.sleep(2 * ttl_s)
            assert [r.instance_id for r in await store.list()] == [42]

            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            killed_at = time.monotonic()
            assert await next_event(events, timeout=15) == WorkerRemoved(42, "expired")
            assert time.monotonic() - killed_at < 10
        assert await store.list() == []
        assert not store.path_of(42).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
