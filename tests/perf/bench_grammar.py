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

    python tests/perf/bench_grammar.py --fuel               # the limits of dyn.core.protocol.grammar

``--fuel`` measures what ``dyn.core.protocol.grammar.LIMITS`` must allow: for each realistic
constraint (this file's, the grammar tests', ``tests/core/protocol/realistic_constraints.py``) the
least ``initial_lexer_fuel`` (within 5 %) with which the frontend's check passes (the original
constraint, compiled and probed) and with which the mocker samples ``--walks`` outputs of its
bounded form (``GrammarSource``, one shared start as the engine's cache holds it), and whether
both pass under ``LIMITS`` as they are; then, for the attack ``(a{K}){1000}``, the time and heap
a refusal costs and the largest K accepted.
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


def fuel_corpus() -> dict:
    """Realistic constraints by name, as ``OutputConstraint``s."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from dyn.core.messages import OutputConstraint
    from dyn.core.protocol.tools import forced_schema, tool_plan
    from tests.core.protocol.realistic_constraints import AGENT_TOOLS, ORDER_SCHEMA
    from tests.plugins.mocker.test_grammar import EDGE_SCHEMAS, LARK

    def schema(value) -> OutputConstraint:
        return OutputConstraint("json", json.dumps(value))

    out = {
        "bench json": schema(SCHEMA),
        "bench regex": OutputConstraint("regex", REGEX),
        "bench choice": OutputConstraint("choice", choices=tuple(CHOICES)),
        "bench GBNF": OutputConstraint("grammar", GBNF),
        "tests Lark": OutputConstraint("grammar", LARK),
        "json_object": OutputConstraint("json_object"),
        "40-property order": schema(ORDER_SCHEMA),
        "16 agent tools, required": schema(forced_schema(tool_plan(AGENT_TOOLS, "required"))),
        "agent tool multi_edit, named": schema(
            forced_schema(tool_plan(AGENT_TOOLS, {"type": "function", "function": {"name": "multi_edit"}}))
        ),
        "enum of 600 strings": schema({"enum": [f"zone/{i:04d}-{'x' * (i % 17)}" for i in range(600)]}),
        "choice of 1024 strings": OutputConstraint(
            "choice", choices=tuple(f"label {i}" for i in range(1024))
        ),
        "regex: e-mail": OutputConstraint(
            "regex", r"[a-zA-Z0-9._%+-]{1,64}@[a-zA-Z0-9.-]{1,255}\.[a-zA-Z]{2,63}"
        ),
        "regex: ISO date-time": OutputConstraint(
            "regex", r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})"
        ),
        "regex: 5-50 Unicode words": OutputConstraint("regex", r"(\w+ ){5,50}\w+\."),
        "regex: 300 alternatives": OutputConstraint(
            "regex", "(" + "|".join(f"w{i}x" for i in range(300)) + ")"
        ),
        "regex: a{1000}": OutputConstraint("regex", "a{1000}"),
    }
    out.update({f"tests schema {name}": schema(value) for name, value in EDGE_SCHEMAS.items()})
    return out


def bench_fuel(tokenizer_json: str, eos: int, walks: int) -> dict:
    """See the module docstring (``--fuel``)."""
    import llguidance

    from dyn.core.memory import heap_bytes, trim
    from dyn.core.protocol.grammar import LIMITS, GrammarCompiler, llguidance_grammar
    from dyn.plugins.mocker.grammar import _bounded_grammar
    from dyn.plugins.mocker.sources import FAIL, STOP

    tokenizer = llguidance.LLTokenizer(tokenizer_json, eos_token=eos)
    compilers: dict[int, GrammarCompiler] = {}

    def compiler(fuel: int) -> GrammarCompiler:
        if fuel not in compilers:
            compilers[fuel] = GrammarCompiler(tokenizer, {**LIMITS, "initial_lexer_fuel": fuel})
        return compilers[fuel]

    class Req:
        __slots__ = ("rand", "num_output", "min_tokens")

    def frontend_ok(text: str, json_like: bool, fuel: int) -> bool:
        try:
            compiler(fuel).matcher(text, json_like)
        except ValueError:
            return False
        return True

    def mocker_ok(text: str, json_like: bool, fuel: int) -> bool:
        from dyn.plugins.mocker.grammar import GrammarSource

        c = compiler(fuel)
        try:
            start = c.matcher(text, json_like)
        except ValueError:
            return False
        rng = random.Random(0)
        for _ in range(walks):
            source = GrammarSource(start.deep_copy(), c.vocab_size, c.eos_token_id)
            req = Req()
            req.rand, req.num_output, req.min_tokens = rng.random, 0, 0
            while req.num_output < 400:
                token = source.next_token(req)
                if token == FAIL:
                    return False
                if token == STOP:
                    break
                req.num_output += 1
        return True

    def least(ok, text: str, json_like: bool) -> int | str:
        lo, hi = 1, 4 * LIMITS["initial_lexer_fuel"]
        if not ok(text, json_like, hi):
            return f"> {hi}"
        while hi > lo * 1.05 + 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if ok(text, json_like, mid) else (mid, hi)
        return hi

    limit = LIMITS["initial_lexer_fuel"]
    out: dict = {"limits": {k: v for k, v in LIMITS.items() if k != "verbose_errors"}, "walks": walks}
    for name, constraint in fuel_corpus().items():
        json_like = constraint.kind in ("json", "json_object")
        original = llguidance_grammar(constraint)
        bounded = _bounded_grammar(constraint)()
        out[name] = {
            "frontend_fuel": least(frontend_ok, original, json_like),
            "mocker_fuel": least(mocker_ok, bounded, json_like),
            "passes_limits": frontend_ok(original, json_like, limit) and mocker_ok(bounded, json_like, limit),
        }
    from dyn.core.messages import OutputConstraint

    attack: dict = {}
    accepted = 0
    for k in (10, 20, 30, 40, 45, 48, 49, 50, 60, 100, 300, 600, 1000):
        text = llguidance_grammar(OutputConstraint("regex", "(a{%d}){1000}" % k))
        trim()
        before = heap_bytes()
        t0 = time.perf_counter()
        try:
            matcher = compiler(limit).matcher(text)
            verdict, heap = "accepted", heap_bytes() - before
            accepted = k
            del matcher
        except ValueError:  # the traceback still holds the refused matcher: its heap counts
            verdict, heap = "refused", heap_bytes() - before
        ms = (time.perf_counter() - t0) * 1e3
        attack[f"(a{{{k}}}){{1000}}"] = {
            "verdict": verdict,
            "ms": round(ms, 1),
            "heap_mb": round(heap / 1e6, 1),
        }
    out["attack"] = attack
    out["attack_largest_K_accepted"] = accepted
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", type=Path, default=TINY, help="tokenizer.json (default: dyn-tiny's)")
    p.add_argument("--eos", type=int, default=4, help="EOS token id (dyn-tiny: 4, <|eot_id|>)")
    p.add_argument("--walks", type=int, default=50)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--fuel", action="store_true", help="measure the grammar limits instead (see above)")
    args = p.parse_args()
    if args.fuel:
        report = bench_fuel(args.tokenizer.read_text(encoding="utf-8"), args.eos, args.walks)
        print(json.dumps(report, indent=1))
        return
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
