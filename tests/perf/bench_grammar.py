"""Benchmark: per-token cost of constrained decoding (mask + pick + advance), llguidance vs xgrammar.

Not a test: run it by hand and write the figures down (docs/grammar-engine.md) with the command.

    python tests/perf/bench_grammar.py                      # llguidance (and the mocker's sampler)
    /tmp/xg/bin/python tests/perf/bench_grammar.py          # a throwaway venv with xgrammar too:
        python3.11 -m venv /tmp/xg && /tmp/xg/bin/pip install torch==2.13.0 xgrammar numpy

Each engine runs the same walks over the same constraints (already bounded, as the mocker bounds
them, so walks end): at every step it computes the full token mask, picks uniformly among the
allowed tokens other than EOS with a seeded RNG (the same pick code for both), and advances; a walk
ends when EOS is allowed and a coin says stop, or only EOS is allowed. Reported per constraint and
engine: microseconds per token (mask + pick + advance) and for the mask alone (the median of
``--repeats`` runs of ``--walks`` walks), compile milliseconds, and tokenizer set-up milliseconds.
When ``dyn`` is importable, ``mocker`` is the mocker's own sampler (``GrammarSource``: proposals
first, the mask only when they miss) on the same constraints; it needs no torch, so it runs only
in the project's venv. Engines that are not installed are skipped. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import numpy as np

TINY = Path(__file__).resolve().parents[2] / "core" / "model" / "dyn-tiny" / "tokenizer.json"

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "score": {"type": "number", "minimum": -1000, "maximum": 1000, "multipleOf": 0.25},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "kind": {"enum": ["user", "admin", "guest"]},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "score", "tags", "kind", "address"],
    "additionalProperties": False,
}
REGEX = r"[A-Z][a-z]{1,8}( [a-z]{1,8}){0,6}\."
CHOICES = ["positive", "negative", "neutral", "mixed"]
GBNF = (
    'root ::= "SELECT " cols " FROM " name ( " WHERE " name " = " num )?\n'
    'cols ::= "*" | name ( ", " name )*\nname ::= [a-z] [a-z_]*\nnum ::= [0-9] [0-9]*'
)
BOUNDED_GBNF = (
    'root ::= "SELECT " cols " FROM " name ( " WHERE " name " = " num )?\n'
    'cols ::= "*" | name ( ", " name ){0,3}\nname ::= [a-z] [a-z_]{0,8}\nnum ::= [0-9]{1,4}'
)
CONSTRAINTS = {"json": SCHEMA, "regex": REGEX, "choice": CHOICES, "grammar": BOUNDED_GBNF}


def pick(words: np.ndarray, eos: int, u: float) -> int:
    """A uniform pick among the set bits of ``words`` (uint32) other than ``eos``; -1 if none."""
    words[eos >> 5] &= np.uint32(~(1 << (eos & 31)) & 0xFFFFFFFF)
    counts = np.bitwise_count(words)
    cumulative = np.cumsum(counts, dtype=np.int64)
    total = int(cumulative[-1])
    if total == 0:
        return -1
    k = int(u * total)
    w = int(cumulative.searchsorted(k, side="right"))
    rank = k - (int(cumulative[w]) - int(counts[w]))
    bits = int(words[w])
    for _ in range(rank):
        bits &= bits - 1
    return w * 32 + (bits & -bits).bit_length() - 1


def walk(new_matcher, fill, advance, words, eos, rng, limit=400):
    """One walk; returns (tokens, mask seconds, total seconds)."""
    m = new_matcher()
    tokens = mask_s = total_s = 0
    while tokens < limit:
        t0 = time.perf_counter()
        fill(m)
        t1 = time.perf_counter()
        accepting = bool(words[eos >> 5] >> np.uint32(eos & 31) & np.uint32(1))
        if accepting and rng.random() < 0.5:
            break
        token = pick(words, eos, rng.random())
        if token < 0:
            break
        advance(m, token)
        total_s += time.perf_counter() - t0
        mask_s += t1 - t0
        tokens += 1
    return tokens, mask_s, total_s


def measure(new_matcher, fill, advance, words, eos, walks, repeats):
    per_token, per_mask, lengths = [], [], []
    for r in range(repeats):
        rng = random.Random(r)
        n = mask_s = total_s = 0
        for _ in range(walks):
            t, ms, ts = walk(new_matcher, fill, advance, words, eos, rng)
            n += t
            mask_s += ms
            total_s += ts
            lengths.append(t)
        per_token.append(total_s / max(n, 1) * 1e6)
        per_mask.append(mask_s / max(n, 1) * 1e6)
    return {
        "us_per_token": round(statistics.median(per_token), 1),
        "us_mask": round(statistics.median(per_mask), 1),
        "tokens_per_walk": round(statistics.mean(lengths), 1),
    }


def bench_llguidance(tokenizer_json: str, eos: int, walks: int, repeats: int) -> dict:
    import llguidance
    from llguidance import LLMatcher, LLTokenizer
    from llguidance.gbnf_to_lark import any_to_lark

    t0 = time.perf_counter()
    general = LLTokenizer(tokenizer_json, eos_token=eos)
    setup_ms = (time.perf_counter() - t0) * 1e3
    json_tok = general.with_slices(LLTokenizer.json_slices())
    words = np.zeros((general.vocab_size + 31) // 32, dtype=np.uint32)
    ptr = words.ctypes.data
    grammars = {
        "json": (
            json_tok,
            LLMatcher.grammar_from_json_schema(SCHEMA, defaults={"whitespace_flexible": False}),
        ),
        "regex": (general, LLMatcher.grammar_from_regex(REGEX)),
        "choice": (
            general,
            LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in CHOICES)),
        ),
        "grammar": (general, LLMatcher.grammar_from_lark(any_to_lark(BOUNDED_GBNF))),
    }
    out = {"version": llguidance.__version__, "tokenizer_setup_ms": round(setup_ms, 1)}
    for name, (tok, grammar) in grammars.items():
        t0 = time.perf_counter()
        start = LLMatcher(tok, grammar, log_level=0)
        compile_ms = (time.perf_counter() - t0) * 1e3
        assert not start.is_error(), start.get_error()
        result = measure(
            start.deep_copy,
            lambda m: m.unsafe_compute_mask_ptr(ptr, words.nbytes),
            lambda m, t: m.consume_token(t),
            words,
            eos,
            walks,
            repeats,
        )
        out[name] = {"compile_ms": round(compile_ms, 2), **result}
    return out


def bench_xgrammar(tokenizer_path: Path, eos: int, walks: int, repeats: int) -> dict:
    import xgrammar as xg
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_path))
    vocab = len(hf)
    t0 = time.perf_counter()
    info = xg.TokenizerInfo.from_huggingface(hf, vocab_size=vocab, stop_token_ids=[eos])
    compiler = xg.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    setup_ms = (time.perf_counter() - t0) * 1e3
    bitmask = xg.allocate_token_bitmask(1, vocab)
    words = bitmask.numpy().view(np.uint32)[0]
    compile_fns = {
        "json": lambda: compiler.compile_json_schema(
            json.dumps(SCHEMA), any_whitespace=False, separators=(",", ":")
        ),
        "regex": lambda: compiler.compile_regex(REGEX),
        "choice": lambda: compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in CHOICES)),
        "grammar": lambda: compiler.compile_grammar(BOUNDED_GBNF),
    }
    from importlib.metadata import version

    out = {"version": version("xgrammar"), "tokenizer_setup_ms": round(setup_ms, 1)}
    for name, make in compile_fns.items():
        t0 = time.perf_counter()
        compiled = make()
        compile_ms = (time.perf_counter() - t0) * 1e3
        result = measure(
            lambda compiled=compiled: xg.GrammarMatcher(compiled),
            lambda m: m.fill_next_token_bitmask(bitmask),
            lambda m, t: m.accept_token(t),
            words,
            eos,
            walks,
            repeats,
        )
        out[name] = {"compile_ms": round(compile_ms, 2), **result}
    return out


def bench_mocker(walks: int, repeats: int) -> dict:
    """The mocker's own sampler (GrammarSource) on dyn-tiny, constraints given unbounded: it bounds them."""
    from dyn.core.messages import OutputConstraint
    from dyn.core.model import load_model_info
    from dyn.plugins.mocker.grammar import GrammarEngine
    from dyn.plugins.mocker.sources import FAIL, STOP

    engine = GrammarEngine.for_model(load_model_info(None, None))
    unbounded = {
        "json": OutputConstraint(
            "json",
            json.dumps(
                {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "age": {"type": "integer"},
                        "score": {"type": "number"},
                        "tags": {"type": "array", "items": {"type": "string"}},
                        "kind": {"enum": ["user", "admin", "guest"]},
                        "address": {
                            "type": "object",
                            "properties": {
                                "city": {"type": "string"},
                                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                            },
                            "required": ["city", "zip"],
                        },
                    },
                    "required": ["name", "age", "score", "tags", "kind", "address"],
                }
            ),
        ),
        "regex": OutputConstraint("regex", r"[A-Z][a-z]+( [a-z]+)*\."),
        "choice": OutputConstraint("choice", choices=tuple(CHOICES)),
        "grammar": OutputConstraint("grammar", GBNF),
    }

    class Req:
        __slots__ = ("rand", "num_output", "min_tokens")

    out = {}
    for name, constraint in unbounded.items():
        t0 = time.perf_counter()
        grammar = engine.compile(constraint)
        compile_ms = (time.perf_counter() - t0) * 1e3
        per_token, lengths = [], []
        for r in range(repeats):
            rng = random.Random(r)
            n = 0
            spent = 0.0
            for _ in range(walks):
                source = grammar.source()
                req = Req()
                req.rand, req.num_output, req.min_tokens = rng.random, 0, 0
                while req.num_output < 400:
                    t0 = time.perf_counter()
                    token = source.next_token(req)
                    spent += time.perf_counter() - t0
                    if token in (STOP, FAIL):
                        break
                    req.num_output += 1
                n += req.num_output + 1
                lengths.append(req.num_output)
            per_token.append(spent / n * 1e6)
        out[name] = {
            "compile_ms": round(compile_ms, 2),
            "us_per_token": round(statistics.median(per_token), 1),
            "tokens_per_walk": round(statistics.mean(lengths), 1),
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", type=Path, default=TINY, help="tokenizer.json (default: dyn-tiny's)")
    p.add_argument("--eos", type=int, default=4, help="EOS token id (dyn-tiny: 4, <|eot_id|>)")
    p.add_argument("--walks", type=int, default=50)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    text = args.tokenizer.read_text(encoding="utf-8")
    report: dict = {"tokenizer": str(args.tokenizer), "walks": args.walks, "repeats": args.repeats}
    for name, run in (
        ("llguidance", lambda: bench_llguidance(text, args.eos, args.walks, args.repeats)),
        ("xgrammar", lambda: bench_xgrammar(args.tokenizer, args.eos, args.walks, args.repeats)),
        ("mocker", lambda: bench_mocker(args.walks, args.repeats)),
    ):
        try:
            report[name] = run()
        except ImportError as exc:
            report[name] = f"skipped: {exc}"
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
