"""``--api-key`` closes every HTTP door but the probes: the frontend's ``/v1/*``, ``/metrics``
(unless ``--public-metrics``), ``/openapi.json`` and ``/kv/*`` (whose query view tells whether
another user's prompt is cached), ``dyn router``'s system port and ``dyn indexer``'s HTTP API.
``/live`` and ``/health`` stay open; the scheme is case-insensitive; the key is compared with
``hmac.compare_digest``; a refusal is a 401 with ``WWW-Authenticate: Bearer``.

The header format is RFC 6750's ``Authorization: Bearer <token>`` (the scheme case-insensitive per
RFC 9110 11.1), as vLLM's ``AuthenticationMiddleware`` reads it
(vllm/entrypoints/openai/server_utils.py: ``scheme.lower() != "bearer"``, ``secrets.compare_digest``
of SHA-256 digests). The frontend's 401 body is OpenAI's error object; the router's and indexer's
are dyn's ``{"error": "<sentence>"}``. The model is dyn's embedded ``dyn-tiny``.

The frontend's doors route by route (every route, the scheme's case, near-miss keys, CORS
preflights, ``--public-metrics``) are tested in process in tests/core/frontend/test_http_access.py;
here a real frontend process is checked end to end, with ``dyn inspect-kv``, the router and the
indexer.
"""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest

from dyn.core import api_key
from dyn.core.api_key import ApiKey
from dyn.core.indexer.service import READY_PREFIX as INDEXER_READY

pytestmark = pytest.mark.integration

KEY = "s3cret-k3y"
GOOD = {"authorization": f"Bearer {KEY}"}
MODEL = "dyn-tiny"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def call(url: str, method: str, path: str, body=None, headers=None) -> httpx.Response:
    return httpx.request(method, url + path, json=body, headers=headers, timeout=30)


def assert_refused(r: httpx.Response, openai_shape: bool = True) -> None:
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == "Bearer"
    error = r.json()["error"]
    message = error["message"] if openai_shape else error
    assert "Authorization: Bearer" in message
    if openai_shape:
        assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"


@pytest.fixture(scope="module")
def guarded(stack_factory):
    """A KV-routed frontend (so it serves ``/kv/``) with an API key, over one mocker worker."""
    return stack_factory("doors").up("--api-key", KEY, "--router-mode", "kv", workers=1)


def test_a_real_frontend_refuses_without_the_key_and_keeps_it_out_of_its_log(guarded):
    assert_refused(call(guarded.url, "GET", "/v1/models", headers={"authorization": "Bearer wrong"}))
    assert call(guarded.url, "POST", "/v1/chat/completions", CHAT, GOOD).status_code == 200
    assert call(guarded.url, "GET", "/live").status_code == 200
    assert KEY not in guarded.frontend.log()


def test_inspect_kv_reads_a_guarded_index_with_its_key(guarded):
    import subprocess
    import sys

    def inspect(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "dyn.cli", "inspect-kv", "--url", guarded.url, "--json", *extra],
            capture_output=True,
            text=True,
            timeout=60,
            env=guarded.env,
        )

    refused = inspect()
    assert refused.returncode == 1 and "401" in refused.stderr, refused.stderr
    allowed = inspect("--api-key", KEY)
    assert allowed.returncode == 0, allowed.stderr
    assert "workers" in json.loads(allowed.stdout)


def test_the_key_is_compared_with_compare_digest_of_digests(monkeypatch):
    seen: list[tuple[bytes, bytes]] = []

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return a == b

    monkeypatch.setattr(api_key.hmac, "compare_digest", spy)
    key = ApiKey(KEY)
    assert key.allows(f"bearer {KEY}".encode()) and not key.allows(b"Bearer x")
    digest = hashlib.sha256(KEY.encode()).digest()
    assert seen == [(digest, digest), (hashlib.sha256(b"x").digest(), digest)]
    assert KEY not in repr(key)


def test_an_empty_key_is_a_mistake():
    with pytest.raises(ValueError):
        ApiKey("")


# --------------------------------------------------------------------------- router and indexer


def _line_after(proc, prefix: str, wait_for) -> str:
    def found():
        for line in proc.log().splitlines():
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        assert proc.proc.poll() is None, proc.log()
        return None

    return wait_for(found, 60, f"{prefix!r} in the log")


def test_the_router_system_port_needs_the_key(dyn_process, wait_for):
    router = dyn_process(
        "router", "--namespace", "doors-router", "--port", "0", "--system-port", "0", "--api-key", KEY
    )
    metrics = _line_after(router, "dyn router metrics: ", wait_for)
    base = metrics.removesuffix("/metrics")
    for method, path, body in (
        ("GET", "/metrics", None),
        ("GET", "/kv/workers", None),
        ("POST", "/kv/query_by_hash", {"block_hashes": [1]}),
        ("GET", "/kv/dump", None),
        ("GET", "/nothing", None),
    ):
        assert_refused(call(base, method, path, body), openai_shape=False)
        assert_refused(call(base, method, path, body, {"authorization": "Bearer wrong"}), openai_shape=False)
        assert call(base, method, path, body, {"authorization": f"bearer {KEY}"}).status_code in (200, 404)
    assert call(base, "GET", "/metrics", headers=GOOD).status_code == 200
    assert KEY not in router.log()


def test_the_indexer_http_api_needs_the_key_but_health(dyn_process, wait_for):
    indexer = dyn_process(
        "indexer",
        "--namespace",
        "doors-indexer",
        "--http-port",
        "0",
        "--zmq-port",
        "0",
        "--block-size",
        "16",
        "--api-key",
        KEY,
    )
    fields = dict(part.split("=", 1) for part in _line_after(indexer, INDEXER_READY, wait_for).split())
    base = fields["http"]
    assert call(base, "GET", "/health").status_code == 200
    for method, path, body, status in (
        ("GET", "/workers", None, 200),
        ("GET", "/metrics", None, 200),
        ("GET", "/dump", None, 200),
        ("POST", "/query", {"token_ids": [1, 2, 3]}, 200),
        ("POST", "/query_by_hash", {"block_hashes": [1]}, 200),
        ("POST", "/register", {"instance_id": 1, "endpoint": "tcp://127.0.0.1:1"}, 201),
        ("POST", "/unregister", {"instance_id": 1}, 200),
    ):
        assert_refused(call(base, method, path, body), openai_shape=False)
        assert call(base, method, path, body, {"authorization": f"BEARER {KEY}"}).status_code == status
    assert KEY not in indexer.log()


def test_the_router_health_says_why_and_shows_worker_ids_only_with_the_key(stack_factory, wait_for):
    """A router with no worker is unhealthy and says why; a public probe learns how many workers
    it routes to, not which (issue 31: it listed them to anyone)."""
    stack = stack_factory("doors-health")
    router = stack.start(
        "router", "--namespace", stack.namespace, "--port", "0", "--system-port", "0", "--api-key", KEY
    )
    base = _line_after(router, "dyn router metrics: ", wait_for).removesuffix("/metrics")
    empty = call(base, "GET", "/health")
    assert empty.status_code == 503 and empty.json()["status"] == "unhealthy"
    assert "no live worker serves model" in empty.json()["reason"]
    stack.worker("--block-size", "16")
    wait_for(lambda: call(base, "GET", "/health").status_code == 200, 60, "the router to see its worker")
    public = call(base, "GET", "/health").json()
    assert public["status"] == "healthy" and public["workers"] == 1 and "instances" not in public
    assert len(call(base, "GET", "/health", headers=GOOD).json()["instances"]) == 1
