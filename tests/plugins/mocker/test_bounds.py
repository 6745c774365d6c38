"""Bounded constraints: tighter than the request's (a subset, so never wrong), short enough to end."""

import re

import pytest

from dyn.plugins.mocker.bounds import (
    MAX_ITEMS,
    MAX_REPEAT,
    MAX_STRING,
    NUMBER_SPAN,
    SHORT_SCALAR,
    bound_lark,
    bound_regex,
    bound_schema,
)


def test_strings_arrays_and_numbers_get_bounds_within_their_own():
    out = bound_schema(
        {
            "type": "object",
            "properties": {
                "s": {"type": "string"},
                "long": {"type": "string", "minLength": 40},
                "short": {"type": "string", "maxLength": 4},
                "a": {"type": "array", "minItems": 5},
                "i": {"type": "integer"},
                "n": {"type": "number", "minimum": 3},
            },
        }
    )
    props = out["properties"]
    assert props["s"]["maxLength"] == MAX_STRING
    assert props["long"]["maxLength"] == 40  # never below minLength
    assert props["short"]["maxLength"] == 4
    assert props["a"]["maxItems"] == 5 and MAX_ITEMS < 5
    assert (props["i"]["minimum"], props["i"]["maximum"]) == (-NUMBER_SPAN, NUMBER_SPAN)
    assert props["n"]["minimum"] == 3 and props["n"]["maximum"] == 3 + NUMBER_SPAN
    assert props["n"]["multipleOf"] == 0.25


def test_values_with_a_fixed_shape_are_left_alone():
    for node in (
        {"enum": ["a" * 50]},
        {"const": "x" * 30},
        {"type": "string", "pattern": "^a{20}$"},
        {"type": "string", "format": "date-time"},
        {"type": "integer", "multipleOf": 5, "minimum": 1, "maximum": 4},
    ):
        assert bound_schema(node) == node


@pytest.mark.parametrize(
    "node,inside",
    [
        ({"type": "number", "exclusiveMinimum": 0.5, "exclusiveMaximum": 0.75}, 0.51),
        ({"type": "integer", "minimum": 5000}, 5000),
        ({"type": "integer", "exclusiveMaximum": -7}, -8),
        ({"type": "integer", "exclusiveMinimum": 2, "maximum": 3}, 3),
        ({"type": "number", "minimum": 1e9}, 1e9),
    ],
)
def test_number_windows_keep_a_value_of_the_original_range(node, inside):
    out = bound_schema(node)
    for key, value in node.items():
        assert out[key] == value  # the original bounds stay
    assert out.get("minimum", -1e300) <= inside <= out.get("maximum", 1e300)
    if "multipleOf" in out:
        q = inside / out["multipleOf"]
        assert abs(q - round(q)) < 1e-9


def test_objects_get_no_keys_beyond_the_declared_ones():
    out = bound_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    assert out["additionalProperties"] is False
    out = bound_schema(
        {
            "type": "object",
            "properties": {"a": {}},
            "required": ["a", "b"],
            "additionalProperties": {"type": "boolean"},
        }
    )
    assert out["properties"]["b"] == {"type": "boolean"} and out["additionalProperties"] is False
    assert out["properties"]["a"] == SHORT_SCALAR  # "anything" became a short scalar
    free = bound_schema({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1})
    assert free["additionalProperties"] is False and 1 <= len(free["properties"]) <= 3
    assert all(v["type"] == "integer" for v in free["properties"].values())
    assert len(bound_schema({"type": "object", "maxProperties": 1})["properties"]) == 1
    # unsatisfiable or beyond what can be bounded: as it was
    for node in (
        {"type": "object", "required": ["a", "b"], "maxProperties": 1},
        {"type": "object", "patternProperties": {"^x": {}}},
    ):
        assert bound_schema(node) == node


def test_all_of_members_and_definitions_are_not_turned_into_scalars():
    node = {"allOf": [{}, {"type": "object"}], "$defs": {"any": {}}}
    out = bound_schema(node)
    assert out["allOf"] == node["allOf"] and out["$defs"] == {"any": {}}


def test_the_original_schema_is_not_changed():
    node = {"type": "object", "properties": {"s": {"type": "string"}}}
    bound_schema(node)
    assert node == {"type": "object", "properties": {"s": {"type": "string"}}}


@pytest.mark.parametrize(
    "pattern,bounded",
    [
        (r"a*b+", "a{0,%d}b{1,%d}" % (MAX_REPEAT, MAX_REPEAT)),
        (r"x{2,}y", "x{2,%d}y" % (2 + MAX_REPEAT)),
        (r"[*+]\*\+", r"[*+]\*\+"),  # classes and escapes are literal
        (r"[]*]+", "[]*]{1,%d}" % MAX_REPEAT),
        (r"(?:ab)*?c", "(?:ab){0,%d}?c" % MAX_REPEAT),
        (r"a{1,3}", "a{1,3}"),
    ],
)
def test_regex_quantifiers_are_bounded(pattern, bounded):
    assert bound_regex(pattern) == bounded


def test_bounded_regex_matches_only_what_the_original_matches():
    pattern = r"(yes|no)( [a-z]+)*\."
    bounded = bound_regex(pattern)
    for text in ("yes.", "no abc de.", "yes " + " ".join(["ab"] * MAX_REPEAT) + "."):
        assert re.fullmatch(bounded, text) and re.fullmatch(pattern, text)
    assert re.fullmatch(pattern, "yes" + " a" * (MAX_REPEAT + 1) + ".")
    assert not re.fullmatch(bounded, "yes" + " a" * (MAX_REPEAT + 1) + ".")


def test_lark_repetitions_and_regex_terminals_are_bounded_strings_and_comments_are_not():
    grammar = 'start: item+ "a*b+" // many+\nitem: /[a-z]+/ | "(" item* ")"\n'
    assert bound_lark(grammar) == (
        'start: item{1,8} "a*b+" // many+\nitem: /[a-z]{1,8}/ | "(" item{0,8} ")"\n'
    )
