"""One streamed OpenAI request and what it measured (``send``).

Chat turns go to ``/v1/chat/completions`` with the conversation so far; token-id turns (traces) go
to ``/v1/completions`` with ``prompt`` as a list of token ids. Every request streams with
``stream_options.include_usage`` and ``ignore_eos`` unless told otherwise, and, when ``nvext`` is on,
asks for ``nvext.extra_fields: ["worker_id", "timing"]`` (``dyn`` and Dynamo answer them; other
servers ignore or reject the field, so ``--no-nvext`` leaves it out).

Chat requests may offer ``tools``; the reply's streamed calls (``delta.tool_calls[i]``: ``index``,
``id`` and ``function.name`` in the first delta of a call, ``function.arguments`` pieces after, as
OpenAI streams them) are put together by index (``ToolCallDeltas``) into ``Reply.tool_calls``.

TTFT is the time to the first chunk carrying output (text, reasoning or a tool call); ITL the gaps
between later chunks that carry output (``vllm bench serve``'s definition); output tokens from
``usage.completion_tokens`` (else one per output chunk). ``timeout_s`` bounds the whole request,
not each read. A failed request gets an error kind: ``http_<status>``, ``timeout``,
``connect``, ``stream`` (a malformed or truncated stream), ``server_error`` (an error object in
the stream) or ``tool_arguments`` (a complete reply with a tool call whose arguments are not a
JSON object, e.g. cut off by ``max_tokens``), and ``detail`` (the server's message, cut to 300
characters).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import orjson

from dyn.core.bench.metrics import RequestRecord
from dyn.core.protocol.errors import error_message

EXTRA_FIELDS = ["worker_id", "timing"]


@dataclass(frozen=True)
class ClientOptions:
    model: str
    nvext: bool = True
    ignore_eos: bool = True
    timeout_s: float = 600.0
    api_key: str | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    agent_ids: bool = False
    """Each request names its conversation (``x-dynamo-session-id``) and a subagent's its parent
    (``x-dynamo-parent-session-id``), as agent harnesses do (``--agent-ids``)."""


@dataclass
class ToolCall:
    """One streamed call, put together; ``arguments`` as the server sent them (a JSON string)."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""

    @property
    def valid(self) -> bool:
        """Whether ``arguments`` is a JSON object, as OpenAI's function arguments are."""
        try:
            return isinstance(orjson.loads(self.arguments), dict)
        except orjson.JSONDecodeError:
            return False


class ToolCallDeltas:
    """Accumulates ``delta.tool_calls`` by ``index``: ``id`` from its first delta that has one,
    ``function.name`` and ``function.arguments`` pieces concatenated in order (as the openai SDK
    does). A delta without ``index`` continues the call of the same position in its list.
    ``TypeError`` / ``AttributeError`` for a delta that is not shaped like OpenAI's."""

    def __init__(self) -> None:
        self._calls: dict[int, ToolCall] = {}

    def feed(self, deltas: list[dict[str, Any]]) -> None:
        if not isinstance(deltas, list):
            raise TypeError(f"tool_calls is not a list: {deltas!r}"[:120])
        for position, delta in enumerate(deltas):
            index = delta.get("index", position)
            if isinstance(index, bool) or not isinstance(index, int):
                raise TypeError(f"tool call index is not an integer: {index!r}"[:120])
            call = self._calls.setdefault(index, ToolCall(index=index))
            if delta.get("id") and not call.id:
                call.id = _string(delta["id"])
            function = delta.get("function") or {}
            call.name += _string(function.get("name") or "")
            call.arguments += _string(function.get("arguments") or "")

    def calls(self) -> list[ToolCall]:
        """The calls so far, by index."""
        return [self._calls[i] for i in sorted(self._calls)]


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}"[:120])
    return value


@dataclass
class Reply:
    """A finished request: its record, the assistant text and tool calls (for the history)."""

    record: RequestRecord
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)


def chat_body(
    options: ClientOptions,
    messages: list[dict[str, Any]],
    max_tokens: int,
    nvext: dict[str, Any] | None,
    tools: Sequence[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A chat request; ``tools`` (OpenAI function tools) are offered when given and not empty."""
    body = _common(options, max_tokens, nvext)
    body["messages"] = messages
    if tools:
        body["tools"] = list(tools)
    return body


def completion_body(
    options: ClientOptions, prompt_ids: list[int], max_tokens: int, nvext: dict[str, Any] | None
) -> dict[str, Any]:
    body = _common(options, max_tokens, nvext)
    body["prompt"] = prompt_ids
    return body


def _common(options: ClientOptions, max_tokens: int, nvext: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": options.model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if options.ignore_eos:
        body["ignore_eos"] = True
    merged = dict(nvext or {})
    if options.nvext:
        merged["extra_fields"] = EXTRA_FIELDS
    if merged:
        body["nvext"] = merged
    body.update(options.extra_body)
    return body


class _Stream:
    """Accumulates one SSE stream's chunks."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.first: float | None = None
        self.last: float | None = None
        self.gaps: list[float] = []
        self.text: list[str] = []
        self.calls = ToolCallDeltas()
        self.chunks = 0
        self.usage: dict[str, Any] | None = None
        self.nvext: dict[str, Any] | None = None
        self.done = False

    def feed(self, data: bytes, now: float) -> str | None:
        """One ``data:`` payload; returns an error message if the server sent one."""
        if data == b"[DONE]":
            self.done = True
            return None
        chunk = orjson.loads(data)
        if chunk.get("error") is not None:
            error = chunk["error"]
            return str(error.get("message", error) if isinstance(error, dict) else error)
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if chunk.get("nvext"):
            self.nvext = chunk["nvext"]
        for choice in chunk.get("choices") or ():
            piece = _text_of(choice)
            calls = (choice.get("delta") or {}).get("tool_calls")
            if choice.get("nvext"):
                self.nvext = choice["nvext"]
            if calls:
                self.calls.feed(calls)
            if piece or calls:
                if piece:
                    self.text.append(piece)
                self.chunks += 1
                if self.first is None:
                    self.first = now
                elif self.last is not None:
                    self.gaps.append(now - self.last)
                self.last = now
        return None


def _text_of(choice: dict[str, Any]) -> str:
    delta = choice.get("delta")
    if delta is not None:
        return (delta.get("content") or "") + (delta.get("reasoning_content") or "")
    return choice.get("text") or ""


async def send(
    client: httpx.AsyncClient,
    path: str,
    body: dict[str, Any],
    record: RequestRecord,
    clock: Any,
    origin: float,
    options: ClientOptions,
    extra_headers: dict[str, str] | None = None,
) -> Reply:
    """POST ``body`` to ``path`` (with ``extra_headers``), stream the answer, fill ``record``
    (times from ``origin``)."""
    started = clock()
    record.start_s = started - origin
    stream = _Stream(started)
    headers = {"content-type": "application/json", **(extra_headers or {})}
    if options.api_key:
        headers["authorization"] = f"Bearer {options.api_key}"
    try:
        with anyio.fail_after(options.timeout_s):
            async with client.stream(
                "POST", path, content=orjson.dumps(body), headers=headers, timeout=options.timeout_s
            ) as response:
                if response.status_code != 200:
                    return _failed(
                        record,
                        stream,
                        clock,
                        origin,
                        f"http_{response.status_code}",
                        error_message(await response.aread()),
                    )
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    message = stream.feed(line[5:].strip().encode(), clock())
                    if message is not None:
                        return _failed(record, stream, clock, origin, "server_error", message)
    except (httpx.TimeoutException, TimeoutError):
        return _failed(record, stream, clock, origin, "timeout", f"not finished within {options.timeout_s} s")
    except httpx.TransportError as exc:
        kind = "connect" if isinstance(exc, httpx.ConnectError) else "stream"
        return _failed(record, stream, clock, origin, kind, str(exc) or type(exc).__name__)
    except (orjson.JSONDecodeError, AttributeError, TypeError) as exc:
        return _failed(record, stream, clock, origin, "stream", f"malformed chunk: {exc}")
    if not stream.done:
        return _failed(record, stream, clock, origin, "stream", "the stream ended without [DONE]")
    try:
        _finish(record, stream, clock() - origin, origin)
    except (TypeError, ValueError) as exc:
        return _failed(record, stream, clock, origin, "stream", f"malformed usage or nvext: {exc}")
    calls = stream.calls.calls()
    record.tool_calls = len(calls)
    invalid = [c for c in calls if not c.valid]
    record.invalid_tool_calls = len(invalid)
    if invalid:
        first = invalid[0]
        record.error = "tool_arguments"
        record.detail = (
            f"the arguments of {first.name or 'a call'} are not a JSON object: {first.arguments!r}"[:300]
        )
    return Reply(record=record, text="".join(stream.text), tool_calls=calls)


def _finish(record: RequestRecord, stream: _Stream, end_s: float, origin: float) -> None:
    """Fill ``record`` from the stream; ``TypeError`` / ``ValueError`` for malformed usage or nvext
    (a server that reports no cached tokens leaves ``cached_tokens`` None, not 0)."""
    record.end_s = end_s
    if stream.first is not None:
        record.ttft_s = stream.first - stream.started
    record.itl_s = stream.gaps
    record.output_tokens = stream.chunks
    usage = _object(stream.usage) or {}
    if usage.get("completion_tokens") is not None:
        record.output_tokens = _count(usage["completion_tokens"])
    if usage.get("prompt_tokens") is not None:
        record.prompt_tokens = _count(usage["prompt_tokens"])
        details = _object(usage.get("prompt_tokens_details")) or {}
        if details.get("cached_tokens") is not None:
            record.cached_tokens = _count(details["cached_tokens"])
    nvext = _object(stream.nvext) or {}
    worker = _object(nvext.get("worker_id")) or {}
    if worker.get("decode_worker_id") is not None:
        record.worker = str(worker["decode_worker_id"])
    wait = (_object(nvext.get("timing")) or {}).get("prefill_wait_time_ms")
    if isinstance(wait, (int, float)) and not isinstance(wait, bool):
        record.queue_s = wait / 1000.0


def _object(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, got {value!r}"[:120])
    return value


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a token count, got {value!r}"[:120])
    return value


def _failed(
    record: RequestRecord, stream: _Stream, clock: Any, origin: float, kind: str, detail: str
) -> Reply:
    try:
        _finish(record, stream, clock() - origin, origin)
    except (TypeError, ValueError):
        record.end_s = clock() - origin
    record.error = kind
    record.detail = detail[:300]
    return Reply(record=record, text="".join(stream.text))
