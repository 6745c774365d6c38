"""``dyn indexer``'s own flags, declared once (``dyn.core.config``): ``IndexerFlags``.

Each field is one flag of ``dyn indexer``, named after it, with its default, range, help text and
``--help`` panel; ``dyn.cli.indexer`` offers them (``dyn.cli.config_flags.flag_table``: the Typer
options, their ``DYN_*`` twins, the ``--config`` keys, the man page and the completions) and builds
the ``IndexerSettings`` from the values. The flags several commands share (``--host``,
``--api-key``, ``--model-path``, ...) stay in ``dyn.cli.options``; the discovery flags are
``DiscoveryConfig``'s. This module imports nothing heavy: the command line is built from it.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from dyn.core.config import flag

INDEXER_PANEL = "Indexer"


class IndexerFlags(msgspec.Struct, kw_only=True, frozen=True):
    """The values of ``dyn indexer``'s own flags, as given (``dyn.cli.indexer`` turns them into an
    ``IndexerSettings``)."""

    http_port: Annotated[
        Annotated[int, Meta(ge=0, le=65535)],
        flag(
            "--http-port",
            "--port",
            scope="indexer",
            panel=INDEXER_PANEL,
            help="Port of the HTTP API (/query, /workers, /dump, /metrics; 0: a free port, printed at start).",
        ),
    ] = 8090
    zmq_port: Annotated[
        Annotated[int, Meta(ge=0, le=65535)],
        flag(
            "--zmq-port",
            panel=INDEXER_PANEL,
            help="Port of the ZMQ query socket routers connect to (0: a free port, printed at start).",
        ),
    ] = 0
    block_size: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        flag(
            "--block-size",
            panel=INDEXER_PANEL,
            help="KV block size the engines use (default: the first discovered "
            "worker's; required with --workers).",
        ),
    ] = None
    workers: Annotated[
        str | None,
        flag(
            "--workers",
            scope="indexer",
            panel=INDEXER_PANEL,
            help="Follow these workers instead of discovery: "
            "'ID[:DP_RANK]=tcp://HOST:PORT[|REPLAY_ENDPOINT],...' (the KV-event "
            "PUB socket, and optionally its replay socket). More can join with POST /register.",
        ),
    ] = None
    peers: Annotated[
        str | None,
        flag(
            "--peers",
            scope="indexer",
            panel=INDEXER_PANEL,
            help="Other indexers of this model, 'http://HOST:PORT,...': at start this one copies "
            "the first answering peer's index (GET /dump) before it says it is ready.",
        ),
    ] = None
    router_event_threads: Annotated[
        Annotated[int, Meta(ge=1)],
        flag(
            "--router-event-threads",
            "--threads",
            panel=INDEXER_PANEL,
            help="Threads that receive and decode KV events (1: on the query loop).",
        ),
    ] = 1
