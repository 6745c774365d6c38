"""A real ``dyn serve``: one frontend and mocker workers as children, ready line, signals, no leftovers."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from dyn.core.serve import parse_ready_url
from tests.integration.conftest import serve_ready_url

pytestmark = pytest.mark.integration


def child_pids(proc) -> dict[str, int]:
    return {
        line.split()[3]: int(line.split("(pid ")[1].split(")")[0])
        for line in proc.log().splitlines()
        if line.startswith("dyn serve: started ")
    }


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie whose new parent has not reaped it yet
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def health(base: str) -> dict:
    return httpx.get(f"{base}/health", timeout=5).json()


def chat(url: str) -> httpx.Response:
    return httpx.post(
        f"{url}/chat/completions",
        timeout=30,
        json={"model": "dyn-tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4},
    )


def stop_and_check(proc, pids, wait_for) -> None:
    started = time.monotonic()
    assert proc.terminate(timeout=30) == 0, proc.log()
    assert time.monotonic() - started < 30
    wait_for(lambda: all(gone(p) for p in pids.values()), 10, f"every child to be gone: {pids}")
    assert "SIGTERM received; stopping" in proc.log()


def test_serve_starts_the_stack_serves_and_stops_cleanly(dyn_process, wait_for):
    proc = dyn_process(
        "serve",
        "--port",  # vLLM's spelling of --http-port
        "0",
        "--workers",
        "2",
        "--namespace",
        "serve-it",
        "--speedup-ratio",
        "100",
        "--router-mode",
        "round-robin",
        "--block-size",
        "16",
    )
    url = serve_ready_url(proc)
    base = url.removesuffix("/v1")
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
    ready = next(line for line in proc.log().splitlines() if parse_ready_url(line))
    assert "model dyn-tiny, 2 mocker workers, router round-robin" in ready
    assert len(health(base)["instances"]) == 2
    response = chat(url)
    assert response.status_code == 200, response.text
    pids = child_pids(proc)
    assert set(pids) == {"frontend", "worker-0", "worker-1"}
    log = proc.log()
    assert "frontend | dyn frontend listening on http://127.0.0.1:" in log
    assert "worker-0 | " in log and "worker-1 | " in log
    assert "--block-size 16" in log and "--speedup-ratio 100" in log
    stop_and_check(proc, pids, wait_for)


def test_serve_restarts_a_worker_that_dies(dyn_process, wait_for):
    proc = dyn_process("serve", "--http-port", "0", "--workers", "2", "--speedup-ratio", "100")
    url = serve_ready_url(proc)
    base = url.removesuffix("/v1")
    pids = child_pids(proc)
    before = set(health(base)["instances"])
    os.kill(pids["worker-0"], signal.SIGKILL)
    wait_for(
        lambda: "worker-0" in proc.log() and "was killed by SIGKILL; restarting it in 1s" in proc.log(),
        15,
        f"the supervisor to report the dead worker:\n{proc.log()}",
    )
    assert len(health(base)["instances"]) == 1  # out of routing at once (its connection closed)
    response = chat(url)
    assert response.status_code == 200, response.text
    wait_for(lambda: child_pids(proc)["worker-0"] != pids["worker-0"], 15, "a new worker-0 process")
    wait_for(lambda: len(health(base)["instances"]) == 2, 60, "the restarted worker to be routable")
    assert len(set(health(base)["instances"]) & before) == 1  # a new instance beside the survivor
    assert proc.proc.poll() is None
    stop_and_check(proc, child_pids(proc), wait_for)


def test_serve_without_restarts_keeps_serving_on_the_rest(dyn_process, wait_for):
    proc = dyn_process(
        "serve", "--http-port", "0", "--workers", "2", "--speedup-ratio", "100", "--no-restart-workers"
    )
    url = serve_ready_url(proc)
    pids = child_pids(proc)
    os.kill(pids["worker-0"], signal.SIGKILL)
    wait_for(lambda: "was killed by SIGKILL; serving on with 1" in proc.log(), 15, "the dead worker reported")
    assert chat(url).status_code == 200
    stop_and_check(proc, pids, wait_for)


@pytest.mark.long
def test_children_stop_when_the_supervisor_is_killed(dyn_process, wait_for):
    proc = dyn_process("serve", "--http-port", "0", "--workers", "1", "--speedup-ratio", "100")
    serve_ready_url(proc)
    pids = child_pids(proc)
    proc.proc.send_signal(signal.SIGKILL)  # no chance to stop them itself
    proc.proc.wait(10)
    wait_for(lambda: all(gone(p) for p in pids.values()), 60, f"every child to follow its parent: {pids}")


def test_serve_stop_drains_an_open_stream(dyn_process, wait_for):
    proc = dyn_process(
        "serve", "--http-port", "0", "--workers", "1", "--speedup-ratio", "1", "--api-key", "k3y"
    )
    url = serve_ready_url(proc)
    assert "k3y" not in proc.log()
    body = {
        "model": "dyn-tiny",
        "prompt": "a long answer",
        "max_tokens": 200,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream(
        "POST", f"{url}/completions", json=body, timeout=60, headers={"Authorization": "Bearer k3y"}
    ) as r:
        assert r.status_code == 200, r.read()
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        proc.proc.send_signal(signal.SIGTERM)  # stop the stack mid-stream
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    assert '"completion_tokens":200' in rest[-2], rest[-3:]
    assert proc.proc.wait(30) == 0


def test_serve_rejects_an_unknown_pass_through_flag(dyn_process):
    proc = dyn_process("serve", "--http-port", "0", "--warp-drive", "9")
    assert proc.proc.wait(60) == 2
    log = proc.log()
    assert "--warp-drive" in log and "dyn frontend" in log and "dyn worker mocker" in log
    assert "dyn serve: started" not in log
