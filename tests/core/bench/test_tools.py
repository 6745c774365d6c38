"""The function tools of ``dyn bench --multi-turn --tools N``: deterministic, realistic, answerable."""

from __future__ import annotations

import random

import jsonschema
import orjson
import pytest

from dyn.core.bench import workloads
from dyn.core.bench.spec import WorkloadSpec
from dyn.core.bench.tools import MAX_TOOLS, ToolUse, function_tools, tool_pause, tool_result


def test_tools_are_deterministic_distinct_and_shaped_like_openais():
    tools = function_tools(12, seed=5)
    assert tools == function_tools(12, seed=5) and tools != function_tools(12, seed=6)
    names = [t["function"]["name"] for t in tools]
    assert len(set(names)) == 12
    for tool in tools:
        assert tool["type"] == "function" and tool["function"]["description"]
        params = tool["function"]["parameters"]
        jsonschema.Draft202012Validator.check_schema(params)
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert 1 <= len(params["properties"]) <= 3
        assert params["required"] and set(params["required"]) <= set(params["properties"])
        for schema in params["properties"].values():
            assert schema["type"] in ("string", "integer")
            if schema["type"] == "string" and "enum" not in schema:
                assert schema["maxLength"] <= 24  # bounded calls: they fit the default --max-tokens
    kinds = {
        ("enum" if "enum" in s else s["type"])
        for t in tools
        for s in t["function"]["parameters"]["properties"].values()
    }
    assert kinds == {"string", "integer", "enum"}
    assert function_tools(0, seed=1) == ()
    assert len(function_tools(MAX_TOOLS, seed=1)) == MAX_TOOLS
    with pytest.raises(ValueError, match="--tools must be between 0 and"):
        function_tools(MAX_TOOLS + 1, seed=1)


def test_the_mockers_grammar_answers_every_tool_with_a_schema_valid_call():
    # the mocker's --tool-call-rate samples a call's arguments under the tool's parameters schema
    # (plugins/mocker/answers.py); every tool we offer must compile there and give valid arguments
    from dyn.core.model import TINY_MODEL_DIR, load_model_info
    from dyn.plugins.mocker.grammar import GrammarEngine

    engine = GrammarEngine.for_model(load_model_info(str(TINY_MODEL_DIR)))
    rng = random.Random(0)
    for seed in range(3):
        for tool in function_tools(8, seed):
            params = tool["function"]["parameters"]
            arguments = engine.compile_schema(orjson.dumps(params).decode()).complete(rng.random, 1024)
            assert arguments is not None
            jsonschema.validate(orjson.loads(arguments), params)


def test_results_and_pauses_are_functions_of_the_position_only():
    use = ToolUse(tools=function_tools(2, 1), max_rounds=4, result_tokens=7, seed=1, pause_s=0.5)
    result = tool_result(use, "agent0-lead", 1, 0, 0, "get_logs")
    assert result == tool_result(use, "agent0-lead", 1, 0, 0, "get_logs")
    assert result.startswith("get_logs: ") and len(result.split()) == 7
    assert result != tool_result(use, "agent0-lead", 1, 0, 1, "get_logs")
    assert result != tool_result(use, "agent1-lead", 1, 0, 0, "get_logs")
    pauses = [tool_pause(use, "agent0-lead", t, r) for t in range(20) for r in range(1, 3)]
    assert pauses == [tool_pause(use, "agent0-lead", t, r) for t in range(20) for r in range(1, 3)]
    assert all(p > 0 for p in pauses) and 0.1 < sum(pauses) / len(pauses) < 1.5
    assert tool_pause(ToolUse(tools=(), max_rounds=1, result_tokens=1, seed=1), "c", 0, 1) == 0.0


def mt(**kw):
    args = dict(
        agents=2,
        lead_turns=3,
        subagents=1,
        subagent_turns=2,
        system_tokens=16,
        turn_tokens=8,
        max_tokens=8,
        tool_pause_s=0.1,
        speculative_prefill=False,
        priority_mix=0.0,
        session_timeout_s=30,
        block_size=8,
        seed=4,
    )
    return workloads.multi_turn(**{**args, **kw})


def test_multi_turn_offers_the_same_tools_everywhere_and_says_so_in_its_shape():
    w = mt(tools=3, max_tool_rounds=2, tool_result_tokens=16)
    uses = [c.tool_use for u in w.units for c in u.conversations]
    use = uses[0]
    assert len(uses) == 4 and all(u == use for u in uses)
    assert use.tools == function_tools(3, 4) and (use.max_rounds, use.result_tokens, use.pause_s) == (
        2,
        16,
        0.1,
    )
    shape = workloads.shape(w)
    assert (shape["tools"], shape["max_tool_rounds"], shape["tool_result_tokens"]) == (3, 2, 16)
    plain = mt()
    assert "tools" not in workloads.shape(plain) and all(
        c.tool_use is None for u in plain.units for c in u.conversations
    )
    # the scripted turns are the same with or without tools
    assert [c.turns for u in w.units for c in u.conversations] == [
        c.turns for u in plain.units for c in u.conversations
    ]
    with pytest.raises(ValueError, match="--max-tool-rounds"):
        mt(tools=1, max_tool_rounds=-1)
    with pytest.raises(ValueError, match="--tool-result-tokens"):
        mt(tools=1, tool_result_tokens=0)


def test_tools_need_the_multi_turn_workload():
    assert WorkloadSpec(kind="multi-turn", agents=1, tools=2).build().units[0].conversations[0].tool_use
    with pytest.raises(ValueError, match="--tools needs --multi-turn"):
        WorkloadSpec(kind="prefix", tools=2).build()
