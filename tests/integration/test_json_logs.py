"""``dyn --log-format json ...`` as a log shipper meets it: every line on stdout and stderr of
every process (the ``dyn serve`` supervisor, the frontend, the workers, ``dyn router``, ``dyn
indexer``) is one JSON object naming its process; the default stays human text.

The field names (``ts``, ``level``, ``logger``, ``message``, ``process``) are dyn's own
(``dyn.core.logs``); the process name as a field stands in for the ``frontend | `` prefix of the
plain ``dyn serve`` output.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from dyn.core.logs import status_text
from dyn.core.serve import parse_ready_url
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

STARTUP_S = 90
REQUIRED = ("ts", "level", "logger", "message", "process")


class Run:
    """``python -m dyn.cli ARGS`` with stdout and stderr in two files, in its own session."""

    def __init__(self, tmp: Path, *args: str) -> None:
        self.out_path, self.err_path = tmp / "stdout", tmp / "stderr"
        env = {
            **os.environ,
            "DYN_DISCOVERY_DIR": str(tmp / "discovery"),
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("DYN_PROCESS_NAME", None)
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dyn.cli", *args],
                stdout=out,
                stderr=err,
                env=env,
                start_new_session=True,
            )

    def lines(self) -> list[str]:
        return (
            self.out_path.read_text(errors="replace").splitlines()
            + self.err_path.read_text(errors="replace").splitlines()
        )

    def find(self, predicate) -> str | None:
        for line in self.lines():
            if predicate(line):
                return line
        if self.proc.poll() is not None:
            raise AssertionError(f"exited with {self.proc.returncode}:\n" + "\n".join(self.lines()))
        return None

    def stop(self) -> int:
        """SIGTERM, then the exit status (SIGKILL to the whole group after 30 s)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


@pytest.fixture
def run(tmp_path):
    started: list[Run] = []

    def start(*args: str) -> Run:
        r = Run(tmp_path, *args)
        started.append(r)
        return r

    yield start
    for r in started:
        r.kill()


def records(run: Run) -> list[dict]:
    """Every line of stdout and stderr as a JSON object with the required fields; fails naming
    the first line that is not one."""
    found = []
    for line in run.lines():
        try:
            record = json.loads(line)
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
        assert isinstance(record, dict), line
        missing = [key for key in REQUIRED if key not in record]
        assert not missing, f"{line!r} lacks {missing}"
        assert "\x1b" not in line, f"ANSI codes in {line!r}"
        found.append(record)
    return found


def status_url(run: Run, prefix: str) -> str:
    line = poll_until(lambda: run.find(lambda line: status_text(line).startswith(prefix)), STARTUP_S, prefix)
    return json.loads(line)["url"]


def exercise(base: str) -> None:
    """A good request, a malformed one, and one for a model nobody serves."""
    good = {"model": "dyn-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with httpx.Client(base_url=base, timeout=30) as http:
        http.post("/v1/chat/completions", json=good)
        bad = http.post(
            "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert bad.status_code == 400
        assert http.post("/v1/chat/completions", json={**good, "model": "nobody"}).status_code == 404
        assert http.get("/v1/models").status_code == 200


def test_serve_writes_only_json_from_every_process(run):
    stack = run(
        "--log-format",
        "json",
        "serve",
        "--http-port",
        "0",
        "--workers",
        "2",
        "--namespace",
        "jsonlogs",
        "--speedup-ratio",
        "100",
    )
    ready = poll_until(lambda: stack.find(lambda line: parse_ready_url(line) is not None), STARTUP_S, "ready")
    base = parse_ready_url(ready).removesuffix("/v1")
    assert json.loads(ready)["url"] == f"{base}/v1"
    exercise(base)
    reply = httpx.post(
        f"{base}/v1/chat/completions",
        json={"model": "dyn-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=30,
    )
    assert reply.status_code == 200, reply.text
    started = next(json.loads(line)["message"] for line in stack.lines() if "started worker-0 (pid" in line)
    os.kill(int(started.split("(pid ")[1].split(")")[0]), signal.SIGKILL)
    poll_until(
        lambda: sum("started worker-0 (pid" in line for line in stack.lines()) == 2, 30, "worker-0's restart"
    )
    assert stack.stop() == 0
    found = records(stack)
    assert {r["process"] for r in found} >= {"serve", "frontend", "worker-0", "worker-1"}
    # the children's own logging (not lines the supervisor wrapped), uvicorn's included
    assert not [r for r in found if r["logger"] in ("stdout", "stderr")], "a child wrote a non-JSON line"
    assert any(r["logger"].startswith("uvicorn") and r["process"] == "frontend" for r in found)
    assert any("SIGTERM received" in r["message"] and r["process"] == "serve" for r in found)
    assert any(r["process"].startswith("worker-") and "SIGTERM" in r["message"] for r in found)
    died = [r for r in found if "was killed by SIGKILL" in r["message"]]
    assert died and died[0]["level"] == "error" and died[0]["process"] == "serve"


def test_frontend_alone_writes_only_json(run):
    frontend = run("--log-format", "json", "frontend", "--http-port", "0", "--namespace", "jsonfe")
    base = status_url(frontend, "dyn frontend listening on ")
    exercise(base)
    assert frontend.stop() in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it drained on
    found = records(frontend)
    assert {r["process"] for r in found} == {"frontend"}
    assert any(r["logger"].startswith("uvicorn") for r in found)


def test_router_and_indexer_alone_write_only_json(run, tmp_path):
    router = run("--log-format", "json", "router", "--namespace", "jsonrt", "--system-port", "0")
    metrics = status_url(router, "dyn router metrics: ")
    assert httpx.get(metrics, timeout=10).status_code == 200
    poll_until(
        lambda: router.find(lambda line: "dyn router ready: zmq=" in status_text(line)), STARTUP_S, "ready"
    )
    assert router.stop() == 0
    assert {r["process"] for r in records(router)} == {"router"}

    (tmp_path / "ix").mkdir()
    indexer = Run(
        tmp_path / "ix", "--log-format", "json", "indexer", "--namespace", "jsonix", "--http-port", "0"
    )
    try:
        ready = poll_until(
            lambda: indexer.find(lambda line: status_text(line).startswith("dyn indexer ready: ")),
            STARTUP_S,
            "ready",
        )
        assert httpx.get(json.loads(ready)["http"] + "/workers", timeout=10).status_code == 200
        assert indexer.stop() == 0
        assert {r["process"] for r in records(indexer)} == {"indexer"}
    finally:
        indexer.kill()


def test_default_output_stays_human_text(run):
    frontend = run("frontend", "--http-port", "0", "--namespace", "plainfe")
    line = poll_until(
        lambda: frontend.find(lambda line: line.startswith("dyn frontend listening on ")),
        STARTUP_S,
        "listening",
    )
    assert not line.startswith("{")
    assert frontend.stop() in (0, -signal.SIGTERM)
    assert not any(line.startswith("{") for line in frontend.lines())


PROGRAM = """
import threading, warnings
from dyn.core.logs import configure_logging
configure_logging("info", "json", process="probe")
warnings.warn("an old API")
t = threading.Thread(target=lambda: 1 / 0, name="helper")
t.start(); t.join()
raise RuntimeError("boom")
"""


def test_warnings_and_uncaught_exceptions_are_json():
    env = {k: v for k, v in os.environ.items() if k != "DYN_PROCESS_NAME"}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 1 and done.stdout == ""
    found = [json.loads(line) for line in done.stderr.splitlines()]
    assert all(r["process"] == "probe" for r in found)
    by_logger = {r["logger"]: r for r in found if r["logger"] == "py.warnings"}
    assert "an old API" in by_logger["py.warnings"]["message"]
    crashes = [r for r in found if r["level"] == "critical"]
    assert "ZeroDivisionError" in crashes[0]["exc"] and "helper" in crashes[0]["message"]
    assert "RuntimeError: boom" in crashes[1]["exc"]


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--log-format", "json", "frontend", "--http-port", "abc"], {}, "Invalid value for '--http-port'"),
        (["frontend", "--no-such-flag"], {"DYN_LOG_FORMAT": "json"}, "No such option: --no-such-flag"),
        (["--log-format", "json", "--log-level", "loud", "router"], {}, "log level must be one of"),
    ],
)
def test_command_line_mistakes_are_json_errors(args, env, says, tmp_path):
    """Click's usage errors, printed before any command runs, are error records too."""
    base = {k: v for k, v in os.environ.items() if k != "DYN_PROCESS_NAME"}
    done = subprocess.run(
        [sys.executable, "-m", "dyn.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, **env, "DYN_DISCOVERY_DIR": str(tmp_path)},
    )
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    record = json.loads(line)
    assert (
        record["level"] == "error"
        and says in record["message"]
        and record["process"] in ("frontend", "router")
    )


def test_relay_keeps_json_and_wraps_everything_else():
    from dyn.core.serve import parse_listening_url, relay_json

    own = '{"ts":1.0,"level":"info","logger":"x","message":"hi","process":"worker-3"}'
    assert relay_json(own, "worker-0", "stderr") == own  # a child's own name wins
    named = json.loads(
        relay_json('{"ts":1.0,"level":"info","logger":"x","message":"hi"}', "worker-0", "stderr")
    )
    assert named["process"] == "worker-0" and named["message"] == "hi"
    raw = json.loads(relay_json("\x1b[31mSegmentation fault\x1b[0m", "worker-1", "stderr"))
    assert raw["message"] == "Segmentation fault" and raw["logger"] == "stderr" and raw["level"] == "warning"
    assert json.loads(relay_json("[1, 2]", "frontend", "stdout"))["message"] == "[1, 2]"
    assert json.loads(relay_json('{"progress": 3}', "worker-0", "stdout"))["message"] == '{"progress": 3}'
    assert relay_json("   ", "frontend", "stdout") is None
    listening = '{"message":"dyn frontend listening on http://0.0.0.0:8000","url":"http://0.0.0.0:8000"}'
    assert parse_listening_url(listening) == "http://0.0.0.0:8000"
