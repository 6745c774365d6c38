"""``dyn indexer``: the standalone KV indexer service routers and tools query."""

from __future__ import annotations

import typer

from dyn.cli import options
from dyn.cli.config_flags import FROM_FLAGS, config_flags, discovery_flags, flag_table
from dyn.core.config import DiscoveryConfig
from dyn.core.indexer.flags import IndexerFlags


@discovery_flags
@config_flags("flags", IndexerFlags, flags=flag_table(IndexerFlags))
def indexer(
    host: str = options.HOST,
    advertise_host: str = options.ADVERTISE_HOST,
    flags: IndexerFlags = FROM_FLAGS,  # --http-port, --zmq-port, --block-size, --workers, ...
    api_key: str = options.API_KEY,
    plane_keys: str = options.PLANE_KEYS,
    model_path: str = options.MODEL_PATH,
    model_name: str = options.MODEL_NAME,
    discovery: DiscoveryConfig = FROM_FLAGS,  # --namespace, --discovery-backend, --discovery-dir
) -> None:
    """Standalone KV indexer: follows the workers' KV events and answers which worker caches
    how much of a prompt, over HTTP and ZMQ (routers use it with --use-remote-indexer)."""
    from dyn.core.indexer.peers import peer_problem
    from dyn.core.indexer.service import IndexerSettings, run_indexer
    from dyn.core.indexer.workers import parse_workers

    options.use_sockets(plane_keys, advertise_host)
    static = None
    if flags.workers is not None:
        try:
            static = parse_workers(flags.workers)
        except ValueError as exc:
            raise typer.BadParameter(options.env_hint(str(exc)), param_hint="--workers") from None
        if flags.block_size is None:
            raise typer.BadParameter(
                "--workers needs --block-size (the engines' KV block size)", param_hint="--block-size"
            )
    peers = [url.strip() for url in (flags.peers or "").split(",") if url.strip()]
    for url in peers:
        if (problem := peer_problem(url)) is not None:
            raise typer.BadParameter(options.env_hint(problem), param_hint="--peers")
    settings = IndexerSettings(
        host=host,
        http_port=flags.http_port,
        zmq_port=flags.zmq_port,
        block_size=flags.block_size,
        workers=static,
        peers=peers,
        model_name=model_name,
        model_path=model_path,
        event_threads=flags.router_event_threads,
        discovery=discovery,
        api_key=api_key or None,
    )
    options.run_service(run_indexer, settings)


def register(app: typer.Typer) -> None:
    """Add this command to ``app`` (``dyn.cli.app``'s loaders)."""
    app.command("indexer")(indexer)
