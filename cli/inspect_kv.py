"""``dyn inspect-kv``: which worker caches which prefix, read from an indexer, router or frontend."""

from __future__ import annotations

import typer

from dyn.cli import options
from dyn.cli.config_flags import FROM_FLAGS, discovery_flags
from dyn.cli.options import flag
from dyn.core.config import DiscoveryConfig

TARGET_PANEL = "Target"
REQUEST_PANEL = "Request"
OUTPUT_PANEL = "Output"


@discovery_flags
def inspect_kv(
    url: str = flag(
        None,
        "--url",
        scope="inspect-kv",
        panel=TARGET_PANEL,
        help="HTTP URL of a dyn indexer (its http= address), of a frontend with "
        "--router-mode kv (http://HOST:PORT, or the /v1 URL dyn serve prints), or of a dyn "
        "router's --system-port (their views are under /kv/, found by probing). Default: the "
        "newest dyn indexer in discovery.",
    ),
    api_key: str = flag(
        None,
        "--api-key",
        panel=TARGET_PANEL,
        help="The target's --api-key, sent as 'Authorization: Bearer KEY'.",
    ),
    discovery: DiscoveryConfig = FROM_FLAGS,  # --namespace, --discovery-backend, --discovery-dir
    model_name: str = flag(
        None,
        "--model-name",
        panel=options.MODEL_PANEL,
        help="Find the dyn indexer of this model in discovery (default: any model).",
    ),
    model_path: str = flag(
        None,
        "--model-path",
        panel=options.MODEL_PANEL,
        help="Model directory whose tokenizer and chat template make the "
        "--prompt / --messages tokens (default: the embedded dyn-tiny).",
    ),
    prompt: str = flag(
        None,
        "--prompt",
        panel=REQUEST_PANEL,
        help="Show each worker's cached share of this text, tokenized raw (no "
        "chat template), as /v1/completions tokenizes it.",
    ),
    messages: str = flag(
        None,
        "--messages",
        panel=REQUEST_PANEL,
        help="Show each worker's cached share of this chat: a JSON file with a "
        'list of OpenAI messages (or an object with "messages"), '
        "rendered with the model's chat template and generation prompt.",
    ),
    json_output: bool = flag(
        False,
        "--json",
        panel=OUTPUT_PANEL,
        help="Print one JSON object (with --watch: one per refresh, one per "
        "line); the schema is in dyn.core.inspect.snapshot.",
    ),
    watch: bool = flag(
        False,
        "--watch",
        panel=OUTPUT_PANEL,
        help="Refresh a live view of per-worker blocks and occupancy and KV events per second.",
    ),
    interval: float = flag(
        1.0, "--interval", min=0.05, panel=OUTPUT_PANEL, help="Seconds between --watch refreshes."
    ),
    duration: float = flag(
        0.0,
        "--duration",
        scope="inspect-kv",
        min=0.0,
        panel=OUTPUT_PANEL,
        help="Stop --watch after this many seconds (0: at Ctrl-C).",
    ),
) -> None:
    """Show what a KV index holds: cached blocks per worker, tree size and depth, hit rates, and
    with --prompt or --messages how much of that request each worker has cached."""
    from dyn.core.errors import ConfigError
    from dyn.core.inspect.command import InspectSettings, run_inspect
    from dyn.core.inspect.target import TargetError
    from dyn.core.server_url import server_root

    if url is not None:
        try:
            url = server_root(url)
        except ConfigError as exc:  # exit 1, as for every other unusable target
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
    settings = InspectSettings(
        url=url,
        discovery=discovery,
        model_name=model_name,
        model_path=model_path,
        prompt=prompt,
        messages_file=messages,
        json=json_output,
        watch=watch,
        interval_s=interval,
        duration_s=duration,
        api_key=api_key or None,
    )
    try:
        run_inspect(settings)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except TargetError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
