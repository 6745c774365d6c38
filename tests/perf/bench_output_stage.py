"""Benchmark: what the output stage (reasoning and tool-call parsing) costs.

Not a test. Two parts:

- ``--micro``: microseconds per token of one choice's ``ChoiceOutput`` (``core/frontend/output.py``)
  fed a realistic reply one dyn-tiny token at a time, for several parser pairs; the baseline is
  the same text with no parser.
- the anchor load (default): ``../shared/anchor/load.py`` (streaming, max_tokens 16, ignore_eos)
  against NVIDIA Dynamo 1.6.1 and ``dyn serve`` (plain requests), then ``dyn serve`` with every
  request offering two tools, unparsed (``tool_choice: none``: the same prompts, nothing parsed)
  and parsed (``tool_choice: auto`` so ``hermes`` reads every chunk, and the frontend's
  ``--reasoning-parser basic``), alternating inside each round; medians of req/s, TTFT p50 and
  the frontend's CPU milliseconds per request (its utime + stime around the load run; steadier
  than req/s on a shared machine). Parsed over unparsed is what parsing costs.

    python tests/perf/bench_output_stage.py --micro
    python tests/perf/bench_output_stage.py --rounds 3 --requests 3000 --concurrency 32 128
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("bench_vs_anchor", HERE / "bench_vs_anchor.py")
anchor = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(anchor)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
        },
    },
]

REPLY = (
    "<think>\nThe user asks for the weather in two cities, so I will call the tool twice and then "
    "summarise what it returns in one short sentence.\n</think>\n\nLet me check both cities.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "San Francisco, CA", "unit": "celsius"}}\n'
    "</tool_call>"
)
PLAIN = (
    "Python's standard library has a module for almost everything: pathlib for paths, json for "
    "JSON, asyncio for concurrency and itertools for iteration. "
) * 3


def micro(repeats: int) -> None:
    from dyn.core.frontend.output import OutputPlan
    from dyn.core.frontend.tokenizer import Tokenizer
    from dyn.core.model import TINY_MODEL_DIR
    from dyn.core.parsers.reasoning import REASONING_PARSERS
    from dyn.core.parsers.tool import TOOL_PARSERS, Tool

    tok = Tokenizer.from_dir(TINY_MODEL_DIR)
    tools = tuple(Tool(t["function"]["name"], t["function"]["parameters"]) for t in TOOLS)

    def pieces(text: str) -> list[str]:
        return [
            tok.decode([i], skip_special_tokens=False) for i in tok.encode(text, add_special_tokens=False)
        ]

    cases = [
        ("no parser (baseline)", PLAIN, None),
        (
            "basic + hermes, plain text",
            PLAIN,
            OutputPlan(REASONING_PARSERS.get("basic"), TOOL_PARSERS.get("hermes"), tools),
        ),
        (
            "qwen3 + hermes, reasoning + 2 calls",
            REPLY,
            OutputPlan(REASONING_PARSERS.get("qwen3"), TOOL_PARSERS.get("hermes"), tools),
        ),
        (
            "hermes alone, 2 calls",
            REPLY.split("</think>\n\n")[1],
            OutputPlan(tool_parser=TOOL_PARSERS.get("hermes"), tools=tools),
        ),
        (
            "forced required, JSON array",
            '[{"name": "get_weather", "parameters": {"city": "Paris"}}]' * 1,
            OutputPlan(forced="required", tools=tools),
        ),
    ]
    print("| stream | tokens | µs per token (median of %d) |" % repeats)
    print("|---|---|---|")
    for name, text, plan in cases:
        parts = pieces(text)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            if plan is not None:
                out = plan.new()
                for part in parts:
                    out.push(part)
                out.finish()
            else:
                for part in parts:
                    part.encode()
            times.append((time.perf_counter() - start) / len(parts) * 1e6)
        print(f"| {name} | {len(parts)} | {statistics.median(times):.2f} |")


class DynParsing(anchor.Dyn):
    """``dyn serve`` with a reasoning parser on the frontend; requests offer tools with
    ``tool_choice`` auto (``hermes`` reads every chunk) or, for ``parsing=False``, ``none`` (the
    same prompts, nothing parsed)."""

    def __init__(self, args, parsing: bool) -> None:
        super().__init__(args)
        self.parsing = parsing
        self.name = "dyn-tools-parsed" if parsing else "dyn-tools-unparsed"

    def start(self) -> int:
        env = {**os.environ, "DYN_DISCOVERY_DIR": self.tmp.name}
        flags = ["--reasoning-parser", "basic"] if self.parsing else []
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dyn.cli",
                "serve",
                "--http-port",
                str(self.args.port),
                "--router-mode",
                self.args.router_mode,
                "--speedup-ratio",
                "100",
                "--block-size",
                "16",
                "--num-gpu-blocks-override",
                "8192",
                *flags,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        anchor.wait_ready(f"http://127.0.0.1:{self.args.port}", 2)
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid), "-f", "dyn.cli frontend"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        return int(out[0])


_WITH_TOOLS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import load
extra = json.loads(sys.argv[2])
plain = load.run_aiohttp
async def with_tools(args, payloads, model):
    return await plain(args, [dict(p, **extra) for p in payloads], model)
load.run_aiohttp = with_tools
sys.argv = ["load.py", *sys.argv[3:]]
load.main()
"""


def load(args, concurrency: int, extra: dict | None) -> dict:
    """The anchor's load.py, every request body updated with ``extra`` (tools, tool_choice)."""
    python = str(Path(args.anchor_dir, "venv", "bin", "python"))
    flags = [
        "--url",
        f"http://127.0.0.1:{args.port}",
        "--concurrency",
        str(concurrency),
        "--requests",
        str(args.requests),
        "--max-tokens",
        "16",
        "--ignore-eos",
    ]
    cmd = (
        [python, "-c", _WITH_TOOLS, args.anchor_scripts, json.dumps(extra), *flags]
        if extra
        else [python, str(Path(args.anchor_scripts) / "load.py"), *flags]
    )
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


SYSTEMS = ("dynamo", "dyn", "dyn-tools-unparsed", "dyn-tools-parsed")


def macro(args) -> None:
    rows: list[dict] = []
    for rnd in range(args.rounds):
        systems = [anchor.Dynamo(args), anchor.Dyn(args), DynParsing(args, False), DynParsing(args, True)]
        for system in systems if rnd % 2 == 0 else systems[::-1]:
            pid = system.start()
            extra = None
            if isinstance(system, DynParsing):
                extra = {"tools": TOOLS, "tool_choice": "auto" if system.parsing else "none"}
            try:
                for c in args.concurrency:
                    cpu0 = anchor.cpu_seconds(pid)
                    result = load(args, c, extra)
                    cpu = anchor.cpu_seconds(pid) - cpu0
                    row = {
                        "system": system.name,
                        "round": rnd,
                        "concurrency": c,
                        "req_per_s": result["req_per_s"],
                        "ttft_p50_ms": result["ttft_ms"]["p50"],
                        "failed": result["requests_failed"],
                        "frontend_cpu_ms_per_req": round(1000 * cpu / max(result["requests_ok"], 1), 3),
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            finally:
                system.stop()
    print()
    print(
        "| concurrency | metric | Dynamo 1.6.1 | dyn | dyn, tools unparsed | dyn, tools parsed | parsed / unparsed |"
    )
    print("|---|---|---|---|---|---|---|")
    for c in args.concurrency:
        for key in ("req_per_s", "ttft_p50_ms", "frontend_cpu_ms_per_req"):
            med = {
                s: statistics.median(r[key] for r in rows if r["system"] == s and r["concurrency"] == c)
                for s in SYSTEMS
            }
            print(
                f"| {c} | {key} | {med['dynamo']:.1f} | {med['dyn']:.1f} | {med['dyn-tools-unparsed']:.1f} | "
                f"{med['dyn-tools-parsed']:.1f} | {med['dyn-tools-parsed'] / med['dyn-tools-unparsed']:.3f} |"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--micro", action="store_true", help="only the per-token cost of the output stage")
    ap.add_argument("--micro-repeats", type=int, default=200)
    ap.add_argument("--anchor-dir", default=os.environ.get("ANCHOR_DIR", "/tmp/dyn-anchor"))
    ap.add_argument("--anchor-scripts", default=str(anchor.DEFAULT_ANCHOR_SCRIPTS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--router-mode", default="kv")
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args()
    if args.micro:
        micro(args.micro_repeats)
    else:
        macro(args)


if __name__ == "__main__":
    main()
