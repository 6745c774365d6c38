"""Who may call the frontend: ``api_key`` closes every door but the probes, CORS answers browsers,
in process over fake workers (``conftest.py``).

With a key every route needs it but ``/live`` and ``/health``: ``/v1/*``, ``/metrics`` (unless
``public_metrics``), ``/openapi.json`` and ``/kv/*`` (whose query view tells whether another user's
prompt is cached). The header is RFC 6750's ``Authorization: Bearer <token>``, the scheme
case-insensitive (RFC 9110 11.1), as vLLM's ``AuthenticationMiddleware`` reads it
(vllm/entrypoints/openai/server_utils.py); a refusal is a 401 with ``WWW-Authenticate: Bearer``
and OpenAI's error object. CORS follows Starlette's ``CORSMiddleware`` as vLLM configures it
(``--allowed-origins`` ...). The model is dyn's embedded ``dyn-tiny``. That the key stays out of a
real frontend's log, and ``dyn inspect-kv --api-key``, are checked against processes in
tests/reliability/test_doors_http.py.
"""

from __future__ import annotations

import httpx
import pytest

from dyn.core.frontend.cors import CorsPolicy

pytestmark = pytest.mark.anyio

KEY = "s3cret-k3y"
GOOD = {"authorization": f"Bearer {KEY}"}
MODEL = "dyn-tiny"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
ORIGIN = "https://app.example"

# (method, path, JSON body, status with the key)
ROUTES = [
    ("GET", "/v1/models", None, 200),
    ("POST", "/v1/chat/completions", CHAT, 200),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2}, 200),
    ("GET", "/metrics", None, 200),
    ("GET", "/openapi.json", None, 200),
    ("GET", "/kv/workers", None, 200),
    ("POST", "/kv/query", {"token_ids": list(range(64))}, 200),
    ("GET", "/kv/dump", None, 200),
    ("GET", "/v1/nothing", None, 404),
    ("GET", "/nothing", None, 404),
    ("DELETE", "/v1/models", None, 405),
]


@pytest.fixture
async def guarded(make_frontend):
    """A KV-routed frontend (so it serves ``/kv/``) with an API key and CORS for one origin."""
    async with make_frontend(
        workers=1, api_key=KEY, router_mode="kv", cors=CorsPolicy(allowed_origins=(ORIGIN,))
    ) as fe:
        yield fe


def assert_refused(r: httpx.Response) -> None:
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == "Bearer"
    error = r.json()["error"]
    assert "Authorization: Bearer" in error["message"]
    assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"


async def test_every_route_needs_the_key(guarded):
    for method, path, body, status in ROUTES:
        call = guarded.client.request
        assert_refused(await call(method, path, json=body))
        assert_refused(await call(method, path, json=body, headers={"authorization": "Bearer wrong"}))
        r = await call(method, path, json=body, headers=GOOD)
        assert r.status_code == status, (method, path, r.text[:300])
    assert len(guarded.fleet.requests) == 2  # only the two generate calls with the key got through


@pytest.mark.parametrize("path", ["/live", "/health"])
async def test_the_probes_stay_open(guarded, path):
    assert (await guarded.client.get(path)).status_code == 200


async def test_health_shows_worker_ids_only_to_holders_of_the_key(guarded):
    """A public probe learns whether requests can be served and how many workers serve them,
    not which instances: those ids go to callers with the key (issue 31)."""
    public = (await guarded.client.get("/health")).json()
    assert public["status"] == "healthy" and public["workers"] == 1 and "instances" not in public
    for header in ({"authorization": "Bearer wrong"}, {"authorization": KEY}):
        assert "instances" not in (await guarded.client.get("/health", headers=header)).json()
    assert (await guarded.client.get("/health", headers=GOOD)).json()["instances"] == [1]


@pytest.mark.parametrize(
    "authorization", [f"bearer {KEY}", f"BEARER {KEY}", f"BeArEr {KEY}", f"Bearer  {KEY}"]
)
async def test_the_scheme_is_case_insensitive(guarded, authorization):
    assert (
        await guarded.client.get("/v1/models", headers={"authorization": authorization})
    ).status_code == 200


@pytest.mark.parametrize(
    "authorization",
    [
        "",
        "Bearer",
        f"Basic {KEY}",
        f"Bearer{KEY}",
        f"Bearer {KEY[:-1]}",
        f"Bearer {KEY}x",
        f"Bearer {KEY.upper()}",
        f"Token {KEY}",
        KEY,
    ],
)
async def test_anything_but_the_exact_key_is_refused(guarded, authorization):
    assert_refused(await guarded.client.get("/v1/models", headers={"authorization": authorization}))


async def test_a_cors_preflight_needs_no_key_and_a_refusal_keeps_the_cors_headers(guarded):
    """Browsers send preflights without credentials; the 401 must stay readable by the page."""
    pre = await guarded.client.options(
        "/v1/chat/completions",
        headers={
            "origin": ORIGIN,
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type",
        },
    )
    assert pre.status_code == 200
    assert pre.headers["access-control-allow-origin"] == ORIGIN
    refused = await guarded.client.post("/v1/chat/completions", json=CHAT, headers={"origin": ORIGIN})
    assert_refused(refused)
    assert refused.headers["access-control-allow-origin"] == ORIGIN


async def test_cors_refuses_other_origins_and_marks_simple_requests(guarded):
    bad = await guarded.client.options(
        "/v1/chat/completions",
        headers={"origin": "https://evil.example", "access-control-request-method": "POST"},
    )
    assert bad.status_code == 400
    simple = await guarded.client.get("/health", headers={"origin": ORIGIN})
    assert simple.headers["access-control-allow-origin"] == ORIGIN
    other = await guarded.client.get("/health", headers={"origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers


async def test_public_metrics_opens_metrics_only(make_frontend):
    async with make_frontend(workers=0, api_key=KEY, public_metrics=True) as fe:
        r = await fe.client.get("/metrics")
        assert r.status_code == 200 and "dynamo_frontend_requests_total" in r.text
        for path in ("/v1/models", "/openapi.json"):
            assert_refused(await fe.client.get(path))


async def test_without_a_key_every_route_is_open(frontend):
    for path in ("/v1/models", "/metrics", "/openapi.json"):
        assert (await frontend.client.get(path)).status_code == 200
