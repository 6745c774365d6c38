"""The file discovery backend (the default): one JSON file per worker in a runtime directory.

Layout: ``{root}/{namespace}/instances/{instance_id}.json``, holding
``{"ttl_s": <seconds>, "record": <WorkerRecord>}``. The file's mtime is the last heartbeat:
``put`` writes the file atomically (a temp file in the same directory, then ``os.replace``),
``keepalive`` touches it (``os.utime``), and the record is live while ``now - mtime <= ttl_s``
(``now`` and the mtimes written come from the store's ``Clock``). No process runs in the
background: whoever lists or watches notices stale files and deletes them. A watcher learns of
changes from the kernel (inotify, through ``watchfiles``) and of expiries from a timer set for the
next record to expire; where the kernel cannot watch (the watch limit, a filesystem without
notifications) it polls every ``poll_interval_s``. Meant for a local filesystem (one clock,
fine-grained mtimes), e.g. tmpfs under ``$XDG_RUNTIME_DIR``; directories it creates are private
to the user (mode 0700).

Whoever can write to the root can register a worker that receives prompts and answers users,
so the root is checked when a store is made: created 0700 if missing, and refused
(``DiscoveryDirError``) when it is not owned by this user or other users may write to it.
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import NamedTuple

import anyio
import anyio.from_thread
import anyio.lowlevel
import msgspec
import watchfiles
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from dyn.core.discovery.store import (
    SYSTEM_CLOCK,
    Clock,
    DiscoveryEvent,
    DiscoveryStore,
    LeaseExpired,
    RemovalReason,
    expiry_timer,
    scan_events,
    validate_namespace,
)
from dyn.core.errors import ConfigError
from dyn.core.messages import WorkerRecord
from dyn.core.private_dir import check_private_dir

log = logging.getLogger(__name__)

_RECORD_NAME = re.compile(r"(-?[0-9]+)\.json")
_TMP_SUFFIX = ".tmp"
_ORPHAN_TMP_AGE_S = 60.0
_NOTIFY_STEP_MS = 50
"""How long the kernel's changes must pause before a watcher rescans (a put is a few events);
watchfiles' default: a change is reported 50-100 ms after it, an idle watcher costs under 1 ms of
CPU a second (10 ms: about 30 ms, and 3.5 ms of CPU a second)."""
_SETTLE_S = 1.0
_SETTLE_POLL_S = 0.05


class _RecordFile(msgspec.Struct):
    ttl_s: float
    record: WorkerRecord


def _why_gone(expired: set[int], now: float) -> Callable[[int, _Live], RemovalReason]:
    """Why an instance's file went, given the ids this scan removed as expired at ``now``."""

    def why_gone(instance_id: int, gone: _Live) -> RemovalReason:
        # Another reader may have collected the stale file first; a file last seen long enough
        # ago to be stale now expired, whoever removed it.
        stale = instance_id in expired or now - gone.mtime > gone.ttl_s
        return "expired" if stale else "deregistered"

    return why_gone


class _Live(NamedTuple):
    record: WorkerRecord
    ttl_s: float
    mtime: float


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(_RecordFile)


def default_root() -> Path:
    """The default runtime directory holding every namespace.

    ``$DYN_DISCOVERY_DIR`` if set, else ``$XDG_RUNTIME_DIR/dyn`` if that is set, else
    ``{tempfile.gettempdir()}/dyn-{uid}``.
    """
    explicit = os.environ.get("DYN_DISCOVERY_DIR")
    if explicit:
        return Path(explicit)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "dyn"
    user = os.getuid() if hasattr(os, "getuid") else getpass.getuser()
    return Path(tempfile.gettempdir()) / f"dyn-{user}"


class DiscoveryDirError(ConfigError):
    """The discovery root is not private to this user."""


def secure_root(root: Path) -> Path:
    """Create ``root`` (0700) if it is missing; ``DiscoveryDirError`` saying what to do if it is
    not a directory owned by this user, closed to other users' writes."""
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise DiscoveryDirError(
            f"cannot create the discovery directory {root}: {exc.strerror}; "
            "choose another --discovery-dir (or DYN_DISCOVERY_DIR)"
        ) from None
    fix = (
        f"another user could register a forged worker there. Run 'chmod 700 {root}' if it is "
        "yours, or choose another --discovery-dir (or DYN_DISCOVERY_DIR)"
    )
    try:
        check_private_dir(root, "the discovery directory", fix)
    except ConfigError as exc:
        raise DiscoveryDirError(str(exc)) from None
    return root


class FileDiscoveryStore(DiscoveryStore):
    """Worker records of ``namespace`` as files under ``root``; see the module docstring.

    A watcher reports a change as the kernel notices it and an expiry when its ttl has passed;
    ``poll_interval_s`` is how often it rescans where the kernel cannot watch the directory.
    Several stores, in one process or many, may share a directory. Reading is cheap: a scan
    stats the directory entries and re-reads a file only when its inode, size or mtime changed.
    ``clock`` is what expiry is judged by and what the mtimes written say (tests pass a manual one).
    """

    def __init__(
        self, root: str | Path, namespace: str, poll_interval_s: float = 0.2, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.namespace = validate_namespace(namespace)
        if not poll_interval_s > 0:
            raise ValueError(f"invalid poll_interval_s {poll_interval_s!r}: must be positive")
        self.root = secure_root(Path(root))
        self.directory = self.root / namespace / "instances"
        self.poll_interval_s = poll_interval_s
        self.clock = clock
        self._parsed: dict[str, tuple[tuple[int, int, int], _RecordFile | None]] = {}

    def for_namespace(self, namespace: str) -> FileDiscoveryStore:
        return FileDiscoveryStore(self.root, namespace, poll_interval_s=self.poll_interval_s)

    def path_of(self, instance_id: int) -> Path:
        """The file that holds the record of ``instance_id``."""
        return self.directory / f"{instance_id}.json"

    async def put(self, record: WorkerRecord, ttl_s: float) -> None:
        ttl_s = self.checked_ttl(record, ttl_s)
        data = _encoder.encode(_RecordFile(ttl_s=ttl_s, record=record))
        self._make_directory()
        path = self.path_of(record.instance_id)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{path.name}.", suffix=_TMP_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
            now = self.clock.time()
            os.utime(tmp, (now, now))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    async def keepalive(self, instance_id: int) -> None:
        path = self.path_of(instance_id)
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            raise LeaseExpired(f"no discovery record for instance {instance_id}") from None
        parsed = self._read(path, stat, instance_id)
        now = self.clock.time()
        if parsed is None or now - stat.st_mtime > parsed.ttl_s:
            raise LeaseExpired(f"the discovery record of instance {instance_id} expired")
        try:
            os.utime(path, (now, now))
        except FileNotFoundError:
            msg = f"the discovery record of instance {instance_id} was removed"
            raise LeaseExpired(msg) from None

    async def delete(self, instance_id: int) -> None:
        path = self.path_of(instance_id)
        path.unlink(missing_ok=True)
        self._parsed.pop(path.name, None)

    async def list(self) -> list[WorkerRecord]:
        live, _ = self._scan()
        return [live[instance_id].record for instance_id in sorted(live)]

    async def watch(self) -> AsyncGenerator[DiscoveryEvent, None]:
        known: dict[int, _Live] = {}
        self._make_directory()
        changes = _DirectoryChanges(self.directory)
        try:
            while True:
                live, expired = self._scan()
                now = self.clock.time()

                for event in scan_events(known, live, _why_gone(expired, now)):
                    yield event
                timer = expiry_timer((r.mtime + r.ttl_s for r in known.values()), self.clock.time())
                if timer is not None and timer < 0:  # it expired while the caller held us: rescan now
                    continue
                poll = (
                    self.poll_interval_s
                    if not changes.watching
                    else min(self.poll_interval_s, _SETTLE_POLL_S)
                    if time.monotonic() < changes.settled_at
                    else None
                )
                if poll is not None:
                    timer = poll if timer is None else min(timer, poll)
                await changes.wait(self.clock, timer)
                if not self.directory.is_dir():  # removed under us: the kernel's watch went with it
                    changes.close()
                    self._make_directory()
                    changes = _DirectoryChanges(self.directory)
        finally:
            changes.close()

    def _make_directory(self) -> None:
        for directory in (self.root, self.root / self.namespace, self.directory):
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)

    def _scan(self) -> tuple[dict[int, _Live], set[int]]:
        """The live records by instance id, and the ids of stale files found (and deleted)."""
        now = self.clock.time()
        live: dict[int, _Live] = {}
        expired: set[int] = set()
        present: set[str] = set()
        try:
            with os.scandir(self.directory) as entries_iter:
                entries = list(entries_iter)
        except FileNotFoundError:
            entries = []
        for entry in entries:
            if entry.name.startswith(".") and entry.name.endswith(_TMP_SUFFIX):
                self._remove_orphan_tmp(entry, now)
                continue
            match = _RECORD_NAME.fullmatch(entry.name)
            if match is None:
                continue
            try:
                stat = entry.stat()
            except FileNotFoundError:
                continue
            present.add(entry.name)
            parsed = self._read(Path(entry.path), stat, int(match[1]))
            if parsed is None:
                continue
            if now - stat.st_mtime > parsed.ttl_s:
                expired.add(parsed.record.instance_id)
                self._remove_if_stale(Path(entry.path), parsed.ttl_s)
                continue
            live[parsed.record.instance_id] = _Live(parsed.record, parsed.ttl_s, stat.st_mtime)
        for name in self._parsed.keys() - present:
            del self._parsed[name]
        return live, expired

    def _read(self, path: Path, stat: os.stat_result, instance_id: int) -> _RecordFile | None:
        """The parsed file, or ``None`` if it is not a valid record (warned once per change)."""
        key = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        cached = self._parsed.get(path.name)
        if cached is not None and cached[0] == key:
            return cached[1]
        parsed: _RecordFile | None
        try:
            parsed = _decoder.decode(path.read_bytes())
            if parsed.record.instance_id != instance_id:
                raise ValueError(f"it holds instance {parsed.record.instance_id}")
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:  # msgspec.DecodeError is a ValueError
            log.warning("skipping unreadable discovery record %s: %s", path, exc)
            parsed = None
        self._parsed[path.name] = (key, parsed)
        return parsed

    def _remove_if_stale(self, path: Path, ttl_s: float) -> bool:
        """Delete the record file if it is still stale (its worker may have just refreshed it)."""
        try:
            if self.clock.time() - os.stat(path).st_mtime <= ttl_s:
                return False
            path.unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.debug("could not remove expired discovery record %s: %s", path, exc)
            return False
        self._parsed.pop(path.name, None)
        log.info("removed expired discovery record %s", path)
        return True

    def _remove_orphan_tmp(self, entry: os.DirEntry[str], now: float) -> None:
        """Delete a temp file that a writer killed mid-``put`` left behind."""
        with contextlib.suppress(OSError):
            if now - entry.stat().st_mtime > _ORPHAN_TMP_AGE_S:
                os.unlink(entry.path)


class _DirectoryChanges:
    """The kernel's change notifications for one directory, from a thread running ``watchfiles``.

    ``wait`` returns at the first change since the last ``wait`` (changes in between coalesce),
    or when ``timeout`` seconds of ``clock`` pass. If the kernel cannot watch the directory
    (inotify's limits, a directory removed under it) ``wait`` returns at once and ``watching``
    turns False: the caller polls instead.
    """

    def __init__(self, directory: Path) -> None:
        self.watching = True
        self.settled_at = time.monotonic() + _SETTLE_S
        """Until then the kernel's watch may not be in place yet (the thread sets it up): poll too."""
        self._stop = threading.Event()
        send, self._receive = anyio.create_memory_object_stream[None](1)
        self._thread = threading.Thread(
            target=self._run,
            args=(directory, send, anyio.lowlevel.current_token()),
            name=f"watch {directory}",
            daemon=True,
        )
        self._thread.start()

    def _run(
        self, directory: Path, send: MemoryObjectSendStream[None], token: anyio.lowlevel.EventLoopToken
    ) -> None:
        def notify() -> None:
            with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                send.send_nowait(None)

        def on_loop(call: Callable[[], None]) -> bool:
            try:
                anyio.from_thread.run_sync(call, token=token)
            except RuntimeError:  # the event loop is gone
                return False
            return True

        try:
            for _ in watchfiles.watch(
                directory,
                watch_filter=None,
                step=_NOTIFY_STEP_MS,
                stop_event=self._stop,
                raise_interrupt=False,
                recursive=False,
            ):
                if not on_loop(notify):
                    return
        except Exception as exc:
            if not self._stop.is_set():
                log.info("cannot watch %s for changes (%s); polling it instead", directory, exc)
        on_loop(send.close)

    async def wait(self, clock: Clock, timeout: float | None) -> None:
        receive: MemoryObjectReceiveStream[None] = self._receive
        async with anyio.create_task_group() as tg:
            if timeout is not None:

                async def timer() -> None:
                    await clock.sleep(timeout)
                    tg.cancel_scope.cancel()

                tg.start_soon(timer)
            try:
                await receive.receive()
            except anyio.EndOfStream:  # the caller rescans now, then polls
                self.watching = False
            tg.cancel_scope.cancel()

    def close(self) -> None:
        """Stop the thread (it exits within a few milliseconds, on its own)."""
        self._stop.set()
        self._receive.close()
