"""The floor of a Python OpenAI front: an ASGI app on uvicorn (httptools, uvloop, as dyn's
frontend runs) that answers every chat completion with the same 16 canned tokens, streamed as 16
SSE chunks, then a usage chunk and ``[DONE]``; no parsing beyond the body, no tokenizer, no
router, no engine. ``bench_vs_anchor.py --floor`` runs it beside dyn and Dynamo under the same load:
what is left of dyn's CPU per request above this is dyn's own work.

    python tests/perf/floor_server.py --port 8000
"""

from __future__ import annotations

import argparse
import json

import uvicorn

_MODELS = json.dumps(
    {"object": "list", "data": [{"id": "floor", "object": "model", "owned_by": "floor"}]}
).encode()
_HEAD = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


def _chunk(delta: dict, finish: str | None = None, usage: dict | None = None) -> bytes:
    body = {
        "id": "chatcmpl-floor",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "floor",
        "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


_TOKENS = [_chunk({"role": "assistant", "content": "tok"})] + [_chunk({"content": " tok"}) for _ in range(14)]
_TOKENS.append(_chunk({"content": " tok"}, finish="length"))
_END = (
    _chunk({}, usage={"prompt_tokens": 100, "completion_tokens": 16, "total_tokens": 116})
    + b"data: [DONE]\n\n"
)
_COMPLETION = json.dumps(
    {
        "id": "chatcmpl-floor",
        "object": "chat.completion",
        "model": "floor",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "tok" * 16}, "finish_reason": "length"}
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 16, "total_tokens": 116},
    }
).encode()


async def app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    if scope["path"] == "/v1/models":
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": _MODELS})
        return
    if b'"stream": true' not in body and b'"stream":true' not in body:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": _COMPLETION})
        return
    await send({"type": "http.response.start", "status": 200, "headers": _HEAD})
    for chunk in _TOKENS:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": _END})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=8000)
    args = p.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", http="httptools", loop="uvloop")


if __name__ == "__main__":
    main()
