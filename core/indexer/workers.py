"""The workers a ``dyn indexer`` is told to follow by hand: ``--workers`` entries
(``parse_workers``) and ``POST /register`` calls, each a ``StaticWorker``: one rank's KV-event PUB
socket (and its replay socket) under the instance id and dp rank the operator gives."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dyn.core.kv.indexer import WorkerKey
from dyn.core.kv.views import U64_MAX


@dataclass(frozen=True, slots=True)
class StaticWorker:
    """One ``--workers`` entry or ``/register`` call: whose KV events, on which PUB socket (and
    replay socket)."""

    instance_id: int
    dp_rank: int
    endpoint: str
    replay_endpoint: str | None = None


_ENTRY = re.compile(r"(?P<id>[0-9]+)(?::(?P<dp>[0-9]+))?=(?P<endpoint>[^|]+)(?:\|(?P<replay>.+))?")
_ZMQ_SCHEMES = ("tcp://", "ipc://", "inproc://")
MAX_REGISTERED = 4096
"""Entries (``--workers`` and ``/register``) followed at once: each holds a ZMQ socket open."""


def address_problem(address: str) -> str | None:
    """Why ``address`` is not a ZMQ address to connect to, or None."""
    if address.startswith(_ZMQ_SCHEMES) and len(address) > address.index("//") + 2:
        return None
    return f"{address!r} is not a ZMQ address like tcp://127.0.0.1:5557"


def parse_workers(text: str) -> list[StaticWorker]:
    """Parse ``"id[:dp]=tcp://host:port[|replay_endpoint],..."``; ``ValueError`` says what is wrong."""
    entries: list[StaticWorker] = []
    seen: set[WorkerKey] = set()
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        match = _ENTRY.fullmatch(item)
        if match is None:
            raise ValueError(
                f"--workers entry {item!r} is not ID[:DP_RANK]=tcp://HOST:PORT"
                "[|REPLAY_ENDPOINT] (ID and DP_RANK are non-negative integers)"
            )
        endpoint = match["endpoint"].strip()
        replay = match["replay"].strip() if match["replay"] else None
        for what, address in (("endpoint", endpoint), ("replay endpoint", replay)):
            problem = address_problem(address) if address is not None else None
            if problem is not None:
                raise ValueError(f"--workers entry {item!r}: the {what} {problem}")
        worker = StaticWorker(int(match["id"]), int(match["dp"] or 0), endpoint, replay)
        if worker.instance_id > U64_MAX:
            raise ValueError(f"--workers entry {item!r}: the instance id is over 2**64 - 1")
        key = (worker.instance_id, worker.dp_rank)
        if key in seen:
            raise ValueError(
                f"--workers names instance {key[0]} dp rank {key[1]} twice; give "
                "each (id, dp rank) one endpoint"
            )
        seen.add(key)
        entries.append(worker)
    if not entries:
        raise ValueError("--workers is empty; give at least one ID[:DP_RANK]=tcp://HOST:PORT")
    return entries
