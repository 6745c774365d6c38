"""A third-party engine registers itself: a package outside dyn that declares a ``dyn.engines``
entry point gets ``dyn worker NAME`` with its own flags, and its worker serves requests.

The package is written to a temporary directory with a ``.dist-info`` (what ``pip install`` leaves),
put on ``PYTHONPATH``, and found by ``importlib.metadata`` like any installed distribution
(entry-point format: the PyPA entry points specification; dyn's group: ``dyn.engines`` in
pyproject.toml). Its engine answers every request with the text of its ``--reply`` flag, encoded
with the served model's tokenizer (dyn-tiny), so the frontend's answer shows the flag reached it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

ENGINE_SOURCE = '''
"""An engine dyn knows nothing about: it replies with a fixed text."""
from typing import Annotated

import anyio
import msgspec
from tokenizers import Tokenizer

from dyn.core.config import ENGINE_PANEL, flag
from dyn.core.engine import EngineInfo, EnginePlugin
from dyn.core.messages import Finish, LoadMetrics, TokenChunk, Usage


class ReplyConfig(msgspec.Struct, kw_only=True, frozen=True):
    reply: Annotated[str, flag("--reply", panel=ENGINE_PANEL, help="The text every request gets.")] = "hi"
    block_size: Annotated[int, msgspec.Meta(ge=1), flag("--reply-block-size", panel=ENGINE_PANEL,
                                                        help="Tokens per KV block advertised.")] = 16


class ReplyEngine:
    def __init__(self, config, model):
        tokenizer = Tokenizer.from_file(str(model.path / "tokenizer.json"))
        self.reply = tokenizer.encode(config.reply, add_special_tokens=False).ids
        self.info = EngineInfo(block_size=config.block_size, total_kv_blocks=1024, max_num_batched_tokens=4096)

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED):
        task_status.started()
        await anyio.sleep_forever()

    async def generate(self, request):
        yield TokenChunk(request.request_id, list(self.reply))
        yield Finish(request.request_id, "stop", Usage(len(request.token_ids), len(self.reply)))

    async def abort(self, request_id):
        return False

    def load_metrics(self):
        return [LoadMetrics(instance_id=0, dp_rank=0, ts=0.0, num_running=0, num_waiting=0,
                            active_kv_blocks=0, total_kv_blocks=1024, kv_usage=0.0)]


ENGINE = EnginePlugin(
    name="reply", config_type=ReplyConfig, summary="Replies with a fixed text.",
    create=lambda config, model, settings, sinks: [ReplyEngine(config, model) for _ in sinks])
'''


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A directory holding the ``reply_engine`` package as pip would install it."""
    root = tmp_path / "site"
    dist = root / "reply_engine-0.1.dist-info"
    dist.mkdir(parents=True)
    (root / "reply_engine.py").write_text(textwrap.dedent(ENGINE_SOURCE))
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: reply-engine\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[dyn.engines]\nreply = reply_engine:ENGINE\n")
    return root


def _env(site: Path, tmp_path: Path) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return {
        **os.environ,
        "PYTHONPATH": path,
        "DYN_DISCOVERY_DIR": str(tmp_path / "discovery"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "200",
    }


def _dyn(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dyn.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_its_command_shows_its_own_flags_with_env_twins_and_the_shared_ones(site, tmp_path):
    env = _env(site, tmp_path)
    listing = _dyn(env, "worker", "--help")
    assert listing.returncode == 0 and "Replies with a fixed text." in listing.stdout
    result = _dyn(env, "worker", "reply", "--help")
    assert result.returncode == 0, result.stderr
    for expected in (
        "--reply ",
        "DYN_REPLY",
        "The text every request gets.",
        "--reply-block-size",
        "x>=1",
        "--namespace",
        "--dyn-tool-call-parser",
        "--model-path",
    ):
        assert expected in result.stdout, expected
    assert "--num-workers" not in result.stdout  # a worker-level flag of the mocker only


def test_its_declared_range_is_checked_before_anything_starts(site, tmp_path):
    result = _dyn(_env(site, tmp_path), "worker", "reply", "--reply-block-size", "0")
    assert result.returncode == 2 and "--reply-block-size" in result.stderr
    assert "Traceback" not in result.stderr


def test_without_the_package_there_is_no_such_command(tmp_path):
    result = _dyn({**os.environ, "DYN_DISCOVERY_DIR": str(tmp_path)}, "worker", "reply", "--help")
    assert result.returncode == 2 and "No such command 'reply'" in result.stderr


def _start(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dyn.cli", *args],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def _until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.mark.integration
def test_its_worker_serves_a_request_through_the_frontend(site, tmp_path):
    env = _env(site, tmp_path)
    worker_log, frontend_log = tmp_path / "worker.log", tmp_path / "frontend.log"
    worker = _start(
        env, worker_log, "worker", "reply", "--namespace", "tp", "--reply", "the third party engine says hi"
    )
    frontend = _start(env, frontend_log, "frontend", "--http-port", "0", "--namespace", "tp")
    try:

        def listening() -> str | None:
            for line in frontend_log.read_text(errors="replace").splitlines():
                if line.startswith("dyn frontend listening on "):
                    return line.removeprefix("dyn frontend listening on ").strip()
            assert frontend.poll() is None, frontend_log.read_text()
            assert worker.poll() is None, worker_log.read_text()
            return None

        url = _until(listening, 60, "the frontend to listen")

        def routable() -> bool:
            try:
                return len(httpx.get(url + "/health", timeout=5).json().get("instances", [])) == 1
            except httpx.HTTPError:
                return False

        _until(routable, 60, "the reply worker to register")
        reply = httpx.post(
            url + "/v1/chat/completions",
            timeout=30,
            json={"model": "dyn-tiny", "max_tokens": 50, "messages": [{"role": "user", "content": "hello"}]},
        )
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["choices"][0]["message"]["content"] == "the third party engine says hi"
        assert body["choices"][0]["finish_reason"] == "stop"
    finally:
        _stop(frontend)
        _stop(worker)


def test_an_engine_that_cannot_load_is_named_and_the_others_stay(site, tmp_path):
    (site / "broken_engine.py").write_text("raise ImportError('needs a GPU library that is missing')\n")
    dist = site / "broken_engine-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-engine\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[dyn.engines]\nbroken = broken_engine:ENGINE\n")
    result = _dyn(_env(site, tmp_path), "worker", "--help")
    assert result.returncode == 0, result.stderr
    assert "engine 'broken'" in result.stderr and "needs a GPU library that is missing" in result.stderr
    assert "mocker" in result.stdout and "Replies with a fixed text." in result.stdout
