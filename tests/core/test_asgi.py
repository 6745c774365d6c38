"""``dyn.core.asgi.HeadWithBody``: a response's head and its first body in one write (a
recording transport counts the writes), and the protocol that uses it serving a raw client over
a real socket; ``respond_parts``: a body given in parts, written whole or about a megabyte at a
time."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dyn.core.asgi import (
    DISCONNECT_HOOK,
    WRITE_BYTES,
    DisconnectHook,
    HeadWithBody,
    json_error_protocol,
    respond_parts,
)

pytestmark = pytest.mark.anyio


class Recording:
    """A transport that keeps each write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name in ("peername", "sockname") else default


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[int]:
    """Serve ``app`` with the frontend's protocol on a free loopback port, for at most 10 s;
    yields the port."""
    import uvicorn

    protocol = json_error_protocol(lambda reason: b'{"error": "bad"}')
    config = uvicorn.Config(app, host="127.0.0.1", port=0, http=protocol, lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(10):
            while not server.started:
                await asyncio.sleep(0.01)
            yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        await task


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"


async def test_the_head_goes_out_with_the_first_body_write():
    inner = Recording()
    transport = HeadWithBody(inner, asyncio.get_running_loop())
    transport.write(HEAD)
    assert inner.writes == []
    transport.write(b"5\r\nhello\r\n")
    transport.write(b"0\r\n\r\n")
    assert inner.writes == [HEAD + b"5\r\nhello\r\n", b"0\r\n\r\n"]
    await asyncio.sleep(0)  # the end-of-turn flush finds nothing held
    assert len(inner.writes) == 2


async def test_a_head_alone_goes_out_at_the_end_of_the_turn_or_before_close():
    inner = Recording()
    transport = HeadWithBody(inner, asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    await asyncio.sleep(0)
    assert inner.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    transport.write(HEAD)
    transport.close()
    assert inner.writes[-1] == HEAD and inner.closed
    assert transport.get_extra_info("peername") == ("127.0.0.1", 1)  # the rest is the transport's


async def test_a_streamed_response_reaches_a_raw_client_whole_over_uvicorn():
    """The protocol the frontend serves with, on a real socket: the SSE head and events arrive
    intact, and a response with no body still gets its head."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        if scope["path"] == "/empty":
            return
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    async with serving(app) as port:
        for path, expect in (("/", b"data: 1\n\n"), ("/empty", b"")):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
            answer = await reader.read()
            writer.close()
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
            assert expect in answer


async def test_a_lost_connection_fires_its_requests_disconnect_hook_over_uvicorn():
    """Each request's scope holds a ``DisconnectHook``: a client that goes away mid-response
    fires it (once, whether watched before or after); a completed response's hook never fires."""

    fired: dict[str, asyncio.Event] = {}
    hooks: dict[str, DisconnectHook] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        path = scope["path"]
        hook = hooks[path] = scope[DISCONNECT_HOOK]
        fired[path] = asyncio.Event()
        hook.watch(fired[path].set)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        if path == "/done":
            await send({"type": "http.response.body", "body": b"ok"})
            return
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await fired[path].wait()  # held until the client leaves

    async with serving(app) as port:
        for path in ("/done", "/held"):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 OK")
            await reader.read(1)
            writer.close()
        await fired["/held"].wait()
        assert hooks["/held"].lost and not hooks["/done"].lost and not fired["/done"].is_set()
        late = []
        hooks["/held"].watch(lambda: late.append(1))  # watched after the loss: at once
        assert late == [1]


@pytest.mark.parametrize("sizes", [[3, 4, 5], [WRITE_BYTES // 3] * 10, [5 * WRITE_BYTES, 1, 2]])
async def test_a_body_in_parts_is_sent_whole_or_a_megabyte_at_a_time(sizes):
    parts = [bytes([65 + i % 26]) * size for i, size in enumerate(sizes)]
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    await respond_parts(send, 200, parts, [(b"content-type", b"application/json")])
    head, *bodies = sent
    assert (b"content-length", str(sum(sizes)).encode()) in head["headers"]
    assert b"".join(m["body"] for m in bodies) == b"".join(parts)
    assert [m.get("more_body", False) for m in bodies] == [True] * (len(bodies) - 1) + [False]
    if sum(sizes) < WRITE_BYTES:
        assert len(bodies) == 1
    else:  # no write much over a megabyte but one part larger than that, none tiny but the last
        assert all(
            WRITE_BYTES <= len(m["body"]) < 2 * WRITE_BYTES or len(m["body"]) >= 5 * WRITE_BYTES
            for m in bodies[:-1]
        )
