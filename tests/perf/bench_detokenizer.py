"""Benchmark: IncrementalDetokenizer.push() one token at a time, tokens per second, on dyn-tiny.

    python tests/perf/bench_detokenizer.py --tokens 100000

The ids are the encoding of Python standard library source plus some CJK and emoji text, repeated
to --tokens; pushed one at a time into one detokenizer, without stop strings and with two. Prints
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from dyn.core.frontend.detokenizer import IncrementalDetokenizer
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.model.info import TINY_MODEL_DIR

_EXTRA = "数据结构与算法 🚀🎉 données naïves — café ☕ 日本語のテキスト 👩‍💻\n"


def _token_ids(tok: Tokenizer, n: int) -> list[int]:
    text = Path(json.__file__).read_text(encoding="utf-8") + _EXTRA * 20
    ids = tok.encode(text, add_special_tokens=False)
    return (ids * (n // len(ids) + 1))[:n]


def _run(tok: Tokenizer, ids: list[int], stop: list[str]) -> float:
    detok = IncrementalDetokenizer(tok, ids[:8], stop=stop)
    push = detok.push
    start = time.perf_counter()
    for i in range(len(ids)):
        push(ids[i:i + 1])
    detok.finish()
    return len(ids) / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    args = p.parse_args()
    tok = Tokenizer.from_dir(TINY_MODEL_DIR)
    ids = _token_ids(tok, args.tokens)
    plain = max(_run(tok, ids, []) for _ in range(args.repeat))
    # stop strings that never match in this text, so every push pays for the check
    stops = max(_run(tok, ids, ["\nUser:", "<|stop|>"]) for _ in range(args.repeat))
    print(json.dumps({"tokens": len(ids), "tokens_per_s": round(plain), "tokens_per_s_with_stop_strings": round(stops),
                      "us_per_token": round(1e6 / plain, 2)}))


if __name__ == "__main__":
    main()
