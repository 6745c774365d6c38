"""The mocker's grammar engine: constrained decoding with llguidance over the model's tokenizer.

Why llguidance and not xgrammar: measured in docs/grammar-engine.md (tests/perf/bench_grammar.py);
in short, it is as fast per token on the tokenizers measured and needs no torch. Compiling goes
through ``dyn.core.protocol.grammar`` (the model's tokenizer, its ``LIMITS``, the probe of the
first mask and token), the path the frontend checks constraints with, so what the frontend accepts
compiles here too.

``GrammarEngine.for_model(model)`` (one per process and model) compiles ``OutputConstraint``s into
``Grammar``s. A constraint is compiled in its bounded form (``bounds``: short strings, few items,
small numbers, bounded repetitions; a subset of the original), falling back to the original when
the bounded form does not compile; one the engine refuses raises ``ConstraintError`` with a
one-line reason. CPU per request is bounded by the limits (lexer fuel at compile, per-token lexer
fuel and Earley items) and by the request's ``max_tokens``.

The cache (agents send the same schema every turn; a cached grammar costs a matcher copy,
microseconds) is bounded in entries (``CACHE_SIZE``) and in bytes (``CACHE_BYTES``). llguidance
exposes no size, so a grammar's size is measured: the growth of malloc's in-use heap over all
arenas (glibc ``mallinfo2``) across its compile and probe, taken under the engine's compile lock
so compiles never overlap (allocations other threads make meanwhile count too: an overestimate,
which only evicts sooner), and at least its grammar text. A grammar over ``CACHE_BYTES`` serves
its request and is not kept. Sampling then adds lexer states to the grammar it copies from, past
that measure (a 40-property schema: 1 MB at compile, 1.5 MB more over 64 outputs; a regex of
Unicode words: 8 MB more), so a grammar is compiled afresh after ``RENEW_USES`` requests, and
``LIMITS``' lexer states cap it meanwhile. A refused
constraint is never kept; a grammar that fails while sampling (a budget exceeded mid-output) is
dropped and its request fails with ``bad_request``. glibc keeps freed memory: ``dyn.core.memory.trim``
hands it back after a refused compile (in the compiling thread) and once a dropped grammar is
freed, its last request over (``_Trimmer``'s thread: a trim takes milliseconds, never on the
event loop).

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
import weakref
from collections import OrderedDict
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from dyn.core.memory import heap_bytes, trim
from dyn.core.messages import OutputConstraint
from dyn.core.protocol.grammar import GrammarCompiler, engine_reason, llguidance_grammar, refusal
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
CACHE_BYTES = 16 << 20
"""The cache's bound in bytes (as measured, see the module docstring)."""
RENEW_USES = 64
"""Requests a compiled grammar serves before it is compiled afresh (its lexer states start over)."""
MAX_SPEC_BYTES = 256 * 1024
"""Largest constraint (schema, regex, grammar, choices) a worker compiles."""


class ConstraintError(ValueError):
    """The grammar engine refuses a constraint; the message is one line, the engine's reason."""


class GrammarEngine:
    """Compiles constraints for one tokenizer; thread-safe (compiles run in worker threads, one
    at a time; cache look-ups never wait for a compile)."""

    def __init__(self, compiler: GrammarCompiler) -> None:
        self.compiler = compiler
        self.tokenizer = compiler.tokenizer
        """The general tokenizer (regexes, choices, grammars)."""
        self.vocab_size: int = compiler.vocab_size
        self.eos_token_id: int = compiler.eos_token_id
        self.cache_bytes = 0
        """The cached grammars' measured size."""
        self._cache: OrderedDict[Any, Grammar] = OrderedDict()
        self._lock = threading.Lock()
        self._compiling = threading.Lock()

    @classmethod
    def for_model(cls, model: ModelInfo) -> GrammarEngine:
        """The process's engine for ``model`` (its compiler is built once: about 30 ms for a 4k
        vocabulary, about a second for 150k)."""
        return _engine(GrammarCompiler.for_model(model))

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
            grammar = self._build(constraint, _bounded_grammar(constraint), _grammar(constraint), json_like)
        return grammar

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
            grammar = self._build(key, _bounded_grammar(constraint), _grammar(constraint), True)
        return grammar

    def original(self, grammar: Grammar) -> llguidance.LLMatcher:
        """The start matcher of ``grammar``'s constraint as the request gave it (not bounded);
        ``ConstraintError`` when the engine refuses it. Its size joins the grammar's."""
        if grammar.original is None:
            with self._compiling:
                if grammar.original is None:
                    before = heap_bytes()
                    try:
                        grammar.original = self.compiler.matcher(grammar.original_text(), grammar.json_like)
                    except Exception as exc:  # llguidance's converters raise plain exceptions
                        raise ConstraintError(str(exc)) from None
                    self._grow(grammar, heap_bytes() - before)
        return grammar.original

    def forget(self, grammar: Grammar) -> None:
        """Drop ``grammar`` from the cache (it failed while sampling, or served ``RENEW_USES``
        requests)."""
        with self._lock:
            if self._cache.get(grammar.key) is grammar:
                del self._cache[grammar.key]
                self.cache_bytes -= grammar.nbytes

    def _build(
        self, key: Any, bounded: Callable[[], str], original: Callable[[], str], json_like: bool
    ) -> Grammar:
        with self._compiling:
            grammar = self.cached(key)  # compiled by another thread meanwhile
            if grammar is not None:
                return grammar
            before = heap_bytes()
            error = ""
            for make in (bounded, original):
                try:
                    text = make()
                except Exception as exc:  # llguidance's converters raise plain exceptions
                    error = engine_reason(str(exc) or type(exc).__name__)
                    continue
                try:
                    matcher = self.compiler.matcher(text, json_like)
                except ValueError as exc:
                    error = str(exc)
                    continue
                grammar = Grammar(self, key, matcher, json_like, original)
                if make is original:
                    grammar.original = matcher
                grammar.nbytes = max(heap_bytes() - before, len(text))
                weakref.finalize(grammar, _TRIMMER.request)
                self._put(grammar)
                return grammar
            trim()  # what the refused matchers took (their peak is gone by now: always)
            raise ConstraintError(error)

    def _put(self, grammar: Grammar) -> None:
        """Cache ``grammar`` (unless it alone is over the bound), evicting the least recently used
        past either bound."""
        if grammar.nbytes > CACHE_BYTES:
            return
        with self._lock:
            self._cache[grammar.key] = grammar
            self.cache_bytes += grammar.nbytes
            self._evict()

    def _grow(self, grammar: Grammar, delta: int) -> None:
        with self._lock:
            grammar.nbytes += max(delta, 0)
            if self._cache.get(grammar.key) is grammar:
                self.cache_bytes += max(delta, 0)
                self._evict()

    def _evict(self) -> None:
        cache = self._cache
        while cache and (len(cache) > CACHE_SIZE or self.cache_bytes > CACHE_BYTES):
            _, gone = cache.popitem(last=False)
            self.cache_bytes -= gone.nbytes


@lru_cache(maxsize=8)
def _engine(compiler: GrammarCompiler) -> GrammarEngine:
    return GrammarEngine(compiler)


class _Trimmer:
    """Trims the heap (``dyn.core.memory.trim``) from its own thread after a grammar is freed: the last
    reference often goes on the event loop (a finished request's source), and a trim takes
    milliseconds. Requests that come while it trims are folded into one more trim."""

    def __init__(self) -> None:
        self._due = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def request(self) -> None:
        self._due.set()
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="grammar-trim", daemon=True)
                    self._thread.start()

    def _run(self) -> None:
        while True:
            self._due.wait()
            self._due.clear()
            trim()


_TRIMMER = _Trimmer()


def _grammar(constraint: OutputConstraint, schema: Any = None) -> Callable[[], str]:
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
    use; the original form is compiled only when ``accepts`` needs it. ``nbytes``: its measured
    size (the module docstring)."""

    __slots__ = (
        "engine",
        "key",
        "_start",
        "json_like",
        "original_text",
        "original",
        "nbytes",
        "uses",
        "__weakref__",
    )

    def __init__(
        self,
        engine: GrammarEngine,
        key: Any,
        start: llguidance.LLMatcher,
        json_like: bool,
        original_text: Callable[[], str],
    ) -> None:
        self.engine = engine
        self.key = key
        self._start = start
        self.json_like = json_like
        self.original_text = original_text
        self.original: llguidance.LLMatcher | None = None
        self.nbytes = 0
        self.uses = 0

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        compiler = self.engine.compiler
        return compiler.json_tokenizer if self.json_like else compiler.tokenizer

    def source(self) -> GrammarSource:
        engine = self.engine
        self.uses += 1
        if self.uses == RENEW_USES:
            engine.forget(self)
        return GrammarSource(self._start.deep_copy(), engine.vocab_size, engine.eos_token_id, self)

    def accepts(self, token_ids: list[int]) -> bool:
        """Whether ``token_ids`` form a complete output under the request's own constraint (False
        when the engine refuses the constraint as given)."""
        try:
            matcher = self.engine.original(self).deep_copy()
        except ConstraintError:
            return False
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
    """A request's tokens under a constraint (see the module docstring). When the engine fails
    mid-output (a budget exceeded), ``error`` is a refusal (``grammar.refusal``) and ``grammar``
    leaves the cache."""

    __slots__ = (
        "matcher",
        "vocab_size",
        "eos",
        "grammar",
        "end_token_id",
        "error",
        "_mask",
        "_mask_ptr",
        "_eos_word",
        "_eos_clear",
    )
    thinks = True

    def __init__(
        self, matcher: llguidance.LLMatcher, vocab_size: int, eos: int, grammar: Grammar | None = None
    ) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.eos = eos
        self.grammar = grammar
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
                return self._fail("no token can continue the output under the constraint")
        if not m.consume_token(token):
            return self._fail(f"the grammar engine refused token {token}")
        return token

    def _fail(self, otherwise: str) -> int:
        error = self.matcher.get_error()
        self.error = refusal(f"mid-output, {engine_reason(error) if error else otherwise}")
        if self.grammar is not None:
            self.grammar.engine.forget(self.grammar)
        return FAIL

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
