"""``dyn bench replay --offline TRACE``: a trace through the real router and simulated mocker
workers in virtual time (``dyn.core.bench.replay`` driving ``dyn.plugins.mocker.simulator``), reported
like a live ``dyn bench`` run.

The command function ``replay`` is registered by ``dyn.cli.bench``. It takes the router flags
(``@router_flags``) and the mocker engine flags (``@mocker_flags_beside_router``) of ``dyn
frontend`` and ``dyn worker mocker``, with the same names and meanings; the ``--aic-*`` flags,
which both declare, are offered once and set both (the router's prefill load model and the
mocker's timing model read the same AIConfigurator setup).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from dyn.cli import completion, options
from dyn.cli.config_flags import FROM_FLAGS
from dyn.cli.mocker_flags import mocker_flags_beside_router
from dyn.cli.options import flag
from dyn.cli.router_flags import router_flags
from dyn.core.router.modes import modes_help

if TYPE_CHECKING:
    from dyn.core.router.config import KvRouterConfig
    from dyn.plugins.mocker.config import MockerConfig

REPLAY_PANEL = "Trace replay"
ROUTER_PANEL = "Router"
OUTPUT_PANEL = "Output"


@mocker_flags_beside_router
@router_flags
def replay(
    offline: str = flag(
        ...,
        "--offline",
        panel=REPLAY_PANEL,
        help="The Mooncake (or Bailian) JSONL trace to replay offline: the real router "
        "and simulated mocker workers in virtual time, no sockets. Only offline "
        "replay exists here; to replay a trace against a live server use "
        "dyn bench --trace FILE.",
    ),
    num_workers: int = flag(
        1,
        "--num-workers",
        min=1,
        panel=options.WORKER_PANEL,
        help="Simulated mocker workers, each with its own scheduler and KV cache.",
    ),
    num_prefill_workers: int = flag(
        0,
        "--num-prefill-workers",
        min=0,
        panel=options.WORKER_PANEL,
        help="Disaggregated replay: simulated prefill workers, beside --num-decode-workers "
        "(--num-workers is then not used), routed in two stages as dyn frontend routes them.",
    ),
    num_decode_workers: int = flag(
        0,
        "--num-decode-workers",
        min=0,
        panel=options.WORKER_PANEL,
        help="Disaggregated replay: simulated decode workers, which receive each prompt's KV "
        "and generate; the transfer takes time only with --kv-bytes-per-token (a replay has no "
        "model to read it from) at --kv-transfer-bandwidth.",
    ),
    router_mode: str = flag(
        "kv",
        "--router-mode",
        panel=ROUTER_PANEL,
        help=modes_help(offline=True),
        autocompletion=completion.offline_router_modes,
    ),
    speedup: float = flag(
        1.0,
        "--speedup",
        min=0.0,
        panel=REPLAY_PANEL,
        help="Divide the trace's arrival times and delays by this.",
    ),
    trace_block_size: int = flag(
        None,
        "--trace-block-size",
        min=1,
        panel=REPLAY_PANEL,
        help="Tokens per trace hash id (default: 512, or 16 for Bailian traces).",
    ),
    vocab_size: int = flag(
        4096,
        "--vocab-size",
        min=17,
        panel=REPLAY_PANEL,
        help="Token ids of synthesized trace prompts stay below this (as dyn bench "
        "--trace, so both send the same prompts).",
    ),
    num_requests: int = flag(
        None,
        "--num-requests",
        min=1,
        panel=REPLAY_PANEL,
        help="Replay only this many rows from the start of the trace.",
    ),
    seed: int = flag(
        0,
        "--seed",
        scope="bench",
        panel=REPLAY_PANEL,
        help="Seed of every random choice (same seed, same records).",
    ),
    output: str = flag(
        None,
        "--output",
        "-o",
        panel=OUTPUT_PANEL,
        help="Write the results (JSON, schema dyn-bench/1, kind offline) here.",
    ),
    mocker_config: MockerConfig = FROM_FLAGS,  # the engine flags, see dyn.cli.mocker_flags
    router_config: KvRouterConfig = FROM_FLAGS,  # the KV router flags, see dyn.cli.router_flags
) -> None:
    """Replay a trace offline: the real router code drives simulated mocker workers in virtual
    time, so an hour of trace takes seconds to a minute; reports the metrics of a live run."""
    from rich.console import Console

    from dyn.core.bench.replay import ReplaySettings, bench_result, simulation_line
    from dyn.core.bench.replay import replay as run_replay
    from dyn.core.bench.report import print_summary, writable, write_result
    from dyn.core.bench.trace import TraceError, default_block_size, read_trace
    from dyn.core.errors import ConfigError
    from dyn.plugins.mocker.simulator import MockerSimulator

    if router_config.load_aware:  # as in dyn frontend: the preset implies the KV router
        router_mode = "kv"
    try:
        if output:
            writable("--output", output)
        rows = read_trace(offline, limit=num_requests)
        block_size = trace_block_size or default_block_size(rows, offline)
        settings = ReplaySettings(
            num_workers=num_workers,
            num_prefill_workers=num_prefill_workers,
            num_decode_workers=num_decode_workers,
            simulator=MockerSimulator(mocker_config),
            router_mode=router_mode,
            router=router_config,
            speedup=speedup,
            trace_block_size=block_size,
            vocab_size=vocab_size,
            seed=seed,
            limit=num_requests,
        )
        result = run_replay(rows, settings)
    except (TraceError, ConfigError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    bench = bench_result(offline, rows, settings, result)
    console = Console()
    print_summary(bench, console)
    console.print(simulation_line(result))
    if output:
        write_result(output, bench)
        console.print(f"results written to {output}")
