"""Compiling structured-output constraints with llguidance, bounded in memory and CPU: the one path
the frontend's check and the mocker's grammar engine share, so what a worker would refuse is
refused before routing.

``GrammarCompiler.for_model(model)`` (one per process and model) holds llguidance tokenizers built
from the model's tokenizer.json (a byte-level stand-in when llguidance cannot read it) and compiles
grammar text with ``LIMITS`` into a matcher. llguidance builds its lexer lazily, so a grammar can
compile and still fail on its first mask or its first token (a regex's expression set too large,
too many Earley items); ``matcher`` therefore probes a copy (first mask, first allowed token, next
mask) before returning, and a refusal is ``GrammarError`` with a one-line reason: never the
engine's state dump, never a newline (``one_line``).

``LIMITS`` were chosen by measurement on dyn-tiny (docs/grammar-engine.md, ``python
tests/perf/bench_grammar.py --fuel``): the largest lexer fuel a realistic constraint needs is
16.4k (a regex of Unicode words; a 40-property nested schema needs 5.3k, a coding agent's 16
tools under ``tool_choice: required`` 3.8k), while ``(a{K}){1000}`` needs about 2,050 x K: at 100k
K >= 49 is refused in about 45 ms (a 19 MB peak, handed back), where llguidance's default 1M let
K = 600 take 0.85 s and 150-190 MB before failing, and the engine kept it.

``check(constraint)`` is the frontend's verdict ("" when the constraint compiles): verdicts are
cached (``VERDICTS``, keyed by a digest, so a cached verdict never holds a 256 KiB schema),
grammars never are, and freed memory goes back to the OS (``dyn.core.memory.trim``) after a compile
that took ``TRIM_BYTES`` or more of heap (glibc keeps it otherwise).

``refusal`` writes a worker's message for a constraint it refuses; ``refused_param`` tells the
frontend which request field such a message is about.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from dyn.core.memory import heap_bytes, trim
from dyn.core.messages import OutputConstraint

if TYPE_CHECKING:
    import llguidance

    from dyn.core.model import ModelInfo

log = logging.getLogger(__name__)

LIMITS: dict[str, Any] = {
    "initial_lexer_fuel": 100_000,  # the lexer's regex set: ~60 ms and a few MB at most
    "step_lexer_fuel": 100_000,  # ~7 ms per token at worst
    "step_max_items": 20_000,  # ~1 ms of Earley items per token
    "max_grammar_size": 200_000,
    "max_lexer_states": 20_000,  # 1-2 kB each
    "verbose_errors": False,  # no parser state or grammar in messages
}
VERDICTS = 1024
"""Distinct constraints whose verdict the frontend remembers (agents send the same schema every turn)."""
TRIM_BYTES = 4 << 20
"""A compile that took this much heap hands its memory back to the OS when done (``trim``)."""
MAX_MESSAGE_CHARS = 500

_CONSTRAINT = "the constraint cannot be enforced: "
_TOOL = re.compile(r"the parameters of tool .* cannot be enforced: ")
_LIMIT_WORDS = ("too many", "toocomplex", "fuel", "limit", "too large", "too big")


class GrammarError(ValueError):
    """llguidance refuses a grammar; the message is one line, without the engine's state."""


class GrammarCompiler:
    """Compiles grammar text for one tokenizer under ``LIMITS``; thread-safe."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, limits: dict[str, Any] | None = None) -> None:
        """``limits``: llguidance's parser limits (default ``LIMITS``; the benchmark varies them)."""
        import llguidance

        self._llg = llguidance
        self.tokenizer = tokenizer
        """The general tokenizer (regexes, choices, grammars)."""
        self.json_tokenizer = tokenizer.with_slices(llguidance.LLTokenizer.json_slices())
        self.vocab_size: int = tokenizer.vocab_size
        self.eos_token_id: int = tokenizer.eos_token
        self.limits = llguidance.LLParserLimits(**(LIMITS if limits is None else limits))
        self._verdicts: OrderedDict[bytes, str] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def for_model(cls, model: ModelInfo) -> GrammarCompiler:
        """The process's compiler for ``model`` (built once: about 30 ms for a 4k vocabulary, about
        a second for 150k)."""
        eos = model.eos_token_ids[0] if model.eos_token_ids else None
        return _compiler(str(model.tokenizer_dir / "tokenizer.json"), model.vocab_size, eos)

    def matcher(self, grammar: str, json_like: bool = False) -> llguidance.LLMatcher:
        """A matcher of ``grammar`` (llguidance grammar text) in its start state, probed; ``json_like``
        picks the tokenizer sliced for JSON. ``GrammarError`` when llguidance refuses it."""
        tokenizer = self.json_tokenizer if json_like else self.tokenizer
        matcher = self._llg.LLMatcher(tokenizer, grammar, log_level=0, limits=self.limits)
        error = engine_reason(matcher.get_error()) if matcher.is_error() else self._probe(matcher.deep_copy())
        if error:
            raise GrammarError(error)
        return matcher

    def _probe(self, m: llguidance.LLMatcher) -> str:
        """Why ``m`` fails on its first mask, first token or second mask ("" when it does not)."""
        mask = m.compute_bitmask()
        if m.is_error():
            return engine_reason(m.get_error())
        bits = int.from_bytes(mask, "little") & ~(1 << self.eos_token_id)
        if not bits:
            return "" if m.is_accepting() else "no output satisfies it"
        m.consume_token((bits & -bits).bit_length() - 1)
        if not m.is_error():
            m.compute_bitmask()
        return engine_reason(m.get_error()) if m.is_error() else ""

    def check(self, constraint: OutputConstraint) -> str:
        """Why ``constraint`` cannot be enforced ("" when it can): compiled and probed as a worker
        does, then dropped; the verdict is cached."""
        key = hashlib.blake2b(msgspec.msgpack.encode(constraint), digest_size=16).digest()
        with self._lock:
            verdict = self._verdicts.get(key)
            if verdict is not None:
                self._verdicts.move_to_end(key)
                return verdict
        before = heap_bytes()
        try:
            matcher = self.matcher(llguidance_grammar(constraint), constraint.kind in ("json", "json_object"))
            took = heap_bytes() - before
            del matcher
            verdict = ""
        except ValueError as exc:
            took = heap_bytes() - before
            verdict = str(exc)
        if took >= TRIM_BYTES:
            trim()
        with self._lock:
            self._verdicts[key] = verdict
            while len(self._verdicts) > VERDICTS:
                self._verdicts.popitem(last=False)
        return verdict


@lru_cache(maxsize=8)
def _compiler(path: str, vocab_size: int, eos: int | None) -> GrammarCompiler:
    import llguidance

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        log.warning("no tokenizer for the grammar engine (%s); checking constraints byte by byte", exc)
        return byte_compiler()
    try:
        try:
            tokenizer = llguidance.LLTokenizer(text, n_vocab=vocab_size, eos_token=eos)
        except ValueError:  # the config's vocab_size is below the tokenizer's: let llguidance size it
            tokenizer = llguidance.LLTokenizer(text, eos_token=eos)
    except Exception as exc:  # llguidance raises plain exceptions for tokenizers it cannot read
        log.warning("llguidance cannot read %s (%s); checking constraints byte by byte", path, exc)
        return byte_compiler()
    return GrammarCompiler(tokenizer)


class _Bytes:
    """A byte-level tokenizer for llguidance: 256 byte tokens and an end token."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"<|end|>"]
    special_token_ids = [256]

    def __call__(self, text: bytes | str) -> list[int]:
        return list(text.encode() if isinstance(text, str) else text)


@lru_cache(maxsize=1)
def byte_compiler() -> GrammarCompiler:
    """A compiler over single bytes: for checks without the model's tokenizer (same limits)."""
    import llguidance

    return GrammarCompiler(llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes())))


def llguidance_grammar(constraint: OutputConstraint, schema: Any = None) -> str:
    """The constraint as an llguidance grammar (JSON text). ``schema`` replaces a ``json``
    constraint's schema (the mocker tightens it). ``ValueError`` (one line) for a schema, regex or
    grammar llguidance's converters refuse."""
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import any_to_lark

    kind = constraint.kind
    try:
        if kind == "json":
            schema = msgspec.json.decode(constraint.spec) if schema is None else schema
            if constraint.whitespace_pattern is not None and isinstance(schema, dict):
                schema = {**schema, "x-guidance": {"whitespace_pattern": constraint.whitespace_pattern}}
            return LLMatcher.grammar_from_json_schema(schema)
        if kind == "json_object":
            return LLMatcher.grammar_from_json_schema({"type": "object"} if schema is None else schema)
        if kind == "regex":
            return LLMatcher.grammar_from_regex(constraint.spec)
        if kind == "choice":
            return LLMatcher.grammar_from_lark(
                "start: " + " | ".join(msgspec.json.encode(c).decode() for c in constraint.choices)
            )
        if kind == "grammar":
            try:
                text = any_to_lark(constraint.spec)
            except Exception as exc:  # llguidance's converter raises plain exceptions
                raise ValueError(f"not a valid GBNF or Lark grammar: {one_line(str(exc))}") from None
            return LLMatcher.grammar_from_lark(text)
    except Exception as exc:  # llguidance's converters raise ValueError, and plain exceptions
        raise ValueError(one_line(str(exc) or type(exc).__name__)) from None
    raise RuntimeError(f"unknown constraint kind {kind!r}")


def one_line(message: str) -> str:
    """An engine's message as one short line: no parser state, no grammar, no newlines."""
    for marker in ("<non-verbose/>", "<state>", "<grammar>"):
        message = message.split(marker, 1)[0]
    message = " ".join(message.split())
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[: MAX_MESSAGE_CHARS - 3] + "..."
    return message or "the grammar engine gave no reason"


def engine_reason(error: str) -> str:
    """A matcher's error as a reason: one line, and a budget exceeded said so."""
    reason = one_line(error)
    if reason.startswith(("NoExtension", "NoExtensionBias")):
        return "no output satisfies it (e.g. a $ref that refers only to itself)"
    lowered = reason.lower()
    if any(word in lowered for word in _LIMIT_WORDS):
        return f"it is too complex for the grammar engine's limits ({reason})"
    return reason


def refusal(reason: str, tool: str | None = None) -> str:
    """A worker's message for a constraint (or a tool's parameters) it cannot enforce."""
    if tool is None:
        return _CONSTRAINT + reason
    return f"the parameters of tool {tool!r} cannot be enforced: {reason}"


def is_refusal(message: str) -> bool:
    """Whether a worker's message is a ``refusal``."""
    return message.startswith(_CONSTRAINT) or _TOOL.match(message) is not None


def refused_param(message: str, constraint_param: str | None) -> str | None:
    """The request field a worker's ``bad_request`` message is about: the constraint's field
    (``constraint_param``) for a refused constraint, ``tools`` for a tool's parameters, else None."""
    if message.startswith(_CONSTRAINT):
        return constraint_param
    if _TOOL.match(message):
        return "tools"
    return None
