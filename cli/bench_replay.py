"""``dyn bench replay --offline TRACE``: a trace through the real router and simulated mocker
workers in virtual time (``dyn.core.bench.replay`` driving ``dyn.plugins.mocker.simulator``), reported
like a live ``dyn bench`` run.

The command function ``replay`` is registered by ``dyn.cli.bench``. Its own flags are declared once
in ``dyn.core.bench.replay_flags.ReplayFlags``; it also takes the router flags
(``@router_flags``) and the mocker engine flags (``@mocker_flags_beside_router``) of ``dyn
frontend`` and ``dyn worker mocker``, with the same names and meanings; the ``--aic-*`` flags,
which both declare, are offered once and set both (the router's prefill load model and the
mocker's timing model read the same AIConfigurator setup).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from dyn.cli import completion
from dyn.cli.config_flags import FROM_FLAGS, config_flags, flag_table
from dyn.cli.mocker_flags import mocker_flags_beside_router
from dyn.cli.router_flags import router_flags
from dyn.core.bench.replay_flags import ReplayFlags

if TYPE_CHECKING:
    from dyn.core.bench.replay import ReplayResult, ReplaySettings
    from dyn.core.bench.trace import TraceRow
    from dyn.core.router.config import KvRouterConfig
    from dyn.plugins.mocker.config import MockerConfig


@mocker_flags_beside_router
@router_flags
@config_flags(
    "flags",
    ReplayFlags,
    flags=flag_table(ReplayFlags, {"router_mode": completion.offline_router_modes}),
)
def replay(
    flags: ReplayFlags = FROM_FLAGS,  # --offline, --num-workers, ... (dyn.core.bench.replay_flags)
    mocker_config: MockerConfig = FROM_FLAGS,  # the engine flags, see dyn.cli.mocker_flags
    router_config: KvRouterConfig = FROM_FLAGS,  # the KV router flags, see dyn.cli.router_flags
) -> None:
    """Replay a trace offline: the real router code drives simulated mocker workers in virtual
    time, so an hour of trace takes seconds to a minute; reports the metrics of a live run."""
    from dyn.core.bench.replay import replay as run_replay
    from dyn.core.bench.report import writable
    from dyn.core.bench.trace import TraceError, read_trace
    from dyn.core.errors import ConfigError

    try:
        if flags.output:
            writable("--output", flags.output)
        rows = read_trace(flags.offline, limit=flags.num_requests)
        settings = _settings(flags, rows, mocker_config, router_config)
        result = run_replay(rows, settings)
    except (TraceError, ConfigError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    _report(flags, rows, settings, result)


def _settings(
    flags: ReplayFlags, rows: list[TraceRow], mocker_config: MockerConfig, router_config: KvRouterConfig
) -> ReplaySettings:
    """The replay the flags ask for: its workers, the simulated mocker, the router and the trace's
    block size (``--trace-block-size``, else the trace format's)."""
    from dyn.core.bench.replay import ReplaySettings
    from dyn.core.bench.trace import default_block_size
    from dyn.plugins.mocker.simulator import MockerSimulator

    # as in dyn frontend: the load-aware preset implies the KV router
    router_mode = "kv" if router_config.load_aware else flags.router_mode
    return ReplaySettings(
        num_workers=flags.num_workers,
        num_prefill_workers=flags.num_prefill_workers,
        num_decode_workers=flags.num_decode_workers,
        simulator=MockerSimulator(mocker_config),
        router_mode=router_mode,
        router=router_config,
        speedup=flags.speedup,
        trace_block_size=flags.trace_block_size or default_block_size(rows, flags.offline),
        vocab_size=flags.vocab_size,
        seed=flags.seed,
        limit=flags.num_requests,
    )


def _report(flags: ReplayFlags, rows: list[TraceRow], settings: ReplaySettings, result: ReplayResult) -> None:
    """Print the run's summary and the simulation's line; write the results with ``--output``."""
    from rich.console import Console

    from dyn.core.bench.replay import bench_result, simulation_line
    from dyn.core.bench.report import print_summary, write_result

    bench = bench_result(flags.offline, rows, settings, result)
    console = Console()
    print_summary(bench, console)
    console.print(simulation_line(result))
    if flags.output:
        write_result(flags.output, bench)
        console.print(f"results written to {flags.output}")
