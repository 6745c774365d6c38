"""``dyn inspect-kv``: read a KV index's views once (or every ``interval_s`` with ``watch``) and
show a ``KvSnapshot``, as rich tables or as JSON.

One inspection reads ``/workers``, ``/dump`` and ``/metrics`` (and ``POST /query`` with a
prompt). ``--watch`` reads ``/dump`` once (the model and block size: a dump per refresh would
stall a large index's single writer), then ``/workers`` and ``/metrics`` (and the query) every
``interval_s``, for ``duration_s`` seconds (0: until Ctrl-C, which ends it with status 0).
``ConfigError`` (what the user gave is wrong) and ``TargetError`` (the target cannot be read)
carry the sentence the CLI prints.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field

from dyn.core.config import DiscoveryConfig
from dyn.core.errors import ConfigError
from dyn.core.inspect.metrics import MetricsError, events_per_second, read_metrics
from dyn.core.inspect.prompt import PromptTokens, prompt_tokens
from dyn.core.inspect.snapshot import (
    KvSnapshot,
    overlap,
    snapshot_json,
    tree_stats,
    worker_caches,
)
from dyn.core.inspect.target import KvTarget, TargetError, find_indexer_url, open_target


@dataclass(slots=True)
class InspectSettings:
    url: str | None = None
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    model_name: str | None = None
    model_path: str | None = None
    prompt: str | None = None
    messages_file: str | None = None
    json: bool = False
    watch: bool = False
    interval_s: float = 1.0
    duration_s: float = 0.0
    api_key: str | None = None
    """Sent as a bearer token to a target started with ``--api-key``."""


def run_inspect(settings: InspectSettings) -> None:
    """Inspect the target ``settings`` name (``--url``, else the newest ``dyn indexer`` in
    discovery) and print what it holds on stdout."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not one line per request
    if settings.prompt is not None and settings.messages_file is not None:
        raise ConfigError("give --prompt TEXT or --messages FILE, not both")
    if not settings.interval_s > 0:
        raise ConfigError(f"--interval must be positive, got {settings.interval_s}")
    if not settings.duration_s >= 0:
        raise ConfigError(f"--duration must be 0 (until Ctrl-C) or positive, got {settings.duration_s}")
    tokens = None
    if settings.prompt is not None or settings.messages_file is not None:
        tokens = prompt_tokens(
            settings.model_path, prompt=settings.prompt, messages_file=settings.messages_file
        )
    url = settings.url or find_indexer_url(
        settings.discovery.namespace,
        settings.discovery.backend,
        settings.discovery.dir,
        settings.model_name,
        settings.discovery.etcd_endpoints,
    )
    with open_target(url, api_key=settings.api_key) as target:
        model, dump = target.dump()
        if tokens is not None and model is not None and model != tokens.model_name:
            print(
                f"note: {target.base} indexes model {model!r}; the request was tokenized "
                f"with {tokens.model_name!r}'s tokenizer (pass --model-path for {model!r})",
                file=sys.stderr,
            )
        if settings.watch:
            _watch(target, settings, model, dump.block_size, tokens)
            return
        tree, deepest = tree_stats(dump)
        snapshot = read_snapshot(target, model, dump.block_size, tokens, deepest)
        snapshot.tree = tree
        _show(snapshot, settings.json)


def read_snapshot(
    target: KvTarget,
    model: str | None,
    block_size: int | None,
    tokens: PromptTokens | None,
    deepest: dict[tuple[int, int], int] | None = None,
) -> KvSnapshot:
    """Workers, metrics and the request's overlap as the target answers now (no tree)."""
    workers = worker_caches(target.workers(), deepest)
    try:
        hit_rate, events = read_metrics(target.metrics())
    except MetricsError as exc:
        raise TargetError(f"{target.base}/metrics: {exc}") from None
    snapshot = KvSnapshot(
        target=target.base,
        model=model,
        block_size=block_size,
        workers=workers,
        cached_blocks=sum(w.blocks for w in workers),
        hit_rate=hit_rate,
        events=events,
    )
    if tokens is not None:
        snapshot.overlap = overlap(target.query(tokens.token_ids), len(tokens.token_ids), workers)
        snapshot.block_size = snapshot.block_size or snapshot.overlap.block_size or None
    return snapshot


def _show(snapshot: KvSnapshot, as_json: bool) -> None:
    if as_json:
        print(snapshot_json(snapshot), flush=True)
        return
    from rich.console import Console

    from dyn.core.inspect.view import snapshot_view

    Console().print(snapshot_view(snapshot))


def _watch(
    target: KvTarget,
    settings: InspectSettings,
    model: str | None,
    block_size: int | None,
    tokens: PromptTokens | None,
) -> None:
    from rich.console import Console
    from rich.live import Live

    from dyn.core.inspect.view import watch_view

    started = time.monotonic()
    ends = started + settings.duration_s if settings.duration_s else None
    previous = None
    console = Console()
    live = None if settings.json else Live(console=console, auto_refresh=False)
    try:
        if live is not None:
            live.start()
        while True:
            now = time.monotonic()
            snapshot = read_snapshot(target, model, block_size, tokens)
            if previous is not None and snapshot.events is not None:
                snapshot.events.per_second = events_per_second(
                    previous[1].events, snapshot.events, now - previous[0]
                )
            previous = (now, snapshot)
            if live is None:
                print(snapshot_json(snapshot), flush=True)
            else:
                live.update(watch_view(snapshot, now - started), refresh=True)
            wake = now + settings.interval_s
            if ends is not None and wake > ends:
                if now >= ends:
                    return
                wake = ends
            time.sleep(max(0.0, wake - time.monotonic()))
    except KeyboardInterrupt:
        return
    finally:
        if live is not None:
            live.stop()
            if not console.is_terminal:
                console.line()  # the final frame ends without one
