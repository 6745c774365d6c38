"""The openai SDK's async client for tests that hand it to an agent framework running its own
event loop (``Runner.run_sync``, ``asyncio.run``).

The SDK's default HTTP client closes itself when it is garbage-collected by scheduling
``aclose()`` on whatever event loop is running then (``AsyncHttpxClientWrapper.__del__``): in a
test suite that is a later test's loop, where closing a connection of the dead loop raises
"Event loop is closed" and fails that test. A client made here brings its own HTTP client, which
has no such hook, and keeps no connection open between requests, so nothing outlives the loop
that used it.
"""

from __future__ import annotations

from typing import Any


def async_openai(url: str) -> Any:
    """An ``openai.AsyncOpenAI`` for the stack at ``url`` (see the module docstring)."""
    import httpx2
    import openai

    http = openai.DefaultAsyncHttpxClient(limits=httpx2.Limits(max_keepalive_connections=0))
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, http_client=http)
