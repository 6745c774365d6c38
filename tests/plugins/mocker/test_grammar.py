"""The mocker's grammar engine: every output that ends with "stop" satisfies the request's
constraint (parsed and validated here), outputs end well before max_tokens, and runs are
deterministic per seed. Constraint kinds as vLLM's structured outputs take them (docs/features/
structured_outputs.md: guided_json, guided_regex, guided_choice, guided_grammar)."""

from __future__ import annotations

import json
import random
import re
import time

import pytest

from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.messages import OutputConstraint
from dyn.core.model import load_model_info
from dyn.core.protocol.grammar import LIMITS, GrammarCompiler, is_refusal
from dyn.plugins.mocker import grammar as grammar_module
from dyn.plugins.mocker.grammar import RENEW_USES, ConstraintError, GrammarEngine
from dyn.plugins.mocker.sources import FAIL, STOP

MODEL = load_model_info(None, None)
ENGINE = GrammarEngine.for_model(MODEL)
TOKENIZER = Tokenizer.from_model(MODEL)
SEEDS = range(25)
ORDINARY = 200
"""Tokens an ordinary schema's output stays under (the requests allow 4000)."""


class Req:
    """What a source reads from a ``SimRequest``."""

    def __init__(self, seed: int, min_tokens: int = 0) -> None:
        self.rand = random.Random(seed).random
        self.num_output = 0
        self.min_tokens = min_tokens


def sample(constraint: OutputConstraint, seed: int, max_tokens: int = 4000, min_tokens: int = 0):
    """(text, finish reason, tokens) as the scheduler would produce them."""
    source = ENGINE.compile(constraint).source()
    req = Req(seed, min_tokens)
    tokens = []
    while len(tokens) < max_tokens:
        token = source.next_token(req)
        if token == STOP:
            return TOKENIZER.decode(tokens), "stop", tokens
        assert token != FAIL, source.error
        tokens.append(token)
        req.num_output += 1
    return TOKENIZER.decode(tokens), "length", tokens


def schema(value) -> OutputConstraint:
    return OutputConstraint("json", json.dumps(value))


EDGE_SCHEMAS = {
    "enums": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"type": "string", "enum": ["S", "M", "a much longer enum value than twelve"]},
            "level": {"enum": [1, 2.5, None, True]},
        },
        "required": ["color", "size", "level"],
    },
    "nested_objects": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "minLength": 3},
                    "address": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string"},
                            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                        },
                        "required": ["city", "zip"],
                    },
                },
                "required": ["name", "address"],
            }
        },
        "required": ["user"],
    },
    "arrays": {
        "type": "object",
        "properties": {
            "ints": {
                "type": "array",
                "items": {"type": "integer", "minimum": 1, "maximum": 9},
                "minItems": 2,
            },
            "points": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                    "required": ["x", "y"],
                },
            },
            "pair": {
                "type": "array",
                "prefixItems": [{"type": "string"}, {"type": "boolean"}],
                "items": False,
                "minItems": 2,
            },
        },
        "required": ["ints", "points", "pair"],
    },
    "additional_properties_false": {
        "type": "object",
        "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}},
        "additionalProperties": False,
    },
    "required_beyond_properties": {
        "type": "object",
        "properties": {"known": {"type": "integer"}},
        "required": ["known", "extra"],
        "minProperties": 3,
    },
    "free_form_map": {"type": "object", "additionalProperties": {"type": "integer", "exclusiveMinimum": 10}},
    "any_of": {
        "anyOf": [
            {"type": "integer", "exclusiveMinimum": 10},
            {"type": "string", "maxLength": 3},
            {"type": "null"},
        ]
    },
    "narrow_numbers": {
        "type": "object",
        "properties": {
            "p": {"type": "number", "exclusiveMinimum": 0.5, "exclusiveMaximum": 0.75},
            "big": {"type": "integer", "minimum": 5000},
            "neg": {"type": "integer", "exclusiveMaximum": -7},
            "fives": {"type": "integer", "multipleOf": 5},
        },
        "required": ["p", "big", "neg", "fives"],
    },
    "defs_and_refs": {
        "$defs": {
            "item": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
                "required": ["sku", "qty"],
            }
        },
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1}},
        "required": ["items"],
    },
    "anything": {},
    "scalars": {"type": "array", "items": {"type": ["boolean", "null", "string"]}, "minItems": 3},
    "date": {
        "type": "object",
        "properties": {"when": {"type": "string", "format": "date"}},
        "required": ["when"],
    },
}


@pytest.mark.parametrize("name", EDGE_SCHEMAS)
def test_json_schema_outputs_parse_validate_and_end_early(name, check_schema):
    spec = EDGE_SCHEMAS[name]
    for seed in SEEDS:
        text, reason, tokens = sample(schema(spec), seed)
        assert reason == "stop", f"seed {seed}: ran to max_tokens: {text[:200]!r}"
        assert len(tokens) < ORDINARY, f"seed {seed}: {len(tokens)} tokens: {text!r}"
        check_schema(json.loads(text), spec)


def test_recursive_schema_is_valid_whenever_it_stops(check_schema):
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "value": {"type": "integer"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["value"],
            }
        },
        "$ref": "#/$defs/node",
    }
    stopped = 0
    for seed in SEEDS:
        text, reason, _ = sample(schema(tree), seed, max_tokens=600)
        if reason == "stop":
            stopped += 1
            check_schema(json.loads(text), tree)
    assert stopped >= len(SEEDS) // 2


def test_json_object_is_one_object():
    for seed in SEEDS:
        text, reason, tokens = sample(OutputConstraint("json_object"), seed)
        assert reason == "stop" and len(tokens) < ORDINARY
        assert isinstance(json.loads(text), dict)


def test_whitespace_pattern_is_respected(check_schema):
    spec = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
        "required": ["a", "b"],
    }
    for seed in range(10):
        text, reason, _ = sample(
            OutputConstraint("json", json.dumps(spec), whitespace_pattern=r"[ ]{0,2}"), seed
        )
        assert reason == "stop"
        check_schema(json.loads(text), spec)
        outside_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
        assert not re.search(r"[\n\t]| {3}", outside_strings)


# ASCII classes: llguidance reads \w and \d as Rust's regex does, by a newer Unicode than Python 3.11's
@pytest.mark.parametrize(
    "pattern",
    [
        r"^[A-Z]{2}-[0-9]{3}$",  # anchors
        r"[a-z0-9_]+@[a-z]+\.com",  # an unbounded part before a needle
        r"(?s).*END",  # anything, then a fixed end
        r"(yes|no|maybe)( [a-z]+)*\.",
        r"[0-9]{3,}",
    ],
)
def test_regex_outputs_match_the_whole_pattern(pattern):
    for seed in SEEDS:
        text, reason, tokens = sample(OutputConstraint("regex", pattern), seed)
        assert reason == "stop" and len(tokens) < ORDINARY, text
        assert re.fullmatch(pattern, text), f"seed {seed}: {text!r}"


def test_choice_outputs_are_one_of_the_choices():
    choices = ("alpha", "beta", "gamma delta", "ALPHA-2")
    seen = set()
    for seed in SEEDS:
        text, reason, _ = sample(OutputConstraint("choice", choices=choices), seed)
        assert reason == "stop" and text in choices
        seen.add(text)
    assert len(seen) >= 3


GBNF = (
    'root ::= "SELECT " cols " FROM " name ( " WHERE " name " = " num )?\n'
    'cols ::= "*" | name ( ", " name )*\n'
    "name ::= [a-z] [a-z_]*\n"
    "num ::= [0-9]+"
)
GBNF_RE = r"SELECT (\*|[a-z][a-z_]*(, [a-z][a-z_]*)*) FROM [a-z][a-z_]*( WHERE [a-z][a-z_]* = [0-9]+)?"


def test_gbnf_grammar_outputs_are_sentences_of_the_grammar():
    for seed in SEEDS:
        text, reason, tokens = sample(OutputConstraint("grammar", GBNF), seed)
        assert reason == "stop" and len(tokens) < ORDINARY, text
        assert re.fullmatch(GBNF_RE, text), text


LARK = 'start: expr\nexpr: term (("+" | "-") term)*\nterm: NUMBER | "(" expr ")"\nNUMBER: /[0-9]+/'


def _parse_expr(text: str, i: int = 0) -> int:
    """Index after the longest ``expr`` of LARK at ``i``; raises ValueError when there is none."""
    i = _parse_term(text, i)
    while i < len(text) and text[i] in "+-":
        i = _parse_term(text, i + 1)
    return i


def _parse_term(text: str, i: int) -> int:
    if i < len(text) and text[i] == "(":
        i = _parse_expr(text, i + 1)
        if i >= len(text) or text[i] != ")":
            raise ValueError(f"no ) at {i}")
        return i + 1
    digits = re.match(r"[0-9]+", text[i:])
    if not digits:
        raise ValueError(f"no number at {i}")
    return i + digits.end()


def test_lark_grammar_outputs_are_sentences_of_the_grammar():
    stopped = 0
    for seed in SEEDS:
        text, reason, _ = sample(OutputConstraint("grammar", LARK), seed, max_tokens=400)
        if reason == "stop":
            stopped += 1
            assert _parse_expr(text) == len(text), text
    assert stopped >= len(SEEDS) - 2


@pytest.mark.parametrize(
    "constraint",
    [
        schema(EDGE_SCHEMAS["arrays"]),
        OutputConstraint("regex", r"[a-z]+@[a-z]+\.com"),
        OutputConstraint("grammar", GBNF),
        OutputConstraint("choice", choices=("a", "bb", "ccc")),
    ],
)
def test_outputs_are_deterministic_per_seed_and_vary_across_seeds(constraint):
    runs = [sample(constraint, seed)[2] for seed in range(8)]
    assert runs == [sample(constraint, seed)[2] for seed in range(8)]
    assert len({tuple(r) for r in runs}) > 1


def test_min_tokens_holds_off_the_end_while_the_grammar_can_go_on():
    text, reason, tokens = sample(OutputConstraint("regex", r"[a-z]{1,40}"), seed=1, min_tokens=6)
    assert reason == "stop" and len(tokens) >= 6 and re.fullmatch(r"[a-z]{1,40}", text)
    # nothing may follow "yes": the end comes anyway
    text, reason, _ = sample(OutputConstraint("choice", choices=("yes",)), seed=1, min_tokens=50)
    assert (text, reason) == ("yes", "stop")


@pytest.mark.parametrize(
    "constraint,message",
    [
        (OutputConstraint("regex", "("), "unclosed group"),
        (OutputConstraint("json", '{"type": "strin"}'), "strin"),
        (OutputConstraint("json", "not json"), "JSON is malformed"),
        (OutputConstraint("json", "false"), "Unsatisfiable"),
        (OutputConstraint("grammar", "root ::= undefined_rule"), "undefined_rule"),
        (
            OutputConstraint("json", json.dumps({"type": "string", "format": "date-time", "pattern": "^x$"})),
            "Unsatisfiable",
        ),
        (OutputConstraint("regex", "a" * (300 * 1024)), "at most"),
    ],
)
def test_constraints_the_engine_refuses_raise_constraint_error(constraint, message):
    with pytest.raises(ConstraintError, match=re.escape(message)):
        ENGINE.compile(constraint)


def test_compiled_constraints_are_cached():
    constraint = OutputConstraint("regex", r"[a-z]{3}\d")
    assert ENGINE.compile(constraint) is ENGINE.compile(constraint)
    assert ENGINE.cached(OutputConstraint("regex", r"[a-z]{3}\d")) is not None


def test_complete_samples_a_whole_output_as_text(check_schema):
    spec = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
        "required": ["city", "days"],
    }
    grammar = ENGINE.compile_schema(json.dumps(spec))
    text = grammar.complete(random.Random(3).random, 1000)
    check_schema(json.loads(text), spec)
    assert text == grammar.complete(random.Random(3).random, 1000)
    assert grammar.complete(random.Random(3).random, 2) is None  # does not end in 2 tokens


# Issue 31: the engine's limits and its cache's bounds (``dyn.core.protocol.grammar``).

DOUBLING_LARK = "\n".join(['r0: "a"', *(f"r{i}: r{i - 1} r{i - 1}" for i in range(1, 60)), "start: r59"])


@pytest.mark.parametrize(
    "constraint, reason",
    [
        (schema({"$ref": "#"}), "no output satisfies it"),
        (
            schema({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
            "no output satisfies it",
        ),
        (OutputConstraint("regex", "(a{600}){1000}"), "too many expressions"),
        (OutputConstraint("grammar", DOUBLING_LARK), "Too many items"),
    ],
)
def test_constraints_failing_on_their_first_steps_are_refused_at_compile_and_never_cached(constraint, reason):
    """They used to compile, be cached, and fail on the first mask or token with a 500."""
    start = time.perf_counter()
    with pytest.raises(ConstraintError, match=re.escape(reason)) as info:
        ENGINE.compile(constraint)
    assert time.perf_counter() - start < 1.0
    message = str(info.value)
    assert "\n" not in message and "<state>" not in message and "<grammar>" not in message
    assert ENGINE.cached(constraint) is None


@pytest.fixture
def engine():
    """A private engine (the shared one's cache is left alone)."""
    return GrammarEngine(GrammarCompiler(ENGINE.tokenizer))


def test_the_cache_is_bounded_in_bytes(engine, monkeypatch):
    monkeypatch.setattr(grammar_module, "CACHE_BYTES", 24 << 20)
    sizes = []
    for k in range(20, 30):  # each 9-11 MB as measured
        grammar = engine.compile(OutputConstraint("regex", "(a{%d}){1000}" % k))
        sizes.append(grammar.nbytes)
        assert engine.cache_bytes <= 24 << 20
        assert engine.cache_bytes == sum(g.nbytes for g in engine._cache.values())
    assert min(sizes) > 4 << 20 and 1 <= len(engine._cache) <= 2


def test_the_cache_is_bounded_in_entries(engine, monkeypatch):
    monkeypatch.setattr(grammar_module, "CACHE_SIZE", 4)
    constraints = [OutputConstraint("regex", f"[a-z]{{{n}}}") for n in range(1, 8)]
    for constraint in constraints:
        engine.compile(constraint)
    assert list(engine._cache) == constraints[-4:]
    assert engine.cache_bytes == sum(g.nbytes for g in engine._cache.values()) > 0


def test_a_grammar_over_the_byte_bound_serves_and_is_not_kept(engine, monkeypatch):
    monkeypatch.setattr(grammar_module, "CACHE_BYTES", 1 << 20)
    constraint = OutputConstraint("regex", "(a{30}){1000}")
    assert engine.compile(constraint).source() is not None
    assert engine.cached(constraint) is None and engine.cache_bytes == 0


def test_a_grammar_that_fails_mid_output_leaves_the_cache_with_a_one_line_refusal():
    small = GrammarEngine(GrammarCompiler(ENGINE.tokenizer, {**LIMITS, "max_lexer_states": 400}))
    constraint = OutputConstraint("regex", r"(\w+ ){5,50}\w+\.")
    grammar = small.compile(constraint)
    assert small.cached(constraint) is grammar
    source, req = grammar.source(), Req(0)
    for _ in range(1000):
        token = source.next_token(req)
        if token in (FAIL, STOP):
            break
        req.num_output += 1
    assert token == FAIL
    assert is_refusal(source.error) and "too many states" in source.error and "\n" not in source.error
    assert small.cached(constraint) is None and small.cache_bytes == 0


def test_a_grammar_is_compiled_afresh_after_serving_its_share(engine):
    constraint = OutputConstraint("regex", "[a-z]{4}")
    grammar = engine.compile(constraint)
    for _ in range(RENEW_USES):
        grammar.source()
    assert engine.cached(constraint) is None
    assert engine.compile(constraint) is not grammar
