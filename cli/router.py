"""``dyn router``: the standalone KV-aware router service several frontends share."""

from __future__ import annotations

import typer

from dyn.cli import options
from dyn.cli.config_flags import FROM_FLAGS, discovery_flags
from dyn.cli.options import flag
from dyn.cli.router_flags import router_flags
from dyn.core.config import DiscoveryConfig

SERVICE_PANEL = "Router service"


@router_flags
@discovery_flags
def router(
    host: str = options.HOST,
    advertise_host: str = options.ADVERTISE_HOST,
    port: int = flag(
        0,
        "--port",
        min=0,
        max=65535,
        panel=SERVICE_PANEL,
        help="Port of the ZMQ query socket frontends connect to (0: a free port, printed at start).",
    ),
    system_port: int = flag(
        None,
        "--system-port",
        min=0,
        max=65535,
        panel=SERVICE_PANEL,
        help="Serve HTTP on this port: Prometheus metrics at /metrics and "
        "the router's KV index views under /kv/ (/kv/workers, "
        "/kv/query, /kv/dump; read by dyn inspect-kv). 0: a free "
        "port, printed at start.",
    ),
    api_key: str = options.API_KEY,
    plane_keys: str = options.PLANE_KEYS,
    model_path: str = options.MODEL_PATH,
    model_name: str = options.MODEL_NAME,
    discovery: DiscoveryConfig = FROM_FLAGS,  # --namespace, --discovery-backend, --discovery-dir
    router_config=None,
) -> None:
    """Standalone KV-aware router service for several frontends: start it, then run each
    frontend with --router-mode kv --router-address tcp://HOST:PORT (or auto)."""
    from dyn.core.router.service import RouterSettings, run_router_service

    options.use_sockets(plane_keys, advertise_host)
    if router_config.uses_aic:  # built while workers register
        from dyn.core.router.prefill_model import AicSetup, shared_durations

        shared_durations(AicSetup.from_config(router_config))
    settings = RouterSettings(
        host=host,
        port=port,
        discovery=discovery,
        model_path=model_path,
        model_name=model_name,
        router_config=router_config,
        system_port=system_port,
        api_key=api_key or None,
    )
    options.run_service(run_router_service, settings)


def register(app: typer.Typer) -> None:
    """Add this command to ``app`` (``dyn.cli.app``'s loaders)."""
    app.command("router")(router)
