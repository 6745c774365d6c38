"""Benchmark: IncrementalDetokenizer.push() one token at a time, tokens per second, on dyn-tiny.

    python tests/perf/bench_detokenizer.py --tokens 100000
    python tests/perf/bench_detokenizer.py --chunk 16   # pushes of 16 ids (a burst, as the mocker sends)
    git show HEAD:core/frontend/detokenizer.py > /tmp/old.py
    python tests/perf/bench_detokenizer.py --detokenizer /tmp/old.py   # the same cases, another version

The ids are the encoding of Python standard library source plus some CJK and emoji text, repeated
to --tokens; pushed one at a time into one detokenizer: without stop strings, with two short ones,
with sixteen (none of which occur, so every push pays for the check), and a hostile case: one
stop string of --hostile-chars characters ("aaa...ab") that the stream keeps almost completing,
then breaks (" ca"), pushed --hostile-tokens times. ``construct_ms``: making a detokenizer with
that stop string, and with one four times as long; ``build_ms``: building the matcher of 64
random stop strings of 4096 characters (the default caps' largest set), when the module has one.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import time
from pathlib import Path

from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.model.info import TINY_MODEL_DIR

_EXTRA = "数据结构与算法 🚀🎉 données naïves — café ☕ 日本語のテキスト 👩‍💻\n"
_SIXTEEN = [f"<|stop{i}|>" for i in range(8)] + [f"\n### Turn {i}:" for i in range(8)]


def _token_ids(tok: Tokenizer, n: int) -> list[int]:
    text = Path(json.__file__).read_text(encoding="utf-8") + _EXTRA * 20
    ids = tok.encode(text, add_special_tokens=False)
    return (ids * (n // len(ids) + 1))[:n]


def _run(detokenizer: type, tok: Tokenizer, ids: list[int], stop: list[str], chunk: int = 1) -> float:
    detok = detokenizer(tok, ids[:8], stop=stop)
    push = detok.push
    start = time.perf_counter()
    for i in range(0, len(ids), chunk):
        push(ids[i : i + chunk])
    detok.finish()
    return len(ids) / (time.perf_counter() - start)


def _load(path: str | None):
    if path is None:
        from dyn.core.frontend import detokenizer

        return detokenizer
    spec = importlib.util.spec_from_file_location("detokenizer_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    p.add_argument("--hostile-chars", type=int, default=4096)
    p.add_argument("--hostile-tokens", type=int, default=2000)
    p.add_argument("--detokenizer", help="a detokenizer.py to measure instead of the installed one")
    p.add_argument("--chunk", type=int, default=1, help="ids per push (the hostile case keeps 1)")
    args = p.parse_args()
    module = _load(args.detokenizer)
    detokenizer = module.IncrementalDetokenizer
    tok = Tokenizer.from_dir(TINY_MODEL_DIR)
    ids = _token_ids(tok, args.tokens)

    def best(run_ids: list[int], stop: list[str], chunk: int = args.chunk) -> int:
        return round(max(_run(detokenizer, tok, run_ids, stop, chunk) for _ in range(args.repeat)))

    plain = best(ids, [])
    chars = args.hostile_chars
    hostile_ids = tok.encode("a" * (chars - 2) + " ca", add_special_tokens=False)
    hostile_ids = (hostile_ids * (args.hostile_tokens // len(hostile_ids) + 1))[: args.hostile_tokens]
    report = {
        "tokens": len(ids),
        "chunk": args.chunk,
        "tokens_per_s": plain,
        "us_per_token": round(1e6 / plain, 2),
        "tokens_per_s_with_stop_strings": best(ids, ["\nUser:", "<|stop|>"]),
        "tokens_per_s_with_16_stop_strings": best(ids, _SIXTEEN),
        "hostile_tokens_per_s": best(hostile_ids, ["a" * (chars - 1) + "b"], 1),
    }
    for size in (chars, 4 * chars):
        start = time.perf_counter()
        detokenizer(tok, stop=["c" * (size - 1) + "d"])  # a set no cache holds yet
        report[f"construct_ms_{size}"] = round((time.perf_counter() - start) * 1000, 2)
    matcher = getattr(module, "StopMatcher", None)
    if matcher is not None:
        rng = random.Random(0)
        stops = ["".join(rng.choice("abcdefgh") for _ in range(4096)) for _ in range(64)]
        start = time.perf_counter()
        matcher(stops)
        report["build_ms"] = round((time.perf_counter() - start) * 1000, 1)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
