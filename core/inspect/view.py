"""``KvSnapshot`` as rich tables for people: a summary, the workers, the depth histogram, the
overlap of a request; ``watch_view`` is the compact frame ``--watch`` refreshes."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from dyn.core.inspect.snapshot import KvSnapshot

BAR_WIDTH = 10


def snapshot_view(snapshot: KvSnapshot) -> RenderableType:
    parts: list[RenderableType] = [summary(snapshot), workers_table(snapshot)]
    if snapshot.tree is not None and snapshot.tree.depth_histogram:
        parts.append(depth_table(snapshot))
    if snapshot.overlap is not None:
        parts.append(overlap_table(snapshot))
    return Group(*parts)


def watch_view(snapshot: KvSnapshot, elapsed_s: float) -> RenderableType:
    parts: list[RenderableType] = [summary(snapshot, elapsed_s), workers_table(snapshot)]
    if snapshot.overlap is not None:
        parts.append(overlap_table(snapshot))
    return Group(*parts)


def summary(snapshot: KvSnapshot, elapsed_s: float | None = None) -> Text:
    lines = [
        f"target      {snapshot.target}",
        f"model       {snapshot.model or 'n/a'} (block size {snapshot.block_size or 'n/a'})",
        f"workers     {len(snapshot.workers)}, {snapshot.cached_blocks} cached blocks",
    ]
    if snapshot.tree is not None:
        tree = snapshot.tree
        lines.append(
            f"tree        {tree.nodes} distinct blocks, {tree.entries} (worker, block) "
            f"entries, max depth {tree.max_depth}"
        )
    lines.append(f"hit rate    {hit_rate_text(snapshot)}")
    lines.append(f"KV events   {events_text(snapshot, elapsed_s is not None)}")
    if elapsed_s is not None:
        lines.append(f"watching    {elapsed_s:.0f} s (Ctrl-C stops)")
    return Text("\n".join(lines))


def hit_rate_text(snapshot: KvSnapshot) -> str:
    hits = snapshot.hit_rate
    if hits is None:
        return "n/a (the target has no KV router)"
    if hits.mean is None:
        return "n/a (no request routed yet)"
    return f"{hits.mean:.1%} mean predicted over {hits.requests} routed requests"


def events_text(snapshot: KvSnapshot, rate: bool) -> str:
    events = snapshot.events
    if events is None:
        return "n/a (the index is not fed by KV events)"
    text = f"{events.applied} applied, {events.failed} refused by the index"
    if rate:
        text += (
            f", {events.per_second:.1f}/s"
            if events.per_second is not None
            else ", -/s (measured from the next refresh)"
        )
    return text


def workers_table(snapshot: KvSnapshot) -> Table:
    table = Table(title="Cached blocks per worker", title_justify="left")
    table.add_column("instance", no_wrap=True, min_width=19)
    for name in ("dp", "blocks", "capacity", "occupancy"):
        table.add_column(name, justify="right", no_wrap=True)
    depth = any(w.max_depth is not None for w in snapshot.workers)
    if depth:
        table.add_column("max depth", justify="right", no_wrap=True)
    for w in snapshot.workers:
        row = [
            str(w.instance_id),
            str(w.dp_rank),
            str(w.blocks),
            str(w.total_blocks) if w.total_blocks else "n/a",
            f"{w.occupancy:.1%} {bar(w.occupancy)}" if w.occupancy is not None else "n/a",
        ]
        if depth:
            row.append(str(w.max_depth) if w.max_depth is not None else "n/a")
        table.add_row(*row)
    if not snapshot.workers:
        table.add_row("(no workers)", *[""] * (len(table.columns) - 1))
    return table


def depth_table(snapshot: KvSnapshot) -> Table:
    assert snapshot.tree is not None
    buckets = snapshot.tree.depth_histogram
    top = max(b.blocks for b in buckets)
    table = Table(title="Blocks by chain depth", title_justify="left")
    table.add_column("depth", justify="right")
    table.add_column("blocks", justify="right")
    table.add_column("", justify="left")
    for b in buckets:
        depths = str(b.min_depth) if b.min_depth == b.max_depth else f"{b.min_depth}-{b.max_depth}"
        table.add_row(depths, str(b.blocks), bar(b.blocks / top))
    return table


def overlap_table(snapshot: KvSnapshot) -> Table:
    assert snapshot.overlap is not None
    o = snapshot.overlap
    table = Table(
        title=f"Cached prefix of the request ({o.prompt_tokens} tokens, "
        f"{o.prompt_blocks} full blocks of {o.block_size})",
        title_justify="left",
    )
    table.add_column("instance", no_wrap=True, min_width=19)
    for name in ("dp", "blocks", "tokens", "share"):
        table.add_column(name, justify="right", no_wrap=True)
    for w in o.workers:
        table.add_row(
            str(w.instance_id),
            str(w.dp_rank),
            str(w.matched_blocks),
            str(w.matched_tokens),
            f"{w.share:.1%} {bar(w.share)}",
        )
    if not o.workers:
        table.add_row("(no workers)", "", "", "", "")
    return table


def bar(fraction: float) -> str:
    filled = round(max(0.0, min(fraction, 1.0)) * BAR_WIDTH)
    return "█" * filled + "·" * (BAR_WIDTH - filled)
