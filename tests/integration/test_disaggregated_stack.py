"""Disaggregated serving as users meet it: real mocker prefill and decode workers behind a real
frontend (embedded KV router, or a ``dyn router``), the official openai client, both worker ids in
``nvext.worker_id`` checked against the roles in discovery, conditional disaggregation, and a
prefill worker killed under load without a lost request."""

from __future__ import annotations

import concurrent.futures

import anyio
import openai
import pytest

from dyn.core.discovery.file_store import FileDiscoveryStore
from dyn.core.router.service import READY_PREFIX as ROUTER_READY
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

MODEL = "dyn-tiny"
MESSAGES = [{"role": "user", "content": "Tell me about disaggregated serving."}]
WORKER = ("--block-size", "16")


def roles(stack) -> dict[int, str]:
    records = anyio.run(FileDiscoveryStore(stack.root / "discovery", stack.namespace).list)
    return {r.instance_id: r.disaggregation_mode for r in records}


def ask(stack, max_tokens: int = 6, messages=MESSAGES, *, ignore_eos: bool = False, **nvext):
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="x", max_retries=0)
    return client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=max_tokens,
        extra_body={"ignore_eos": ignore_eos, "nvext": {"extra_fields": ["worker_id", "timing"], **nvext}},
    )


def ids(response) -> tuple[int, int]:
    worker_id = response.model_extra["nvext"]["worker_id"]
    return worker_id["prefill_worker_id"], worker_id["decode_worker_id"]


@pytest.fixture(scope="module")
def pd_stack(stack_factory):
    stack = stack_factory("pd")
    stack.worker(*WORKER, "--disaggregation-mode", "prefill")
    stack.worker(*WORKER, "--disaggregation-mode", "decode")
    stack.start_frontend("--router-mode", "kv")
    stack.wait_instances(2)
    return stack


def test_each_request_is_prefilled_and_decoded_by_workers_of_those_roles(pd_stack):
    by_id = roles(pd_stack)
    for _ in range(3):
        response = ask(pd_stack, ignore_eos=True)  # the mocker may sample EOS sooner otherwise
        prefill, decode = ids(response)
        assert (by_id[prefill], by_id[decode]) == ("prefill", "decode")
        assert response.usage.completion_tokens == 6
    client = openai.OpenAI(base_url=pd_stack.url + "/v1", api_key="x", max_retries=0)
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5, stream=True)
    assert sum(1 for chunk in stream if chunk.choices and chunk.choices[0].delta.content) >= 1


def test_named_workers_and_a_wrong_role(pd_stack):
    by_id = roles(pd_stack)
    prefill = next(i for i, role in by_id.items() if role == "prefill")
    decode = next(i for i, role in by_id.items() if role == "decode")
    assert ids(ask(pd_stack, prefill_worker_id=prefill, decode_worker_id=decode)) == (prefill, decode)
    with pytest.raises(openai.NotFoundError, match="not live"):
        ask(pd_stack, prefill_worker_id=decode)


def test_through_a_dyn_router(stack_factory):
    stack = stack_factory("pdrouter")
    stack.worker(*WORKER, "--disaggregation-mode", "prefill")
    stack.worker(*WORKER, "--disaggregation-mode", "decode")
    router = stack.start("router", "--namespace", stack.namespace)
    address = poll_until(
        lambda: next(
            (
                line.split(ROUTER_READY)[1].strip()
                for line in router.log().splitlines()
                if ROUTER_READY in line
            ),
            None,
        ),
        60,
        "the dyn router to start",
    )
    stack.start_frontend("--router-mode", "kv", "--router-address", address)
    stack.wait_instances(2)
    by_id = roles(stack)
    for _ in range(2):
        prefill, decode = ids(ask(stack))
        assert (by_id[prefill], by_id[decode]) == ("prefill", "decode")


def test_conditional_disaggregation_keeps_a_short_prompt_on_its_decode_worker(stack_factory):
    stack = stack_factory("pdcond")
    stack.worker(*WORKER, "--disaggregation-mode", "prefill")
    stack.worker(*WORKER, "--disaggregation-mode", "decode")
    stack.start_frontend(
        "--router-mode",
        "kv",
        "--router-conditional-disagg",
        "--router-conditional-disagg-config",
        '{"eff_isl_threshold": 256, "eff_isl_ratio_threshold": 1.01}',
    )
    stack.wait_instances(2)
    by_id = roles(stack)
    prefill, decode = ids(ask(stack))  # a short prompt: no transfer
    assert prefill == decode and by_id[decode] == "decode"
    long = [{"role": "user", "content": "tell me more " * 150}]
    prefill, decode = ids(ask(stack, messages=long))
    assert (by_id[prefill], by_id[decode]) == ("prefill", "decode")


def test_a_prefill_worker_killed_under_load_loses_no_request(stack_factory):
    stack = stack_factory("pdkill")
    # the doomed worker prefills slowly, so it holds requests when it is killed
    doomed = stack.worker(*WORKER, "--disaggregation-mode", "prefill", "--speedup-ratio", "0.01")
    stack.worker(*WORKER, "--disaggregation-mode", "prefill")
    stack.worker(*WORKER, "--disaggregation-mode", "decode")
    stack.start_frontend("--router-mode", "round-robin")
    stack.wait_instances(3)
    prompts = [[{"role": "user", "content": f"request {i}: " + "long context " * 60}] for i in range(40)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        # ignore_eos: the mocker's random tokens include EOS now and then (1 run in ~10 ended a
        # stream after 3 tokens with "stop")
        futures = [pool.submit(ask, stack, 4, p, ignore_eos=True) for p in prompts]
        poll_until(lambda: sum(f.done() for f in futures) >= 2, 60, "the first answers")
        doomed.kill()
        results = [f.result(timeout=120) for f in futures]
    assert all(r.usage.completion_tokens == 4 for r in results)
    assert len(results) == 40
    assert "failed" in stack.frontend.log()  # some were on it: their prefill moved


def test_dyn_serve_starts_a_prefill_decode_stack(dyn_process):
    from tests.integration.conftest import serve_ready_url

    proc = dyn_process(
        "serve", "--prefill-workers", "1", "--decode-workers", "2", "--http-port", "0", "--router-mode", "kv"
    )
    url = serve_ready_url(proc)
    ready = next(line for line in proc.log().splitlines() if "ready at" in line)
    assert "1 prefill + 2 decode mocker workers" in ready
    client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
    response = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=3, extra_body={"nvext": {"extra_fields": ["worker_id"]}}
    )
    prefill, decode = ids(response)
    records = anyio.run(FileDiscoveryStore(dyn_process.discovery_dir, "default").list)
    by_id = {r.instance_id: r.disaggregation_mode for r in records}
    assert sorted(by_id.values()) == ["decode", "decode", "prefill"]
    assert (by_id[prefill], by_id[decode]) == ("prefill", "decode")
    log = proc.log()
    assert "started prefill-0 (pid" in log and "started decode-2 (pid" in log
