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

Bounded: a file grows to ``max_bytes``, then is renamed ``PATH.1`` (``PATH.1`` to ``PATH.2``, ...,
keeping ``backups`` of them) and a new one starts; the sessions remembered for ``delay_ms`` are
capped at ``MAX_SESSIONS`` (least recently used first out). A write that fails (a full disk) is
logged once and tracing stops: serving goes on. Lines are written on the event loop, one buffered
write and flush per request (a few microseconds; the block hashes are what costs, about a
microsecond per block).
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import msgspec
import orjson

from dyn.core.errors import ConfigError
from dyn.core.frontend import nvext as nvext_out
from dyn.core.frontend.session_identity import agent_ids
from dyn.core.kv.hashing import block_hashes, sequence_hashes

if TYPE_CHECKING:
    from dyn.core.frontend.choice import Choice
    from dyn.core.frontend.generation import Generation

log = logging.getLogger(__name__)

MAX_SESSIONS = 65536
"""Sessions whose last request end is remembered (for ``delay_ms``)."""


class AgentTrace:
    """Writes the trace of one frontend process (see the module docstring)."""

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

    def record(self, gen: Generation, ok: bool) -> None:
        """Write one line per choice of ``gen`` (a finished request; ``ok``: it succeeded)."""
        if self._file is None:
            return
        lines = b"".join(orjson.dumps(self._row(gen, choice, ok)) + b"\n" for choice in gen.choices)
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

    def _row(self, gen: Generation, choice: Choice, ok: bool) -> dict[str, Any]:
        ctx = gen.ctx
        route = choice.route
        timing = choice.timing
        tokens = choice.prompt.token_ids
        block_size = route.worker.record.block_size
        hashes = sequence_hashes(block_hashes(tokens, block_size)) if block_size > 0 else []
        if self._start is None:
            self._start = ctx.received
        row: dict[str, Any] = {
            # a request that arrived before the first one recorded (it ended later) is dated 0
            "timestamp": round(max(ctx.received - self._start, 0.0) * 1000, 3),
            "input_length": len(tokens),
            "output_length": choice.tokens,
            "hash_ids": hashes,
            "block_size": block_size,
        }
        nvext = gen.req.nvext
        agent = nvext.agent_context if nvext is not None else None
        session, parent = agent_ids(nvext, ctx.session_id, ctx.parent_session_id)
        now = time.perf_counter()
        if session is not None:
            row["session_id"] = session
            ended = self._ended.pop(session, None)
            if ended is not None:
                row["delay_ms"] = round(max(ctx.received - ended, 0.0) * 1000, 3)
            self._ended[session] = now
            if len(self._ended) > MAX_SESSIONS:
                self._ended.popitem(last=False)
        row["request_id"] = ctx.request_id
        row["model"] = gen.service.model_name
        row["endpoint"] = gen.endpoint
        if agent is not None:
            row["agent_context"] = {k: v for k, v in msgspec.structs.asdict(agent).items() if v is not None}
        if parent is not None:
            row["parent_session_id"] = parent
        row["status"] = "success" if ok else "error"
        row["finish_reason"] = choice.finish_reason
        row["worker_id"] = nvext_out.worker_id(route)
        timings = nvext_out.timing(timing, route, now)
        for key in ("ttft_ms", "itl_ms", "total_time_ms", "kv_hit_rate"):
            if key in timings:
                row[key] = timings[key]
        row["cached_tokens"] = choice.usage[2]
        if route.queue_depth is not None:
            row["queue_depth"] = route.queue_depth
        return row
