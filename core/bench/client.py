"""One streamed OpenAI request and what it measured (``send``).

Chat turns go to ``/v1/chat/completions`` with the conversation so far; token-id turns (traces) go
to ``/v1/completions`` with ``prompt`` as a list of token ids. Every request streams with
``stream_options.include_usage`` and ``ignore_eos`` unless told otherwise, and, when ``nvext`` is on,
asks for ``nvext.extra_fields: ["worker_id", "timing"]`` (``dyn`` and Dynamo answer them; other
servers ignore or reject the field, so ``--no-nvext`` leaves it out).

TTFT is the time to the first chunk carrying output text; ITL the gaps between later chunks that
carry text (``vllm bench serve``'s definition); output tokens from ``usage.completion_tokens``
(else one per text chunk). ``timeout_s`` bounds the whole request, not each read. A failed request
gets an error kind: ``http_<status>``, ``timeout``,
``connect``, ``stream`` (a malformed or truncated stream) or ``server_error`` (an error object in
the stream), and ``detail`` (the server's message, cut to 300 characters).
"""

from __future__ import annotations

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


@dataclass
class Reply:
    """A finished request: its record and the assistant text (for the next turn's history)."""

    record: RequestRecord
    text: str


def chat_body(options: ClientOptions, messages: list[dict[str, str]], max_tokens: int,
              nvext: dict[str, Any] | None) -> dict[str, Any]:
    body = _common(options, max_tokens, nvext)
    body["messages"] = messages
    return body


def completion_body(options: ClientOptions, prompt_ids: list[int], max_tokens: int,
                    nvext: dict[str, Any] | None) -> dict[str, Any]:
    body = _common(options, max_tokens, nvext)
    body["prompt"] = prompt_ids
    return body


def _common(options: ClientOptions, max_tokens: int, nvext: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": options.model, "max_tokens": max_tokens, "stream": True,
                            "stream_options": {"include_usage": True}}
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
            if choice.get("nvext"):
                self.nvext = choice["nvext"]
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


async def send(client: httpx.AsyncClient, path: str, body: dict[str, Any], record: RequestRecord,
               clock: Any, origin: float, options: ClientOptions) -> Reply:
    """POST ``body`` to ``path``, stream the answer, fill ``record`` (times from ``origin``)."""
    started = clock()
    record.start_s = started - origin
    stream = _Stream(started)
    headers = {"content-type": "application/json"}
    if options.api_key:
        headers["authorization"] = f"Bearer {options.api_key}"
    try:
        with anyio.fail_after(options.timeout_s):
            async with client.stream("POST", path, content=orjson.dumps(body), headers=headers,
                                     timeout=options.timeout_s) as response:
                if response.status_code != 200:
                    return _failed(record, stream, clock, origin, f"http_{response.status_code}",
                                   error_message(await response.aread()))
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
    return Reply(record=record, text="".join(stream.text))


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


def _failed(record: RequestRecord, stream: _Stream, clock: Any, origin: float, kind: str,
            detail: str) -> Reply:
    try:
        _finish(record, stream, clock() - origin, origin)
    except (TypeError, ValueError):
        record.end_s = clock() - origin
    record.error = kind
    record.detail = detail[:300]
    return Reply(record=record, text="".join(stream.text))
