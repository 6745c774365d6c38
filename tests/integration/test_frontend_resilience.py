"""Load, disconnects and workers that die: the frontend stays correct and up."""

from __future__ import annotations

import os
import signal
import threading
import time

import anyio
import httpx
import pytest

from tests.sse import sse_lines

pytestmark = pytest.mark.integration

MODEL = "dyn-tiny"


@pytest.fixture(scope="module")
def resilient(stack_factory):
    """Two worker processes (so one can be killed) behind a round-robin frontend."""
    s = stack_factory("resilient")
    s.worker("--block-size", "16")
    # real time, so its requests take a while (a walk-away is seen before the reply ends); its debug
    # log shows the aborts
    s.worker("--block-size", "16", "--speedup-ratio", "1", log_level="debug")
    s.start_frontend()
    s.wait_instances(2)
    return s


def test_200_concurrent_streams_complete(resilient):
    async def one(client: httpx.AsyncClient, i: int) -> int:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"question {i}"}],
            "max_tokens": 8,
            "stream": True,
            "ignore_eos": True,
        }
        events = 0
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200, await r.aread()
            async for line in sse_lines(r):
                if line.startswith("data: ") and line != "data: [DONE]":
                    assert not line.startswith('data: {"error"'), line
                    events += 1
                elif line == "data: [DONE]":
                    return events
        raise AssertionError("stream ended without [DONE]")

    async def main() -> list[int]:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        async with httpx.AsyncClient(base_url=resilient.url, limits=limits, timeout=60) as client:
            results: list[int] = []

            async def run(i: int) -> None:
                results.append(await one(client, i))

            async with anyio.create_task_group() as tg:
                for i in range(200):
                    tg.start_soon(run, i)
            return results

    results = anyio.run(main)
    assert len(results) == 200
    assert all(n >= 2 for n in results)  # role event + content/finish events


def test_client_disconnect_cancels_the_engine_request(resilient, wait_for):
    debug_worker = resilient.procs[1]
    # find which instance the slow, debug-logging worker hosts: its log names it when serving
    log = debug_worker.log()
    instance = next(i for i in resilient.instances() if f"worker {i} " in log)
    body = {
        "model": MODEL,
        "prompt": "stream forever",
        "max_tokens": 4000,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.Client(base_url=resilient.url, timeout=30) as client:
        with client.stream(
            "POST",
            "/v1/completions",
            json=body,
            headers={"x-worker-instance-id": str(instance), "x-request-id": "walk-away"},
        ) as r:
            assert r.status_code == 200
            for n, _ in enumerate(r.iter_lines()):
                if n >= 3:
                    break
    wait_for(
        lambda: (
            "walk-away" in debug_worker.log() and "cancelled by its client (aborted)" in debug_worker.log()
        ),
        20,
        "the worker to log the abort",
    )
    metrics = httpx.get(resilient.url + "/metrics", timeout=10).text
    assert "dynamo_frontend_client_disconnects_total" in metrics


def test_killed_worker_stops_receiving_requests(resilient, wait_for):
    victim = resilient.procs[1]
    before = resilient.instances()
    assert len(before) == 2
    victim_id = next(i for i in before if f"worker {i} " in victim.log())
    answers: list[httpx.Response] = []

    def long_unary_request() -> None:
        answers.append(
            httpx.post(
                resilient.url + "/v1/completions",
                timeout=60,
                headers={"x-worker-instance-id": str(victim_id)},
                json={"model": MODEL, "prompt": "never finishes", "max_tokens": 8000, "ignore_eos": True},
            )
        )

    caller = threading.Thread(target=long_unary_request)
    caller.start()
    wait_for(
        lambda: resilient.metric("dynamo_frontend_active_requests") >= 1,
        20,
        "the request to reach the victim",
    )
    os.killpg(victim.proc.pid, signal.SIGKILL)
    victim.proc.wait(10)
    caller.join(30)
    # the in-flight request fails cleanly once the worker's record expires: 503, not a 500
    assert answers and answers[0].status_code == 503, answers[0].text if answers else "no answer"
    assert "went away" in answers[0].json()["error"]["message"]
    t0 = time.monotonic()
    survivors = wait_for(
        lambda: len(resilient.instances()) == 1 and resilient.instances(),
        20,
        "the frontend to drop the killed worker",
    )
    assert time.monotonic() - t0 < 15  # discovery expiry (5 s lease) plus polling
    assert survivors[0] in before
    with httpx.Client(base_url=resilient.url, timeout=30) as client:
        for i in range(6):
            r = client.post("/v1/completions", json={"model": MODEL, "prompt": f"after {i}", "max_tokens": 2})
            assert r.status_code == 200, r.text
