"""A Responses request -> the chat request ``OpenAIService.prepare_chat`` prepares.

- ``instructions`` become the leading system message, joined by the system and developer messages
  that open the input (one system message: many chat templates accept no other).
- Input items: ``message`` (``type`` may be omitted; role user, system, developer (a system
  message) or assistant; content a string or text parts, ``input_image`` passed on as an
  ``image_url`` part for the chat path to take or refuse); ``reasoning`` (its ``content`` texts,
  else what its ``encrypted_content`` holds, else its ``summary`` texts) becomes the
  ``reasoning_content`` of the assistant message after it; an assistant message and the
  ``function_call`` items after it are one assistant message with ``tool_calls``;
  ``function_call_output`` a tool message; ``custom_tool_call`` and its output likewise
  (``item_reference`` items were resolved before, ``references``). Other items
  (``local_shell_call``, ``web_search_call``, ...) are dropped and named in one warning: nothing
  here can run them, and a 400 would stop the agent.
- ``tools``: function tools, and those of ``namespace`` groups (flattened; a call to one is
  answered with its ``namespace``). Hosted and freeform tools (``web_search``, ``file_search``,
  ``custom``, ``local_shell``, ``mcp``, ...) cannot run here and are dropped, named in one
  warning; so is a ``tool_choice`` naming one (then ``auto``).
- ``text.format`` -> ``response_format``; ``reasoning.effort`` -> ``chat_template_kwargs``
  ``{"reasoning_effort": ...}`` (as vLLM); ``max_output_tokens`` -> ``max_tokens``;
  ``include: ["message.output_text.logprobs"]`` with ``top_logprobs`` -> logprobs.

Every input is bounded: at most ``MAX_INPUT_ITEMS`` items, ``metadata`` as OpenAI bounds it; the
text itself by the frontend's prompt limits in ``prepare_chat``. A malformed item is a 400 naming
it (``input[3].call_id``); ``conversation`` is a 400 (not supported).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from dyn.core.frontend.apis.responses.protocol import ResponsesRequest
from dyn.core.protocol.errors import bad_request
from dyn.core.protocol.openai import ChatCompletionRequest

MAX_INPUT_ITEMS = 4096
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
MAX_SHORT_CHARS = 256
"""The longest ``prompt_cache_key``, ``reasoning.effort`` and such short strings."""

ENCRYPTED_PREFIX = "dyn.reasoning.v1:"
"""What starts the ``encrypted_content`` this server writes (``seal_reasoning``)."""
LOGPROBS_INCLUDE = "message.output_text.logprobs"
ENCRYPTED_INCLUDE = "reasoning.encrypted_content"

_MESSAGE_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text"})


@dataclass(slots=True)
class ChatTurn:
    """A Responses request as the core prepares it, and what its wire needs to answer it."""

    chat: ChatCompletionRequest
    items: list[Any]
    """The conversation before this response (history and this request's input, as items): what
    the stored response's ``conversation`` starts with."""
    history_json: bytes = b"[]"
    """The history's items as the store held them (a JSON array), so that storing this response
    encodes only what is new (``items[history_len:]``): an agent's conversation grows with every
    turn."""
    history_len: int = 0
    namespaces: dict[str, str] = field(default_factory=dict)
    """Function name -> the ``namespace`` tool group it came from."""
    dropped_items: list[str] = field(default_factory=list)
    """The types of the input items dropped (for the warning)."""
    dropped_tools: list[str] = field(default_factory=list)
    """The types of the tools dropped (for the warning)."""


def seal_reasoning(text: str) -> str:
    """``encrypted_content`` for a reasoning text. It is not encryption: a self-hosted server has
    no secret to keep from its own client, and nothing to hide the model's reasoning from the one
    who runs it. It is an opaque string (base64 with a recognisable prefix) that the client sends
    back with the item, so that a client keeping no state (Codex, ``store: false``) gives the model
    its earlier reasoning back."""
    return ENCRYPTED_PREFIX + base64.b64encode(text.encode()).decode("ascii")


def unseal_reasoning(sealed: str, where: str) -> str | None:
    """The text ``seal_reasoning`` sealed; None for another server's ``encrypted_content``."""
    if not sealed.startswith(ENCRYPTED_PREFIX):
        return None
    try:
        return base64.b64decode(sealed[len(ENCRYPTED_PREFIX) :], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise bad_request(
            f"{where} is not an encrypted_content this server wrote (it is damaged); send the "
            "reasoning item back as it was received",
            param=where,
        ) from None


def chat_request(
    req: ResponsesRequest, history: list[Any] | None = None, history_json: bytes = b"[]"
) -> ChatTurn:
    """The chat request of ``req``, continuing ``history`` (a stored response's conversation,
    decoded from ``history_json``)."""
    _check(req)
    own = (
        [{"type": "message", "role": "user", "content": req.input}]
        if isinstance(req.input, str)
        else req.input or []
    )
    if len(own) > MAX_INPUT_ITEMS:
        raise bad_request(f"input may hold at most {MAX_INPUT_ITEMS} items, got {len(own)}", param="input")
    items = [*(history or ()), *own]
    if not items:
        raise bad_request("input must hold at least one item (or name a previous_response_id)", param="input")
    offset = len(items) - len(own)
    turn = ChatTurn(ChatCompletionRequest(messages=[]), items, history_json=history_json, history_len=offset)
    messages = _messages(items, offset, turn.dropped_items)
    messages = _with_instructions(req.instructions, messages)
    tools, choice = _tools(req, turn)
    if not tools and choice in ("auto", "none"):
        choice = None  # every tool was dropped (or none sent): nothing to choose from
    include = req.include or ()
    logprobs = LOGPROBS_INCLUDE in include
    effort = req.reasoning.effort if req.reasoning is not None else None
    turn.chat = ChatCompletionRequest(
        messages=messages,
        model=req.model,
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        stream=bool(req.stream),
        user=req.user,
        tools=tools or None,
        tool_choice=choice,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        response_format=_response_format(req),
        logprobs=logprobs,
        top_logprobs=req.top_logprobs if logprobs else None,
        chat_template_kwargs={"reasoning_effort": effort} if effort else None,
        nvext=req.nvext,
    )
    return turn


def _check(req: ResponsesRequest) -> None:
    if req.conversation is not None:
        raise bad_request(
            "conversations are not supported by this server; continue a response with "
            "previous_response_id, or send the whole input",
            param="conversation",
            code="unsupported_parameter",
        )
    if req.truncation not in (None, "auto", "disabled"):
        raise bad_request(
            f"truncation must be 'auto' or 'disabled', got {str(req.truncation)[:64]!r}", param="truncation"
        )
    if req.max_output_tokens is not None and req.max_output_tokens < 1:
        raise bad_request(
            f"max_output_tokens must be at least 1, got {req.max_output_tokens}", param="max_output_tokens"
        )
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= 20:
        raise bad_request(
            f"top_logprobs must be between 0 and 20, got {req.top_logprobs}", param="top_logprobs"
        )
    metadata = req.metadata or {}
    if len(metadata) > MAX_METADATA_PAIRS:
        raise bad_request(f"metadata may hold at most {MAX_METADATA_PAIRS} pairs", param="metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise bad_request(
                f"metadata keys may be at most {MAX_METADATA_KEY_CHARS} characters",
                param=f"metadata.{key[:64]}",
            )
        if len(value) > MAX_METADATA_VALUE_CHARS:
            raise bad_request(
                f"metadata values may be at most {MAX_METADATA_VALUE_CHARS} characters",
                param=f"metadata.{key}",
            )
    for name in (
        "prompt_cache_key",
        "previous_response_id",
        "safety_identifier",
        "truncation",
        "service_tier",
    ):
        value = getattr(req, name)
        if value is not None and len(value) > MAX_SHORT_CHARS:
            raise bad_request(f"{name} may be at most {MAX_SHORT_CHARS} characters", param=name)
    if req.reasoning is not None:
        for name in ("effort", "summary"):
            value = getattr(req.reasoning, name)
            if value is not None and len(value) > MAX_SHORT_CHARS:
                raise bad_request(
                    f"reasoning.{name} may be at most {MAX_SHORT_CHARS} characters", param=f"reasoning.{name}"
                )


# --------------------------------------------------------------------------- input items


def _messages(items: list[Any], offset: int, dropped: list[str]) -> list[dict[str, Any]]:
    """Chat messages of ``items``; errors name ``input[i]`` counted from ``offset`` (the items
    before it came from the store, checked when they were sent)."""
    messages: list[dict[str, Any]] = []
    assistant: dict[str, Any] | None = None
    """The assistant message the next reasoning, text or call joins (None after any other)."""
    call_names: dict[str, str] = {}

    def open_assistant() -> dict[str, Any]:
        nonlocal assistant
        assistant = {"role": "assistant", "content": None}
        messages.append(assistant)
        return assistant

    for i, item in enumerate(items):
        where = f"input[{i - offset}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object (an input item)", param=where)
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"
        if kind == "message":
            role = item.get("role")
            if not isinstance(role, str) or role not in _MESSAGE_ROLES:
                raise bad_request(
                    f"{where}.role must be user, system, developer or assistant, got {role!r}",
                    param=f"{where}.role",
                )
            content = _content(item.get("content"), f"{where}.content", images=role == "user")
            if role == "assistant":
                target = assistant
                if target is None or target["content"] is not None or "tool_calls" in target:
                    target = open_assistant()
                target["content"] = _joined(content)
            else:
                assistant = None
                messages.append(
                    {"role": _MESSAGE_ROLES[role], "content": content if role == "user" else _joined(content)}
                )
        elif kind == "reasoning":
            text = _reasoning_text(item, where)
            if not text:
                continue  # another server's sealed reasoning, without a summary: nothing to give back
            target = assistant
            if target is None or target["content"] is not None or "tool_calls" in target:
                target = open_assistant()
            previous = target.get("reasoning_content")
            target["reasoning_content"] = f"{previous}\n{text}" if previous else text
        elif kind in ("function_call", "custom_tool_call"):
            call_id = _string(item, "call_id", where)
            name = _string(item, "name", where)
            if kind == "function_call":
                arguments = _string(item, "arguments", where)
            else:  # freeform input: the chat template takes JSON arguments
                arguments = json.dumps({"input": _string(item, "input", where)})
            target = assistant if assistant is not None else open_assistant()
            target.setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            )
            call_names[call_id] = name
        elif kind in ("function_call_output", "custom_tool_call_output"):
            assistant = None
            call_id = _string(item, "call_id", where)
            output = item.get("output")
            if isinstance(output, list):
                output = _joined(_content(output, f"{where}.output", images=False, dropped=dropped))
            elif not isinstance(output, str):
                raise bad_request(
                    f"{where}.output must be a string or a list of content parts", param=f"{where}.output"
                )
            message = {"role": "tool", "tool_call_id": call_id, "content": output}
            if call_id in call_names:
                message["name"] = call_names[call_id]
            messages.append(message)
        else:
            assistant = None
            dropped.append(str(kind)[:64])
    return messages


def _with_instructions(instructions: str | None, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with ``instructions`` and the system messages that open them as one."""
    texts = [instructions] if instructions else []
    head = 0
    while head < len(messages) and messages[head]["role"] == "system":
        texts.append(messages[head]["content"])
        head += 1
    if not texts or (not instructions and head == 1):
        return messages
    return [{"role": "system", "content": "\n\n".join(texts)}, *messages[head:]]


def _content(
    content: Any, where: str, *, images: bool, dropped: list[str] | None = None
) -> str | list[dict[str, Any]]:
    """A message's content as chat takes it: its string, or its text (and image) parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of content parts", param=where)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str):
            kind = None
        if kind in _TEXT_PARTS:
            key = "refusal" if kind == "refusal" else "text"
            parts.append({"type": "text", "text": _string(part, key, at)})
        elif kind == "input_image" and images and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        elif kind is not None and dropped is not None:
            dropped.append(f"{str(kind)[:64]} part")
        else:
            raise bad_request(
                f"{at} must be a content part: input_text, output_text or refusal"
                + (", or input_image with an image_url" if images else ""),
                param=at,
            )
    return parts


def _joined(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p["text"] for p in content if p["type"] == "text")


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    """What a reasoning item gives back to the model (see the module docstring)."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if parts is not None and not isinstance(parts, list):
            raise bad_request(f"{where}.{key} must be a list of text parts", param=f"{where}.{key}")
        texts = [_string(part, "text", f"{where}.{key}[{j}]") for j, part in enumerate(parts or ())]
        if texts:
            return "\n".join(texts)
        if key == "content":
            sealed = item.get("encrypted_content")
            if sealed is not None:
                if not isinstance(sealed, str):
                    raise bad_request(
                        f"{where}.encrypted_content must be a string", param=f"{where}.encrypted_content"
                    )
                text = unseal_reasoning(sealed, f"{where}.encrypted_content")
                if text is not None:
                    return text
    return ""


def _string(item: Any, key: str, where: str) -> str:
    value = item.get(key) if isinstance(item, dict) else None
    if not isinstance(value, str):
        raise bad_request(f"{where}.{key} must be a string", param=f"{where}.{key}")
    return value


# --------------------------------------------------------------------------- tools and formats


def _tools(req: ResponsesRequest, turn: ChatTurn) -> tuple[list[dict[str, Any]], str | dict[str, Any] | None]:
    """The chat ``tools`` and ``tool_choice`` of ``req`` (see the module docstring)."""
    tools: list[dict[str, Any]] = []
    names: set[str] = set()
    for i, tool in enumerate(req.tools or ()):
        where = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not isinstance(kind, str):
            raise bad_request(f"{where} must be a tool object with a type", param=f"{where}.type")
        if kind == "function":
            tools.append(_function(tool, where, names, None, turn))
        elif kind == "namespace":
            group = tool.get("tools")
            namespace = tool.get("name")
            if not isinstance(group, list) or not isinstance(namespace, str):
                raise bad_request(f"{where} (a namespace) needs a name and a list of tools", param=where)
            for j, inner in enumerate(group):
                if isinstance(inner, dict) and inner.get("type") == "function":
                    tools.append(_function(inner, f"{where}.tools[{j}]", names, namespace, turn))
                else:
                    turn.dropped_tools.append(f"{namespace}.{_kind(inner)}")
        else:
            turn.dropped_tools.append(kind[:64])
    tools = [t for t in tools if t]
    choice = req.tool_choice
    if not isinstance(choice, dict):
        return tools, choice
    kind = choice.get("type")
    if kind == "function":
        name = choice.get("name")
        if not isinstance(name, str):
            raise bad_request(
                'a function tool_choice is {"type": "function", "name": NAME}', param="tool_choice.name"
            )
        return tools, {"type": "function", "function": {"name": name}}
    if kind == "allowed_tools":
        mode = choice.get("mode", "auto")
        if mode not in ("auto", "required"):
            raise bad_request("tool_choice.mode must be auto or required", param="tool_choice.mode")
        allowed = choice.get("tools")
        if not isinstance(allowed, list):
            raise bad_request("tool_choice.tools must be a list of tools", param="tool_choice.tools")
        kept = {
            t.get("name")
            for t in allowed
            if isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("name"), str)
        }
        return [t for t in tools if t["function"]["name"] in kept], mode
    turn.dropped_tools.append(f"tool_choice {str(kind)[:64]}")
    return tools, "auto"


def _function(
    tool: dict[str, Any], where: str, names: set[str], namespace: str | None, turn: ChatTurn
) -> dict[str, Any]:
    """A function tool in chat's shape; ``{}`` for a namespace's function whose name is taken."""
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request(f"{where}.name must be a non-empty string", param=f"{where}.name")
    if name in names:
        if namespace is None:
            raise bad_request(f"{where}.name {name!r} is already used by another tool", param=f"{where}.name")
        turn.dropped_tools.append(f"{namespace}.{name} (its name is taken)")
        return {}
    parameters = tool.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise bad_request(f"{where}.parameters must be a JSON Schema object", param=f"{where}.parameters")
    names.add(name)
    if namespace is not None:
        turn.namespaces[name] = namespace
    function: dict[str, Any] = {"name": name}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    if parameters is not None:
        function["parameters"] = parameters
    if isinstance(tool.get("strict"), bool):
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def _kind(tool: Any) -> str:
    return str(tool.get("type"))[:64] if isinstance(tool, dict) else "?"


def _response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format`` (None for plain text)."""
    fmt = req.text.format if req.text is not None else None
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise bad_request(
            "text.format.type must be text, json_schema or json_object", param="text.format.type"
        )
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise bad_request("text.format.schema must be a JSON Schema object", param="text.format.schema")
    name = fmt.get("name", "response")
    if not isinstance(name, str) or not 0 < len(name) <= 64:
        raise bad_request("text.format.name must be a string of 1 to 64 characters", param="text.format.name")
    json_schema: dict[str, Any] = {"name": name, "schema": schema}
    for key, kind in (("strict", bool), ("description", str)):
        value = fmt.get(key)
        if value is not None and not isinstance(value, kind):
            raise bad_request(f"text.format.{key} must be a {kind.__name__}", param=f"text.format.{key}")
        if value is not None:
            json_schema[key] = value
    return {"type": "json_schema", "json_schema": json_schema}
