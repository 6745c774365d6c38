"""Anthropic's context editing (``context_management.edits``): the conversation a Messages request
sends, edited before it reaches the model, as Anthropic's API edits it server side. The client
keeps its whole history; each request is edited anew from it.

- ``clear_thinking_20251015``: the ``thinking`` and ``redacted_thinking`` blocks of every
  assistant turn but the last ``keep`` turns that have some are removed (``keep``:
  ``{"type": "thinking_turns", "value": N}``, default 1; ``"all"`` or ``{"type": "all"}`` keeps
  every one, what Claude Code asks for, and edits nothing).
- ``clear_tool_uses_20250919``: once ``trigger`` is passed (``{"type": "input_tokens"}``, the
  prompt's tokens, default 100,000; or ``{"type": "tool_uses"}``, the conversation's tool calls),
  every tool call but the last ``keep`` (``{"type": "tool_uses", "value": N}``, default 3) and
  those of ``exclude_tools`` has its result replaced by ``CLEARED_RESULT``, and its input by
  ``{}`` where ``clear_tool_inputs`` says (true: every tool; a list: those tools). With
  ``clear_at_least`` (``{"type": "input_tokens", "value": N}``) nothing is cleared unless that
  frees at least N tokens.

Edits apply in the order given; an edit that clears nothing is not reported. What was cleared is
answered in ``context_management.applied_edits`` (the message, and the stream's
``message_delta``), with the tokens each edit freed, counted as ``count_tokens`` counts them
(each count renders and tokenizes the conversation: only an edit that changes something, or a
token trigger, costs one). ``count_tokens`` answers the edited count and the
``original_input_tokens``. Bounded: at most ``MAX_EDITS`` edits (``protocol``). An edit type this server does
not run (``compact_20260112``, Anthropic's server-side summary; any newer one) is ignored with a
warning, so a client that adds one keeps working.

Unlike Anthropic's API, a request without a ``clear_thinking`` edit keeps every turn's thinking
blocks (Anthropic keeps the last turn's): the model's chat template decides which past reasoning
it renders, and an unchanged history keeps its KV prefix cached.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Literal

import msgspec

from dyn.core.frontend.apis.anthropic.protocol import (
    ContentBlock,
    ContextManagement,
    MessageParam,
    RedactedThinkingBlock,
    ThinkingBlock,
    ThinkingCleared,
    ToolResultBlock,
    ToolUseBlock,
    ToolUsesCleared,
)
from dyn.core.protocol.errors import bad_request

log = logging.getLogger(__name__)

CLEARED_RESULT = "[This tool result was cleared from the context to save space.]"
DEFAULT_TRIGGER_TOKENS = 100_000
DEFAULT_KEEP_TOOL_USES = 3
DEFAULT_KEEP_THINKING_TURNS = 1

Count = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]


class ThinkingTurns(msgspec.Struct, frozen=True, tag_field="type", tag="thinking_turns"):
    value: Count


class AllTurns(msgspec.Struct, frozen=True, tag_field="type", tag="all"):
    pass


class InputTokens(msgspec.Struct, frozen=True, tag_field="type", tag="input_tokens"):
    value: Count


class ToolUses(msgspec.Struct, frozen=True, tag_field="type", tag="tool_uses"):
    value: Count


class ClearThinking(msgspec.Struct, kw_only=True, tag_field="type", tag="clear_thinking_20251015"):
    keep: ThinkingTurns | AllTurns | Literal["all"] = ThinkingTurns(DEFAULT_KEEP_THINKING_TURNS)


class ClearToolUses(msgspec.Struct, kw_only=True, tag_field="type", tag="clear_tool_uses_20250919"):
    trigger: InputTokens | ToolUses = InputTokens(DEFAULT_TRIGGER_TOKENS)
    keep: ToolUses = ToolUses(DEFAULT_KEEP_TOOL_USES)
    clear_at_least: InputTokens | None = None
    exclude_tools: Annotated[list[str], msgspec.Meta(max_length=4096)] | None = None
    clear_tool_inputs: bool | Annotated[list[str], msgspec.Meta(max_length=4096)] | None = None


Edit = ClearThinking | ClearToolUses


_KNOWN = {"clear_thinking_20251015": ClearThinking, "clear_tool_uses_20250919": ClearToolUses}


def edits_of(config: ContextManagement | None) -> list[Edit]:
    """The edits this server runs, checked (a 400 naming the field); others are logged and left."""
    edits: list[Edit] = []
    for i, raw in enumerate(config.edits if config is not None else ()):
        kind = raw.get("type")
        cls = _KNOWN.get(kind) if isinstance(kind, str) else None
        if cls is None:
            log.warning(
                "context_management.edits[%d]: %.64r is not an edit this server runs; ignored", i, kind
            )
            continue
        try:
            edits.append(msgspec.convert(raw, cls))
        except msgspec.ValidationError as exc:
            raise bad_request(
                f"context_management.edits[{i}]: {exc}", param=f"context_management.edits[{i}]"
            ) from None
    return edits


Counter = Callable[[list[MessageParam]], Awaitable[int]]
"""The prompt tokens of a conversation (the request with these messages), as count_tokens counts."""


async def edited(
    messages: list[MessageParam], edits: list[Edit], count: Counter
) -> tuple[list[MessageParam], list[ThinkingCleared | ToolUsesCleared], int | None]:
    """``messages`` after ``edits``, what each edit that changed something cleared, and the
    prompt's tokens before any edit (None when no edit changed anything)."""
    applied: list[ThinkingCleared | ToolUsesCleared] = []
    original: int | None = None
    tokens: int | None = None
    for edit in edits:
        if isinstance(edit, ClearThinking):
            keep = edit.keep
            if not isinstance(keep, ThinkingTurns):
                continue
            candidate, cleared = _without_old_thinking(messages, keep.value)
        else:
            if isinstance(edit.trigger, ToolUses):
                fired = len(_tool_uses(messages)) > edit.trigger.value
            else:
                tokens = tokens if tokens is not None else await count(messages)
                fired = tokens > edit.trigger.value
            if not fired:
                continue
            candidate, cleared = _without_old_tool_uses(messages, edit)
        if not cleared:
            continue
        before = tokens if tokens is not None else await count(messages)
        after = await count(candidate)
        tokens = before
        if isinstance(edit, ClearToolUses) and edit.clear_at_least is not None:
            if before - after < edit.clear_at_least.value:
                continue
        original = before if original is None else original
        messages, tokens = candidate, after
        if isinstance(edit, ClearThinking):
            applied.append(ThinkingCleared(cleared, before - after))
        else:
            applied.append(ToolUsesCleared(cleared, before - after))
    return messages, applied, original


def _without_old_thinking(messages: list[MessageParam], keep: int) -> tuple[list[MessageParam], int]:
    """``messages`` with the thinking of all but the last ``keep`` assistant turns that think
    removed; and how many turns lost theirs."""
    thinking = (ThinkingBlock, RedactedThinkingBlock)
    turns = [
        i
        for i, m in enumerate(messages)
        if m.role == "assistant"
        and isinstance(m.content, list)
        and any(isinstance(b, thinking) for b in m.content)
    ]
    cleared = turns[: max(len(turns) - keep, 0)]
    if not cleared:
        return messages, 0
    out = list(messages)
    for i in cleared:
        blocks = out[i].content
        assert isinstance(blocks, list)
        out[i] = msgspec.structs.replace(out[i], content=[b for b in blocks if not isinstance(b, thinking)])
    return out, len(cleared)


def _tool_uses(messages: list[MessageParam]) -> list[ToolUseBlock]:
    return [
        b
        for m in messages
        if m.role == "assistant" and isinstance(m.content, list)
        for b in m.content
        if isinstance(b, ToolUseBlock)
    ]


def _without_old_tool_uses(
    messages: list[MessageParam], edit: ClearToolUses
) -> tuple[list[MessageParam], int]:
    """``messages`` with the results (and, as ``clear_tool_inputs`` says, the inputs) of every tool
    call but the last ``keep`` and the excluded tools' cleared; and how many calls were."""
    uses = _tool_uses(messages)
    excluded = set(edit.exclude_tools or ())
    older = uses[: max(len(uses) - edit.keep.value, 0)]
    ids = {u.id: u.name for u in older if u.name not in excluded}
    if not ids:
        return messages, 0
    inputs = edit.clear_tool_inputs
    clear_input = (lambda name: True) if inputs is True else (lambda name: name in inputs) if inputs else None
    out = []
    for m in messages:
        if isinstance(m.content, list) and any(_targeted(b, ids) for b in m.content):
            m = msgspec.structs.replace(m, content=[_cleared(b, ids, clear_input) for b in m.content])
        out.append(m)
    return out, len(ids)


def _targeted(block: ContentBlock, ids: dict[str, str]) -> bool:
    return (
        isinstance(block, ToolResultBlock)
        and block.tool_use_id in ids
        or (isinstance(block, ToolUseBlock) and block.id in ids)
    )


def _cleared(
    block: ContentBlock, ids: dict[str, str], clear_input: Callable[[str], bool] | None
) -> ContentBlock:
    if isinstance(block, ToolResultBlock) and block.tool_use_id in ids:
        return msgspec.structs.replace(block, content=CLEARED_RESULT)
    if (
        isinstance(block, ToolUseBlock)
        and block.id in ids
        and clear_input is not None
        and clear_input(block.name)
    ):
        return msgspec.structs.replace(block, input={})
    return block
