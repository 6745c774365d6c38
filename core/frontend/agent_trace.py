"""The agent trace (``--agent-trace-file``): one JSON line per finished engine request, for
replaying production traffic against other router flags (``dyn bench --trace`` live, ``dyn bench
replay --offline`` in virtual time).

A line is a Mooncake trace row (``dyn.core.bench.trace``) with the serving facts beside it:

- replay fields: ``timestamp`` (ms since the first request recorded arrived), ``input_length``,
  ``output_length``, ``hash_ids`` (the prompt's full KV blocks as chained sequence hashes, so
  equal leading ids mean a shared prefix, exactly where the router saw one), ``block_size`` (the
  worker's; the replay reads it), and for a request of an agent session, ``session_id``
  (``agent_context.program_id``, else the session its headers or ``nvext.session_control``
  name) with, from its second turn on, ``delay_ms``: the time since the session's previous
  request ended, which the replay waits before sending the turn;
- identity: ``request_id``, ``model``, ``endpoint``, ``agent_context`` (Dynamo's
  ``nvext.agent_context``), ``parent_session_id`` (its ``parent_program_id``, else a parent
  header);
- what happened: ``status`` (``success``/``error``), ``finish_reason``, ``worker_id``
  (``nvext.worker_id``'s shape), ``ttft_ms``, ``itl_ms``, ``total_time_ms``, ``cached_tokens``
  (the engine's count), ``kv_hit_rate`` (the router's prediction), ``queue_depth``.

One writer (``TraceFile``) dates and writes every line. In a single frontend each request's
entries go to it directly; under ``--num-http-workers`` every HTTP worker process sends them down a
pipe of its own (``PipeSink``, at most ``MAX_UNSENT`` requests waiting, the rest dropped and
counted) to the supervising process, whose ``TraceReceiver`` writes the one file: the lines are
the same as one process would write (``AgentTraceEntry`` carries the monotonic clock's times).

Bounded: a file grows to ``max_bytes``, then is renamed ``PATH.1`` (``PATH.1`` to ``PATH.2``, ...,
keeping ``backups`` of them) and a new one starts; the sessions remembered for ``delay_ms`` are
capped at ``MAX_SESSIONS`` (least recently used first out). A write that fails (a full disk) is
logged once and tracing stops: serving goes on. Lines are written on the event loop, one buffered
write and flush per request (a few microseconds; the block hashes are what costs, about a
microsecond per block).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections import OrderedDict, deque
from multiprocessing import connection
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

import msgspec
import orjson

from dyn.core.errors import ConfigError
from dyn.core.frontend import nvext as nvext_out
from dyn.core.frontend.session_identity import agent_ids
from dyn.core.kv.hashing import block_hashes, sequence_hashes
from dyn.core.messages import AgentTraceEntry

if TYPE_CHECKING:
    from dyn.core.frontend.choice import Choice
    from dyn.core.frontend.generation import Generation

log = logging.getLogger(__name__)

MAX_SESSIONS = 65536
"""Sessions whose last request end is remembered (for ``delay_ms``)."""


class TraceFile:
    """The trace's one writer: dates each entry (``timestamp``, ``delay_ms``) and writes it as a
    line, rotating the file at ``max_bytes`` (see the module docstring)."""

    def __init__(self, path: str | Path, max_bytes: int = 64 << 20, backups: int = 3) -> None:
        if max_bytes < 4096:
            raise ConfigError("--agent-trace-max-bytes must be at least 4096")
        if backups < 0:
            raise ConfigError("--agent-trace-backups must be 0 or more")
        self.path = Path(path).expanduser()
        if self.path.is_dir():
            raise ConfigError(f"--agent-trace-file {path}: is a directory; give a file path")
        self.max_bytes = max_bytes
        self.backups = backups
        self._start: float | None = None
        """The first recorded request's arrival: the trace's time 0."""
        self._ended: OrderedDict[str, float] = OrderedDict()
        try:
            self._file: IO[bytes] | None = self._open()
        except OSError as exc:
            raise ConfigError(f"--agent-trace-file {path}: cannot be written ({exc.strerror})") from None
        self._size = self._file.tell()

    def _open(self) -> IO[bytes]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return open(self.path, "ab")

    def write(self, entries: list[AgentTraceEntry]) -> None:
        """Write one line per entry (a finished request's choices, together)."""
        if self._file is None:
            return
        lines = b"".join(orjson.dumps(self._row(entry)) + b"\n" for entry in entries)
        try:
            if self._size and self._size + len(lines) > self.max_bytes:
                self._rotate()
            self._file.write(lines)
            self._file.flush()
            self._size += len(lines)
        except OSError as exc:
            log.error("the agent trace %s cannot be written (%s): tracing stops", self.path, exc)
            self.close()

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None

    def _rotate(self) -> None:
        assert self._file is not None
        self._file.close()
        if self.backups == 0:
            os.truncate(self.path, 0)
        else:
            for i in range(self.backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{i}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._file = self._open()
        self._size = 0

    def _row(self, entry: AgentTraceEntry) -> dict[str, Any]:
        if self._start is None:
            self._start = entry.received
        # a request that arrived before the first one recorded (it ended later) is dated 0
        row: dict[str, Any] = {"timestamp": round(max(entry.received - self._start, 0.0) * 1000, 3)}
        row.update(entry.head)
        session = entry.session
        if session is not None:
            row["session_id"] = session
            ended = self._ended.pop(session, None)
            if ended is not None:
                row["delay_ms"] = round(max(entry.received - ended, 0.0) * 1000, 3)
            self._ended[session] = entry.ended
            if len(self._ended) > MAX_SESSIONS:
                self._ended.popitem(last=False)
        row.update(entry.tail)
        return row


class TraceSink(Protocol):
    """Where an ``AgentTrace`` sends a finished request's entries: the ``TraceFile`` itself in a
    single frontend, a ``PipeSink`` to the writing process in an HTTP worker process."""

    def write(self, entries: list[AgentTraceEntry]) -> None: ...

    def close(self) -> None: ...


class AgentTrace:
    """Turns each finished request of this frontend process into trace entries for ``sink``."""

    def __init__(self, sink: TraceSink) -> None:
        self.sink = sink

    def record(self, gen: Generation, ok: bool) -> None:
        """One entry per choice of ``gen`` (a finished request; ``ok``: it succeeded)."""
        self.sink.write([self._entry(gen, choice, ok) for choice in gen.choices])

    def close(self) -> None:
        self.sink.close()

    def _entry(self, gen: Generation, choice: Choice, ok: bool) -> AgentTraceEntry:
        ctx = gen.ctx
        route = choice.route
        timing = choice.timing
        tokens = choice.prompt.token_ids
        block_size = route.worker.record.block_size
        hashes = sequence_hashes(block_hashes(tokens, block_size)) if block_size > 0 else []
        head: dict[str, Any] = {
            "input_length": len(tokens),
            "output_length": choice.tokens,
            "hash_ids": hashes,
            "block_size": block_size,
        }
        nvext = gen.req.nvext
        agent = nvext.agent_context if nvext is not None else None
        session, parent = agent_ids(nvext, ctx.session_id, ctx.parent_session_id)
        now = time.perf_counter()
        tail: dict[str, Any] = {"request_id": ctx.request_id}
        tail["model"] = gen.service.model_name
        tail["endpoint"] = gen.endpoint
        if agent is not None:
            tail["agent_context"] = {k: v for k, v in msgspec.structs.asdict(agent).items() if v is not None}
        if parent is not None:
            tail["parent_session_id"] = parent
        tail["status"] = "success" if ok else "error"
        tail["finish_reason"] = choice.finish_reason
        tail["worker_id"] = nvext_out.worker_id(route)
        timings = nvext_out.timing(timing, route, now)
        for key in ("ttft_ms", "itl_ms", "total_time_ms", "kv_hit_rate"):
            if key in timings:
                tail[key] = timings[key]
        tail["cached_tokens"] = choice.usage[2]
        if route.queue_depth is not None:
            tail["queue_depth"] = route.queue_depth
        return AgentTraceEntry(head, tail, ctx.received, now, session)


MAX_UNSENT = 4096
"""Requests an HTTP worker process keeps for the writer while its pipe is full; more are dropped
(counted and logged), never waited for: serving does not slow down for the trace."""

_RECEIVE_POLL_S = 0.2
"""How often the receiver takes up new pipes (and, closing, sees that none has more)."""
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(list[AgentTraceEntry])


class PipeSink:
    """An HTTP worker process's sink (``--num-http-workers``): each request's entries go, as one
    msgpack message, down ``conn`` (this process's own pipe to the writing process) from a
    thread, so a full pipe never blocks the event loop; at most ``MAX_UNSENT`` wait for it."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.dropped = 0
        self._unsent: deque[bytes | None] = deque()
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._send, name="dyn-agent-trace", daemon=True)
        self._thread.start()

    def write(self, entries: list[AgentTraceEntry]) -> None:
        data = _ENCODER.encode(entries)
        with self._ready:
            if len(self._unsent) >= MAX_UNSENT:
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.warning("the agent trace's writer is behind: %d request(s) not traced", self.dropped)
                return
            self._unsent.append(data)
            self._ready.notify()

    def close(self) -> None:
        """Send what is waiting, then close the pipe (bounded: a writer gone is not waited for)."""
        with self._ready:
            self._unsent.append(None)
            self._ready.notify()
        self._thread.join(5.0)
        self.conn.close()

    def _send(self) -> None:
        while True:
            with self._ready:
                while not self._unsent:
                    self._ready.wait()
                data = self._unsent.popleft()
            if data is None:
                return
            try:
                self.conn.send_bytes(data)
            except OSError:  # the writing process is gone: this process is stopping with it
                return


class TraceReceiver:
    """The writing end under ``--num-http-workers``: a thread in the process that supervises the
    HTTP workers reads each worker's pipe (``pipe()`` makes one per worker start) and writes its
    entries through ``file`` until ``close()``. A message that does not decode is logged and
    skipped; a pipe whose worker exited is dropped."""

    def __init__(self, file: TraceFile) -> None:
        self.file = file
        self._conns: list[Connection] = []
        self._new: list[Connection] = []
        self._lock = threading.Lock()
        self._closing = False
        self._thread = threading.Thread(target=self._receive, name="dyn-agent-trace", daemon=True)
        self._thread.start()

    def pipe(self) -> Connection:
        """The sending end of a new pipe for one HTTP worker process (pass it to the process)."""
        reading, sending = multiprocessing.Pipe(duplex=False)
        with self._lock:
            self._new.append(reading)
        return sending

    def close(self) -> None:
        """Write what the pipes still hold, then close the file (call once the workers exited)."""
        with self._lock:
            self._closing = True
        self._thread.join(10.0)
        self.file.close()

    def _receive(self) -> None:
        while True:
            with self._lock:
                self._conns += self._new
                self._new.clear()
                closing = self._closing  # read with the new pipes: each is in this wait
            ready = connection.wait(self._conns, timeout=_RECEIVE_POLL_S)
            if not ready and closing:
                break
            for conn in ready:
                assert isinstance(conn, Connection)
                try:
                    data = conn.recv_bytes()
                except (EOFError, OSError):
                    self._conns.remove(conn)
                    conn.close()
                    continue
                try:
                    entries = _DECODER.decode(data)
                except msgspec.DecodeError as exc:
                    log.error("an agent-trace message from an HTTP worker does not decode (%s): skipped", exc)
                    continue
                self.file.write(entries)
        for conn in self._conns:
            conn.close()
