"""``dyn worker mocker --max-model-len 1024`` behind a real ``dyn frontend``: the worker advertises
the capped context, the frontend serves it (``/v1/models``' ``max_model_len``) and refuses a chat
prompt over it with a 400 in vLLM's words, and serves one that fits."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.integration

MODEL = "dyn-tiny"
LIMIT = 1024


@pytest.fixture(scope="module")
def capped(stack_factory):
    return stack_factory("maxlen").up(
        workers=1, worker_args=("--block-size", "16", "--max-model-len", str(LIMIT))
    )


def _messages(url: str, tokens: int) -> list[dict]:
    """A one-message chat whose rendered prompt is ``tokens`` tokens long, give or take a few."""
    words = tokens
    for _ in range(8):
        messages = [{"role": "user", "content": " ".join(["word"] * words)}]
        r = httpx.post(url + "/tokenize", json={"model": MODEL, "messages": messages}, timeout=30)
        count = r.json()["count"]
        if abs(count - tokens) <= 8:
            return messages
        words = max(1, words + tokens - count)
    raise AssertionError(f"no prompt of about {tokens} tokens (last: {count})")


def test_a_prompt_over_the_workers_limit_is_a_400_naming_it_and_one_under_it_is_served(capped):
    models = httpx.get(capped.url + "/v1/models", timeout=10).json()["data"]
    assert models[0]["max_model_len"] == LIMIT

    over = httpx.post(
        capped.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": _messages(capped.url, 1500), "max_tokens": 16},
        timeout=30,
    )
    assert over.status_code == 400, over.text
    error = over.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["message"].startswith(f"This model's maximum context length is {LIMIT} tokens. However, ")

    fits = httpx.post(
        capped.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": _messages(capped.url, 900), "max_tokens": 16},
        timeout=30,
    )
    assert fits.status_code == 200, fits.text
    usage = fits.json()["usage"]
    assert 890 <= usage["prompt_tokens"] <= 910 and usage["completion_tokens"] <= 16

    # without max_tokens the completion is capped to what the worker's context leaves
    rest = httpx.post(
        capped.url + "/v1/completions",
        json={"model": MODEL, "prompt": [5] * (LIMIT - 4), "ignore_eos": True},
        timeout=30,
    )
    assert rest.status_code == 200, rest.text
    assert rest.json()["usage"]["completion_tokens"] == 4
