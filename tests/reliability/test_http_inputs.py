"""Malformed HTTP input against a real ``dyn frontend`` and mocker workers: every probe of issue 16
is answered with a 4xx and an OpenAI error body, never a 500 and never a dropped connection; the
body must be ``application/json`` (415 otherwise, as Dynamo answers); ``--max-inflight`` answers
503 with ``Retry-After`` beyond capacity; a client that leaves while its request waits in the
router queue takes it out of the queue.

The error body is OpenAI's ``{"error": {"message", "type", "param", "code"}}`` (OpenAI API
reference, "Error codes"; vLLM's ``ErrorResponse`` in vllm/entrypoints/openai/engine/protocol.py).
Dynamo 1.6.1 answers a non-JSON Content-Type with 415 (its ``ensure_json_content_type``, shown in
ai-dynamo/dynamo pull request 13268's table). The model is dyn's embedded ``dyn-tiny`` (vocabulary
4096, context 8192); the mocker's words are random tokens of it.
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
import msgspec
import openai
import pytest

from dyn.core.protocol.openai import ChatCompletionRequest, CompletionRequest

pytestmark = pytest.mark.integration

MODEL = "dyn-tiny"
MESSAGES = b'"messages":[{"role":"user","content":"hi"}]'
HUGE = b"100000000000000000000000"  # > 2**64
JSON_TYPE = {"content-type": "application/json"}


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
    headers = {k.decode().lower(): v.decode("latin-1").strip()
               for k, _, v in (line.partition(b":") for line in lines[1:])}
    return status, headers, body


def raw_post(url: str, path: str, body: bytes, headers: dict[bytes, bytes] | None = None):
    fields = {b"host": b"dyn", b"connection": b"close", b"content-type": b"application/json",
              b"content-length": str(len(body)).encode(), **(headers or {})}
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


# --------------------------------------------------------------------------- the probe's bodies

PROBES = [  # (name, endpoint, body, the param the 400 names)
    ("seed above 2**64", "/v1/chat/completions", b'{' + MESSAGES + b',"seed":' + HUGE + b'}', "seed"),
    ("seed above int64", "/v1/chat/completions", b'{' + MESSAGES + b',"seed":9223372036854775808}', "seed"),
    ("seed below int64", "/v1/chat/completions", b'{' + MESSAGES + b',"seed":-9223372036854775809}', "seed"),
    ("top_k above 2**64", "/v1/chat/completions", b'{' + MESSAGES + b',"top_k":' + HUGE + b'}', "top_k"),
    ("priority above 2**64", "/v1/chat/completions", b'{' + MESSAGES + b',"priority":' + HUGE + b'}',
     "priority"),
    ("priority below int32", "/v1/chat/completions", b'{' + MESSAGES + b',"priority":-2147483649}',
     "priority"),
    ("agent_hints.priority above 2**64", "/v1/chat/completions",
     b'{' + MESSAGES + b',"nvext":{"agent_hints":{"priority":' + HUGE + b'}}}', "nvext.agent_hints.priority"),
    ("stop_token_ids above 2**64", "/v1/chat/completions",
     b'{' + MESSAGES + b',"stop_token_ids":[1,' + HUGE + b']}', "stop_token_ids[1]"),
    ("stop_token_ids negative", "/v1/chat/completions", b'{' + MESSAGES + b',"stop_token_ids":[-5]}',
     "stop_token_ids[0]"),
    ("max_tokens above 2**64", "/v1/chat/completions", b'{' + MESSAGES + b',"max_tokens":' + HUGE + b'}',
     "max_tokens"),
    ("n above 2**64", "/v1/chat/completions", b'{' + MESSAGES + b',"n":' + HUGE + b'}', "n"),
    ("min_tokens above 2**64", "/v1/chat/completions", b'{' + MESSAGES + b',"min_tokens":' + HUGE + b'}',
     "min_tokens"),
    ("truncate_prompt_tokens above 2**64", "/v1/chat/completions",
     b'{' + MESSAGES + b',"truncate_prompt_tokens":' + HUGE + b'}', "truncate_prompt_tokens"),
    ("session timeout above 2**64", "/v1/chat/completions",
     b'{' + MESSAGES + b',"nvext":{"session_control":{"session_id":"s","action":"open","timeout":'
     + HUGE + b'}}}', "nvext.session_control.timeout"),
    ("cache_control ttl above 2**64", "/v1/chat/completions",
     b'{' + MESSAGES + b',"nvext":{"cache_control":{"type":"ephemeral","ttl":' + HUGE + b'}}}',
     "nvext.cache_control.ttl"),
    ("dp_rank negative", "/v1/chat/completions", b'{' + MESSAGES + b',"nvext":{"dp_rank":-1}}',
     "nvext.dp_rank"),
    ("completions seed above 2**64", "/v1/completions", b'{"prompt":"hi","seed":' + HUGE + b'}', "seed"),
    ("completions logprobs above 2**64", "/v1/completions", b'{"prompt":"hi","logprobs":' + HUGE + b'}',
     "logprobs"),
    ("invalid UTF-8 in the content", "/v1/chat/completions",
     b'{"messages":[{"role":"user","content":"\xff\xfe"}]}', None),
    ("invalid UTF-8 in request_id", "/v1/chat/completions", b'{' + MESSAGES + b',"request_id":"a\xc3"}',
     None),
    ("lone surrogate in request_id", "/v1/chat/completions", b'{' + MESSAGES + rb',"request_id":"\ud800"}',
     None),
    ("lone surrogate in the content", "/v1/chat/completions",
     b'{"messages":[{"role":"user","content":"a\\udc00b"}]}', None),
    ("control character in request_id", "/v1/chat/completions",
     b'{' + MESSAGES + rb',"request_id":"a\u0001b"}', "request_id"),
    ("newline in request_id", "/v1/chat/completions", b'{' + MESSAGES + rb',"request_id":"a\nb"}',
     "request_id"),
    ("non-latin-1 request_id", "/v1/chat/completions", b'{' + MESSAGES + rb',"request_id":"\u4e2d"}',
     "request_id"),
    ("request_id of 10,000 characters", "/v1/chat/completions",
     b'{' + MESSAGES + b',"request_id":"' + b"r" * 10_000 + b'"}', "request_id"),
    ("empty body", "/v1/chat/completions", b"", None),
    ("null body", "/v1/chat/completions", b"null", None),
    ("array body", "/v1/completions", b"[]", None),
    ("string body", "/v1/completions", b'"prompt"', None),
    ("number body", "/v1/completions", b"1e999", None),
]


@pytest.mark.parametrize("name, path, body, param", PROBES, ids=[p[0] for p in PROBES])
def test_probe_bodies_are_400_with_an_openai_error(stack, name, path, body, param):
    status, _, answer = raw_post(stack.url, path, body)
    openai_error(status, answer, 400, param)


@pytest.mark.parametrize("body", [
    b"[" * 100_000,
    b'{"messages":[{"role":"user","content":"hi"}],"x":' + b"[" * 100_000,
    b'{"messages":[{"role":"user","content":' + b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b"}]}",
], ids=["bare", "in an unknown field", "in a message"])
def test_deeply_nested_json_is_a_quick_400(stack, body):
    started = time.perf_counter()
    status, _, answer = raw_post(stack.url, "/v1/chat/completions", body)
    openai_error(status, answer, 400)
    assert time.perf_counter() - started < 5
    assert httpx.get(stack.url + "/live", timeout=5).status_code == 200


def _wrong_types(kind: type[msgspec.Struct], required: bytes) -> list[tuple[str, bytes]]:
    """For every field of ``kind``, the request with that field set to values of the wrong JSON
    type for most fields (an object, a string, nested arrays, a huge float); ``required`` (which
    holds ``max_tokens``: 2, so accepted cases stay short) comes first, the field last (when it
    is one of ``required``'s, the later key wins)."""
    cases = []
    for field in kind.__struct_fields__:
        for value in (b'{"wrong":[1,{"x":null}]}', b'"not-this"', b"[[[]]]", b"-1.5e300"):
            cases.append((f"{field}={value.decode()}",
                          b"{" + required + b',"' + field.encode() + b'":' + value + b"}"))
    return cases


WRONG_TYPES = [("/v1/chat/completions", *case)
               for case in _wrong_types(ChatCompletionRequest, MESSAGES + b',"max_tokens":2')]
WRONG_TYPES += [("/v1/completions", *case)
                for case in _wrong_types(CompletionRequest, b'"prompt":"hi","max_tokens":2')]


@pytest.mark.parametrize("path, name, body", WRONG_TYPES, ids=[f"{p[4:]}:{n}" for p, n, _ in WRONG_TYPES])
def test_wrong_json_types_in_every_field_are_answered_without_a_server_error(stack, path, name, body):
    status, _, answer = raw_post(stack.url, path, body)
    assert 200 <= status < 500, answer[:300]
    if status >= 400:
        openai_error(status, answer, status)


ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/embeddings", "/v1/", "/v1",
          "/health", "/live", "/metrics", "/openapi.json", "/kv/query", "/", "/%ff", "/v1/chat/completions/x"]


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"])
def test_every_route_and_method_is_answered_without_a_server_error(stack, method):
    for route in ROUTES:
        body = b"" if method in ("GET", "HEAD", "OPTIONS") else b'{"prompt":"hi","max_tokens":1}'
        request = (f"{method} {route} HTTP/1.1\r\nhost: dyn\r\nconnection: close\r\n"
                   f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body
        status, _, answer = raw_exchange(stack.url, request)
        assert status < 500, (method, route, answer[:300])
        if status >= 400 and method != "HEAD":
            openai_error(status, answer, status)


# --------------------------------------------------------------------------- headers


@pytest.mark.parametrize("value", [b"a\x01b", b"a\x7fb", b"a\x00b"], ids=["SOH", "DEL", "NUL"])
def test_a_control_character_in_x_request_id_is_an_openai_400(stack, value):
    """The HTTP parser refuses these before the app sees them; the answer is still JSON."""
    status, headers, answer = raw_post(stack.url, "/v1/chat/completions", b'{' + MESSAGES + b'}',
                                       {b"x-request-id": value})
    openai_error(status, answer, 400)
    assert headers["content-type"] == "application/json"


@pytest.mark.parametrize("value", [b"caf\xe9", "中文".encode(), b"a b", b"x" * 300],
                         ids=["latin-1", "utf-8", "space", "too long"])
def test_an_x_request_id_that_cannot_be_echoed_is_a_400_naming_it(stack, value):
    status, _, answer = raw_post(stack.url, "/v1/chat/completions", b'{' + MESSAGES + b'}',
                                 {b"x-request-id": value})
    openai_error(status, answer, 400, "x-request-id")


def test_a_valid_x_request_id_is_echoed_byte_for_byte(stack):
    rid = b"req-2026_11.23:abc/DEF+~!"
    status, headers, answer = raw_post(stack.url, "/v1/chat/completions",
                                       b'{' + MESSAGES + b',"max_tokens":2}', {b"x-request-id": rid})
    assert status == 200, answer
    assert headers["x-request-id"] == rid.decode()
    assert json.loads(answer)["id"].endswith(rid.decode())


# --------------------------------------------------------------------------- content type


@pytest.mark.parametrize("content_type", [None, b"text/plain", b"application/x-www-form-urlencoded",
                                          b"multipart/form-data; boundary=x", b"application/jsonp",
                                          b"application/vnd.api+json", b""])
def test_a_body_that_is_not_declared_json_is_415(stack, content_type):
    body = b'{' + MESSAGES + b',"max_tokens":2}'
    fields = {b"host": b"dyn", b"connection": b"close", b"content-length": str(len(body)).encode()}
    if content_type is not None:
        fields[b"content-type"] = content_type
    head = b"".join(k + b": " + v + b"\r\n" for k, v in fields.items())
    request = b"POST /v1/chat/completions HTTP/1.1\r\n" + head + b"\r\n" + body
    status, _, answer = raw_exchange(stack.url, request)
    error = openai_error(status, answer, 415)
    assert "Content-Type: application/json" in error["message"]
    if content_type == b"application/x-www-form-urlencoded":
        assert "curl -d" in error["message"]


@pytest.mark.parametrize("content_type", [b"application/json", b"application/json; charset=utf-8",
                                          b"Application/JSON", b"APPLICATION/JSON;charset=UTF-8",
                                          b"application/json ; charset=utf-8"])
def test_json_content_types_are_accepted_in_any_case_with_parameters(stack, content_type):
    status, _, answer = raw_post(stack.url, "/v1/completions", b'{"prompt":"hi","max_tokens":2}',
                                 {b"content-type": content_type})
    assert status == 200, answer


def test_the_openai_sdk_httpx_json_and_curl_with_the_header_still_work(stack):
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=2)
    assert r.choices[0].message.role == "assistant"
    assert httpx.post(stack.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                      timeout=30).status_code == 200
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    body = '{"prompt": "hi", "max_tokens": 2}'
    target = stack.url + "/v1/completions"
    with_header = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H",
                                  "Content-Type: application/json", "-d", body, target],
                                 capture_output=True, text=True, timeout=30, check=False)
    assert with_header.stdout == "200"
    without = subprocess.run(["curl", "-s", "-d", body, target],
                             capture_output=True, text=True, timeout=30, check=False)
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
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"story {i}"}],
                "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return r.status_code, (r.headers.get("retry-after"), await r.aread())
            events = [line[6:] async for line in r.aiter_lines() if line.startswith("data: ")]
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
    print(f"{streams} streams at --max-inflight 8: {len(served)} served, {len(refused)} refused with 503; "
          f"frontend RSS {before:.0f} MiB before, {peak['rss']:.0f} MiB at peak")
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


# --------------------------------------------------------------------------- disconnect while queued


@pytest.fixture(scope="module")
def queueing(stack_factory):
    """A KV-routed frontend whose router queues every request while its one slow worker has any
    prefill in flight (threshold 0.0001 of the worker's batch budget); bookings are kept until
    the first token however long the prefill takes (no unstarted-booking expiry)."""
    s = stack_factory("queueing")
    s.start("worker", "mocker", "--namespace", s.namespace, "--speedup-ratio", "0.002",
            "--drain-timeout", "0")
    s.start_frontend("--router-mode", "kv", "--router-queue-threshold", "0.0001",
                     "--router-unstarted-booking-secs", "0")
    s.wait_instances(1)
    return s


def _open_post(url: str, body: dict) -> socket.socket:
    """A POST left open on its own socket: closing the socket is the client leaving."""
    data = json.dumps(body).encode()
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: dyn\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n" % len(data) + data)
    return sock


def _received(sock: socket.socket) -> bytes:
    """Whatever the server has sent on ``sock`` so far, without waiting."""
    sock.setblocking(False)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except BlockingIOError:
        pass
    return data


def test_a_client_that_leaves_while_queued_leaves_the_router_queue(queueing):
    url = queueing.url
    queued = "dynamo_frontend_router_queue_pending_requests"
    # A long prefill (1,000 prompt tokens at 1/500 speed: about 15 s) keeps the worker busy.
    blocker = _open_post(url, {"model": MODEL, "prompt": [7] * 1000, "max_tokens": 1, "stream": True})
    waiter = None
    try:
        deadline = time.monotonic() + 30
        while _metric(url, "dynamo_frontend_worker_active_prefill_tokens") <= 0:
            assert time.monotonic() < deadline, "the blocker never started its prefill"
            time.sleep(0.05)
        waiter = _open_post(url, {"model": MODEL, "prompt": [9] * 50, "max_tokens": 1})
        deadline = time.monotonic() + 10
        while _metric(url, queued) < 1:
            assert time.monotonic() < deadline, "the second request was never queued"
            time.sleep(0.02)
        waiter.close()
        left = time.monotonic()
        while _metric(url, queued) > 0:
            assert time.monotonic() - left < 3, "the queued request stayed queued after its client left"
            time.sleep(0.02)
        assert b"data: " not in _received(blocker), "the blocker's prefill ended first: nothing was shown"
        assert _metric(url, "dynamo_frontend_client_disconnects_total") >= 1
    finally:
        blocker.close()
        if waiter is not None:
            waiter.close()
