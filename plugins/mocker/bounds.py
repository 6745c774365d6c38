"""Bounded constraints: the subset of a constraint the mocker samples from, so that random sampling
ends well before ``max_tokens``.

A model writes short values because it was trained to; a sampler that picks uniformly among the
allowed tokens does not, so an unbounded string or repetition runs until ``max_tokens``. These
functions tighten a JSON Schema or a regular expression into one whose every match is also a match
of the original (a subset: the mocker never writes something the request's constraint refuses),
but whose values are short:

- strings without ``enum``/``const``/``pattern``/``format`` get ``maxLength`` (at least their
  ``minLength``);
- arrays get ``maxItems`` (at least their ``minItems``);
- integers and numbers get a window of ``minimum``/``maximum`` inside their own bounds, and numbers
  a ``multipleOf`` (0.25, or finer when the range is narrow) so that fractions end;
- objects get ``additionalProperties: false``: required names without a declaration are declared
  (with the schema extra keys had), free-form objects and maps get a few fixed keys whose values
  follow the map's value schema, and fixed keys fill up to ``minProperties``;
- a schema that accepts anything (``{}`` or ``true``) in a value position becomes a short scalar;
- in a regex, ``*``, ``+`` and ``{n,}`` become bounded repetitions; in a Lark grammar (GBNF is
  converted to Lark first), so do ``*`` and ``+`` on rule items and the quantifiers inside its
  regex terminals.

``allOf`` members, ``not`` and ``if``/``then``/``else`` are left as they are (tightening one member
of a conjunction can make the whole unsatisfiable). The caller compiles the bounded form and falls
back to the original when the grammar engine refuses it.
"""

from __future__ import annotations

import math
from typing import Any

MAX_STRING = 12
"""Characters of a bounded string."""
MAX_ITEMS = 3
"""Items of a bounded array."""
NUMBER_SPAN = 1000
"""Half-width of a bounded number's window."""
NUMBER_STEPS = (0.25, 0.01, 0.0001)
"""Candidate ``multipleOf`` of a bounded number (the first with a multiple in its range)."""
MAX_REPEAT = 8
"""Repetitions of a bounded regex quantifier."""
MAP_KEYS = ("id", "name", "value")
"""Keys of a bounded free-form object."""
MAX_DEPTH = 64

_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "$id",
        "$schema",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$anchor",
    }
)
_SCHEMA_MAPS = ("$defs", "definitions", "properties", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SCHEMA_ONES = ("items", "additionalItems", "contains", "unevaluatedItems")
SHORT_SCALAR: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "maxLength": MAX_STRING},
        {"type": "integer", "minimum": -NUMBER_SPAN, "maximum": NUMBER_SPAN},
        {"type": "boolean"},
        {"type": "null"},
    ]
}
"""What a schema that accepts anything becomes."""
FLAT_OBJECT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": MAX_STRING},
        "id": {"type": "integer", "minimum": 0, "maximum": NUMBER_SPAN},
        "ok": {"type": "boolean"},
    },
    "required": ["name"],
    "additionalProperties": False,
}
"""A ``json_object`` constraint's bounded form: a flat object, a subset of every JSON object."""


def bound_schema(schema: Any) -> Any:
    """A bounded copy of ``schema`` (see the module docstring); ``schema`` is not changed."""
    return _bound(schema, 0, value=True)


def _bound(node: Any, depth: int, value: bool) -> Any:
    if node is True or (isinstance(node, dict) and value and not (node.keys() - _ANNOTATIONS)):
        return dict(SHORT_SCALAR)
    if not isinstance(node, dict) or depth > MAX_DEPTH:
        return node
    out = dict(node)
    d = depth + 1
    for key in _SCHEMA_MAPS:
        sub = node.get(key)
        if isinstance(sub, dict):
            out[key] = {name: _bound(s, d, value=key == "properties") for name, s in sub.items()}
    for key in _SCHEMA_LISTS:
        sub = node.get(key)
        if isinstance(sub, list):
            out[key] = [_bound(s, d, value=True) for s in sub]
    for key in _SCHEMA_ONES:
        if key in node:
            out[key] = _bound(node[key], d, value=True)
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _bound(node["additionalProperties"], d, value=True)
    if "enum" in node or "const" in node:
        return out
    types = node.get("type")
    types = {types} if isinstance(types, str) else set(types) if isinstance(types, list) else None
    if (types is None and value) or (types is not None and "string" in types):
        _bound_string(out)
    if (types is None and value) or (types is not None and "array" in types):
        _bound_array(out)
    if types is not None and types & {"number", "integer"}:
        _bound_number(out, integer="number" not in types)
    if types is not None and "object" in types:
        _bound_object(out, d)
    return out


def _bound_string(out: dict[str, Any]) -> None:
    if "pattern" in out or "format" in out:
        return
    low = out.get("minLength", 0)
    high = out.get("maxLength")
    if not isinstance(low, int) or (high is not None and not isinstance(high, int)):
        return
    cap = max(low, MAX_STRING)
    out["maxLength"] = cap if high is None else min(high, cap)


def _bound_array(out: dict[str, Any]) -> None:
    low = out.get("minItems", 0)
    high = out.get("maxItems")
    if not isinstance(low, int) or (high is not None and not isinstance(high, int)):
        return
    prefix = out.get("prefixItems")
    floor = max(low, len(prefix) if isinstance(prefix, list) and out.get("items") is False else 0)
    cap = max(floor, MAX_ITEMS)
    out["maxItems"] = cap if high is None else min(high, cap)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def _bound_number(out: dict[str, Any], integer: bool) -> None:
    """A window ``[a - NUMBER_SPAN, a + NUMBER_SPAN]`` around an allowed multiple ``a`` nearest 0
    (of the schema's ``multipleOf``; else of 1 for integers, of the first of ``NUMBER_STEPS``
    with a multiple in range for numbers, which then becomes the ``multipleOf``)."""
    low, high = _number(out.get("minimum")), _number(out.get("maximum"))
    xlow, xhigh = out.get("exclusiveMinimum"), out.get("exclusiveMaximum")
    xlow_number, xhigh_number = _number(xlow), _number(xhigh)
    low_open = high_open = False
    if xlow is True:  # draft 4: the boolean form makes minimum exclusive
        low_open = low is not None
    elif xlow_number is not None and (low is None or xlow_number >= low):
        low, low_open = xlow_number, True
    if xhigh is True:
        high_open = high is not None
    elif xhigh_number is not None and (high is None or xhigh_number <= high):
        high, high_open = xhigh_number, True
    given = _number(out.get("multipleOf"))
    if "multipleOf" in out and (given is None or given <= 0):
        return
    if integer and given is not None and given != int(given):
        return
    steps = (given,) if given is not None else (1,) if integer else NUMBER_STEPS
    for step in steps:
        a = _multiple_in(low, low_open, high, high_open, step)
        if a is not None:
            break
    else:
        return  # no multiple in range: leave the node as it is
    new_low, new_high = a - NUMBER_SPAN, a + NUMBER_SPAN
    if integer:
        new_low, new_high = math.ceil(new_low), math.floor(new_high)
    if low is None or new_low > low:
        out["minimum"] = new_low
    if high is None or new_high < high:
        out["maximum"] = new_high
    if given is None and not integer:
        out["multipleOf"] = step


def _multiple_in(
    low: float | None, low_open: bool, high: float | None, high_open: bool, step: float
) -> float | None:
    """The multiple of ``step`` inside the bounds nearest to 0 (or to the nearer bound), if any."""

    def inside(x: float) -> bool:
        return not (
            (low is not None and (x < low or (low_open and x <= low)))
            or (high is not None and (x > high or (high_open and x >= high)))
        )

    anchor = 0.0 if low is None or low <= 0 else low
    if high is not None and anchor > high:
        anchor = high
    a = round(anchor / step) * step
    if low is not None and not inside(a) and (a < low or (low_open and a <= low)):
        a = (math.floor(low / step) + 1) * step
    if high is not None and not inside(a):
        a = (math.ceil(high / step) - 1) * step
    if isinstance(step, int) or float(step).is_integer():
        a = int(a)
    return a if inside(a) else None


def _bound_object(out: dict[str, Any], depth: int) -> None:
    """No keys beyond the declared ones: required names without a declaration, and a few fixed
    keys for a free-form object or map (or to reach ``minProperties``), are declared with the
    schema extra keys had."""
    if "patternProperties" in out or "unevaluatedProperties" in out or "propertyNames" in out:
        return
    given = out.get("properties")
    required = out.get("required", [])
    min_props = out.get("minProperties", 0)
    max_props = out.get("maxProperties")
    if (
        (given is not None and not isinstance(given, dict))
        or not isinstance(required, list)
        or not all(isinstance(n, str) for n in required)
        or not isinstance(min_props, int)
        or (max_props is not None and not isinstance(max_props, int))
    ):
        return
    extra = out.get("additionalProperties", True)
    if extra is False:
        return
    if max_props is not None and (len(required) > max_props or min_props > max_props):
        return
    values = extra if isinstance(extra, dict) else dict(SHORT_SCALAR)
    props = dict(given or {})
    for name in required:
        props.setdefault(name, values)
    wanted = (
        min_props if given else max(min_props, min(len(MAP_KEYS), max_props if max_props is not None else 99))
    )
    for key in MAP_KEYS:
        if len(props) >= wanted:
            break
        props.setdefault(key, values)
    if len(props) < min_props:
        return
    out["properties"] = props
    out["additionalProperties"] = False


def bound_regex(pattern: str) -> str:
    """``pattern`` with its unbounded quantifiers (``*``, ``+``, ``{n,}``) bounded to
    ``MAX_REPEAT`` repetitions; escapes and character classes are copied as they are."""
    out: list[str] = []
    i, n = 0, len(pattern)
    depth = 0  # character-class nesting
    while i < n:
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if depth:
            if c == "[":
                depth += 1
            elif c == "]" and not _class_start(pattern, i):
                depth -= 1
            out.append(c)
            i += 1
            continue
        if c == "[":
            depth = 1
            out.append(c)
            i += 1
            continue
        if c == "*" and not _after_group_open(out):
            out.append("{0,%d}" % MAX_REPEAT)
        elif c == "+" and not _after_group_open(out):
            out.append("{1,%d}" % MAX_REPEAT)
        elif c == "{":
            end = pattern.find("}", i)
            body = pattern[i + 1 : end] if end > 0 else ""
            if body.endswith(",") and body[:-1].isdigit():
                low = int(body[:-1])
                out.append("{%d,%d}" % (low, low + MAX_REPEAT))
                i = end + 1
                continue
            out.append(c)
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _class_start(pattern: str, i: int) -> bool:
    """``]`` at ``i`` is a literal: the first character of a class (``[]`` or ``[^]``)."""
    return pattern[i - 1] == "[" or (pattern[i - 1] == "^" and i >= 2 and pattern[i - 2] == "[")


def _after_group_open(out: list[str]) -> bool:
    """A ``*``/``+`` right after ``(`` or ``|`` is not a quantifier (a syntax error the engine
    reports on the original); leave it."""
    return not out or out[-1] in ("(", "|")


def bound_lark(grammar: str) -> str:
    """A Lark grammar (llguidance's dialect) with ``*`` and ``+`` on items bounded to ``MAX_REPEAT``
    repetitions and its ``/regex/`` terminals bounded by ``bound_regex``; string literals and
    ``//`` comments are copied as they are."""
    out: list[str] = []
    i, n = 0, len(grammar)
    while i < n:
        c = grammar[i]
        if c in "\"'":
            end = _literal_end(grammar, i, c)
            out.append(grammar[i:end])
            i = end
        elif grammar.startswith("//", i):
            end = grammar.find("\n", i)
            end = n if end < 0 else end
            out.append(grammar[i:end])
            i = end
        elif c == "/":
            end = _regex_end(grammar, i)
            if end < 0:  # not a regex literal after all: let the engine report the original
                return grammar
            out.append("/" + bound_regex(grammar[i + 1 : end]) + "/")
            i = end + 1
        elif c == "*":
            out.append("{0,%d}" % MAX_REPEAT)
            i += 1
        elif c == "+":
            out.append("{1,%d}" % MAX_REPEAT)
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _literal_end(text: str, i: int, quote: str) -> int:
    """Index after the string literal opening at ``i``."""
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
            continue
        if text[j] == quote:
            return j + 1
        j += 1
    return len(text)


def _regex_end(text: str, i: int) -> int:
    """Index of the ``/`` closing the regex literal opening at ``i``; -1 if it does not close."""
    j = i + 1
    in_class = False
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == "\n":
            return -1
        if in_class:
            if c == "]":
                in_class = False
        elif c == "[":
            in_class = True
        elif c == "/":
            return j
        j += 1
    return -1
