"""Issue 16, bounded work: the probe's requests against a real ``dyn frontend`` + mocker workers.

Each request below once cost the frontend gigabytes or froze its event loop: a 1 MB stop string
(19.6 GB, killed), 10k-character stop strings x n (45 MB each), a request ``chat_template`` of
``{{ 'a ' * 10000000 }}`` (4.3 GB, /live blocked 8.7 s), a 10 MB prompt (+1.4 GB, 5.6 s),
1000 prompts x n=128 (/live blocked > 30 s). Now each is refused at once (or served in bounded
memory), and ``/live`` keeps answering (``LivePoller.assert_live``) while the largest prompt the
caps accept is preprocessed. Issue 31: a 40 MB non-streaming response (n=128, 20 logprobs, 200
tokens) held the event loop for 1.3 s while it was built; now it is built and sent a slice at a
time, and a response that could exceed --max-response-bytes is refused before it is generated. The request bodies are the probe's; the model is the embedded dyn-tiny (its
context length, 131072, makes the default --max-prompt-bytes 4 MiB).
"""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.waiting import poll_until

pytestmark = pytest.mark.integration

MODEL = "dyn-tiny"
READY = "dyn frontend listening on "
STOP_CHARS = 10_000


@pytest.fixture(scope="module")
def bounded(stack_factory):
    """Two mocker workers behind a frontend with the default caps but 10k-character stop strings,
    and a second frontend, on the same workers, that trusts request chat templates."""
    s = stack_factory("bounded").up("--max-stop-string-chars", str(STOP_CHARS))
    trusting = s.start(
        "frontend", "--http-port", "0", "--namespace", s.namespace, "--trust-request-chat-template"
    )

    def listening() -> str | None:
        assert trusting.proc.poll() is None, trusting.log()
        return _listening(trusting.log_path)

    s.trusting_url = poll_until(listening, 60, "the trusting frontend to listen")
    s.trusting_pid = trusting.proc.pid
    return s


def _listening(log: Path) -> str | None:
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith(READY):
            return line[len(READY) :].strip()
    return None


def _memory_kib(pid: int, field: str) -> int:
    """``VmHWM`` (peak resident memory) or ``VmRSS`` of a process, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


class LivePoller:
    """Polls ``/live`` from its own thread and connection while a request is in flight; every
    answer's latency is kept."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            client.get("/live")  # connected before the measured request starts
            while not self._stop.is_set():
                start = time.perf_counter()
                r = client.get("/live")
                self.latencies.append(time.perf_counter() - start)
                if r.status_code != 200:
                    self.failures.append(f"{r.status_code} {r.text}")
                time.sleep(0.01)

    def __enter__(self) -> LivePoller:
        self._thread.start()
        poll_until(lambda: self.latencies or self.failures, 10, "the first /live answer", interval=0.01)
        return self

    def __exit__(self, *exc) -> None:
        time.sleep(0.05)  # a few more samples after the request: the loop may lag behind its end
        self._stop.set()
        self._thread.join(15)

    def assert_live(self, work_s: float) -> None:
        """Every /live answered, and none waited 100 ms or a quarter of ``work_s`` (the measured
        request's time), whichever is longer: work done on the event loop stalls it for nearly
        all of that time, while one scheduling hiccup of this shared machine (a 140 ms answer
        during a 1.3 s request in CI) is no freeze."""
        assert not self.failures, self.failures
        assert len(self.latencies) >= 5, self.latencies
        assert max(self.latencies) < max(0.1, work_s / 4), (work_s, sorted(self.latencies)[-5:])

    def assert_never_held(self, bound_s: float = 0.25) -> None:
        """Every /live answered within ``bound_s`` but perhaps one, which met a scheduling hiccup
        of this shared machine (and still came within 5 x ``bound_s``: under the full suite's
        parallel load one such answer took 0.27-0.41 s, where holding the loop took 1.3 s). The
        default is 0.25 s: on a 2-core machine half as fast per core, two answers in one run took
        0.10 and 0.14 s under the suite's load, and holding the loop would take twice the 1.3 s."""
        assert not self.failures, self.failures
        assert len(self.latencies) >= 5, self.latencies
        slowest = sorted(self.latencies)[-2:]
        assert slowest[0] < bound_s and slowest[-1] < 5 * bound_s, sorted(self.latencies)[-5:]


def _post(url: str, path: str, body: dict | bytes, timeout: float = 60) -> tuple[httpx.Response, float]:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    start = time.perf_counter()
    r = httpx.post(url + path, content=content, headers={"content-type": "application/json"}, timeout=timeout)
    return r, time.perf_counter() - start


def _error(r: httpx.Response) -> dict:
    assert r.status_code == 400, r.text[:500]
    return r.json()["error"]


def test_megabyte_stop_string_is_refused_without_growing_the_frontend(bounded):
    pid = bounded.frontend.proc.pid
    peak = _memory_kib(pid, "VmHWM")
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "stop": ["s" * (1 << 20)],
    }
    r, took = _post(bounded.url, "/v1/chat/completions", body)
    err = _error(r)
    assert err["param"] == "stop[0]" and "--max-stop-string-chars" in err["message"]
    assert took < 1
    assert _memory_kib(pid, "VmHWM") - peak < 64 * 1024  # was 19.6 GB, then the kernel's OOM killer
    assert httpx.get(bounded.url + "/live").status_code == 200


def test_long_stop_strings_times_n_at_the_limits_stay_in_bounded_memory(bounded):
    """16 stop strings (the most the protocol takes) of 10,000 characters, n=128 (--max-n):
    the old detokenizer built every prefix of every string for every choice (45 MB per string
    and choice, about 92 GB here); now one matcher serves all 128 choices."""
    pid = bounded.frontend.proc.pid
    rng = random.Random(16)
    stops = ["".join(rng.choice("qxzj") for _ in range(STOP_CHARS)) for _ in range(16)]
    peak = _memory_kib(pid, "VmHWM")
    body = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 8,
        "n": 128,
        "ignore_eos": True,
        "stop": stops,
    }
    r, _ = _post(bounded.url, "/v1/completions", body, timeout=120)
    assert r.status_code == 200, r.text[:500]
    choices = r.json()["choices"]
    assert len(choices) == 128 and all(c["finish_reason"] == "length" for c in choices)
    assert _memory_kib(pid, "VmHWM") - peak < 200 * 1024


@pytest.mark.parametrize("trusted", [False, True], ids=["untrusted", "trusted"])
def test_template_bomb_is_a_400_in_under_a_second(bounded, trusted):
    url = bounded.trusting_url if trusted else bounded.url
    pid = bounded.trusting_pid if trusted else bounded.frontend.proc.pid
    peak = _memory_kib(pid, "VmHWM")
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "chat_template": "{{ 'a ' * 10000000 }}",
    }
    with LivePoller(url) as live:
        r, took = _post(url, "/v1/chat/completions", body)
    err = _error(r)
    assert err["param"] == "chat_template" and took < 1
    if trusted:
        assert "longer than" in err["message"]
    else:
        assert "--trust-request-chat-template" in err["message"]
    assert _memory_kib(pid, "VmHWM") - peak < 64 * 1024  # was 4.3 GB
    live.assert_live(took)
    # a trusted template that is not a bomb is used
    if trusted:
        body["chat_template"] = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        body["echo"] = False
        r, _ = _post(url, "/v1/chat/completions", body)
        assert r.status_code == 200, r.text[:500]


def test_ten_megabyte_prompt_is_refused_while_live_answers(bounded):
    pid = bounded.frontend.proc.pid
    peak = _memory_kib(pid, "VmHWM")
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "a" * (10 << 20)}], "max_tokens": 8}
    ).encode()
    with LivePoller(bounded.url) as live:
        r, took = _post(bounded.url, "/v1/chat/completions", body)
    err = _error(r)
    assert err["param"] == "messages" and "--max-prompt-bytes" in err["message"]
    assert took < 2
    live.assert_live(took)
    assert _memory_kib(pid, "VmHWM") - peak < 200 * 1024  # the body and its decoded text; was +1.4 GB


def test_thousand_prompts_times_128_is_refused_at_once(bounded):
    body = {"model": MODEL, "prompt": ["Tell me a story about a dragon."] * 1000, "n": 128, "max_tokens": 16}
    with LivePoller(bounded.url) as live:
        r, took = _post(bounded.url, "/v1/completions", body)
    err = _error(r)
    assert err["param"] == "prompt" and "--max-prompts" in err["message"] and "128000" in err["message"]
    assert took < 1
    live.assert_live(took)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_largest_accepted_prompt_keeps_live_answering(bounded, endpoint):
    """A prompt just under the default --max-prompt-bytes (4 MiB for dyn-tiny) passes the caps, is
    rendered and tokenized (about 1,400,000 tokens: then refused for the context length), and
    /live keeps answering all the while (with the work on the event loop, one answer waits for
    nearly all of the request)."""
    text = ("The quick brown fox jumps over the lazy dog. " * 100_000)[: (4 << 20) - 4096]
    if endpoint == "chat":
        path, body = "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    else:
        path, body = "/v1/completions", {"model": MODEL, "prompt": text}
    with LivePoller(bounded.url) as live:
        r, took = _post(bounded.url, path, body)
    err = _error(r)
    assert err["code"] == "context_length_exceeded", err
    assert took > 0.05  # the prompt really was tokenized
    live.assert_live(took)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_n128_with_twenty_logprobs_is_built_without_holding_the_loop(bounded, endpoint):
    """The probe's request, in every default cap: 128 choices of 200 tokens with 20 top logprobs
    each (a 40 MB chat body). /live held 1.32 s while it was built in one go; now no answer waits
    100 ms."""
    common = {"model": MODEL, "n": 128, "max_tokens": 200, "ignore_eos": True}
    if endpoint == "chat":
        path = "/v1/chat/completions"
        body = {
            **common,
            "messages": [{"role": "user", "content": "hi"}],
            "logprobs": True,
            "top_logprobs": 20,
        }
    else:
        path, body = "/v1/completions", {**common, "prompt": "hi", "logprobs": 20}
    with LivePoller(bounded.url) as live:
        r, _ = _post(bounded.url, path, body, timeout=120)
    assert r.status_code == 200, r.text[:500]
    choices = r.json()["choices"]
    assert len(choices) == 128
    for choice in choices:
        lps = choice["logprobs"]
        if endpoint == "chat":
            assert len(lps["content"]) == 200 and all(len(e["top_logprobs"]) == 20 for e in lps["content"])
        else:
            assert len(lps["tokens"]) == 200 and all(1 <= len(t) <= 21 for t in lps["top_logprobs"])
    live.assert_never_held()


def test_a_response_over_max_response_bytes_is_refused_before_it_is_generated(bounded):
    """The same request without max_tokens could hold 128 x 131,057 tokens with 21 logprob entries
    each (over 13 GiB of JSON): a 400 at once, naming the cap. Streamed, it is served."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "n": 128,
        "logprobs": True,
        "top_logprobs": 20,
    }
    r, took = _post(bounded.url, "/v1/chat/completions", body)
    err = _error(r)
    assert err["param"] == "max_tokens" and "--max-response-bytes" in err["message"], err
    assert "64 MiB" in err["message"] and '"stream": true' in err["message"]
    assert took < 1
    with httpx.stream(
        "POST", bounded.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=30
    ) as streamed:
        assert streamed.status_code == 200
        assert next(streamed.iter_lines()).startswith("data: ")
