"""Sessions, engine priority and cache pinning end to end (official openai client, real processes):
each hint changes what the engine does, not just what it parses."""

from __future__ import annotations

import json
import threading
import time
import uuid

import anyio
import httpx
import openai
import pytest
import zmq

from dyn.core.discovery.backends import open_store
from dyn.core.messages import LOAD_METRICS_TOPIC, LoadMetrics, PinPrefixRequest
from dyn.core.transport.event_plane import decode_load_metrics
from dyn.core.transport.request_plane import WorkerClient
from tests.integration.conftest import first_tokens_behind_a_blocker
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

MODEL = "dyn-tiny"
BLOCK = 16
SMALL_CACHE = ("--block-size", str(BLOCK), "--num-gpu-blocks-override", "96")


def client_of(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key="x", max_retries=0, timeout=60)


def records(stack) -> dict:
    async def read():
        store = open_store("file", stack.namespace, stack.root / "discovery")
        return {r.instance_id: r for r in await store.list()}

    return anyio.run(read)


def load_of(stack, instance_id: int, timeout: float = 5.0) -> LoadMetrics:
    """The worker's next load-metrics snapshot (workers publish at least every second)."""
    record = records(stack)[instance_id]
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    try:
        sub.setsockopt(zmq.SUBSCRIBE, LOAD_METRICS_TOPIC)
        sub.connect(record.endpoints.metrics)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sub.poll(200):
                _, payload = sub.recv_multipart()
                metrics = decode_load_metrics(payload)
                if metrics.instance_id == instance_id:
                    return metrics
        raise AssertionError(f"no load metrics from worker {instance_id} in {timeout}s")
    finally:
        sub.close(linger=0)


def chat(client, messages, nvext=None, max_tokens=8, headers=None):
    return client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=max_tokens,
        extra_headers=headers,
        extra_body={"nvext": {**(nvext or {}), "extra_fields": ["worker_id"]}},
    )


def session(sid, action=None, timeout=60):
    control = {"session_id": sid, "timeout": timeout}
    if action:
        control["action"] = action
    return {"session_control": control}


def pressure(client, rounds=8, tokens_each=25, target=None):
    """Unique prompts that fill the small cache, evicting whatever may be evicted."""
    headers = {"x-worker-instance-id": str(target)} if target is not None else None
    for _ in range(rounds):
        filler = " ".join(uuid.uuid4().hex for _ in range(tokens_each))
        client.completions.create(model=MODEL, prompt=filler, max_tokens=2, extra_headers=headers)


# ------------------------------------------------------------------ sessions


@pytest.fixture(scope="module")
def session_stack(stack_factory):
    s = stack_factory("sessions")
    s.worker("--engine-type", "sglang", "--enable-streaming-session", *SMALL_CACHE, count=2)
    s.start_frontend("--router-mode", "kv", "--enable-cache-control", log_level="debug")  # it logs pins
    s.wait_instances(2)
    return s


def test_a_subagent_sticks_its_session_kv_survives_pressure_and_close_frees_it(session_stack):
    client = client_of(session_stack)
    messages = [
        {"role": "system", "content": "You are a research subagent. " * 6},
        {"role": "user", "content": "Find every paper on radix caches."},
    ]
    opened = chat(client, messages, session("sub-1", "open"))
    worker = opened.nvext["worker_id"]["decode_worker_id"]
    messages += [
        {"role": "assistant", "content": opened.choices[0].message.content},
        {"role": "user", "content": "Now the ones on paged attention."},
    ]
    turn2 = chat(client, messages, session("sub-1"))
    assert turn2.nvext["worker_id"]["decode_worker_id"] == worker
    load = load_of(session_stack, worker)
    assert (
        load.num_streaming_sessions == 1 and load.streaming_session_held_tokens >= turn2.usage.prompt_tokens
    )

    ordinary = [{"role": "user", "content": "An ordinary question about cache eviction. " * 8}]
    first = client.chat.completions.create(
        model=MODEL, messages=ordinary, max_tokens=2, extra_headers={"x-worker-instance-id": str(worker)}
    )
    pressure(client, target=worker)
    again = client.chat.completions.create(
        model=MODEL, messages=ordinary, max_tokens=2, extra_headers={"x-worker-instance-id": str(worker)}
    )
    assert again.usage.prompt_tokens_details.cached_tokens < first.usage.prompt_tokens // 2

    messages += [
        {"role": "assistant", "content": turn2.choices[0].message.content},
        {"role": "user", "content": "Summarise both."},
    ]
    turn3 = chat(client, messages, session("sub-1", "close"))
    assert turn3.nvext["worker_id"]["decode_worker_id"] == worker
    held = turn2.usage.prompt_tokens // BLOCK * BLOCK
    assert turn3.usage.prompt_tokens_details.cached_tokens >= held
    poll_until(
        lambda: load_of(session_stack, worker).num_streaming_sessions == 0,
        10,
        "the closed session to be freed",
    )
    assert load_of(session_stack, worker).streaming_session_held_tokens == 0


def test_an_idle_session_is_reaped(session_stack):
    client = client_of(session_stack)
    opened = chat(client, [{"role": "user", "content": "short-lived"}], session("idle-1", "open", timeout=1))
    worker = opened.nvext["worker_id"]["decode_worker_id"]
    assert load_of(session_stack, worker).num_streaming_sessions >= 1
    poll_until(
        lambda: load_of(session_stack, worker).num_streaming_sessions == 0,
        15,
        "the idle session to be reaped",
    )


def test_cache_control_pins_a_prefix_through_pressure_until_its_ttl(session_stack):
    client = client_of(session_stack)
    worker = sorted(session_stack.instances())[0]
    headers = {"x-worker-instance-id": str(worker)}
    pinned = [{"role": "user", "content": "A system prompt worth keeping around. " * 8}]
    pins = f"worker {worker} pinned"
    before = session_stack.frontend.log().count(pins)
    first = chat(
        client, pinned, {"cache_control": {"type": "ephemeral", "ttl": "5m"}}, max_tokens=2, headers=headers
    )
    # the pin is a background call after the stream ends; the frontend logs its answer
    poll_until(lambda: session_stack.frontend.log().count(pins) > before, 20, "the worker to pin the prefix")
    pressure(client, target=worker)
    again = chat(client, pinned, max_tokens=2, headers=headers)
    assert (
        again.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens // BLOCK * BLOCK - BLOCK
    )

    # a pin whose TTL ends (asked of the worker directly: the frontend clamps TTLs to >= 300 s)
    short = [{"role": "user", "content": "Kept only briefly, then evictable. " * 8}]
    warm = chat(client, short, max_tokens=2, headers=headers)
    token_ids = warm_token_ids(session_stack, short)

    endpoint = records(session_stack)[worker].endpoints.request

    async def pin():
        async with WorkerClient(endpoint) as c:
            return await c.call(PinPrefixRequest("short-pin", token_ids, 1.0))

    assert anyio.run(pin).value >= 1
    time.sleep(1.5)  # the pin's 1 s TTL runs out: the behaviour under test
    pressure(client, target=worker)
    later = chat(client, short, max_tokens=2, headers=headers)
    assert later.usage.prompt_tokens_details.cached_tokens < warm.usage.prompt_tokens // 2


def warm_token_ids(stack, messages) -> list[int]:
    r = httpx.post(
        stack.url + "/v1/chat/completions",
        timeout=30,
        json={
            "model": MODEL,
            "messages": messages,
            "max_tokens": 1,
            "stream": True,
            "nvext": {"annotations": ["token_ids"]},
        },
    )
    lines = r.text.splitlines()
    return json.loads(lines[lines.index("event: token_ids") + 1][2:])


# ------------------------------------------------------------------ priority


@pytest.mark.parametrize(
    "flags",
    [
        ("--scheduling-policy", "priority"),
        ("--engine-type", "sglang", "--enable-priority-scheduling"),
        ("--engine-type", "sglang", "--enable-priority-scheduling", "--schedule-low-priority-values-first"),
    ],
    ids=["vllm", "sglang", "sglang-low-first"],
)
def test_high_priority_requests_get_their_first_token_sooner(stack_factory, flags):
    s = stack_factory("prio")
    s.start(
        "worker", "mocker", "--namespace", s.namespace, "--max-num-seqs", "1", "--speedup-ratio", "1", *flags
    )
    s.start_frontend()
    s.wait_instances(1)
    first_token = first_tokens_behind_a_blocker(client_of(s), MODEL, (("low", 1), ("high", 10)))
    highs = [first_token[f"high{i}"] for i in range(3)]
    lows = [first_token[f"low{i}"] for i in range(3)]
    assert max(highs) < min(lows), (highs, lows)
    s.close()


# ------------------------------------------------------------------ the OpenCode scenario


def test_a_lead_agent_and_subagents_with_sessions_run_together(session_stack):
    """The seed's OpenCode setup: the lead agent has no session control and is load-balanced;
    each subagent opens a session, works a few turns on one worker and closes it."""
    client = client_of(session_stack)
    errors: list[BaseException] = []
    sub_workers: dict[str, set[int]] = {}
    lead_cached: list[int] = []

    def lead() -> None:
        messages = [{"role": "system", "content": "You are the lead coding agent. " * 10}]
        for turn in range(4):
            messages.append({"role": "user", "content": f"Step {turn}: plan the next change."})
            r = chat(client, messages)
            lead_cached.append(r.usage.prompt_tokens_details.cached_tokens)
            messages.append({"role": "assistant", "content": r.choices[0].message.content})

    def subagent(sid: str) -> None:
        messages = [
            {"role": "system", "content": "You are the lead coding agent. " * 10},
            {"role": "user", "content": f"Subtask {sid}: read the files."},
        ]
        for turn, action in enumerate(("open", None, None, "close")):
            r = chat(client, messages, session(sid, action))
            sub_workers.setdefault(sid, set()).add(r.nvext["worker_id"]["decode_worker_id"])
            messages += [
                {"role": "assistant", "content": r.choices[0].message.content},
                {"role": "user", "content": f"Turn {turn}: continue."},
            ]

    def guarded(fn, *args):
        try:
            fn(*args)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(lead,))]
    threads += [threading.Thread(target=guarded, args=(subagent, f"task-{i}")) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert all(len(w) == 1 for w in sub_workers.values()), sub_workers
    # the lead's growing conversation is served from cache; on this 96-block cache the subagents'
    # held sessions may evict it again by the last turn, so any later turn counts
    assert max(lead_cached[1:]) > 0, lead_cached
    for worker in session_stack.instances():
        poll_until(
            lambda w=worker: load_of(session_stack, w).num_streaming_sessions == 0,
            10,
            "every subagent session to be closed",
        )
