"""``dyn indexer``: the standalone KV indexer service routers and tools query."""

from __future__ import annotations

import typer

from dyn.cli import options
from dyn.cli.config_flags import FROM_FLAGS, discovery_flags
from dyn.cli.options import flag
from dyn.core.config import DiscoveryConfig

INDEXER_PANEL = "Indexer"


@discovery_flags
def indexer(
    host: str = options.HOST,
    advertise_host: str = options.ADVERTISE_HOST,
    http_port: int = flag(
        8090,
        "--http-port",
        "--port",
        scope="indexer",
        min=0,
        max=65535,
        panel=INDEXER_PANEL,
        help="Port of the HTTP API (/query, /workers, /dump, /metrics; 0: a free port, printed at start).",
    ),
    zmq_port: int = flag(
        0,
        "--zmq-port",
        min=0,
        max=65535,
        panel=INDEXER_PANEL,
        help="Port of the ZMQ query socket routers connect to (0: a free port, printed at start).",
    ),
    block_size: int = flag(
        None,
        "--block-size",
        min=1,
        panel=INDEXER_PANEL,
        help="KV block size the engines use (default: the first discovered "
        "worker's; required with --workers).",
    ),
    workers: str = flag(
        None,
        "--workers",
        scope="indexer",
        panel=INDEXER_PANEL,
        help="Follow these workers instead of discovery: "
        "'ID[:DP_RANK]=tcp://HOST:PORT[|REPLAY_ENDPOINT],...' (the KV-event "
        "PUB socket, and optionally its replay socket).",
    ),
    router_event_threads: int = flag(
        1,
        "--router-event-threads",
        "--threads",
        min=1,
        panel=INDEXER_PANEL,
        help="Threads that receive and decode KV events (1: on the query loop).",
    ),
    api_key: str = options.API_KEY,
    plane_keys: str = options.PLANE_KEYS,
    model_path: str = options.MODEL_PATH,
    model_name: str = options.MODEL_NAME,
    discovery: DiscoveryConfig = FROM_FLAGS,  # --namespace, --discovery-backend, --discovery-dir
) -> None:
    """Standalone KV indexer: follows the workers' KV events and answers which worker caches
    how much of a prompt, over HTTP and ZMQ (routers use it with --use-remote-indexer)."""
    from dyn.core.errors import ConfigError
    from dyn.core.indexer.service import IndexerSettings, parse_workers, run_indexer

    options.use_plane_keys(plane_keys)
    options.use_advertise_host(advertise_host)
    static = None
    if workers is not None:
        try:
            static = parse_workers(workers)
        except ValueError as exc:
            raise typer.BadParameter(options.env_hint(str(exc)), param_hint="--workers") from None
        if block_size is None:
            raise typer.BadParameter(
                "--workers needs --block-size (the engines' KV block size)", param_hint="--block-size"
            )
    settings = IndexerSettings(
        host=host,
        http_port=http_port,
        zmq_port=zmq_port,
        block_size=block_size,
        workers=static,
        model_name=model_name,
        model_path=model_path,
        event_threads=router_event_threads,
        discovery=discovery,
        api_key=api_key or None,
    )
    try:
        run_indexer(settings)
    except ConfigError as exc:
        options.fail(str(exc))
