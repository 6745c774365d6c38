"""SSE chunks are valid JSON of OpenAI's chunk shapes."""

from __future__ import annotations

import json

from dyn.core.frontend.apis.chat_completions.chunks import DONE, StreamEncoder
from dyn.core.frontend.generation import usage_info


def event(data: bytes) -> dict:
    assert data.startswith(b"data: ") and data.endswith(b"\n\n")
    return json.loads(data[6:])


def test_chat_chunks():
    enc = StreamEncoder('id-"quoted"', 123, "m", chat=True)
    role = event(enc.role(0))
    assert role["id"] == 'id-"quoted"' and role["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = event(enc.text(2, 'é "\n'))
    assert text["choices"][0] == {
        "index": 2,
        "delta": {"content": 'é "\n'},
        "logprobs": None,
        "finish_reason": None,
    }
    fin = event(enc.finish(1, "stop", "###"))
    assert fin["choices"][0]["delta"] == {} and fin["choices"][0]["finish_reason"] == "stop"
    assert fin["choices"][0]["stop_reason"] == "###" and fin["choices"][0]["index"] == 1
    assert event(enc.finish(0, "length", None, "tail"))["choices"][0]["delta"] == {"content": "tail"}
    usage = event(enc.usage(usage_info(10, 4, 8)))
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 4,
        "total_tokens": 14,
        "prompt_tokens_details": {"cached_tokens": 8},
    }
    assert DONE == b"data: [DONE]\n\n"


def test_completion_chunks():
    enc = StreamEncoder("c", 1, "m", chat=False)
    text = event(enc.text(0, "abc"))
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "abc"
    fin = event(enc.finish(0, "stop", 4))
    assert fin["choices"][0]["text"] == "" and fin["choices"][0]["stop_reason"] == 4
