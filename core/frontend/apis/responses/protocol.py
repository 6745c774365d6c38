"""The Responses API's request and response types, in OpenAI's shapes (``openai.types.responses``).

``ResponsesRequest`` decodes the body; unknown top-level fields are ignored and logged, as for
chat completions. Input items and tools stay plain dicts: their ``type`` may be omitted (an easy
message), new kinds appear often (Codex sends whatever OpenAI serves), and the adapter reads each
kind it knows and drops the others with a warning, where a decoder would refuse the request.

The response object and its output items are Structs; ``ResponseObject`` carries the request's
settings back as OpenAI echoes them.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dyn.core.protocol.openai import I32, I64, NvExt


class TextConfig(msgspec.Struct, forbid_unknown_fields=False, omit_defaults=True):
    """``text``: the output's ``format`` (``text``, ``json_schema``, ``json_object``) and
    ``verbosity`` (echoed, not acted on)."""

    format: dict[str, Any] | None = None
    verbosity: str | None = None


class ReasoningConfig(msgspec.Struct, forbid_unknown_fields=False):
    """``reasoning``: ``effort`` goes to the chat template as ``reasoning_effort``; ``summary`` is
    accepted and echoed (no summaries are written: the reasoning itself is returned)."""

    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """``POST /v1/responses``."""

    model: str | None = None
    input: str | list[Any] | None = None
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    """None: true."""
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: I64 | None = None
    max_tool_calls: I64 | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: I32 | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    store: bool | None = None
    """None: true."""
    stream: bool | None = None
    previous_response_id: str | None = None
    include: list[str] | None = None
    truncation: str | None = None
    service_tier: str | None = None
    background: bool | None = None
    conversation: Any = None
    request_id: str | None = None
    """vLLM's extra: the request's id when no ``x-request-id`` header names one."""
    nvext: NvExt | None = None
    """dyn's and Dynamo's extension, passed to the chat request as it is."""


# --------------------------------------------------------------------------- output items


class OutputText(msgspec.Struct, tag="output_text", tag_field="type"):
    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)
    logprobs: msgspec.Raw | list[Any] = msgspec.field(default_factory=list)
    """The tokens' logprobs, a JSON array (``include: ["message.output_text.logprobs"]``)."""


class MessageItem(msgspec.Struct, kw_only=True, tag="message", tag_field="type"):
    id: str
    status: str
    role: str = "assistant"
    content: list[OutputText]


class ReasoningText(msgspec.Struct, tag="reasoning_text", tag_field="type"):
    text: str


class ReasoningItem(msgspec.Struct, kw_only=True, tag="reasoning", tag_field="type"):
    id: str
    summary: list[Any] = msgspec.field(default_factory=list)
    content: list[ReasoningText]
    encrypted_content: str | None = None
    status: str


class FunctionCallItem(
    msgspec.Struct, kw_only=True, tag="function_call", tag_field="type", omit_defaults=True
):
    id: str
    call_id: str
    name: str
    arguments: str
    status: str
    namespace: str | None = None
    """The ``namespace`` tool group the function came from (none for a top-level function)."""


OutputItem = ReasoningItem | MessageItem | FunctionCallItem


# --------------------------------------------------------------------------- the response


class InputTokensDetails(msgspec.Struct):
    cached_tokens: int
    """Prompt tokens served from the KV cache."""
    cache_write_tokens: int = 0
    """Not known to the frontend (OpenAI's billing of explicit cache writes): always 0."""


class OutputTokensDetails(msgspec.Struct):
    reasoning_tokens: int = 0
    """Not counted apart from the output tokens: always 0."""


class ResponseUsage(msgspec.Struct):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseError(msgspec.Struct):
    code: str
    message: str


class IncompleteDetails(msgspec.Struct):
    reason: str


class ReasoningEcho(msgspec.Struct):
    effort: str | None = None
    summary: str | None = None


class ResponseObject(msgspec.Struct, kw_only=True):
    """A response as ``POST`` (unary), the stream's lifecycle events and ``GET`` return it."""

    id: str
    object: str = "response"
    created_at: int
    status: str
    """``in_progress``, ``completed``, ``incomplete`` (``max_output_tokens``) or ``failed``; a
    background response is ``queued`` when created, and may end ``cancelled``."""
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    background: bool = False
    instructions: str | None
    max_output_tokens: int | None
    max_tool_calls: int | None
    metadata: dict[str, str]
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    prompt_cache_key: str | None
    reasoning: ReasoningEcho
    safety_identifier: str | None
    service_tier: str
    store: bool
    temperature: float | None
    text: TextConfig
    tool_choice: str | dict[str, Any]
    tools: list[Any]
    top_logprobs: int
    top_p: float | None
    truncation: str
    usage: ResponseUsage | None = None
    user: str | None


class DeletedResponse(msgspec.Struct):
    id: str
    object: str = "response.deleted"
    deleted: bool = True
