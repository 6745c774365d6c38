"""``dyn inspect-kv``: which worker caches which prefix, read from an indexer, router or frontend."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import typer

from dyn.cli.config_flags import FROM_FLAGS, config_flags, discovery_flags, flag_table
from dyn.core.config import DiscoveryConfig
from dyn.core.inspect.flags import InspectFlags

_DISCOVERY_AFTER = "api_key"
"""The ``InspectFlags`` flag the discovery flags follow, in the command's order (the order of
``--help``, the man page and the completions): after the target's, before the model's."""


def inspect_flags(command: Callable[..., None]) -> Callable[..., None]:
    """Put ``InspectFlags``' flags where the command's ``flags`` parameter is, with its
    ``discovery`` parameter after ``_DISCOVERY_AFTER``; the command receives one ``InspectFlags``."""
    wrapper = config_flags("flags", InspectFlags, flags=flag_table(InspectFlags))(command)
    signature = inspect.signature(wrapper)
    params = [p for p in signature.parameters.values() if p.name != "discovery"]
    at = next(i for i, p in enumerate(params) if p.name == _DISCOVERY_AFTER)
    params.insert(at + 1, signature.parameters["discovery"])
    wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    return wrapper


@discovery_flags
@inspect_flags
def inspect_kv(
    flags: InspectFlags = FROM_FLAGS,  # --url, --api-key, --model-name, --prompt, --json, ...
    discovery: DiscoveryConfig = FROM_FLAGS,  # --namespace, --discovery-backend, --discovery-dir
) -> None:
    """Show what a KV index holds: cached blocks per worker, tree size and depth, hit rates, and
    with --prompt or --messages how much of that request each worker has cached."""
    from dyn.core.errors import ConfigError
    from dyn.core.inspect.command import InspectSettings, run_inspect
    from dyn.core.inspect.target import TargetError
    from dyn.core.server_url import server_root

    url = flags.url
    if url is not None:
        try:
            url = server_root(url)
        except ConfigError as exc:  # exit 1, as for every other unusable target
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
    settings = InspectSettings(
        url=url,
        discovery=discovery,
        model_name=flags.model_name,
        model_path=flags.model_path,
        prompt=flags.prompt,
        messages_file=flags.messages,
        json=flags.json,
        watch=flags.watch,
        interval_s=flags.interval,
        duration_s=flags.duration,
        api_key=flags.api_key or None,
    )
    try:
        run_inspect(settings)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except TargetError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def register(app: typer.Typer) -> None:
    """Add this command to ``app`` (``dyn.cli.app``'s loaders)."""
    app.command("inspect-kv")(inspect_kv)
