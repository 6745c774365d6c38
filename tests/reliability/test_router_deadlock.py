"""Issue 16's "one request can freeze all of them", against real processes.

The probe: ``dyn frontend --router-mode kv`` and two ``dyn worker mocker`` with their default flags
(``max_num_batched_tokens`` 8192, router queue threshold 16: a worker is "busy" past 131,072
booked prefill tokens), then one non-streaming request with ``n=128`` on a ~2,100-token prompt
(128 x 2,200 = 281,600 tokens, more than both workers' 262,144). Routed one choice at a time,
the choices past the threshold waited in the router queue for the prefill of their siblings,
which the frontend starts only once every choice is routed: the request never finished, and
every later request (a plain "hi") queued behind it until the 300 s stale-booking expiry while
``/health`` said healthy. Before the fix this test's "hi" timed out after 20 s and the n=128
request after 120 s.

The prompt is the probe's: 700 words ``word0 .. word699``, 2,200 tokens of the embedded dyn-tiny
tokenizer (``core/model``'s dyn-tiny; counted by the frontend's ``usage.prompt_tokens``).
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.waiting import poll_until

pytestmark = pytest.mark.integration

PROMPT = " ".join(f"word{i}" for i in range(700))
N = 128


def test_n128_on_a_long_prompt_completes_and_never_freezes_other_requests(stack_factory):
    stack = stack_factory("deadlock")
    stack.start(
        "--log-level", "info", "worker", "mocker", "--namespace", stack.namespace, "--num-workers", "2"
    )  # the probe's defaults: no speed-up, default batch size
    stack.start_frontend("--router-mode", "kv")
    stack.wait_instances(2)
    url = stack.url

    big: dict = {}

    def fan_out() -> None:
        t0 = time.monotonic()
        try:
            r = httpx.post(
                url + "/v1/completions",
                timeout=120,
                json={"model": "dyn-tiny", "prompt": PROMPT, "n": N, "max_tokens": 64},
            )
            big.update(status=r.status_code, body=r.json())
        except httpx.HTTPError as exc:
            big.update(error=repr(exc))
        big["seconds"] = time.monotonic() - t0

    thread = threading.Thread(target=fan_out, daemon=True)
    thread.start()
    poll_until(
        lambda: (
            stack.metric("dynamo_frontend_active_requests") >= 1
            or stack.metric("dynamo_frontend_router_queue_pending_requests") >= 1
        ),
        30,
        f"the n={N} request to be routed or queued",
    )

    t0 = time.monotonic()
    hi = httpx.post(
        url + "/v1/chat/completions",
        timeout=20,
        json={"model": "dyn-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
    )
    hi_seconds = time.monotonic() - t0
    assert hi.status_code == 200, hi.text
    assert hi.json()["choices"][0]["message"]["content"]
    assert hi_seconds < 10, f"'hi' took {hi_seconds:.1f} s behind the n={N} request"

    thread.join(90)
    assert "error" not in big, big
    assert big["status"] == 200, big["body"]
    body = big["body"]
    assert body["usage"]["prompt_tokens"] == 2200
    assert sorted(c["index"] for c in body["choices"]) == list(range(N))
    assert all(c["finish_reason"] in ("length", "stop") for c in body["choices"])
    assert body["usage"]["completion_tokens"] > 0

    # With the frontend admitting the choices as one unit (route_all) and reporting each start,
    # no booking waits for the unstarted-booking expiry: the fix is the admission, not the
    # expiry (which would also have ended the freeze, seconds later).
    log = " ".join(stack.frontend.log().split())
    assert "whose request was not sent to its worker" not in log, log[-3000:]
    assert httpx.get(url + "/health", timeout=5).status_code == 200
