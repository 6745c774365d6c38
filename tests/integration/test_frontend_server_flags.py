"""vLLM's server flags on a real ``dyn frontend`` over mocker workers (issue 18 item 5): what a
user sees through the ``openai`` client and in the JSON log.

- ``--root-path``: vLLM sets FastAPI's ``root_path`` only (``vllm/entrypoints/openai/
  api_server.py build_app``), so a client reaches the server both through the proxy's prefix and
  directly; ``/openapi.json`` lists the prefix in ``servers``.
- ``--enable-log-requests`` / ``--max-log-len``: vLLM's ``RequestLogger.log_inputs``
  (``vllm/entrypoints/serve/utils/request_logger.py``) logs ``Received request ID: params: ...``
  at info and the prompt with its token ids, cut to ``--max-log-len``, at debug; the old
  ``--disable-log-requests`` is accepted and deprecated (vLLM >= 0.10.2 logs nothing by default).
- ``--uvicorn-log-level``: uvicorn's own loggers (``uvicorn.error``, ``uvicorn.access``,
  ``uvicorn.asgi``) at that level (vLLM passes it as uvicorn's ``log_level``), whatever
  ``--log-level`` says.
- ``--disable-fastapi-docs``: ``/openapi.json`` is a 404.
"""

from __future__ import annotations

import json

import httpx
import pytest

from dyn.core.serve import parse_listening_url
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

openai = pytest.importorskip("openai")


def start_frontend(stack, *args: str, log_level: str = "info"):
    """``dyn --log-format json --log-level L frontend ARGS`` over ``stack``'s workers; its URL."""
    proc = stack.start(
        "--log-format",
        "json",
        "--log-level",
        log_level,
        "frontend",
        "--http-port",
        "0",
        "--namespace",
        stack.namespace,
        *args,
    )

    def listening():
        for line in proc.log().splitlines():
            url = parse_listening_url(line)
            if url:
                return url
        if proc.proc.poll() is not None:
            raise AssertionError(f"frontend exited:\n{proc.log()}")
        return None

    url = poll_until(listening, 60, "the frontend to listen")
    poll_until(
        lambda: httpx.get(f"{url}/health", timeout=5).status_code == 200, 60, "a routable worker at " + url
    )
    return proc, url


def records(proc) -> list[dict]:
    out = []
    for line in proc.log().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


@pytest.fixture(scope="module")
def stack(stack_factory):
    s = stack_factory("flags")
    s.worker("--block-size", "16")
    return s


def test_root_path_behind_a_prefix_and_direct(stack):
    _, url = start_frontend(stack, "--root-path", "/llm")
    for base in (f"{url}/llm/v1", f"{url}/v1"):
        with openai.OpenAI(base_url=base, api_key="unused", max_retries=0) as client:
            reply = client.chat.completions.create(
                model="dyn-tiny",
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=2,
                extra_body={"ignore_eos": True},
            )
            assert reply.usage.completion_tokens == 2, base
    assert httpx.get(f"{url}/llm/openapi.json").json()["servers"] == [{"url": "/llm"}]


def test_requests_are_logged_as_json_cut_to_max_log_len(stack):
    proc, url = start_frontend(stack, "--enable-log-requests", "--max-log-len", "5", log_level="debug")
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        client.completions.create(
            model="dyn-tiny",
            prompt="The quick brown fox jumps over the lazy dog",
            max_tokens=3,
            temperature=0.7,
            extra_headers={"x-request-id": "log-me"},
        )
    logged = poll_until(
        lambda: [r for r in records(proc) if r.get("request_id") == "log-me"] or None,
        10,
        "the request's log lines",
    )
    by_level = {r["level"]: r for r in logged}
    info = by_level["info"]
    assert info["message"].startswith("Received request log-me: params:")
    assert info["params"]["temperature"] == 0.7 and info["params"]["max_tokens"] == 3
    debug = by_level["debug"]
    assert debug["prompt"] == "The q" and len(debug["prompt_token_ids"]) == 5


def test_deprecated_disable_log_requests_logs_nothing(stack):
    proc, url = start_frontend(stack, "--disable-log-requests", log_level="debug")
    httpx.post(
        f"{url}/v1/completions",
        json={"prompt": "hello", "max_tokens": 1},
        headers={"x-request-id": "quiet"},
        timeout=30,
    ).raise_for_status()
    lines = records(proc)
    assert any("--disable-log-requests is deprecated" in r["message"] for r in lines)
    assert not [r for r in lines if "Received request" in r["message"]]


def test_uvicorn_log_level_is_independent_of_log_level(stack):
    loud, loud_url = start_frontend(stack, "--uvicorn-log-level", "trace", log_level="info")
    httpx.get(f"{loud_url}/live", timeout=5)
    poll_until(
        lambda: any(r["level"] == "trace" and r["logger"].startswith("uvicorn") for r in records(loud)),
        10,
        "uvicorn's trace lines",
    )
    quiet, quiet_url = start_frontend(stack, "--uvicorn-log-level", "warning", log_level="info")
    httpx.get(f"{quiet_url}/live", timeout=5)
    # uvicorn says "Started server process" at info; dyn's own info lines still show
    assert not [r for r in records(quiet) if r["logger"].startswith("uvicorn")]
    assert any(r["logger"] == "dyn.status" for r in records(quiet))
    assert any(r["logger"].startswith("uvicorn") and "Started server" in r["message"] for r in records(loud))


def test_disable_fastapi_docs(stack):
    _, url = start_frontend(stack, "--disable-fastapi-docs")
    assert httpx.get(f"{url}/openapi.json").status_code == 404
    assert httpx.get(f"{url}/v1/models").status_code == 200
