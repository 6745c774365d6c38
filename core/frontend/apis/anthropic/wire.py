"""``MessagesWire``: a generation written as Anthropic's Messages API writes it.

Streaming is SSE with named events, as Anthropic's SDKs read them (``event: NAME\\ndata: JSON``,
no ``[DONE]``): ``message_start`` (the message with no content, ``stop_reason`` null and the
prompt's tokens as ``input_tokens``), ``ping``, then the content blocks, each
``content_block_start``, its deltas and ``content_block_stop``, then ``message_delta`` (the stop
reason, the matched stop sequence and the final usage) and ``message_stop``. Blocks open as the
output needs them and one closes before the next opens: ``thinking`` (``thinking_delta``s, then a
``signature_delta``), ``text`` (``text_delta``s), one ``tool_use`` per call (``input_json_delta``s
of its arguments). A failure after the stream started is an ``error`` event.

The unary body is the same message whole: thinking first, then text, then the tool calls (their
arguments parsed into ``input``).

Usage, as Anthropic counts it (prompt = ``input_tokens`` + ``cache_read_input_tokens`` +
``cache_creation_input_tokens``): ``cache_read_input_tokens`` is the worker's KV-cache hit and
``input_tokens`` the rest of the prompt. ``cache_creation_input_tokens`` is 0: an engine's prefix
cache keeps what it computes without being asked, and may evict it at once, so no prompt token is
known to have been written to a cache the way Anthropic's explicit cache writes are (and billed).
``message_start`` cannot know the cache hit yet, so it counts the whole prompt as input;
``message_delta`` carries the final counts, which Anthropic's SDKs take over those of the start.

A thinking block's ``signature`` is ``signature(thinking)``: a digest of its text, stable for the
same text, so a client that requires one can send the block back. It is not a cryptographic
signature, and this server does not check the ones it is sent.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import msgspec
import orjson

from dyn.core.frontend.apis.anthropic.errors import error_response
from dyn.core.frontend.apis.anthropic.protocol import (
    ContextManagementResponse,
    Message,
    TextOut,
    ThinkingOut,
    ToolUseOut,
    Usage,
)
from dyn.core.frontend.choice import Choice
from dyn.core.frontend.generation import ChoiceEnd, Generation, Wire
from dyn.core.frontend.output import OutputDelta, ToolCallDelta
from dyn.core.protocol.errors import ApiError

log = logging.getLogger(__name__)

PING = b'event: ping\ndata: {"type":"ping"}\n\n'
MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
_DELTA = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,"delta":{"type":"'


def signature(thinking: str) -> str:
    """The ``signature`` of a thinking block with this text (see the module docstring)."""
    return _signed(hashlib.sha256(thinking.encode()))


def _signed(digest: Any) -> str:
    return "dyn-sha256-" + digest.hexdigest()


def stop_reason(reason: str, matched: int | str | None, called: bool) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` for a choice that finished for
    ``reason`` (``stop``, ``length``, ``tool_calls``), ``matched`` (the stop string or token that
    ended it) and ``called`` (it made tool calls)."""
    if isinstance(matched, str):
        return "stop_sequence", matched
    if reason == "length":
        return "max_tokens", None
    if called or reason == "tool_calls":
        return "tool_use", None
    return "end_turn", None


def usage(gen: Generation) -> Usage:
    """The generation's usage as Anthropic counts it (see the module docstring)."""
    info = gen.usage()
    cached = gen.cached_tokens()
    return Usage(
        input_tokens=info.prompt_tokens - cached,
        output_tokens=info.completion_tokens,
        cache_read_input_tokens=cached,
    )


class MessagesWire(Wire):
    """One assistant message (a Messages request has one choice)."""

    def __init__(self, gen: Generation, context: ContextManagementResponse | None = None) -> None:
        """``context``: what the request's context edits cleared, when it asked for some."""
        super().__init__(gen)
        self.context = context
        self.message_id = "msg_" + gen.ctx.request_id
        self._index = -1
        """The index of the last block opened."""
        self._open: str | None = None
        """The kind of the block open now, if one is."""
        self._call = -1
        """The tool call whose ``tool_use`` block is open."""
        self._digest: Any = None
        """The running digest of the open thinking block's text."""
        self._called = False
        self._stop: tuple[str, str | None] = ("end_turn", None)

    # ----------------------------------------------------------------- streaming

    def opening(self) -> bytes:
        prompt_tokens = sum(len(c.prompt.token_ids) for c in self.gen.choices)
        message = self._message([], None, None, Usage(input_tokens=prompt_tokens, output_tokens=0))
        return _event(b"message_start", b'{"type":"message_start","message":' + message + b"}") + PING

    def text(self, choice: Choice, text: str, logprobs: bytes | None) -> bytes:
        return self._text(text) if text else b""

    def delta(self, choice: Choice, delta: OutputDelta | None, logprobs: bytes | None) -> bytes:
        return self._delta(delta) if delta is not None else b""

    def finish(self, choice: Choice, end: ChoiceEnd) -> bytes:
        out = self._delta(end.delta) if end.delta is not None else self._text(end.text) if end.text else b""
        out += self._close()
        self._stop = stop_reason(end.reason, end.stop_reason, self._called)
        return out

    def closing(self) -> bytes:
        reason, sequence = self._stop
        u = usage(self.gen)
        delta: dict[str, Any] = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": {
                "input_tokens": u.input_tokens,
                "output_tokens": u.output_tokens,
                "cache_creation_input_tokens": u.cache_creation_input_tokens,
                "cache_read_input_tokens": u.cache_read_input_tokens,
            },
        }
        if self.context is not None:
            delta["context_management"] = msgspec.to_builtins(self.context)
        return _event(b"message_delta", orjson.dumps(delta)) + MESSAGE_STOP

    def failed(self, error: ApiError) -> bytes:
        body = error_response(error)
        if body.request_id is None:
            body.request_id = self.gen.ctx.request_id
        return _event(b"error", msgspec.json.encode(body))

    def _delta(self, delta: OutputDelta) -> bytes:
        out = b""
        if delta.reasoning:
            out += self._thinking(delta.reasoning)
        if delta.content:
            out += self._text(delta.content)
        for call in delta.tool_calls:
            out += self._tool_call(call)
        return out

    def _text(self, text: str) -> bytes:
        out = b"" if self._open == "text" else self._start(b'{"type":"text","text":""}', "text")
        return out + _DELTA % self._index + b'text_delta","text":' + orjson.dumps(text) + b"}}\n\n"

    def _thinking(self, text: str) -> bytes:
        out = b""
        if self._open != "thinking":
            out = self._start(b'{"type":"thinking","thinking":"","signature":""}', "thinking")
            self._digest = hashlib.sha256()
        self._digest.update(text.encode())
        return out + _DELTA % self._index + b'thinking_delta","thinking":' + orjson.dumps(text) + b"}}\n\n"

    def _tool_call(self, call: ToolCallDelta) -> bytes:
        out = b""
        if call.name is not None:
            block = orjson.dumps({"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
            out = self._start(block, "tool_use")
            self._call = call.index
            self._called = True
        if call.arguments and self._open == "tool_use" and self._call == call.index:
            out += (
                _DELTA % self._index
                + b'input_json_delta","partial_json":'
                + orjson.dumps(call.arguments)
                + b"}}\n\n"
            )
        return out

    def _start(self, block: bytes, kind: str) -> bytes:
        out = self._close()
        self._index += 1
        self._open = kind
        start = b'{"type":"content_block_start","index":%d,"content_block":' % self._index + block + b"}"
        return out + _event(b"content_block_start", start)

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        out = b""
        if self._open == "thinking":
            out = (
                _DELTA % self._index
                + b'signature_delta","signature":'
                + orjson.dumps(_signed(self._digest))
                + b"}}\n\n"
            )
            self._digest = None
        self._open = None
        return out + _event(b"content_block_stop", b'{"type":"content_block_stop","index":%d}' % self._index)

    # ----------------------------------------------------------------- unary

    async def body(self) -> list[bytes]:
        gen = self.gen
        choice = gen.choices[0]
        content, reasoning, calls, reason = gen.outcome(choice)
        blocks: list[TextOut | ThinkingOut | ToolUseOut] = []
        if reasoning:
            blocks.append(ThinkingOut(reasoning, signature(reasoning)))
        if content:
            blocks.append(TextOut(content))
        for call in calls:
            blocks.append(ToolUseOut(call.id, call.function.name, _input(call.function.arguments)))
        stop, sequence = stop_reason(reason, choice.stop_reason, bool(calls))
        return [self._message(blocks, stop, sequence, usage(gen))]

    def _message(
        self,
        content: list[TextOut | ThinkingOut | ToolUseOut],
        stop: str | None,
        sequence: str | None,
        u: Usage,
    ) -> bytes:
        model = self.gen.service.model_name
        return msgspec.json.encode(
            Message(
                id=self.message_id,
                model=model,
                content=content,
                stop_reason=stop,
                stop_sequence=sequence,
                usage=u,
                role="assistant",
                context_management=self.context if stop is not None else None,
            )
        )


def _event(name: bytes, data: bytes) -> bytes:
    return b"event: " + name + b"\ndata: " + data + b"\n\n"


def _input(arguments: str) -> dict[str, Any]:
    """A call's arguments as ``input``: Anthropic's is an object; anything else (a parser that
    let through arguments that are not one) becomes ``{}``, and is logged."""
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        value = None
    if isinstance(value, dict):
        return value
    log.warning("Messages API: a tool call's arguments are not a JSON object; sent as {}: %.200r", arguments)
    return {}
