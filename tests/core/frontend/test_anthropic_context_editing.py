"""Anthropic's context editing (``context_management``): the edits on a conversation, counted by a
stand-in counter, then ``/v1/messages`` and ``count_tokens`` in process over fake workers read by
the ``anthropic`` SDK's beta types (``client.beta.messages``), the edited prompt checked where
the engine receives it."""

from __future__ import annotations

import logging

import msgspec
import pytest

from dyn.core.frontend.apis.anthropic.context_editing import (
    CLEARED_RESULT,
    ClearThinking,
    ClearToolUses,
    InputTokens,
    ThinkingTurns,
    ToolUses,
    edited,
    edits_of,
)
from dyn.core.frontend.apis.anthropic.protocol import (
    MAX_EDITS,
    ContextManagement,
    MessageParam,
    ThinkingBlock,
    ThinkingCleared,
    ToolResultBlock,
    ToolUseBlock,
    ToolUsesCleared,
)
from dyn.core.protocol.errors import ApiError
from tests.core.frontend.fake_workers import reply, tokenizer
from tests.core.frontend.test_anthropic_api import MODEL, client

pytestmark = pytest.mark.anyio

BETA = ["context-management-2025-06-27"]


def turns(tools: list[str], thinking: bool = False) -> list[dict]:
    """A conversation of one tool call per round trip (a tool of ``tools`` in turn), each result a
    long text naming its call, the assistant thinking before each call when ``thinking``."""
    out: list[dict] = [{"role": "user", "content": "Start."}]
    for i, name in enumerate(tools):
        blocks: list[dict] = (
            [{"type": "thinking", "thinking": f"plan {i} " * 8, "signature": "s"}] if thinking else []
        )
        blocks.append({"type": "tool_use", "id": f"call{i}", "name": name, "input": {"n": i}})
        out.append({"role": "assistant", "content": blocks})
        result = {"type": "tool_result", "tool_use_id": f"call{i}", "content": f"result {i} " * 40}
        out.append({"role": "user", "content": [result]})
    return out


def params(raw: list[dict]) -> list[MessageParam]:
    return msgspec.convert(raw, list[MessageParam])


async def length(messages: list[MessageParam]) -> int:
    """A stand-in token count: the conversation's JSON length."""
    return len(msgspec.json.encode(messages))


def blocks_of(messages: list[MessageParam], kind: type) -> list:
    return [b for m in messages if isinstance(m.content, list) for b in m.content if isinstance(b, kind)]


async def test_clear_thinking_keeps_the_last_turns_that_think():
    messages = params(turns(["a", "b", "c"], thinking=True))
    out, applied, original = await edited(messages, [ClearThinking(keep=ThinkingTurns(1))], length)
    assert [len(blocks_of([m], ThinkingBlock)) for m in out if m.role == "assistant"] == [0, 0, 1]
    assert applied == [ThinkingCleared(2, await length(messages) - await length(out))]
    assert original == await length(messages) and blocks_of(out, ToolUseBlock) == blocks_of(
        messages, ToolUseBlock
    )
    for keep in ("all", ThinkingTurns(3)):
        same, applied, original = await edited(messages, [ClearThinking(keep=keep)], length)
        assert same == messages and applied == [] and original is None


async def test_clear_tool_uses_keeps_the_last_and_the_excluded_and_clears_inputs_as_asked():
    messages = params(turns(["read", "grep", "read", "bash", "read"]))
    edit = ClearToolUses(
        trigger=ToolUses(4), keep=ToolUses(2), exclude_tools=["grep"], clear_tool_inputs=["read"]
    )
    out, applied, _ = await edited(messages, [edit], length)
    results = {b.tool_use_id: b.content for b in blocks_of(out, ToolResultBlock)}
    inputs = {b.id: b.input for b in blocks_of(out, ToolUseBlock)}
    assert [results[f"call{i}"] == CLEARED_RESULT for i in range(5)] == [True, False, True, False, False]
    assert inputs == {"call0": {}, "call1": {"n": 1}, "call2": {}, "call3": {"n": 3}, "call4": {"n": 4}}
    assert applied == [ToolUsesCleared(2, await length(messages) - await length(out))]
    every_input = ClearToolUses(trigger=ToolUses(4), keep=ToolUses(2), clear_tool_inputs=True)
    out, _, _ = await edited(messages, [every_input], length)
    assert [b.input for b in blocks_of(out, ToolUseBlock)] == [{}, {}, {}, {"n": 3}, {"n": 4}]


async def test_clear_tool_uses_waits_for_its_trigger_and_its_minimum():
    messages = params(turns(["a", "b", "c", "d"]))
    size = await length(messages)
    for edit in (
        ClearToolUses(trigger=ToolUses(4)),  # 4 calls: not over 4
        ClearToolUses(trigger=InputTokens(size)),  # not over the count
        ClearToolUses(trigger=ToolUses(1), clear_at_least=InputTokens(size)),  # cannot free that much
    ):
        out, applied, original = await edited(messages, [edit], length)
        assert out == messages and applied == [] and original is None
    out, applied, original = await edited(messages, [ClearToolUses(trigger=InputTokens(size - 1))], length)
    assert applied[0].cleared_tool_uses == 1 and original == size


def test_edits_are_checked_and_unknown_ones_are_left_with_a_warning(caplog):
    caplog.set_level(logging.WARNING)
    config = ContextManagement(
        edits=[{"type": "compact_20260112"}, {"type": "clear_thinking_20251015", "keep": {"type": "all"}}]
    )
    assert len(edits_of(config)) == 1 and "compact_20260112" in caplog.text
    with pytest.raises(ApiError) as bad:
        edits_of(ContextManagement(edits=[{"type": "clear_tool_uses_20250919", "keep": {"type": "x"}}]))
    assert bad.value.status == 400 and bad.value.param == "context_management.edits[0]"


async def test_the_engine_gets_the_edited_prompt_and_the_sdk_reads_what_was_cleared(make_frontend):
    messages = turns(["read", "read", "read", "read"], thinking=True)
    context = {
        "edits": [
            {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}},
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "tool_uses", "value": 1},
                "keep": {"type": "tool_uses", "value": 1},
            },
        ]
    }
    async with make_frontend(workers=1, script=reply("ok")) as fe:
        sdk = client(fe).beta.messages
        unary = await sdk.create(
            model=MODEL, max_tokens=8, messages=messages, context_management=context, betas=BETA
        )
        async with sdk.stream(
            model=MODEL, max_tokens=8, messages=messages, context_management=context, betas=BETA
        ) as stream:
            streamed = await stream.get_final_message()
        counted = await client(fe).beta.messages.count_tokens(
            model=MODEL, messages=messages, context_management=context, betas=BETA
        )
        plain = await client(fe).beta.messages.count_tokens(model=MODEL, messages=messages, betas=BETA)
        prompt = tokenizer().decode(fe.fleet.requests[0].token_ids)
    thinking, tools = unary.context_management.applied_edits
    assert (thinking.type, thinking.cleared_thinking_turns) == ("clear_thinking_20251015", 3)
    assert (tools.type, tools.cleared_tool_uses) == ("clear_tool_uses_20250919", 3)
    # dyn-tiny's chat template renders no reasoning: its turns' thinking cost no prompt tokens
    assert thinking.cleared_input_tokens == 0 and tools.cleared_input_tokens > 0
    assert streamed.context_management == unary.context_management
    assert prompt.count(CLEARED_RESULT) == 3 and "result 3" in prompt and "result 0" not in prompt
    assert counted.context_management.original_input_tokens == plain.input_tokens
    assert (
        counted.input_tokens
        == plain.input_tokens - thinking.cleared_input_tokens - tools.cleared_input_tokens
    )
    assert unary.usage.input_tokens == counted.input_tokens


async def test_more_edits_than_the_bound_are_a_400(make_frontend):
    edits = [{"type": "clear_thinking_20251015", "keep": "all"}] * (MAX_EDITS + 1)
    body = {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}],
        "context_management": {"edits": edits},
    }
    async with make_frontend(workers=1, script=reply("ok")) as fe:
        r = await fe.client.post("/v1/messages", json=body)
    assert r.status_code == 400 and "context_management.edits" in r.text and not fe.fleet.requests
