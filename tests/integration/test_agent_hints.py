"""Agent hints show their effect end to end (official openai client, real processes):
speculative prefill warms the next turn, latency_sensitivity jumps the router queue."""

from __future__ import annotations

import re
import threading
import time

import httpx
import openai
import pytest

from dyn.core.frontend.preprocessor import Preprocessor
from dyn.core.model import load_model_info
from dyn.core.protocol.openai import ChatCompletionRequest
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

MODEL = "dyn-tiny"
BLOCK = 16


@pytest.fixture(scope="module")
def kv_stack(stack_factory):
    return stack_factory("hints").up("--router-mode", "kv", worker_args=("--block-size", str(BLOCK)))


def longest_cached(stack, token_ids: list[int]) -> int:
    body = httpx.post(stack.url + "/kv/query", json={"token_ids": token_ids}, timeout=10).json()
    return max((i["longest_matched"] for i in body["instances"].values()), default=0)


def test_speculative_prefill_caches_the_whole_conversation_for_the_next_turn(kv_stack):
    client = openai.OpenAI(base_url=kv_stack.url + "/v1", api_key="x", max_retries=0)
    preprocessor = Preprocessor(load_model_info(None, None))

    def conversation(topic: str) -> tuple[int, int]:
        """Two turns; returns (turn 2's cached tokens, tokens of the conversation before it).

        Without the hint the next turn may hit too: the engine caches its output blocks, and a
        reply that re-tokenizes to the ids it generated matches them. The hint's effect shown
        here is that the whole conversation is in the index before the next turn is sent."""
        messages = [
            {"role": "system", "content": f"You research {topic}. " * 10},
            {"role": "user", "content": f"Summarise what is known about {topic}."},
        ]
        first = client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=40,
            stream=True,
            extra_body={"nvext": {"agent_hints": {"speculative_prefill": True}}},
        )
        reply = "".join(c.choices[0].delta.content or "" for c in first if c.choices)
        prefix = preprocessor.next_turn_prefix(ChatCompletionRequest(messages=messages), reply)
        full_blocks = len(prefix) // BLOCK * BLOCK
        poll_until(
            lambda: longest_cached(kv_stack, prefix) >= full_blocks,
            20,
            "the speculative prefill to be cached",
        )
        messages += [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "Now list the open questions."},
        ]
        second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
        return second.usage.prompt_tokens_details.cached_tokens, full_blocks

    cached, conversation_tokens = conversation("tide pools")
    assert cached >= conversation_tokens


@pytest.fixture(scope="module")
def queued_stack(stack_factory):
    """One slow worker behind a router queue that holds requests while any prefill runs."""
    s = stack_factory("queue")
    s.start(
        "worker", "mocker", "--namespace", s.namespace, "--block-size", str(BLOCK), "--speedup-ratio", "0.1"
    )
    s.start_frontend("--router-mode", "kv", "--router-queue-threshold", "0.0001")
    s.wait_instances(1)
    return s


def queue_pending(stack) -> int:
    text = httpx.get(stack.url + "/metrics", timeout=10).text
    match = re.search(r"^dynamo_frontend_router_queue_pending_requests\S* (\S+)$", text, re.M)
    return int(float(match.group(1))) if match else 0


def test_latency_sensitivity_dequeues_a_later_request_first(queued_stack):
    client = openai.OpenAI(base_url=queued_stack.url + "/v1", api_key="x", max_retries=0)
    first_token: dict[str, float] = {}

    def stream(name: str, prompt: str, hints: dict | None) -> None:
        body = {"nvext": {"agent_hints": hints}} if hints else None
        for chunk in client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=2, stream=True, extra_body=body
        ):
            if chunk.choices and chunk.choices[0].text is not None:
                first_token.setdefault(name, time.monotonic())

    threads = []

    def start(name, prompt, hints=None):
        t = threading.Thread(target=stream, args=(name, prompt, hints), daemon=True)
        t.start()
        threads.append(t)

    start("blocker", "long prefill " * 1500)
    poll_until(
        lambda: queue_pending(queued_stack) == 0 and "blocker" not in first_token and threads[0].is_alive(),
        10,
        "the blocker to be admitted",
    )
    # the blocker's prefill is in the router's load view: what comes next must queue
    poll_until(
        lambda: queued_stack.metric("dynamo_frontend_worker_active_prefill_tokens") > 0,
        10,
        "the blocker's prefill to count as the worker's load",
    )
    start("plain", "plain request " * 20)
    poll_until(lambda: queue_pending(queued_stack) == 1, 10, "the plain request to queue")
    start("urgent", "urgent request " * 20, {"latency_sensitivity": 5.0})
    poll_until(lambda: queue_pending(queued_stack) == 2, 10, "the urgent request to queue")
    for t in threads:
        t.join(60)
    assert set(first_token) == {"blocker", "plain", "urgent"}
    assert first_token["urgent"] < first_token["plain"]
