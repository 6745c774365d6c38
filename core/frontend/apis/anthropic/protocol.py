"""The Messages API's request and response types, as Anthropic defines them and Claude Code sends them.

Requests decode straight from the body (``dyn.core.protocol.openai.decode_request``): a wrong
type, a content block of an unknown ``type``, a missing field or a list over its bound is a 400
naming the field. Unknown fields are accepted and ignored (Claude Code sends ``betas``,
``container``, ``mcp_servers`` and more; the endpoint logs them), so nothing a new
client version adds stops it. Every list is bounded here; text sizes are bounded by the
frontend's prompt byte limit when the request is prepared, and the body by its size limit.

Responses and stream events are encoded from the Structs at the end of the module; ``null``
fields Anthropic always sends (``stop_reason``, ``stop_sequence``) are kept.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from dyn.core.protocol.openai import NvExt

MAX_MESSAGES = 4096
MAX_BLOCKS = 4096
"""The most content blocks in one message, in ``system``, or in one ``tool_result``."""
MAX_TOOLS = 4096
MAX_EDITS = 4
"""The most ``context_management`` edits in one request (each may render the conversation)."""
"""Bounds the list as decoded; ``dyn.core.protocol.tools.MAX_TOOLS`` bounds the function tools kept."""

U32 = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]


# --------------------------------------------------------------------------- request


class CacheControlParam(msgspec.Struct, kw_only=True):
    """``cache_control`` on a block or a tool: keep the prompt up to here cached for ``ttl``."""

    type: Literal["ephemeral"] = "ephemeral"
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(msgspec.Struct, tag_field="type", tag="text", kw_only=True):
    text: str
    cache_control: CacheControlParam | None = None


class ImageBlock(msgspec.Struct, tag_field="type", tag="image", kw_only=True):
    """An image: ``source`` is ``{"type": "base64", "media_type", "data"}`` or ``{"type": "url", "url"}``."""

    source: Any = None
    cache_control: CacheControlParam | None = None


class DocumentBlock(msgspec.Struct, tag_field="type", tag="document", kw_only=True):
    """A document: its ``source`` (text, content blocks or a base64 PDF) read as text
    (``dyn.core.frontend.apis.anthropic.documents``); ``citations`` is accepted and ignored."""

    source: Any = None
    title: str | None = None
    context: str | None = None
    citations: Any = None
    cache_control: CacheControlParam | None = None


class ToolReferenceBlock(msgspec.Struct, tag_field="type", tag="tool_reference", kw_only=True):
    """A deferred tool (``defer_loading``) was loaded, in a ``tool_result`` or a turn. Every tool
    is rendered already, so it adds nothing to the prompt."""

    tool_name: str | None = None
    cache_control: CacheControlParam | None = None


ToolResultPart = TextBlock | ImageBlock | DocumentBlock | ToolReferenceBlock


class ToolUseBlock(msgspec.Struct, tag_field="type", tag="tool_use", kw_only=True):
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControlParam | None = None


class ToolResultBlock(msgspec.Struct, tag_field="type", tag="tool_result", kw_only=True):
    tool_use_id: str
    content: str | Annotated[list[ToolResultPart], msgspec.Meta(max_length=MAX_BLOCKS)] | None = None
    is_error: bool = False
    cache_control: CacheControlParam | None = None


class ThinkingBlock(msgspec.Struct, tag_field="type", tag="thinking", kw_only=True):
    thinking: str
    signature: str | None = None
    cache_control: CacheControlParam | None = None


class RedactedThinkingBlock(msgspec.Struct, tag_field="type", tag="redacted_thinking", kw_only=True):
    data: str = ""
    cache_control: CacheControlParam | None = None


ContentBlock = (
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | ToolReferenceBlock
)


class MessageParam(msgspec.Struct, kw_only=True):
    """One turn. ``system`` inside ``messages`` is a mid-conversation system message (Claude
    Code sends them); ``ctx`` and ``msg`` are read as ``user``, as vLLM reads the roles newer
    Claude Code versions send."""

    role: Literal["user", "assistant", "system", "ctx", "msg"]
    content: str | Annotated[list[ContentBlock], msgspec.Meta(max_length=MAX_BLOCKS)]


class ToolParam(msgspec.Struct, kw_only=True):
    """A tool: a client tool (``type`` absent or ``custom``) with its JSON Schema, or a
    server/hosted tool (``web_search_20250305``, ``bash_20250124``, ``text_editor_...``,
    ``computer_...``), which this server ignores."""

    name: str
    type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    cache_control: CacheControlParam | None = None


class ToolChoiceParam(msgspec.Struct, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingParam(msgspec.Struct, kw_only=True):
    """``enabled`` (with ``budget_tokens``), ``adaptive`` (the model decides) or ``disabled``."""

    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: U32 | None = None


class Metadata(msgspec.Struct, kw_only=True):
    user_id: str | None = None


class OutputFormat(msgspec.Struct, kw_only=True):
    type: Literal["json_schema"] = "json_schema"
    schema: dict[str, Any] | None = None


class OutputConfig(msgspec.Struct, kw_only=True):
    """``format``: structured output (a JSON Schema); ``effort``: the template's
    ``reasoning_effort``."""

    format: OutputFormat | None = None
    effort: str | None = None


SystemParam = str | Annotated[list[TextBlock], msgspec.Meta(max_length=MAX_BLOCKS)]


class ContextManagement(msgspec.Struct, kw_only=True):
    """``context_management``: Anthropic's context editing, each edit an object with its ``type``
    (read by ``dyn.core.frontend.apis.anthropic.context_editing.edits_of``)."""

    edits: Annotated[list[dict[str, Any]], msgspec.Meta(max_length=MAX_EDITS)] = []


class CountTokensRequest(msgspec.Struct, kw_only=True):
    """``POST /v1/messages/count_tokens``: what a Messages request's prompt is made of."""

    model: str
    messages: Annotated[list[MessageParam], msgspec.Meta(min_length=1, max_length=MAX_MESSAGES)]
    system: SystemParam | None = None
    tools: Annotated[list[ToolParam], msgspec.Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingParam | None = None
    output_config: OutputConfig | None = None
    cache_control: CacheControlParam | None = None
    context_management: ContextManagement | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    """vLLM's extension: extra variables for the chat template."""


class MessagesRequest(CountTokensRequest, kw_only=True):
    """``POST /v1/messages``. ``nvext``: dyn's extensions, as in a chat completion."""

    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)]
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    top_k: U32 | None = None
    metadata: Metadata | None = None
    service_tier: str | None = None
    nvext: NvExt | None = None


# --------------------------------------------------------------------------- response


class Usage(msgspec.Struct, kw_only=True):
    """Anthropic's accounting: ``input_tokens`` excludes the tokens read from the cache and
    written to it (prompt = input + cache_read + cache_creation)."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    service_tier: str = "standard"


class TextOut(msgspec.Struct, tag_field="type", tag="text"):
    text: str


class ThinkingOut(msgspec.Struct, tag_field="type", tag="thinking"):
    thinking: str
    signature: str


class ToolUseOut(msgspec.Struct, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


class ThinkingCleared(msgspec.Struct, tag_field="type", tag="clear_thinking_20251015"):
    cleared_thinking_turns: int
    cleared_input_tokens: int


class ToolUsesCleared(msgspec.Struct, tag_field="type", tag="clear_tool_uses_20250919"):
    cleared_tool_uses: int
    cleared_input_tokens: int


class ContextManagementResponse(msgspec.Struct):
    """What the request's context edits cleared (``context_editing``)."""

    applied_edits: list[ThinkingCleared | ToolUsesCleared]


class Message(msgspec.Struct, tag_field="type", tag="message", kw_only=True, omit_defaults=True):
    """The unary response, and the ``message`` of ``message_start`` (with no content yet);
    ``context_management`` only for a request that sent one."""

    id: str
    model: str
    content: list[TextOut | ThinkingOut | ToolUseOut]
    stop_reason: str | None
    stop_sequence: str | None
    usage: Usage
    role: Literal["assistant"]
    context_management: ContextManagementResponse | None = None


class CountTokensContextManagement(msgspec.Struct):
    original_input_tokens: int


class CountTokensResponse(msgspec.Struct, omit_defaults=True):
    input_tokens: int
    context_management: CountTokensContextManagement | None = None


class ErrorObject(msgspec.Struct):
    type: str
    message: str


class ErrorResponse(msgspec.Struct, tag_field="type", tag="error", omit_defaults=True):
    error: ErrorObject
    request_id: str | None = None
