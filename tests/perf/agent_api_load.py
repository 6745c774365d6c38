#!/usr/bin/env python3
"""Closed-loop streaming load on one of three APIs, the same prompts on each: chat completions,
OpenAI's Responses API or Anthropic's Messages API. Not a test; ``bench_agent_apis.py`` runs it.

Prompts are the anchor's shape (``../shared/anchor/load.py``: a shared prefix of words plus a
random tail); every request streams ``--max-tokens`` tokens. TTFT is the time to the first event
that carries output text (chat: a ``delta.content``; Responses: ``response.output_text.delta``;
Messages: a ``text_delta``). Prints one JSON object: req/s, TTFT and end-to-end percentiles in ms,
output tokens per request (from each API's usage), failures. Loopback only, bounded by count and
``--time-limit``. Runs with aiohttp (the anchor's venv has it).

    python agent_api_load.py --url http://127.0.0.1:8000 --api responses --concurrency 32 --requests 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import string
import time
from urllib.parse import urlparse

import aiohttp

LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def prompt(rng: random.Random, shared_words: int, words: int) -> str:
    prefix = ("You are a helpful assistant answering questions about Python. " * 8).split()[:shared_words]
    tail = [
        "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 8))) for _ in range(words)
    ]
    return " ".join(prefix + tail)


def body(api: str, model: str, text: str, max_tokens: int) -> dict:
    if api == "chat":
        return {
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    if api == "responses":
        return {
            "model": model,
            "input": text,
            "max_output_tokens": max_tokens,
            "stream": True,
            "store": False,
        }
    return {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": True,
    }


# Byte markers of the events each API's measurement reads: the client parses only those lines, so
# an API's extra events (Responses' item and part events, each with the whole response object at
# the start and end) cost the client a substring scan, not a JSON parse, and the load measures the
# server rather than this client on the same two cores. The parsed event is still checked.
MARKERS = {
    "chat": (b'"content":', b'"usage":{'),
    "responses": (b'"response.output_text.delta"', b'"response.completed"', b'"response.incomplete"'),
    "messages": (b'"text_delta"', b'"message_delta"'),
}


def wanted(api: str, data: bytes, ttft_found: bool) -> bool:
    """Whether the event ``data`` may carry what is still to be measured: text before the first
    token, the usage at the end."""
    first, *last = MARKERS[api]
    return (not ttft_found and first in data) or any(marker in data for marker in last)


def first_text(api: str, event: dict) -> bool:
    """Whether ``event`` carries output text."""
    if api == "chat":
        return any((c.get("delta") or {}).get("content") for c in event.get("choices") or ())
    if api == "responses":
        return event.get("type") == "response.output_text.delta" and bool(event.get("delta"))
    return (
        event.get("type") == "content_block_delta" and (event.get("delta") or {}).get("type") == "text_delta"
    )


def output_tokens(api: str, event: dict) -> int | None:
    if api == "chat":
        usage = event.get("usage")
        return usage.get("completion_tokens") if usage else None
    if api == "responses":
        if event.get("type") in ("response.completed", "response.incomplete"):
            return event["response"]["usage"]["output_tokens"]
        return None
    if event.get("type") == "message_delta":
        return event["usage"]["output_tokens"]
    return None


async def one(session, url, api, payload, out):
    start = time.perf_counter()
    ttft = None
    tokens = None
    async with session.post(url, json=payload) as response:
        if response.status != 200:
            out["failed"] += 1
            out["errors"].append(f"{response.status}: {(await response.text())[:200]}")
            return
        async for raw in response.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            if not wanted(api, data, ttft is not None):
                continue
            event = json.loads(data)
            if ttft is None and first_text(api, event):
                ttft = time.perf_counter() - start
            got = output_tokens(api, event)
            if got is not None:
                tokens = got
    out["ttft"].append(ttft if ttft is not None else time.perf_counter() - start)
    out["e2e"].append(time.perf_counter() - start)
    if tokens is not None:
        out["tokens"].append(tokens)


def pct(xs, p):
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summary(xs):
    if not xs:
        return None
    return {"p50": round(pct(xs, 50) * 1000, 3), "p99": round(pct(xs, 99) * 1000, 3)}


async def main(args) -> None:
    host = urlparse(args.url).hostname
    if host not in LOOPBACK:
        raise SystemExit(f"--url must be a loopback address, got {host}")
    rng = random.Random(args.seed)
    texts = [prompt(rng, args.shared_words, args.words) for _ in range(args.requests)]
    url = args.url.rstrip("/") + PATHS[args.api]
    out = {"ttft": [], "e2e": [], "tokens": [], "failed": 0, "errors": []}
    queue = iter(texts)
    deadline = time.monotonic() + args.time_limit
    headers = {"x-api-key": "unused", "anthropic-version": "2023-06-01"} if args.api == "messages" else {}
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:
        model = (await (await session.get(args.url.rstrip("/") + "/v1/models")).json())["data"][0]["id"]

        async def worker():
            for text in queue:
                if time.monotonic() > deadline:
                    return
                try:
                    await one(session, url, args.api, body(args.api, model, text, args.max_tokens), out)
                except (TimeoutError, aiohttp.ClientError) as exc:
                    out["failed"] += 1
                    out["errors"].append(repr(exc)[:200])

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        elapsed = time.perf_counter() - start
    ok = len(out["e2e"])
    print(
        json.dumps(
            {
                "api": args.api,
                "concurrency": args.concurrency,
                "requests_ok": ok,
                "requests_failed": out["failed"],
                "req_per_s": round(ok / elapsed, 2),
                "ttft_ms": summary(out["ttft"]),
                "e2e_ms": summary(out["e2e"]),
                "output_tokens_mean": round(sum(out["tokens"]) / len(out["tokens"]), 2)
                if out["tokens"]
                else None,
                "errors": out["errors"][:3],
            }
        )
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api", choices=sorted(PATHS), default="chat")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--shared-words", type=int, default=32)
    ap.add_argument("--words", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=300)
    asyncio.run(main(ap.parse_args()))
