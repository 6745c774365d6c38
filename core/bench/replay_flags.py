"""``dyn bench replay``'s own flags, declared once (``dyn.core.config``): ``ReplayFlags``.

Each field is one flag of ``dyn bench replay``, named after it, with its default, range, help text
and ``--help`` panel; ``dyn.cli.bench_replay`` offers them (``dyn.cli.config_flags.flag_table``:
the Typer options, their ``DYN_*`` twins, the ``--config`` keys, the man page and the completions).
The router's and the mocker's flags are ``KvRouterConfig``'s and ``MockerConfig``'s; ``--speedup``
and ``--trace-block-size`` are ``dyn bench --trace``'s (``dyn.core.bench.config``). This module
imports nothing heavy: the command line is built from it before anything runs.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from dyn.core.bench.config import TRACE, TraceBlockSize, TraceSpeedup
from dyn.core.config import WORKER_PANEL, flag
from dyn.core.router.modes import modes_help

REPLAY_PANEL = TRACE
ROUTER_PANEL = "Router"
OUTPUT_PANEL = "Output"


class ReplayFlags(msgspec.Struct, kw_only=True, frozen=True):
    """The values of ``dyn bench replay``'s own flags, as given."""

    offline: Annotated[
        str,
        flag(
            "--offline",
            panel=REPLAY_PANEL,
            help="The Mooncake (or Bailian) JSONL trace to replay offline: the real router "
            "and simulated mocker workers in virtual time, no sockets. Only offline "
            "replay exists here; to replay a trace against a live server use "
            "dyn bench --trace FILE.",
        ),
    ]
    num_workers: Annotated[
        Annotated[int, Meta(ge=1)],
        flag(
            "--num-workers",
            panel=WORKER_PANEL,
            help="Simulated mocker workers, each with its own scheduler and KV cache.",
        ),
    ] = 1
    num_prefill_workers: Annotated[
        Annotated[int, Meta(ge=0)],
        flag(
            "--num-prefill-workers",
            panel=WORKER_PANEL,
            help="Disaggregated replay: simulated prefill workers, beside --num-decode-workers "
            "(--num-workers is then not used), routed in two stages as dyn frontend routes them.",
        ),
    ] = 0
    num_decode_workers: Annotated[
        Annotated[int, Meta(ge=0)],
        flag(
            "--num-decode-workers",
            panel=WORKER_PANEL,
            help="Disaggregated replay: simulated decode workers, which receive each prompt's KV "
            "and generate; the transfer takes time only with --kv-bytes-per-token (a replay has no "
            "model to read it from) at --kv-transfer-bandwidth.",
        ),
    ] = 0
    router_mode: Annotated[
        str,
        flag("--router-mode", panel=ROUTER_PANEL, help=modes_help(offline=True)),
    ] = "kv"
    speedup: TraceSpeedup = 1.0
    trace_block_size: TraceBlockSize = None
    vocab_size: Annotated[
        Annotated[int, Meta(ge=17)],
        flag(
            "--vocab-size",
            panel=REPLAY_PANEL,
            help="Token ids of synthesized trace prompts stay below this (as dyn bench "
            "--trace, so both send the same prompts).",
        ),
    ] = 4096
    num_requests: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        flag(
            "--num-requests",
            panel=REPLAY_PANEL,
            help="Replay only this many rows from the start of the trace.",
        ),
    ] = None
    seed: Annotated[
        int,
        flag(
            "--seed",
            scope="bench",
            panel=REPLAY_PANEL,
            help="Seed of every random choice (same seed, same records).",
        ),
    ] = 0
    output: Annotated[
        str | None,
        flag(
            "--output",
            "-o",
            panel=OUTPUT_PANEL,
            help="Write the results (JSON, schema dyn-bench/1, kind offline) here.",
        ),
    ] = None
