"""Malformed HTTP input that only a real ``dyn frontend`` process shows, with mocker workers: a
control character in a header is refused by the HTTP parser (httptools) before the app sees it,
and the answer is still an OpenAI error body; the OpenAI SDK, httpx and curl (with the JSON
Content-Type) get answers and curl without it a 415 that says what to send; ``--max-inflight``
under 10x overload answers full streams or immediate 503s with ``Retry-After`` in bounded memory.

The app's own answers to malformed bodies, headers, content types, routes and methods (issue 16's
probe), ``--max-inflight`` and a client leaving the router queue are tested in process in
tests/core/frontend/test_http_errors.py and test_http_serving.py.

The error body is OpenAI's ``{"error": {"message", "type", "param", "code"}}`` (OpenAI API
reference, "Error codes"; vLLM's ``ErrorResponse`` in vllm/entrypoints/openai/engine/protocol.py).
Dynamo 1.6.1 answers a non-JSON Content-Type with 415 (its ``ensure_json_content_type``, shown in
ai-dynamo/dynamo pull request 13268's table). The model is dyn's embedded ``dyn-tiny`` (vocabulary
4096, context 131072); the mocker's words are random tokens of it.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import subprocess
import threading
import time
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from tests.sse import sse_lines

pytestmark = pytest.mark.integration

MODEL = "dyn-tiny"
MESSAGES = b'"messages":[{"role":"user","content":"hi"}]'


def raw_exchange(url: str, request: bytes, timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` (a whole HTTP/1.1 request, ``connection: close``) on a new socket and read
    until the server closes it: (status, headers, body). No answer at all fails the test."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data, "the server closed the connection without an answer"
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {
        k.decode().lower(): v.decode("latin-1").strip()
        for k, _, v in (line.partition(b":") for line in lines[1:])
    }
    return status, headers, body


def raw_post(url: str, path: str, body: bytes, headers: dict[bytes, bytes] | None = None):
    fields = {
        b"host": b"dyn",
        b"connection": b"close",
        b"content-type": b"application/json",
        b"content-length": str(len(body)).encode(),
        **(headers or {}),
    }
    head = b"".join(k + b": " + v + b"\r\n" for k, v in fields.items())
    return raw_exchange(url, b"POST " + path.encode() + b" HTTP/1.1\r\n" + head + b"\r\n" + body)


def openai_error(status: int, body: bytes, expected: int, param: str | None = None) -> dict:
    assert status == expected, body[:500]
    error = json.loads(body)["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert set(error) == {"message", "type", "param", "code"}
    if param is not None:
        assert error["param"] == param, error
    return error


# --------------------------------------------------------------------------- headers


@pytest.mark.parametrize("value", [b"a\x01b", b"a\x7fb", b"a\x00b"], ids=["SOH", "DEL", "NUL"])
def test_a_control_character_in_x_request_id_is_an_openai_400(stack, value):
    """The HTTP parser refuses these before the app sees them; the answer is still JSON."""
    status, headers, answer = raw_post(
        stack.url, "/v1/chat/completions", b"{" + MESSAGES + b"}", {b"x-request-id": value}
    )
    openai_error(status, answer, 400)
    assert headers["content-type"] == "application/json"


def test_the_openai_sdk_httpx_json_and_curl_with_the_header_still_work(stack):
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert r.choices[0].message.role == "assistant"
    assert (
        httpx.post(
            stack.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30
        ).status_code
        == 200
    )
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    body = '{"prompt": "hi", "max_tokens": 2}'
    target = stack.url + "/v1/completions"
    with_header = subprocess.run(
        [
            "curl",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
            target,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert with_header.stdout == "200"
    without = subprocess.run(
        ["curl", "-s", "-d", body, target], capture_output=True, text=True, timeout=30, check=False
    )
    assert "send Content-Type: application/json" in json.loads(without.stdout)["error"]["message"]


# --------------------------------------------------------------------------- admission control


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _metric(url: str, name: str, labels: str = "") -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    match = re.search(rf"^{re.escape(name)}{{[^}}]*{re.escape(labels)}[^}}]*}} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


@pytest.fixture(scope="module")
def admission(stack_factory):
    """A frontend that serves at most 8 requests at once, over one unhurried mocker."""
    s = stack_factory("admission")
    s.start("worker", "mocker", "--namespace", s.namespace, "--speedup-ratio", "1")
    s.start_frontend("--max-inflight", "8")
    s.wait_instances(1)
    return s


def test_ten_times_overload_gets_full_answers_or_immediate_503s(admission):
    url, streams, max_tokens = admission.url, 80, 30
    pid = admission.frontend.proc.pid
    before = _rss_mib(pid)
    peak = {"rss": before, "active": 0.0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak["rss"] = max(peak["rss"], _rss_mib(pid))
            peak["active"] = max(peak["active"], _metric(url, "dynamo_frontend_active_requests"))
            time.sleep(0.05)

    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, object]:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"story {i}"}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return r.status_code, (r.headers.get("retry-after"), await r.aread())
            events = [line[6:] async for line in sse_lines(r) if line.startswith("data: ")]
            return 200, events

    async def overload() -> list[tuple[int, object]]:
        limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            return await asyncio.gather(*(one(client, i) for i in range(streams)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        results = asyncio.run(overload())
    finally:
        done.set()
        sampler.join(5)
    served = [r for status, r in results if status == 200]
    refused = [r for status, r in results if status == 503]
    print(
        f"{streams} streams at --max-inflight 8: {len(served)} served, {len(refused)} refused with 503; "
        f"frontend RSS {before:.0f} MiB before, {peak['rss']:.0f} MiB at peak"
    )
    assert len(served) + len(refused) == streams, [s for s, _ in results if s not in (200, 503)]
    assert served and refused
    for events in served:
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["usage"]["completion_tokens"] == max_tokens
    for retry_after, body in refused:
        assert retry_after == "1"
        assert "--max-inflight" in openai_error(503, body, 503)["message"]
    assert peak["active"] <= 8
    assert _metric(url, "dynamo_frontend_requests_rejected_total", 'reason="max_inflight"') == len(refused)
    assert peak["rss"] - before < 64, (before, peak)
