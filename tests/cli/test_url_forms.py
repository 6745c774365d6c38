"""Every ``--url`` flag takes a server's root (``http://HOST:PORT``) and the OpenAI ``base_url`` form
(``http://HOST:PORT/v1``, what ``dyn serve`` prints), with or without a trailing slash (issue 18,
item 10); a malformed URL is one line naming the flag.

``dyn bench`` runs against a real HTTP server on a free loopback port that answers like an OpenAI
server (``GET /v1/models``, streamed ``POST /v1/chat/completions`` with a final usage chunk and
``data: [DONE]``, as the OpenAI API reference's streaming section and vLLM's
``vllm/entrypoints/openai/serving_chat.py`` send them) and records every path it is asked for.
``dyn inspect-kv`` reads the known index state of ``tests/core/inspect/index_state.py`` under
``/kv`` (where a frontend serves its views), as the inspector's own tests do.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from dyn.cli.app import app
from dyn.core.errors import ConfigError
from dyn.core.inspect import command
from dyn.core.inspect.target import open_target
from dyn.core.server_url import server_root
from tests.core.inspect.index_state import MODEL, asgi_client, kv_app

runner = CliRunner()
FORMS = ["", "/", "/v1", "/v1/"]


class OpenAIShaped(BaseHTTPRequestHandler):
    """Answers /v1/models and streamed chat completions; 404 for anything else."""

    paths: list[str]

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.paths.append(self.path)
        if self.path == "/v1/models":
            self._send(
                200, json.dumps({"object": "list", "data": [{"id": "m1"}]}).encode(), "application/json"
            )
        else:
            self._send(404, b'{"error": {"message": "no route"}}', "application/json")

    def do_POST(self) -> None:
        self.paths.append(self.path)
        self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path != "/v1/chat/completions":
            self._send(404, b'{"error": {"message": "no route"}}', "application/json")
            return
        chunks = [
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
            {"choices": [], "usage": {"prompt_tokens": 16, "completion_tokens": 1}},
        ]
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        self._send(200, body.encode(), "text/event-stream")


@pytest.fixture
def openai_server() -> Iterator[tuple[str, list[str]]]:
    """``(http://127.0.0.1:PORT, the paths asked for so far)``."""
    paths: list[str] = []
    handler = type("Handler", (OpenAIShaped,), {"paths": paths})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", paths
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.parametrize("suffix", FORMS)
def test_bench_reaches_the_server_through_either_form(openai_server, suffix, tmp_path):
    root, paths = openai_server
    out = tmp_path / "result.json"
    result = runner.invoke(
        app,
        ["bench", "--url", root + suffix, "--prefix", "--groups", "1", "--per-group", "2", "--isl", "16"]
        + ["--max-tokens", "1", "--no-progress", "--timeout", "10", "--output", str(out)],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(out.read_text())["summary"]
    assert (summary["requests"], summary["succeeded"]) == (2, 2) and summary["errors"] == {}
    assert paths == ["/v1/models", "/v1/chat/completions", "/v1/chat/completions"]


@pytest.mark.parametrize("suffix", FORMS)
def test_inspect_kv_reads_a_frontends_views_through_either_form(monkeypatch, suffix):
    seen: list[str] = []

    def served(url: str, **_: object):
        seen.append(url)
        return open_target(url, client=asgi_client(kv_app(prefix="/kv")))

    monkeypatch.setattr(command, "open_target", served)
    result = runner.invoke(app, ["inspect-kv", "--url", "http://frontend:8000" + suffix, "--json"])
    assert result.exit_code == 0, result.output
    snapshot = json.loads(result.output)
    assert seen == ["http://frontend:8000"]
    assert (snapshot["target"], snapshot["model"]) == ("http://frontend:8000/kv", MODEL)


@pytest.mark.parametrize(
    ("command_args", "status"),
    [(["bench", "--prefix", "--url"], 2), (["inspect-kv", "--url"], 1)],
)
@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("127.0.0.1:8000", "is not an HTTP URL"),
        ("ftp://127.0.0.1:8000", "is not an HTTP URL"),
        ("http://:8000/v1", "names no host"),
        ("http://127.0.0.1:99999/v1", "has a bad port"),
        ("http://127.0.0.1:8000/v1?x=1", "carries a query or fragment"),
    ],
)
def test_a_malformed_url_is_one_line_naming_the_flag(command_args, status, url, message):
    result = runner.invoke(app, [*command_args, url])
    assert result.exit_code == status, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --url {url!r} {message}"), result.output


def test_the_root_keeps_a_proxy_prefix_and_any_other_path():
    assert server_root("https://gw.example/team/v1/") == "https://gw.example/team"
    assert server_root("HTTP://127.0.0.1:8090/kv") == "http://127.0.0.1:8090/kv"
    assert server_root(" http://[::1]:8000/v1 ") == "http://[::1]:8000"
    with pytest.raises(ConfigError, match="^--indexer-url 'x' is not an HTTP URL"):
        server_root("x", flag="--indexer-url")
