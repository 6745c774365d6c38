"""A Messages request as the chat completion request the generation core prepares.

``adapt(request)`` returns the ``ChatCompletionRequest`` and the ``FieldNames`` that turn the
names of a 400 the chat path raises back into the Messages API's (``stop`` is ``stop_sequences``,
``tools[1].function.parameters`` the ``input_schema`` of the tool where the client put it).

Messages:

- ``system`` (a string or text blocks) and the system messages that lead ``messages`` become the
  first system message; Claude Code's ``x-anthropic-billing-header`` line is dropped
  (``dyn.core.frontend.chat_template.without_billing_header``), as vLLM drops it: it changes
  every request, and at the head of the prompt it would defeat prefix caching. A later system message stays a system message where it is, except
  that one between an assistant's ``tool_use`` and the user turn holding its results moves after
  that turn (a template needs the tool results right after the calls).
- A user turn's ``tool_result`` blocks become ``tool`` messages, in order, before its text; the
  result's text is kept as it is when ``is_error`` is set, as vLLM keeps it (Claude Code writes
  its errors in the text). ``tool_reference`` blocks add nothing: every tool is rendered,
  ``defer_loading`` or not.
- An assistant turn's text becomes ``content``, its ``tool_use`` blocks ``tool_calls`` (the
  ``input`` as JSON arguments) and its ``thinking`` blocks ``reasoning_content``; a
  ``redacted_thinking`` block carries no text and adds nothing. A conversation that ends with an
  assistant turn of text is continued from that text (Anthropic's prefill).
- ``image`` blocks of a user turn or a tool result become chat's ``image_url`` parts (a
  ``base64`` source as a data URL of its ``media_type``, a ``url`` source as its URL) beside the
  text parts, in order, for the chat path to load and check (a model that takes no images
  refuses them there); a ``file`` source and an image in an assistant turn are a 400 naming the
  block. ``document`` blocks there become text parts (``documents``: text, content, and PDFs
  read before adapting).

Options: ``tools`` with ``input_schema`` become function tools; a server or hosted tool (any other
``type``) is ignored, with one warning per type per process. ``tool_choice`` auto / any / tool /
none is chat's auto / required / named / none, ``disable_parallel_tool_use`` is
``parallel_tool_calls: false``. ``thinking`` enabled or adaptive sets the template's
``enable_thinking`` and ``thinking`` (the names Qwen3 and DeepSeek templates read), enabled also
``nvext.max_thinking_tokens``; disabled sets both false. ``cache_control`` anywhere (blocks,
tools, the request) becomes ``nvext.cache_control`` with the longest ttl asked.
``output_config.format`` is ``response_format`` json_schema, ``output_config.effort`` the template's
``reasoning_effort``; ``metadata.user_id`` is ``user``.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import msgspec

from dyn.core.frontend.apis.anthropic.documents import document_text
from dyn.core.frontend.apis.anthropic.protocol import (
    CacheControlParam,
    ContentBlock,
    CountTokensRequest,
    DocumentBlock,
    ImageBlock,
    MessageParam,
    MessagesRequest,
    RedactedThinkingBlock,
    SystemParam,
    TextBlock,
    ThinkingBlock,
    ToolReferenceBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from dyn.core.frontend.chat_template import without_billing_header
from dyn.core.protocol.errors import ApiError, bad_request
from dyn.core.protocol.openai import CacheControl, ChatCompletionRequest, NvExt

log = logging.getLogger(__name__)

"""The line Claude Code puts first in its system prompt (its version and a per-session hash)."""

_warned_hosted: set[str] = set()
MAX_WARNED_TYPES = 64
"""The server-tool types remembered as warned about: past them each is warned at debug level, so a
client sending new type names cannot grow the set."""


def adapt(req: CountTokensRequest) -> tuple[ChatCompletionRequest, FieldNames]:
    """The chat request of a Messages (or count_tokens) request; 400 naming the field for a
    request the chat path could not express."""
    conv = _Conversion()
    messages = conv.messages(req.system, req.messages)
    tools, origins = _tools(req, conv)
    conv.cache(req.cache_control)
    prefill = _prefill(req, messages)
    choice = req.tool_choice
    sampling: dict[str, Any] = {}
    if isinstance(req, MessagesRequest):
        sampling = {
            "max_tokens": req.max_tokens,
            "stop": req.stop_sequences,
            "stream": req.stream,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
            "user": req.metadata.user_id if req.metadata is not None else None,
        }
    chat = ChatCompletionRequest(
        messages=messages,
        model=req.model,
        tools=tools or None,
        tool_choice=_tool_choice(req, bool(tools)),
        parallel_tool_calls=False if choice is not None and choice.disable_parallel_tool_use else None,
        chat_template_kwargs=_template_kwargs(req),
        add_generation_prompt=not prefill,
        continue_final_message=prefill,
        response_format=_response_format(req),
        nvext=_nvext(req, conv.ttl),
        **sampling,
    )
    return chat, FieldNames(origins)


class FieldNames:
    """The Messages API's names for the fields of the chat request ``adapt`` built."""

    _FIXED = {  # the longer of two names that share a start comes first
        "stop": "stop_sequences",
        "max_completion_tokens": "max_tokens",
        "user": "metadata.user_id",
        "tool_choice.function.name": "tool_choice.name",
        "response_format.json_schema.schema": "output_config.format.schema",
        "response_format": "output_config.format",
    }

    def __init__(self, tools: list[int]) -> None:
        self.tools = tools
        """For each function tool of the chat request, its index in the request's ``tools``."""

    def name(self, param: str) -> str:
        for chat_name, name in self._FIXED.items():
            if param == chat_name or param.startswith((chat_name + "[", chat_name + ".")):
                return name + param[len(chat_name) :]
        match = re.fullmatch(r"tools\[(\d+)\](?:\.function)?(\.parameters|\.name|\.description)?(.*)", param)
        if match and int(match.group(1)) < len(self.tools):
            field = {".parameters": ".input_schema"}.get(match.group(2) or "", match.group(2) or "")
            return f"tools[{self.tools[int(match.group(1))]}]{field}{match.group(3)}"
        return param

    def renamed(self, exc: ApiError) -> ApiError:
        """``exc`` with its ``param``, and that name in its message, in the Messages API's terms."""
        if exc.param is None:
            return exc
        name = self.name(exc.param)
        if name != exc.param:
            exc.message = re.sub(rf"(?<![\w.\[-]){re.escape(exc.param)}(?![\w\[-])", name, exc.message)
            exc.param = name
        return exc


# --------------------------------------------------------------------------- messages


class _Conversion:
    """The messages of one request, and the longest ``cache_control`` ttl met on the way."""

    def __init__(self) -> None:
        self.ttl: str | None = None

    def cache(self, control: CacheControlParam | None) -> None:
        if control is not None and (self.ttl is None or control.ttl == "1h"):
            self.ttl = control.ttl or "5m"

    def messages(self, system: SystemParam | None, turns: list[MessageParam]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        lead = 0
        while lead < len(turns) and turns[lead].role == "system":
            lead += 1
        head = [self.system_text(system, "system")]
        head += [self.system_text(turns[i].content, f"messages[{i}].content") for i in range(lead)]
        text = "\n".join(t for t in head if t)
        if text:
            out.append({"role": "system", "content": text})
        held: list[dict[str, Any]] = []
        awaiting_results = False
        for i in range(lead, len(turns)):
            turn = turns[i]
            where = f"messages[{i}].content"
            if turn.role == "system":
                message = {"role": "system", "content": self.system_text(turn.content, where)}
                (held if awaiting_results else out).append(message)
                continue
            if turn.role == "assistant":
                out.extend(held)
                held.clear()
                message = self.assistant(turn.content, where)
                out.append(message)
                awaiting_results = "tool_calls" in message
            else:
                out.extend(self.user(turn.content, where))
                out.extend(held)
                held.clear()
                awaiting_results = False
        out.extend(held)
        return out

    def system_text(self, content: str | list[Any] | None, where: str) -> str:
        """A system prompt's text, its text blocks joined by newlines, the billing line dropped."""
        if content is None:
            return ""
        if isinstance(content, str):
            return without_billing_header(content)
        texts = []
        for j, block in enumerate(content):
            if not isinstance(block, TextBlock):
                raise _only(f"{where}[{j}]", block, "text blocks", "a system prompt")
            self.cache(block.cache_control)
            if text := without_billing_header(block.text):
                texts.append(text)
        return "\n".join(texts)

    def user(self, content: str | list[ContentBlock], where: str) -> list[dict[str, Any]]:
        """A user turn: its tool results as ``tool`` messages, then its text (if it has any, or
        nothing else)."""
        if isinstance(content, str):
            return [{"role": "user", "content": content}]
        out: list[dict[str, Any]] = []
        parts: list[dict[str, Any]] = []
        for j, block in enumerate(content):
            at = f"{where}[{j}]"
            self.cache(block.cache_control)
            if isinstance(block, TextBlock):
                parts.append({"type": "text", "text": block.text})
            elif isinstance(block, ImageBlock):
                parts.append(_image_part(block, at))
            elif isinstance(block, ToolResultBlock):
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": block.tool_use_id,
                        "content": self.result_content(block.content, f"{at}.content"),
                    }
                )
            elif isinstance(block, DocumentBlock):
                parts.append({"type": "text", "text": document_text(block, at)})
            elif not isinstance(block, ToolReferenceBlock):
                raise _only(at, block, "text, image, document and tool_result blocks", "a user turn")
        if parts or not out:
            out.append({"role": "user", "content": _joined(parts)})
        return out

    def result_content(self, content: str | list[Any] | None, where: str) -> str | list[dict[str, Any]]:
        """A tool result's content: its text, or its text and image parts."""
        if content is None or isinstance(content, str):
            return content or ""
        parts: list[dict[str, Any]] = []
        for k, part in enumerate(content):
            self.cache(part.cache_control)
            if isinstance(part, TextBlock):
                parts.append({"type": "text", "text": part.text})
            elif isinstance(part, ImageBlock):
                parts.append(_image_part(part, f"{where}[{k}]"))
            elif isinstance(part, DocumentBlock):
                parts.append({"type": "text", "text": document_text(part, f"{where}[{k}]")})
            elif not isinstance(part, ToolReferenceBlock):
                raise _only(f"{where}[{k}]", part, "text, image and document blocks", "a tool result")
        return _joined(parts)

    def assistant(self, content: str | list[ContentBlock], where: str) -> dict[str, Any]:
        if isinstance(content, str):
            return {"role": "assistant", "content": content}
        texts: list[str] = []
        reasoning: list[str] = []
        calls: list[dict[str, Any]] = []
        for j, block in enumerate(content):
            self.cache(block.cache_control)
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ThinkingBlock):
                reasoning.append(block.thinking)
            elif isinstance(block, ToolUseBlock):
                arguments = msgspec.json.encode(block.input).decode()
                calls.append(
                    {
                        "id": block.id,
                        "type": "function",
                        "function": {"name": block.name, "arguments": arguments},
                    }
                )
            elif isinstance(block, (ImageBlock, DocumentBlock)):
                raise _unsupported(f"{where}[{j}]", block)
            elif not isinstance(block, (RedactedThinkingBlock, ToolReferenceBlock)):
                raise _only(f"{where}[{j}]", block, "text, thinking and tool_use blocks", "an assistant turn")
        message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
        if reasoning:
            message["reasoning_content"] = "".join(reasoning)
        if calls:
            message["tool_calls"] = calls
        return message


def fold_late_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` for a chat template that refuses a system message after the conversation's
    first turns (``Preprocessor.accepts_late_system``): each such message becomes user text,
    joined to the user message before or after it, so that roles still alternate."""
    out: list[dict[str, Any]] = []
    started = False
    for message in messages:
        folded = message["role"] == "system" and started
        started = started or message["role"] != "system"
        if folded:
            message = {"role": "user", "content": message["content"]}
        last = out[-1] if out else None
        if last is not None and message["role"] == "user" == last["role"] and (folded or last.get("_folded")):
            out[-1] = {
                "role": "user",
                "content": _concat(last["content"], message["content"]),
                "_folded": True,
            }
        else:
            out.append({**message, "_folded": True} if folded else message)
    return [{k: v for k, v in m.items() if k != "_folded"} for m in out]


def _concat(first: Any, second: Any) -> Any:
    if isinstance(first, str) and isinstance(second, str):
        return f"{first}\n\n{second}"
    as_parts = [[{"type": "text", "text": c}] if isinstance(c, str) else list(c) for c in (first, second)]
    return [*as_parts[0], {"type": "text", "text": "\n\n"}, *as_parts[1]]


def _joined(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Text parts alone as one string (as before images were taken); with an image, the parts."""
    if all(part["type"] == "text" for part in parts):
        return "\n".join(part["text"] for part in parts)
    return parts


def _image_part(block: ImageBlock, where: str) -> dict[str, Any]:
    """An image block as chat's ``image_url`` part: a base64 source as a data URL, a url source
    as its URL; anything else is a 400 naming the block's source."""
    source = block.source if isinstance(block.source, dict) else {}
    kind = source.get("type")
    if kind == "base64" and isinstance(source.get("data"), str) and isinstance(source.get("media_type"), str):
        url = f"data:{source['media_type']};base64,{source['data']}"
    elif kind == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise bad_request(
            f"{where}.source: an image takes a base64 source (media_type and data), a url source or a "
            "file source (the file_id of an upload)",
            param=f"{where}.source",
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _kind(block: Any) -> str:
    return str(type(block).__struct_config__.tag)


def _unsupported(where: str, block: Any) -> ApiError:
    return bad_request(
        f"{where}: {_kind(block)} blocks are not supported yet by this server; send the content as text",
        param=where,
        code="unsupported_content",
    )


def _only(where: str, block: Any, allowed: str, place: str) -> ApiError:
    return bad_request(
        f"{where}: a {_kind(block)} block cannot be in {place}; it takes {allowed}", param=where
    )


# --------------------------------------------------------------------------- options


def _tools(req: CountTokensRequest, conv: _Conversion) -> tuple[list[dict[str, Any]], list[int]]:
    """The function tools and, for each, its index in the request's ``tools``."""
    tools: list[dict[str, Any]] = []
    where: list[int] = []
    for i, tool in enumerate(req.tools or ()):
        conv.cache(tool.cache_control)
        if tool.type not in (None, "custom"):
            if tool.type not in _warned_hosted:
                if len(_warned_hosted) < MAX_WARNED_TYPES:
                    _warned_hosted.add(tool.type)
                log.log(
                    logging.WARNING if tool.type in _warned_hosted else logging.DEBUG,
                    "Messages API: server tool %r (type %s) is ignored: this server runs no hosted "
                    "tools; the model sees only the client tools (warned once per type)",
                    tool.name[:100],
                    tool.type[:100],
                )
            continue
        if tool.input_schema is None:
            raise bad_request(
                f"tools[{i}].input_schema is required: a client tool takes a JSON Schema object",
                param=f"tools[{i}].input_schema",
            )
        function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description is not None:
            function["description"] = tool.description
        tools.append({"type": "function", "function": function})
        where.append(i)
    return tools, where


def _tool_choice(req: CountTokensRequest, has_tools: bool) -> str | dict[str, Any] | None:
    choice = req.tool_choice
    if choice is None:
        return None
    if choice.type == "auto":
        return "auto" if has_tools else None
    if choice.type == "none":
        return "none"
    if choice.type == "any":
        return "required"
    if not choice.name:
        raise bad_request(
            'tool_choice.name is required when tool_choice.type is "tool"', param="tool_choice.name"
        )
    return {"type": "function", "function": {"name": choice.name}}


MAX_EFFORT_CHARS = 64


def _template_kwargs(req: CountTokensRequest) -> dict[str, Any] | None:
    """``thinking`` and ``output_config.effort`` as the template variables reasoning templates
    read; the request's own ``chat_template_kwargs`` win."""
    kwargs: dict[str, Any] = {}
    thinking = req.thinking
    if thinking is not None:
        if thinking.type == "enabled" and thinking.budget_tokens is None:
            raise bad_request(
                'thinking.budget_tokens is required when thinking.type is "enabled"',
                param="thinking.budget_tokens",
            )
        on = thinking.type != "disabled"
        kwargs = {"enable_thinking": on, "thinking": on}
    effort = req.output_config.effort if req.output_config is not None else None
    if effort is not None:
        if not 0 < len(effort) <= MAX_EFFORT_CHARS:
            raise bad_request(
                f"output_config.effort must be 1 to {MAX_EFFORT_CHARS} characters (low, medium, high)",
                param="output_config.effort",
            )
        kwargs["reasoning_effort"] = effort  # what the Responses API's reasoning.effort sets, as vLLM
    if req.chat_template_kwargs:
        kwargs.update(req.chat_template_kwargs)
    return kwargs or None


def _prefill(req: CountTokensRequest, messages: list[dict[str, Any]]) -> bool:
    """The request ends with an assistant turn of text, which the answer continues."""
    final = messages[-1] if messages else None
    return (
        req.messages[-1].role == "assistant"
        and final is not None
        and final["role"] == "assistant"
        and bool(final["content"])
        and "tool_calls" not in final
    )


def _response_format(req: CountTokensRequest) -> dict[str, Any] | None:
    output = req.output_config
    if output is None or output.format is None:
        return None
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": output.format.schema or {}}}


def _nvext(req: CountTokensRequest, ttl: str | None) -> NvExt | None:
    """The request's ``nvext`` with the thinking budget and the cache pin (its own win)."""
    nvext = req.nvext if isinstance(req, MessagesRequest) else None
    thinking = req.thinking
    budget = thinking.budget_tokens if thinking is not None and thinking.type == "enabled" else None
    if budget is None and ttl is None:
        return nvext
    nvext = nvext or NvExt()
    if budget is not None and nvext.max_thinking_tokens is None:
        nvext = msgspec.structs.replace(nvext, max_thinking_tokens=budget)
    if ttl is not None and nvext.cache_control is None:
        nvext = msgspec.structs.replace(nvext, cache_control=CacheControl("ephemeral", ttl))
    return nvext
