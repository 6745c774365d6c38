"""``dyn serve --engine sglang`` with 2 live SGLang workers (SGLang 0.5.23's CPU engine, a tiny
random Llama).

Runs only when ``DYN_SGLANG_VENV`` names a venv made by ``scripts/provision_sglang_cpu.sh`` (the
README's test command makes one); the stack runs on that venv's Python, the test on this one. What
it proves on SGLang's own code: chat through the openai client, SGLang's KV events reaching the
router and a shared prefix routed to its holder, priority scheduling reordering a contended queue,
priority radix eviction keeping an important prefix, streaming sessions sending only what the
session does not hold and freeing it on close and on idle timeout (with SGLang's own session
gauges on the worker's ``/metrics``), structured outputs and a forced tool call that validate,
OpenCode with seed 003's provider completing a turn, a SIGTERM stopping a worker through dyn
(out of discovery, its open stream drained), and HiCache's host-tier KV events, written by
SGLang's own classes, decoded into their tiers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid

import httpx
import pytest

from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.model import load_model_info
from tests.agent_clis import opencode_env, provisioned_agents, run_cli, seed_003_model
from tests.live_engines import (
    cached,
    chat,
    check_a_shared_prefix_goes_to_its_holder,
    check_beam_search,
    check_chat_through_the_openai_client,
    instances,
    worker_of,
)
from tests.sglang_cpu import MODEL, NEEDS_SGLANG, python_and_model, sglang_env, sglang_serve
from tests.waiting import poll_until

pytestmark = [pytest.mark.integration, NEEDS_SGLANG, pytest.mark.timeout(600)]
PAGE = 16
POOL_TOKENS = 4096
"""The priority worker's KV pool (--max-total-tokens): small, so a few prompts fill it."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """``dyn serve --engine sglang --workers 2`` with streaming sessions, SGLang's metrics on each
    worker's --system-port, and structured outputs; yields ``(url, log)``."""
    with sglang_serve(
        tmp_path_factory.mktemp("sglang"),
        "--router-mode",
        "kv",
        # SGLang server flags: declared by dyn worker sglang, or passed through to SGLang
        "--page-size",
        str(PAGE),
        "--max-total-tokens",
        "16384",
        "--enable-streaming-session",
        "--enable-metrics",
        "--grammar-backend",
        "xgrammar",
        # the random-weight model would fill all the whitespace a JSON grammar allows
        "--constrained-json-disable-any-whitespace",
        "--dyn-tool-call-parser",
        "hermes",
        "--system-port",  # each worker's /metrics: SGLang's own gauges
        "0",
        workers=2,
    ) as served:
        yield served


@pytest.fixture(scope="module")
def priority_stack(tmp_path_factory):
    """One SGLang worker with one running slot, priority scheduling, priority radix eviction and
    streaming sessions over a 4096-token pool; yields ``(url, log)``."""
    with sglang_serve(
        tmp_path_factory.mktemp("sglang-priority"),
        "--page-size",
        str(PAGE),
        "--max-total-tokens",
        str(POOL_TOKENS),
        "--max-running-requests",
        "1",
        "--enable-priority-scheduling",
        "--radix-eviction-policy",
        "priority",
        "--enable-streaming-session",
    ) as served:
        yield served


def test_chat_unary_and_streamed_through_the_openai_client(stack):
    check_chat_through_the_openai_client(stack[0], workers=2)


def test_kv_events_reach_the_router_and_a_shared_prefix_goes_to_its_holder(stack):
    check_a_shared_prefix_goes_to_its_holder(stack[0], PAGE, "SGLang")


def worker_metrics(log_text: str) -> dict[int, str]:
    """Each worker's ``/metrics`` URL, from its start-up line in the serve log."""
    found = re.findall(r"worker (\d+) .*metrics at (http://\S+)", log_text)
    return {int(instance): f"{base}/metrics" for instance, base in found}


def gauge(text: str, name: str) -> float:
    values = [float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith(name + "{")]
    assert values, f"{name} is not in the worker's /metrics"
    return sum(values)


DECODE_LOG = 48
"""Tokens a request generates so that SGLang's scheduler logs a decode batch (every 40 steps by
default), which is when it sets its gauges."""


def sessions_after_a_step(url: str, worker: int, metrics: str) -> tuple[float, float]:
    """SGLang's session gauges on ``worker`` once an ordinary request has made its scheduler log."""
    chat(url, f"tick {uuid.uuid4().hex}", worker, max_tokens=DECODE_LOG, ignore_eos=True)
    text = httpx.get(metrics, timeout=10).text
    return gauge(text, "sglang:num_streaming_sessions"), gauge(text, "sglang:streaming_session_held_tokens")


def test_a_streaming_session_holds_its_kv_in_sglang_until_closed(stack):
    """open, a second turn that sends SGLang only what the session does not hold, close: SGLang's
    own gauges on the worker's /metrics count the session and its KV while it is open, and
    nothing once it is closed."""
    url, log = stack
    system = {"role": "system", "content": "You are a research subagent. " * 10}
    messages = [system, {"role": "user", "content": "Find every paper on radix caches."}]

    def turn(action: str | None) -> dict:
        control = {"session_id": "sub-1", "timeout": 60, **({"action": action} if action else {})}
        # A reply re-rendered in the next turn's prompt must tokenize as it was generated for the
        # session to be extended; a random model's text seldom does, one "." always does.
        reply = chat(url, messages, max_tokens=8, guided_regex=r"\.", nvext={"session_control": control})
        assert reply["choices"][0]["message"]["content"] == ".", reply
        messages.append({"role": "assistant", "content": "."})
        return reply

    opened = turn("open")
    worker = worker_of(opened)
    metrics = worker_metrics(log.read_text())[worker]
    messages.append({"role": "user", "content": "Now the ones on paged attention."})
    second = turn(None)
    assert worker_of(second) == worker
    # SGLang held the first turn's prompt and reply; only the new message was sent
    held_before = opened["usage"]["prompt_tokens"] + opened["usage"]["completion_tokens"]
    assert cached(second) >= held_before, second["usage"]
    # SGLang counts the KV a session holds outside the radix tree (its last, unshared pages)
    sessions, held = sessions_after_a_step(url, worker, metrics)
    assert sessions == 1 and held > 0, (sessions, held)
    messages.append({"role": "user", "content": "Summarise."})
    turn("close")
    poll_until(
        lambda: sessions_after_a_step(url, worker, metrics) == (0, 0), 60, "SGLang to free the closed session"
    )


def test_an_idle_streaming_session_is_freed_after_its_timeout(stack):
    url, log = stack
    control = {"session_id": "idle-1", "action": "open", "timeout": 10}
    reply = chat(url, "A session that goes quiet.", nvext={"session_control": control})
    worker = worker_of(reply)
    metrics = worker_metrics(log.read_text())[worker]
    assert sessions_after_a_step(url, worker, metrics)[0] == 1
    poll_until(
        lambda: sessions_after_a_step(url, worker, metrics) == (0, 0), 60, "SGLang to free the idle session"
    )


HOST_TIER_EVENTS = """
import json, msgspec
from sglang.srt.disaggregation.kv_events import (
    AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, StorageMedium)
from dyn.core.kv.events import decode_event_batch, tier_of
events = [
    BlockStored([11, 12], None, list(range(32)), 16, None, medium=StorageMedium.CPU.value),
    BlockStored([13], 12, list(range(16)), 16, None, medium=StorageMedium.DISK.value, session_id="s"),
    BlockRemoved([11], medium=StorageMedium.GPU.value),
    BlockRemoved([13], medium=StorageMedium.EXTERNAL.value),
    AllBlocksCleared(),
]
payload = msgspec.msgpack.Encoder().encode(KVEventBatch(ts=1.0, events=events))
batch = decode_event_batch(payload)
print(json.dumps([[type(e).__name__, getattr(e, "block_hashes", None), tier_of(getattr(e, "medium", None))]
                  for e in batch.events]))
"""


def test_hicache_host_tier_events_as_sglang_writes_them_decode_into_their_tiers():
    """HiCache cannot run on SGLang's CPU engine (the worker refuses the flag there), so its
    events are written by SGLang's own classes and encoder, as its publisher writes them."""
    python, _ = python_and_model()
    out = subprocess.run(
        [str(python), "-c", HOST_TIER_EVENTS], env=sglang_env(), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout) == [
        ["BlockStored", [11, 12], "host_pinned"],
        ["BlockStored", [13], "disk"],
        ["BlockRemoved", [11], "device"],
        ["BlockRemoved", [13], "external"],
        ["AllBlocksCleared", None, "device"],
    ]


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


def test_structured_outputs_json_schema_regex_and_ebnf(stack):
    import jsonschema
    import openai

    url, _ = stack
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a light."}],
        max_tokens=100,
        response_format={"type": "json_schema", "json_schema": {"name": "light", "schema": LIGHT}},
    )
    assert reply.choices[0].finish_reason == "stop", reply
    jsonschema.validate(json.loads(reply.choices[0].message.content), LIGHT)
    regex = client.completions.create(
        model=MODEL, prompt="A date:", max_tokens=20, extra_body={"guided_regex": r"20\d\d-0[1-9]-[12]\d"}
    )
    assert re.fullmatch(r"20\d\d-0[1-9]-[12]\d", regex.choices[0].text), regex
    grammar = 'root ::= "yes" | "no" | "maybe so"'
    ebnf = client.completions.create(
        model=MODEL, prompt="Answer:", max_tokens=20, extra_body={"guided_grammar": grammar}
    )
    assert ebnf.choices[0].text in ("yes", "no", "maybe so"), ebnf


def test_a_forced_tool_call_is_valid(stack):
    import jsonschema
    import openai

    url, _ = stack
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    tool = {"type": "function", "function": {"name": "set_light", "parameters": LIGHT}}
    for tool_choice in ({"type": "function", "function": {"name": "set_light"}}, "required"):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Turn on the kitchen light."}],
            max_tokens=200,
            tools=[tool],
            tool_choice=tool_choice,
            # one call: "required" otherwise allows a list the random model may not close in time
            parallel_tool_calls=False,
        )
        (call,) = reply.choices[0].message.tool_calls or [None]
        assert call is not None and call.function.name == "set_light", reply
        jsonschema.validate(json.loads(call.function.arguments), LIGHT)


def served_streams(url: str) -> float:
    """Streamed chat completions the frontend has answered with success."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("dynamo_frontend_requests_total{")
        and 'endpoint="chat_completions"' in line
        and 'request_type="stream"' in line
        and 'status="success"' in line
    )


def test_opencode_completes_a_turn_on_sglang_with_seed_003s_provider(stack, tmp_path):
    """Seed 003's walk-through on the real engine: ``opencode run`` with seed 003's model entry
    (``@ai-sdk/openai-compatible``, tool calls, reasoning, ``interleaved.field``) streams its
    turns through dyn to SGLang and exits 0. The random weights answer with text (the scripted
    tool loop is the mocker's, ``test_agent_clis.py``); the output limit keeps their replies short."""
    agents = provisioned_agents()
    url, _ = stack
    before = served_streams(url)
    env = opencode_env(tmp_path, url, MODEL, seed_003_model(MODEL, output_limit=32))
    run_cli([str(agents / "bin" / "opencode"), "run", "Say hello."], env, tmp_path / "work")
    assert served_streams(url) > before


@pytest.mark.all_engines
def test_priority_radix_eviction_keeps_the_important_prefix_under_pressure(priority_stack):
    """An important prompt, then an ordinary one, then unique prompts that overflow the worker's
    4096-token pool: with --radix-eviction-policy priority SGLang evicts the ordinary prefix and
    keeps the important one (by LRU it would evict the important one first, being older)."""
    url, _ = priority_stack
    (worker,) = instances(url)
    important = " ".join(f"important rule {i} stays cached" for i in range(60))
    ordinary = " ".join(f"ordinary note {i} may be evicted" for i in range(60))
    first = chat(url, important, worker, nvext={"agent_hints": {"priority": 10}})
    chat(url, ordinary, worker)
    for _ in range(12):
        chat(url, " ".join(uuid.uuid4().hex for _ in range(15)), worker, max_tokens=1)
    again_ordinary = chat(url, ordinary, worker)
    again_important = chat(url, important, worker, nvext={"agent_hints": {"priority": 10}})
    assert cached(again_important) >= (first["usage"]["prompt_tokens"] // PAGE - 1) * PAGE
    assert cached(again_ordinary) < again_ordinary["usage"]["prompt_tokens"] // 2


@pytest.mark.all_engines
def test_priority_scheduling_reorders_a_contended_sglang_queue(priority_stack):
    """One worker, one running slot (--max-running-requests 1): a long request holds it, three
    normal ones queue, then an important one (dyn's convention: a larger nvext priority) arrives
    last. SGLang's priority scheduler runs it first (preempting the long one, as its
    --priority-scheduling-preemption-threshold allows), then the normal ones in arrival order."""
    url, _ = priority_stack
    (worker,) = instances(url)
    done: dict[str, tuple[float, float]] = {}
    """name -> (received, finished) in ms, the frontend's clock (nvext timing): the order the
    client threads wake up in is not the order SGLang ran them."""
    errors: list[str] = []

    def send(name: str, max_tokens: int, priority: int | None = None) -> None:
        nvext = {"agent_hints": {"priority": priority}} if priority is not None else {}
        try:
            timing = chat(
                url, f"request {name}", worker, max_tokens=max_tokens, ignore_eos=True, nvext=nvext
            )["nvext"]["timing"]
            done[name] = (
                timing["request_received_ms"],
                timing["request_received_ms"] + timing["total_time_ms"],
            )
        except Exception as exc:  # reported below
            errors.append(f"{name}: {exc!r}")

    long = threading.Thread(target=send, args=("long", 2000))  # about 4 s of decoding here
    long.start()
    time.sleep(0.7)  # the long request holds the slot (an idle stack admits one in ~30 ms)
    threads = []
    for name, priority in [("normal-1", None), ("normal-2", None), ("normal-3", None), ("important", 10)]:
        threads.append(threading.Thread(target=send, args=(name, 8, priority)))
        threads[-1].start()
        time.sleep(0.1)
    for thread in [long, *threads]:
        thread.join(120)
    assert not errors, errors
    order = sorted(done, key=lambda name: done[name][1])
    assert order.index("long") > 0, done  # the others arrived while it ran
    shorts = [name for name in order if name != "long"]
    assert shorts[0] == "important", done
    # the normal ones in the order they reached the frontend (FCFS among equals)
    assert [done[name][0] for name in shorts[1:]] == sorted(done[name][0] for name in shorts[1:]), done


@pytest.mark.all_engines
def test_a_session_on_one_running_slot_runs_as_ordinary_requests_instead_of_deadlocking(priority_stack):
    """SGLang keeps a running slot per open streaming session, so with one slot a session's next
    turn (and every other request) would wait for its idle timeout; dyn opens none there."""
    url, log = priority_stack
    control = {"session_id": "one-slot", "action": "open", "timeout": 120}
    messages = [{"role": "user", "content": "First turn."}]
    first = chat(url, messages, max_tokens=4, nvext={"session_control": control})
    messages += [first["choices"][0]["message"], {"role": "user", "content": "Second turn."}]
    chat(url, messages, max_tokens=4, nvext={"session_control": {"session_id": "one-slot"}})
    chat(url, "An ordinary request.", max_tokens=4)
    assert "no session can be opened here" in log.read_text()


@pytest.mark.all_engines
def test_a_sigterm_to_a_worker_deregisters_it_and_drains_its_stream(tmp_path):
    """SIGTERM to a live SGLang worker mid-stream (a rolling restart): dyn's runner, not SGLang's
    own handler (which SGLang sets on the worker's loop), stops it: the worker leaves discovery,
    the open stream runs to its last token, and the worker exits cleanly."""
    with sglang_serve(tmp_path, "--page-size", str(PAGE), "--max-total-tokens", str(POOL_TOKENS)) as (
        url,
        log,
    ):
        (pid,) = re.findall(r"started worker-0 \(pid (\d+)\)", log.read_text())
        body = {
            "model": MODEL,
            "prompt": "a long answer",
            "max_tokens": 300,
            "ignore_eos": True,
            "stream": True,
        }
        body["stream_options"] = {"include_usage": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            assert r.status_code == 200, r.read()
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            os.kill(int(pid), signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2].removeprefix("data: "))["usage"]["completion_tokens"] == 300
        poll_until(lambda: "exited with code 0" in log.read_text(), 60, "the worker to exit")
        text = log.read_text()
    assert re.search(r"worker-0 \| .*SIGTERM received; stopping 1 worker\(s\)", text), text[-3000:]
    assert re.search(r"worker \d+ left discovery; draining 1 request\(s\)", text), text[-3000:]
    assert "Draining requests and shutting down" not in text


def test_beam_search_over_sglangs_logprobs(stack):
    check_beam_search(stack[0], MODEL)


def test_logit_bias_reaches_sglang_and_allowed_token_ids_is_refused(stack):
    """SGLang's own logit bias: +100 on a token makes greedy decoding repeat it. SGLang has no
    allowed_token_ids, so a request with them is a 400 saying so, never served unconstrained."""
    url, _ = stack
    body = {"model": MODEL, "prompt": "Count with me:", "max_tokens": 8, "ignore_eos": True, "temperature": 0}
    forced = httpx.post(
        url + "/v1/completions", json={**body, "logit_bias": {"777": 100}, "logprobs": 0}, timeout=60
    )
    assert forced.status_code == 200, forced.text
    tokens = forced.json()["choices"][0]["logprobs"]["tokens"]
    decode = Tokenizer.from_model(load_model_info(None, None)).decode  # the tiny Llama's tokenizer
    assert tokens == [decode([777])] * 8
    refused = httpx.post(url + "/v1/completions", json={**body, "allowed_token_ids": [300, 301]}, timeout=60)
    assert refused.status_code == 400 and "allowed_token_ids" in refused.json()["error"]["message"]
