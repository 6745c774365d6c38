"""This session's server extras through the official SDKs against a real default ``dyn serve``
(the mocker): ``stream_options.continuous_usage_stats`` with the ``openai`` client, documents by
URL with the ``openai`` Responses client and the ``anthropic`` client (fetched from a loopback
HTTP server this test runs), Claude Code's billing line dropped from a chat completion's system
message, and ``GET /tokenizer_info`` behind ``--enable-tokenizer-info-endpoint``."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import anthropic
import httpx
import openai
import pytest

from tests.integration.conftest import serve_ready_url

pytestmark = pytest.mark.integration
NOTES = b"Quarterly notes: revenue grew 12 percent."


@contextmanager
def file_server() -> Iterator[str]:
    """A loopback HTTP server on a free port answering every GET with ``NOTES``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/plain")
            self.send_header("content-length", str(len(NOTES)))
            self.end_headers()
            self.wfile.write(NOTES)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/notes.txt"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_the_sdks_use_the_server_extras_against_a_real_stack(dyn_process):
    proc = dyn_process("serve", "--http-port", "0", "--workers", "1", "--enable-tokenizer-info-endpoint")
    url = serve_ready_url(proc)
    base = url.removesuffix("/v1")
    oa = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
    stream = oa.chat.completions.create(
        model="dyn-tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    chunks = list(stream)
    assert all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in chunks if c.choices]
    assert counts == sorted(counts) and counts[-1] == chunks[-1].usage.completion_tokens == 12

    header = "x-anthropic-billing-header: cc_version=2.1.332.f00; cch={};\n" + "You are Claude Code. " * 60
    usages = [
        oa.chat.completions.create(
            model="dyn-tiny",
            messages=[{"role": "system", "content": header.format(cch)}, {"role": "user", "content": "hi"}],
            max_tokens=2,
        ).usage
        for cch in ("7a1b2", "9c3d4")
    ]
    assert usages[0].prompt_tokens == usages[1].prompt_tokens
    # the same prompt, all but its last partial block found in the cache (with the line kept, the
    # prompts part at its cch value, in the first block)
    assert usages[1].prompt_tokens_details.cached_tokens >= usages[1].prompt_tokens - 64

    with file_server() as notes_url:
        turn = {
            "role": "user",
            "content": [
                {"type": "input_file", "file_url": notes_url},
                {"type": "input_text", "text": "Sum up."},
            ],
        }
        plain = {"role": "user", "content": [{"type": "input_text", "text": "Sum up."}]}
        with_file = oa.responses.create(model="dyn-tiny", input=[turn], max_output_tokens=4)
        without = oa.responses.create(model="dyn-tiny", input=[plain], max_output_tokens=4)
        assert with_file.status in ("completed", "incomplete")
        assert with_file.usage.input_tokens > without.usage.input_tokens  # the fetched text is in the prompt
        ac = anthropic.Anthropic(base_url=base, api_key="x", max_retries=0, timeout=60)
        document = {"type": "document", "source": {"type": "url", "url": notes_url}}
        counted = ac.messages.count_tokens(
            model="dyn-tiny",
            messages=[{"role": "user", "content": [document, {"type": "text", "text": "Sum up."}]}],
        )
        bare = ac.messages.count_tokens(model="dyn-tiny", messages=[{"role": "user", "content": "Sum up."}])
        assert counted.input_tokens > bare.input_tokens
        message = ac.messages.create(
            model="dyn-tiny",
            max_tokens=4,
            messages=[{"role": "user", "content": [document, {"type": "text", "text": "Sum up."}]}],
        )
        assert message.usage.input_tokens == counted.input_tokens
        ftp = {"type": "document", "source": {"type": "url", "url": "ftp://127.0.0.1/a.pdf"}}
        with pytest.raises(anthropic.BadRequestError) as bad:
            ac.messages.create(model="dyn-tiny", max_tokens=4, messages=[{"role": "user", "content": [ftp]}])
        assert "not an http(s) URL" in str(bad.value)

    info = httpx.get(base + "/tokenizer_info", timeout=30).json()
    assert info["tokenizer_class"] and "vocab_file" not in info
