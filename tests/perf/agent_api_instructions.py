#!/usr/bin/env python3
"""Streamed requests of one API through the frontend's ASGI app in process, over fake workers
that answer 16 tokens (no socket, no engine): run it under callgrind, once with 0 and once with N
requests, and the difference of the two instruction counts over N is the frontend's cost of one
request of that API, repeatable run to run where timings on a shared machine are not. Not a test.

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        python tests/perf/agent_api_instructions.py responses 200   # then with 0

Both runs send 20 requests first (imports and caches warm). APIs: chat, responses, messages; the
prompt is the anchor load's shape.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import anyio
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.*
from tests.core.frontend.conftest import asgi_call, running_frontend
from tests.core.frontend.fake_workers import reply

TEXT = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho"
PROMPT = ("You are a helpful assistant answering questions about Python. " * 4) + "abc def ghi jkl mno pqr"
BODIES = {
    "chat": {
        "model": "dyn-tiny",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 16,
        "stream": True,
        "stream_options": {"include_usage": True},
    },
    "responses": {
        "model": "dyn-tiny",
        "input": PROMPT,
        "max_output_tokens": 16,
        "stream": True,
        "store": False,
    },
    "messages": {
        "model": "dyn-tiny",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 16,
        "stream": True,
    },
}
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
WARM = 20


async def main(api: str, n: int) -> None:
    body = orjson.dumps(BODIES[api])
    async with running_frontend(Path(tempfile.mkdtemp()), script=reply(TEXT)) as fe:
        for _ in range(WARM + n):
            sent = await asgi_call(fe.app, "POST", PATHS[api], body)
            assert sent[0]["status"] == 200, sent


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]))
