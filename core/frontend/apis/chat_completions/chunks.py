"""The chunks of a streamed chat or text completion (``chat.completion.chunk`` / ``text_completion``).

Streaming is the hot path (one event per engine message per choice), so ``StreamEncoder``
pre-encodes the invariant head of every chunk once per request and splices in only the index,
the JSON-escaped text and the finish reason. The bytes are the same JSON the OpenAI API sends
(``chat.completion.chunk`` / ``text_completion``), checked by the tests with the openai client.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec
import orjson

from dyn.core.protocol.openai import UsageInfo

if TYPE_CHECKING:
    from dyn.core.frontend.output import ToolCallDelta

DONE = b"data: [DONE]\n\n"


class StreamEncoder:
    """SSE ``data:`` events of one streaming response (``chat`` or text completion)."""

    __slots__ = ("_head", "_chat", "_tail")

    def __init__(self, response_id: str, created: int, model: str, chat: bool) -> None:
        kind = b"chat.completion.chunk" if chat else b"text_completion"
        self._head = (
            b'data: {"id":'
            + orjson.dumps(response_id)
            + b',"object":"'
            + kind
            + b'","created":'
            + str(created).encode()
            + b',"model":'
            + orjson.dumps(model)
            + b',"choices":['
        )
        self._chat = chat
        self._tail = b',"logprobs":null,"finish_reason":null}]}\n\n'

    def role(self, index: int, role: str = "assistant") -> bytes:
        """The first event of a chat choice: the role, with empty content (as vLLM sends)."""
        return (
            self._head
            + b'{"index":%d,"delta":{"role":' % index
            + orjson.dumps(role)
            + b',"content":""}'
            + self._tail
        )

    def text(self, index: int, text: str, logprobs: bytes | None = None) -> bytes:
        """A chunk of plain text (chat: ``delta.content``), with its tokens' logprobs (JSON)."""
        if self._chat:
            body = b'{"index":%d,"delta":{"content":' % index + orjson.dumps(text) + b"}"
        else:
            body = b'{"index":%d,"text":' % index + orjson.dumps(text)
        if logprobs is None:
            return self._head + body + self._tail
        return self._head + body + b',"logprobs":' + logprobs + b',"finish_reason":null}]}\n\n'

    def delta(self, index: int, delta: bytes, logprobs: bytes | None = None) -> bytes:
        """A chat chunk with a ``delta`` built by ``chat_delta``."""
        return (
            self._head
            + b'{"index":%d,"delta":' % index
            + delta
            + b',"logprobs":'
            + (logprobs or b"null")
            + b',"finish_reason":null}]}\n\n'
        )

    def finish(
        self,
        index: int,
        reason: str,
        stop_reason: int | str | None,
        text: str = "",
        nvext: bytes | None = None,
        *,
        delta: bytes | None = None,
        logprobs: bytes | None = None,
        prompt_logprobs: bytes | None = None,
    ) -> bytes:
        """The last event of a choice: its remaining text (chat: or a ``chat_delta``), its
        finish reason, the last tokens' logprobs, the prompt logprobs (completions) and the
        response ``nvext`` (JSON) when they were asked for."""
        if self._chat:
            if delta is None:
                delta = b'{"content":' + orjson.dumps(text) + b"}" if text else b"{}"
            body = b'{"index":%d,"delta":' % index + delta
        else:
            body = b'{"index":%d,"text":' % index + orjson.dumps(text)
        if prompt_logprobs is not None:
            body += b',"prompt_logprobs":' + prompt_logprobs
        tail = b"}]" if nvext is None else b'}],"nvext":' + nvext
        return (
            self._head
            + body
            + b',"logprobs":'
            + (logprobs or b"null")
            + b',"finish_reason":'
            + orjson.dumps(reason)
            + b',"stop_reason":'
            + orjson.dumps(stop_reason)
            + tail
            + b"}\n\n"
        )

    @staticmethod
    def with_usage(event: bytes, prompt_tokens: int, completion_tokens: int) -> bytes:
        """A choice's ``event`` with the running usage vLLM adds to every chunk under
        ``stream_options.continuous_usage_stats`` (the choice's tokens so far)."""
        usage = b'"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}' % (
            prompt_tokens,
            prompt_tokens + completion_tokens,
            completion_tokens,
        )
        return event[:-3] + b"," + usage + b"}\n\n"

    def usage(self, usage: UsageInfo) -> bytes:
        """The final ``stream_options.include_usage`` event: no choices, the request's usage."""
        return self._head + b'],"usage":' + msgspec.json.encode(usage) + b"}\n\n"


REASONING_FIELD_NAMES = ("reasoning_content", "reasoning")
"""Where a chat message or delta carries parsed reasoning (``--reasoning-field-name``):
``reasoning_content`` (Dynamo's and DeepSeek's, the default) or ``reasoning`` (vLLM's newer name)."""


def chat_delta(
    content: str,
    reasoning: str,
    tool_calls: Sequence[ToolCallDelta],
    reasoning_field: str = "reasoning_content",
) -> bytes:
    """A chat ``delta`` object with what is set: ``content``, reasoning under
    ``reasoning_field`` and ``tool_calls`` (a call's first entry with its id, type and name,
    later ones with arguments)."""
    parts = []
    if content:
        parts.append(b'"content":' + orjson.dumps(content))
    if reasoning:
        parts.append(b'"%s":%s' % (reasoning_field.encode(), orjson.dumps(reasoning)))
    if tool_calls:
        calls = []
        for call in tool_calls:
            if call.name is not None:
                calls.append(
                    {
                        "index": call.index,
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                )
            else:
                calls.append({"index": call.index, "function": {"arguments": call.arguments}})
        parts.append(b'"tool_calls":' + orjson.dumps(calls))
    return b"{" + b",".join(parts) + b"}"


def error_event(body: msgspec.Struct) -> bytes:
    """An error after the stream started: an SSE event holding the OpenAI error body."""
    return b"data: " + msgspec.json.encode(body) + b"\n\n"
