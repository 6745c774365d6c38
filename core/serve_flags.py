"""``dyn serve``'s own flags, declared once (``dyn.core.config``): ``ServeFlags``.

Each field is one flag of ``dyn serve``, named after it, with its default, range, help text and
``--help`` panel; ``dyn.cli.serve`` offers them (``dyn.cli.config_flags.flag_table``: the Typer
options, their ``DYN_*`` twins, the ``--config`` keys, the man page and the completions). The
discovery flags are ``DiscoveryConfig``'s and ``--model-path`` / ``--model-name`` stay in
``dyn.cli.options``; every other flag goes to the children (``dyn frontend``, ``dyn worker ENGINE``).
This module imports nothing heavy: the command line is built from it before anything runs.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from dyn.core.config import flag

SERVE_PANEL = "Stack"
"""The ``--help`` panel of ``dyn serve``'s own flags."""


class ServeFlags(msgspec.Struct, kw_only=True, frozen=True):
    """The values of ``dyn serve``'s own flags, as given."""

    workers: Annotated[
        Annotated[int, Meta(ge=1)],
        flag("--workers", panel=SERVE_PANEL, help="Worker processes to start."),
    ] = 2
    prefill_workers: Annotated[
        Annotated[int, Meta(ge=0)],
        flag(
            "--prefill-workers",
            panel=SERVE_PANEL,
            help="Disaggregated stack: this many prefill worker processes (--disaggregation-mode "
            "prefill), beside --decode-workers; --workers is then not used.",
        ),
    ] = 0
    decode_workers: Annotated[
        Annotated[int, Meta(ge=0)],
        flag(
            "--decode-workers",
            panel=SERVE_PANEL,
            help="Disaggregated stack: this many decode worker processes (--disaggregation-mode decode).",
        ),
    ] = 0
    engine: Annotated[
        str,
        flag(
            "--engine",
            panel=SERVE_PANEL,
            help="Engine of the workers: any dyn worker subcommand (mocker, vllm, sglang).",
        ),
    ] = "mocker"
    gpus_per_worker: Annotated[
        Annotated[int, Meta(ge=0)],
        flag(
            "--gpus-per-worker",
            panel=SERVE_PANEL,
            help="Give each worker process its own N GPUs through CUDA_VISIBLE_DEVICES "
            "(slices of the visible ones); 0 leaves it alone, so the workers share them.",
        ),
    ] = 0
    http_host: Annotated[
        str,
        flag("--http-host", panel=SERVE_PANEL, help="Address the frontend's HTTP server binds to."),
    ] = "127.0.0.1"
    http_port: Annotated[
        Annotated[int, Meta(ge=0, le=65535)],
        flag(
            "--http-port",
            "--port",
            panel=SERVE_PANEL,
            help="Port of the frontend's HTTP server (0: pick a free one).",
        ),
    ] = 8000
    startup_timeout: Annotated[
        Annotated[float, Meta(ge=0.0)] | None,
        flag(
            "--startup-timeout",
            panel=SERVE_PANEL,
            help="Seconds to wait for the frontend and every worker to be routable "
            "(default: 60 for the mocker, 900 for real engines, which load weights).",
        ),
    ] = None
    restart_workers: Annotated[
        bool,
        flag(
            "--restart-workers/--no-restart-workers",
            panel=SERVE_PANEL,
            help="Restart a worker process that dies once the stack is ready, after a "
            "back-off that doubles with each quick death (1 s up to 30 s).",
        ),
    ] = True

    def startup_timeout_s(self) -> float:
        """``--startup-timeout``, else 60 s for the mocker and 900 s for real engines."""
        if self.startup_timeout is not None:
            return self.startup_timeout
        return 60.0 if self.engine == "mocker" else 900.0
