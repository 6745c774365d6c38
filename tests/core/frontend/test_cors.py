"""CORS decisions as Starlette's CORSMiddleware makes them for vLLM's flags."""

from __future__ import annotations

from dyn.core.frontend.cors import CorsPolicy


def test_wildcard_allows_any_origin_without_credentials():
    p = CorsPolicy()
    assert p.response_headers("https://a") == [(b"access-control-allow-origin", b"*")]
    status, headers = p.preflight("https://a", "POST", "Authorization, Content-Type")
    assert status == 200 and (b"access-control-allow-headers", b"authorization, content-type") in headers


def test_explicit_origins_methods_headers_and_credentials():
    p = CorsPolicy(("https://a",), ("POST",), ("authorization",), allow_credentials=True)
    assert (b"access-control-allow-credentials", b"true") in p.response_headers("https://a")
    assert p.response_headers("https://b") == []
    assert p.preflight("https://a", "POST", "authorization")[0] == 200
    assert p.preflight("https://a", "DELETE", "")[0] == 400
    assert p.preflight("https://a", "POST", "x-other")[0] == 400
    assert p.preflight("https://b", "POST", "")[0] == 400
