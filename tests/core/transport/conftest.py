"""Fixtures and helpers shared by the transport tests: plane keys in use for one test, and one
generate request served over a real request plane."""

from __future__ import annotations

import anyio
import pytest

from dyn.core.messages import Finish, GenerateRequest, TokenChunk, Usage
from dyn.core.transport.request_plane import RequestServer, WorkerClient
from dyn.core.transport.sockets import use_plane_keys, write_plane_keys


@pytest.fixture
def keys(tmp_path):
    """A key directory made by ``write_plane_keys``, in use for the test, switched off after."""
    path = write_plane_keys(tmp_path / "keys")
    use_plane_keys(path)
    try:
        yield path
    finally:
        use_plane_keys(None)


async def served_once(server: RequestServer) -> list[type]:
    """The message types a ``WorkerClient`` gets for one generate request to ``server``, which
    answers it with a token and a finish (10 s at most); closes the server."""

    async def answer_one():
        identity, message = await server.recv()
        server.send(identity, TokenChunk(message.request_id, [1]))
        server.send(identity, Finish(message.request_id, "length", Usage(2, 1)))

    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(answer_one)
                async with WorkerClient(server.endpoint) as client:
                    return [type(m) async for m in client.generate(GenerateRequest("r", [5, 6]))]
    finally:
        server.close()
