"""Benchmark: where a streamed request's first token waits, seen from the client and the server.

Not a test. Runs the anchor load's requests (``load.py``'s prompts: a shared 32-word prefix and 64
random words; streaming, max_tokens 16, ignore_eos) closed-loop at ``--concurrency`` against an
OpenAI-compatible server that answers ``nvext.extra_fields: ["timing"]`` (dyn, NVIDIA Dynamo), and
splits each request's time to first token into:

- ``before``: the client's send to the server's ``request_received_ms`` (the client's own
  turn, the kernel, the server's HTTP parsing and its event-loop turns before the handler);
- ``server``: ``nvext.timing.ttft_ms``, the server's receipt to its first token;
- ``after``: the rest of the client's TTFT (writing the event, the client's turn to read it).

Clocks: the client's and the server's wall clocks are the same clock (same machine). Prints one
JSON object of medians (the first 10% of requests are warm-up, left out). Needs aiohttp (run it
with the anchor's venv python, as ``load.py``):

    /tmp/dyn-anchor/venv/bin/python tests/perf/ttft_breakdown.py --url http://127.0.0.1:8000 \\
        --concurrency 32 --requests 3000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

ANCHOR = Path(__file__).resolve().parents[3] / "shared" / "anchor"


async def run(url: str, concurrency: int, requests: int) -> dict:
    import aiohttp

    sys.path.insert(0, str(ANCHOR))
    from load import make_prompt  # the anchor load's prompts

    rng = random.Random(0)
    rows: list[tuple[float, float, dict]] = []
    todo = list(range(requests))
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.get(url + "/v1/models") as r:
            model = (await r.json())["data"][0]["id"]

        async def client() -> None:
            while todo:
                i = todo.pop()
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": make_prompt(i, 64, 32, rng)}],
                    "max_tokens": 16,
                    "stream": True,
                    "ignore_eos": True,
                    "nvext": {"extra_fields": ["timing"]},
                }
                sent_wall, t0 = time.time(), time.perf_counter()
                ttft = None
                timing: dict = {}
                events = 0
                buf = b""
                async with session.post(url + "/v1/chat/completions", json=body) as r:
                    async for data in r.content.iter_any():
                        buf += data
                        while b"\n" in buf:
                            line, buf = buf.split(b"\n", 1)
                            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                                continue
                            events += 1
                            obj = json.loads(line[5:])
                            choices = obj.get("choices") or []
                            if ttft is None and choices and (choices[0].get("delta") or {}).get("content"):
                                ttft = (time.perf_counter() - t0) * 1000
                            timing = (obj.get("nvext") or {}).get("timing", timing)
                if ttft is None or "ttft_ms" not in timing:
                    raise RuntimeError(f"request {i}: no content or no nvext.timing in the stream")
                timing["events"] = events
                rows.append((ttft, timing["request_received_ms"] - sent_wall * 1000, timing))

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    rows = rows[requests // 10 :]

    def med(values) -> float:
        return round(statistics.median(values), 2)

    return {
        "url": url,
        "concurrency": concurrency,
        "req_per_s": round(requests / elapsed, 1),
        "client_ttft_p50_ms": med(r[0] for r in rows),
        "before_ms": med(r[1] for r in rows),
        "server_ttft_ms": med(r[2]["ttft_ms"] for r in rows),
        "after_ms": med(r[0] - r[1] - r[2]["ttft_ms"] for r in rows),
        "sse_events_per_response": med(r[2]["events"] for r in rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=3000)
    args = ap.parse_args()
    print(json.dumps(asyncio.run(run(args.url, args.concurrency, args.requests))))


if __name__ == "__main__":
    main()
