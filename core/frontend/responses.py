"""Response bodies: SSE chunks for streaming, whole objects for unary requests.

Streaming is the hot path (one event per engine message per choice), so ``StreamEncoder``
pre-encodes the invariant head of every chunk once per request and splices in only the index,
the JSON-escaped text and the finish reason. The bytes are the same JSON the OpenAI API sends
(``chat.completion.chunk`` / ``text_completion``), checked by the tests with the openai client.
"""

from __future__ import annotations

import msgspec
import orjson

from dyn.core.protocol.openai import PromptTokensDetails, UsageInfo

DONE = b"data: [DONE]\n\n"


def usage_info(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> UsageInfo:
    return UsageInfo(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens,
                     PromptTokensDetails(cached_tokens))


class StreamEncoder:
    """SSE ``data:`` events of one streaming response (``chat`` or text completion)."""

    __slots__ = ("_head", "_chat", "_tail")

    def __init__(self, response_id: str, created: int, model: str, chat: bool) -> None:
        kind = b"chat.completion.chunk" if chat else b"text_completion"
        self._head = (b'data: {"id":' + orjson.dumps(response_id) + b',"object":"' + kind
                      + b'","created":' + str(created).encode() + b',"model":'
                      + orjson.dumps(model) + b',"choices":[')
        self._chat = chat
        self._tail = b',"logprobs":null,"finish_reason":null}]}\n\n'

    def role(self, index: int, role: str = "assistant") -> bytes:
        """The first event of a chat choice: the role, with empty content (as vLLM sends)."""
        return (self._head + b'{"index":%d,"delta":{"role":' % index + orjson.dumps(role)
                + b',"content":""}' + self._tail)

    def text(self, index: int, text: str) -> bytes:
        if self._chat:
            return (self._head + b'{"index":%d,"delta":{"content":' % index + orjson.dumps(text)
                    + b"}" + self._tail)
        return self._head + b'{"index":%d,"text":' % index + orjson.dumps(text) + self._tail

    def finish(self, index: int, reason: str, stop_reason: int | str | None,
               text: str = "", nvext: bytes | None = None) -> bytes:
        """The last event of a choice: its remaining text (if any), its finish reason and the
        response ``nvext`` (JSON) when one was asked for."""
        if self._chat:
            delta = b'{"content":' + orjson.dumps(text) + b"}" if text else b"{}"
            body = b'{"index":%d,"delta":' % index + delta
        else:
            body = b'{"index":%d,"text":' % index + orjson.dumps(text)
        tail = b"}]" if nvext is None else b'}],"nvext":' + nvext
        return (self._head + body + b',"logprobs":null,"finish_reason":' + orjson.dumps(reason)
                + b',"stop_reason":' + orjson.dumps(stop_reason) + tail + b"}\n\n")

    def usage(self, usage: UsageInfo) -> bytes:
        """The final ``stream_options.include_usage`` event: no choices, the request's usage."""
        return self._head + b'],"usage":' + msgspec.json.encode(usage) + b"}\n\n"


def error_event(body: msgspec.Struct) -> bytes:
    """An error after the stream started: an SSE event holding the OpenAI error body."""
    return b"data: " + msgspec.json.encode(body) + b"\n\n"
