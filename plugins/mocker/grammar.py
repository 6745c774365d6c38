"""The mocker's grammar engine: constrained decoding with llguidance over the model's tokenizer.

Why llguidance and not xgrammar: measured in docs/grammar-engine.md (tests/perf/bench_grammar.py);
in short, it is as fast per token on the tokenizers measured, needs no torch, and the frontend
already validates constraints with it, so a constraint the frontend accepts compiles here too.

``GrammarEngine.for_model(model)`` (one per process and model) holds an ``LLTokenizer`` built from
the model's tokenizer.json and compiles ``OutputConstraint``s into ``Grammar``s, caching the last
``CACHE_SIZE`` (agents send the same schema every turn): a cached grammar costs a matcher copy
(microseconds) per request. A constraint is compiled in its bounded form (``bounds``: short
strings, few items, small numbers, bounded repetitions; a subset of the original), falling back
to the original when the bounded form does not compile; one the engine refuses raises
``ConstraintError`` with the engine's message. CPU per request is bounded by llguidance's parser
limits (``LIMITS``: compile-time lexer fuel and grammar size, per-token lexer fuel and Earley
items) and by the request's ``max_tokens``.

Sampling (``GrammarSource``, one per request, drawing only from the request's RNG):

1. When the grammar accepts the output so far, end it (``STOP``) with probability ``END_BIAS``
   (always when nothing may follow; never before ``min_tokens`` unless nothing may follow).
2. Otherwise propose ``PROPOSALS`` uniform random tokens and take the first the grammar allows
   (most positions inside strings allow most of the vocabulary, so this often skips the mask);
3. else compute the token mask and pick uniformly among the allowed tokens (EOS excluded).

Steps 2 and 3 together pick uniformly among the allowed tokens (rejection sampling from a uniform
proposal, then an exact draw), so the output distribution does not depend on ``PROPOSALS``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from dyn.core.messages import OutputConstraint
from dyn.plugins.mocker.bounds import FLAT_OBJECT, bound_lark, bound_regex, bound_schema
from dyn.plugins.mocker.sources import FAIL, STOP

if TYPE_CHECKING:
    from collections.abc import Callable

    import llguidance

    from dyn.core.model import ModelInfo
    from dyn.plugins.mocker.scheduler import SimRequest

END_BIAS = 0.5
PROPOSALS = 2
CACHE_SIZE = 128
MAX_SPEC_BYTES = 256 * 1024
"""Largest constraint (schema, regex, grammar, choices) a worker compiles."""
LIMITS = {
    "initial_lexer_fuel": 1_000_000,  # ~20 ms to build the lexer
    "step_lexer_fuel": 100_000,  # ~7 ms per token at worst
    "step_max_items": 20_000,  # ~1 ms of Earley items per token
    "max_grammar_size": 200_000,
    "max_lexer_states": 100_000,
}


class ConstraintError(ValueError):
    """The grammar engine refuses a constraint; the message is the engine's."""


class GrammarEngine:
    """Compiles constraints for one tokenizer; thread-safe (compiles may run in worker threads)."""

    def __init__(
        self, tokenizer_json: str, vocab_size: int | None = None, eos_token_id: int | None = None
    ) -> None:
        import llguidance

        self._llg = llguidance
        base = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos_token_id)
        self.tokenizer = base
        """The general tokenizer (regexes, choices, grammars)."""
        self._json_tokenizer = base.with_slices(llguidance.LLTokenizer.json_slices())
        self.vocab_size: int = base.vocab_size
        self.eos_token_id: int = base.eos_token
        self._limits = llguidance.LLParserLimits(**LIMITS)
        self._cache: OrderedDict[Any, Grammar] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def for_model(cls, model: ModelInfo) -> GrammarEngine:
        """The process's engine for ``model`` (built once: about 30 ms for a 4k vocabulary, about
        a second for 150k)."""
        eos = model.eos_token_ids[0] if model.eos_token_ids else None
        return _engine(str(Path(model.path) / "tokenizer.json"), model.vocab_size, eos)

    def cached(self, key: Any) -> Grammar | None:
        with self._lock:
            grammar = self._cache.get(key)
            if grammar is not None:
                self._cache.move_to_end(key)
            return grammar

    def compile(self, constraint: OutputConstraint) -> Grammar:
        """The bounded grammar of ``constraint`` (cached); ``ConstraintError`` if refused."""
        grammar = self.cached(constraint)
        if grammar is None:
            size = len(constraint.spec) + sum(len(c) for c in constraint.choices)
            if size > MAX_SPEC_BYTES:
                raise ConstraintError(
                    f"the constraint is {size} bytes; at most {MAX_SPEC_BYTES} are accepted"
                )
            json_like = constraint.kind in ("json", "json_object")
            grammar = self._build(_bounded_grammar(constraint), _grammar(constraint), json_like)
            self._put(constraint, grammar)
        return grammar

    def original(self, grammar: Grammar) -> llguidance.LLMatcher:
        """The start matcher of ``grammar``'s constraint as the request gave it (not bounded)."""
        if grammar.original is None:
            text = grammar.original_text()
            grammar.original = self._llg.LLMatcher(grammar.tokenizer, text, log_level=0, limits=self._limits)
        return grammar.original

    def compile_schema(self, schema_json: str) -> Grammar:
        """The bounded grammar of a tool's parameters (a JSON Schema as text) for its arguments:
        always a JSON object (a schema without a type is read as an object schema)."""
        key = ("tool", schema_json)
        grammar = self.cached(key)
        if grammar is None:
            try:
                schema = msgspec.json.decode(schema_json)
            except msgspec.DecodeError as exc:
                raise ConstraintError(f"the tool's parameters are not JSON: {exc}") from None
            if not isinstance(schema, dict):
                raise ConstraintError("the tool's parameters must be a JSON Schema object")
            if "type" not in schema:
                schema = {**schema, "type": "object"}
            constraint = OutputConstraint("json", msgspec.json.encode(schema).decode())
            grammar = self._build(_bounded_grammar(constraint), _grammar(constraint), True)
            self._put(key, grammar)
        return grammar

    def _put(self, key: Any, grammar: Grammar) -> None:
        with self._lock:
            self._cache[key] = grammar
            self._cache.move_to_end(key)
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)

    def _build(self, bounded: Callable[[], str], original: Callable[[], str], json_like: bool) -> Grammar:
        tokenizer = self._json_tokenizer if json_like else self.tokenizer
        error = ""
        for make in (bounded, original):
            try:
                text = make()
            except Exception as exc:  # llguidance's converters raise plain exceptions
                error = str(exc) or type(exc).__name__
                continue
            matcher = self._llg.LLMatcher(tokenizer, text, log_level=0, limits=self._limits)
            if not matcher.is_error():
                grammar = Grammar(self, matcher, tokenizer, original)
                if make is original:
                    grammar.original = matcher
                return grammar
            error = matcher.get_error()
        raise ConstraintError(error)


@lru_cache(maxsize=4)
def _engine(path: str, vocab_size: int, eos: int | None) -> GrammarEngine:
    text = Path(path).read_text(encoding="utf-8")
    try:
        return GrammarEngine(text, vocab_size, eos)
    except ValueError:  # the config's vocab_size is below the tokenizer's: let llguidance size it
        return GrammarEngine(text, None, eos)


def _grammar(constraint: OutputConstraint, schema: Any = None) -> Callable[[], str]:
    from dyn.core.protocol.structured import llguidance_grammar

    return lambda: llguidance_grammar(constraint, schema)


def _bounded_grammar(constraint: OutputConstraint) -> Callable[[], str]:
    kind = constraint.kind
    if kind == "regex":
        return _grammar(OutputConstraint("regex", bound_regex(constraint.spec)))
    if kind == "json_object":
        return _grammar(constraint, _compact(FLAT_OBJECT, None))
    if kind == "json":

        def make() -> str:
            schema = bound_schema(msgspec.json.decode(constraint.spec))
            return _grammar(constraint, _compact(schema, constraint.whitespace_pattern))()

        return make
    if kind == "grammar":

        def make_lark() -> str:
            from llguidance import LLMatcher
            from llguidance.gbnf_to_lark import any_to_lark

            return LLMatcher.grammar_from_lark(bound_lark(any_to_lark(constraint.spec)))

        return make_lark
    return _grammar(constraint)


def _compact(schema: Any, whitespace_pattern: str | None) -> Any:
    """No free whitespace between JSON tokens (a subset of every whitespace option) unless the
    request set its own pattern."""
    if whitespace_pattern is not None or not isinstance(schema, dict):
        return schema
    return {**schema, "x-guidance": {"whitespace_flexible": False, **(schema.get("x-guidance") or {})}}


class Grammar:
    """One compiled constraint: a matcher of its bounded form in its start state, copied for each
    use; the original form is compiled only when ``accepts`` needs it."""

    __slots__ = ("engine", "_start", "tokenizer", "original_text", "original")

    def __init__(
        self,
        engine: GrammarEngine,
        start: llguidance.LLMatcher,
        tokenizer: llguidance.LLTokenizer,
        original_text: Callable[[], str],
    ) -> None:
        self.engine = engine
        self._start = start
        self.tokenizer = tokenizer
        self.original_text = original_text
        self.original: llguidance.LLMatcher | None = None

    def source(self) -> GrammarSource:
        return GrammarSource(self._start.deep_copy(), self.engine.vocab_size, self.engine.eos_token_id)

    def accepts(self, token_ids: list[int]) -> bool:
        """Whether ``token_ids`` form a complete output under the request's own constraint."""
        matcher = self.engine.original(self).deep_copy()
        return matcher.consume_tokens(token_ids) and matcher.is_accepting()

    def complete(self, rand: Callable[[], float], limit: int) -> str | None:
        """A whole output sampled as ``GrammarSource`` samples it, as text; ``None`` when it does
        not end within ``limit`` tokens or the engine fails."""
        source = self.source()
        draw = _Draws(rand)
        out: list[int] = []
        while len(out) < limit:
            token = source.next_token(draw)  # type: ignore[arg-type]
            if token == STOP:
                return self.tokenizer.decode_str(out)
            if token == FAIL:
                return None
            out.append(token)
            draw.num_output += 1
        return None


class _Draws:
    """What ``GrammarSource.next_token`` reads from a request, for sampling outside the scheduler."""

    __slots__ = ("rand", "num_output", "min_tokens")

    def __init__(self, rand: Callable[[], float]) -> None:
        self.rand = rand
        self.num_output = 0
        self.min_tokens = 0


class GrammarSource:
    """A request's tokens under a constraint (see the module docstring)."""

    __slots__ = (
        "matcher",
        "vocab_size",
        "eos",
        "end_token_id",
        "error",
        "_mask",
        "_mask_ptr",
        "_eos_word",
        "_eos_clear",
    )
    thinks = True

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int, eos: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.eos = eos
        self.end_token_id: int | None = eos
        self.error = ""
        self._mask = np.zeros((vocab_size + 31) // 32, dtype=np.uint32)
        self._mask_ptr = self._mask.ctypes.data
        self._eos_word = eos >> 5
        self._eos_clear = np.uint32(~(1 << (eos & 31)) & 0xFFFFFFFF)

    def next_token(self, req: SimRequest) -> int:
        m = self.matcher
        rand = req.rand
        if m.is_accepting() and (m.is_stopped() or (req.num_output >= req.min_tokens and rand() < END_BIAS)):
            return STOP
        vocab = self.vocab_size
        eos = self.eos
        for _ in range(PROPOSALS):
            token = int(rand() * vocab)
            if token != eos and m.validate_tokens([token]):
                break
        else:
            token = self._draw_allowed(rand)
            if token < 0:
                if m.is_accepting():
                    return STOP
                self.error = m.get_error() or "no token can continue the output under the constraint"
                return FAIL
        if not m.consume_token(token):
            self.error = m.get_error() or f"the grammar engine refused token {token}"
            return FAIL
        return token

    def _draw_allowed(self, rand: Callable[[], float]) -> int:
        """A uniform draw among the tokens the mask allows (EOS excluded); -1 when none is."""
        mask = self._mask
        self.matcher.unsafe_compute_mask_ptr(self._mask_ptr, mask.nbytes)
        mask[self._eos_word] &= self._eos_clear
        counts = np.bitwise_count(mask)
        cumulative = np.cumsum(counts, dtype=np.int64)
        total = int(cumulative[-1])
        if total == 0:
            return -1
        k = int(rand() * total)
        word = int(cumulative.searchsorted(k, side="right"))
        rank = k - (int(cumulative[word]) - int(counts[word]))
        bits = int(mask[word])
        for _ in range(rank):
            bits &= bits - 1
        return word * 32 + (bits & -bits).bit_length() - 1
