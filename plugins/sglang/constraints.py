"""A request's ``OutputConstraint`` -> the keys of SGLang's ``sampling_params`` that enforce it.

SGLang 0.5.23 (``python/sglang/srt/sampling/sampling_params.py``, ``srt/constrained/*``,
``srt/entrypoints/openai/protocol.py``) constrains decoding with one of ``json_schema``, ``regex``
and ``ebnf``, compiled by the server's ``--grammar-backend`` (``xgrammar`` by default,
``llguidance``, ``outlines``, or ``none``). A constraint the backend cannot compile ends the
request with SGLang's abort (status 400, "Failed to compile ... grammar"), which the engine
reports as a ``bad_request``.

- ``json``: ``json_schema`` (the schema text). ``whitespace_pattern`` has no per-request key in
  SGLang (only the server's ``--constrained-json-whitespace-pattern``), so it is not sent.
- ``json_object``: ``json_schema`` ``{"type": "object"}``, as SGLang's own OpenAI server sends it.
- ``regex``: ``regex``.
- ``choice``: ``regex``, the choices escaped and joined as alternatives (SGLang has no choice
  key); only characters every backend's regex dialect treats as operators are escaped.
- ``grammar`` in GBNF-style EBNF (``root ::= ...``): ``ebnf``. In Lark (``start: ...``):
  ``llguidance`` reads Lark in ``ebnf`` itself; for ``xgrammar`` the worker converts it to EBNF
  with xgrammar's own Lark front end (``Grammar.from_lark``, the one vLLM's xgrammar backend
  uses; xgrammar is an SGLang dependency); ``outlines`` and ``none`` compile no grammar at all,
  so it goes as written and SGLang refuses it. A Lark grammar xgrammar cannot read is a
  ``bad_request`` with xgrammar's message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from dyn.core.engine import EngineError
from dyn.core.messages import OutputConstraint

JSON_OBJECT_SCHEMA = json.dumps({"type": "object"})
_REGEX_ESCAPES = str.maketrans(
    {**{c: "\\" + c for c in "\\.^$|?*+()[]{}"}, "\n": "\\n", "\r": "\\r", "\t": "\\t"}
)
_EBNF_RULE = re.compile(r"^\s*[A-Za-z_][\w.-]*\s*::=", re.MULTILINE)


def constraint_params(constraint: OutputConstraint, grammar_backend: str) -> dict[str, Any]:
    """SGLang sampling keys for ``constraint`` on a server with ``grammar_backend``;
    ``EngineError(bad_request)`` for a Lark grammar the worker cannot turn into EBNF."""
    kind = constraint.kind
    if kind == "json":
        return {"json_schema": constraint.spec}
    if kind == "json_object":
        return {"json_schema": JSON_OBJECT_SCHEMA}
    if kind == "regex":
        return {"regex": constraint.spec}
    if kind == "choice":
        return {"regex": choice_regex(constraint.choices)}
    if kind == "grammar":
        grammar = constraint.spec
        if grammar_backend == "xgrammar" and is_lark(grammar):
            grammar = lark_to_ebnf(grammar)
        return {"ebnf": grammar}
    raise EngineError(f"unknown structured output kind {kind!r}", code="bad_request")


def choice_regex(choices: Sequence[str]) -> str:
    """A regex matching exactly one of ``choices``, each taken literally."""
    return "(" + "|".join(choice.translate(_REGEX_ESCAPES) for choice in choices) + ")"


def is_lark(grammar: str) -> bool:
    """Whether ``grammar`` is Lark rather than GBNF-style EBNF: no rule is defined with ``::=``."""
    return _EBNF_RULE.search(grammar) is None


@lru_cache(maxsize=256)
def lark_to_ebnf(grammar: str) -> str:
    """``grammar`` (Lark) in the EBNF that SGLang's xgrammar backend compiles."""
    try:
        import xgrammar
    except ImportError:
        raise EngineError(
            "this grammar is Lark, which SGLang's xgrammar backend does not read, and xgrammar "
            "is not importable here to convert it: send the grammar as EBNF (root ::= ...), or "
            "start the worker with --grammar-backend llguidance",
            code="bad_request",
        ) from None
    try:
        return str(xgrammar.Grammar.from_lark(grammar))
    except Exception as exc:  # xgrammar raises RuntimeError with the parser's message
        raise EngineError(
            f"SGLang's xgrammar backend cannot read this Lark grammar: {exc}", code="bad_request"
        ) from None
