"""``best_of`` in-process over fake workers: ``best_of`` generations per prompt, the ``n`` with
the highest cumulative logprob answered (vLLM's V0 ranking; OpenAI's
``best_of`` on text completions), every generated token billed, and the rules around it: at
least ``n``, never streamed when greater, not with beam search.

Each fake generation is told apart by its seed (the frontend gives choice ``j`` the seed
``seed + j``): its text is one word per seed, and each of its tokens has logprob
``-|seed - BEST|``, so the generation seeded ``BEST`` is the likeliest.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from dyn.core.messages import GenerateRequest, TokenChunk, TokenLogprobs
from tests.core.frontend.fake_workers import Batch, finish, token_ids

pytestmark = pytest.mark.anyio

SEED = 100
BEST = 102
WORDS = [" self", " def", " return", " import", " if"]


def by_seed():
    seen: list[GenerateRequest] = []

    async def script(request: GenerateRequest) -> AsyncIterator[Batch]:
        seen.append(request)
        seed = request.sampling.seed
        ids = token_ids(WORDS[seed - SEED] * 2)
        lp = -abs(seed - BEST) - 0.1
        top = request.logprobs or 0
        for token in ids:
            lps = [TokenLogprobs(lp, [token] * min(top, 1), [lp] * min(top, 1), 1)]
            yield [TokenChunk(request.request_id, [token], lps if request.logprobs is not None else [])]
        yield [finish(request, "stop", len(ids))]

    script.seen = seen  # type: ignore[attr-defined]
    return script


async def test_the_likeliest_of_best_of_is_answered_and_all_are_billed(make_frontend):
    script = by_seed()
    async with make_frontend(workers=1, script=script) as fe:
        body = {"prompt": "Hello", "max_tokens": 8, "seed": SEED, "best_of": 4}
        r = await fe.client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        assert [(c["index"], c["text"]) for c in out["choices"]] == [(0, WORDS[2] * 2)]
        assert out["choices"][0]["logprobs"] is None  # asked for the ranking only
        assert len(script.seen) == 4 and all(s.logprobs == 0 for s in script.seen)
        assert out["usage"]["completion_tokens"] == sum(len(token_ids(w * 2)) for w in WORDS[:4])


async def test_n_of_best_of_come_best_first_with_the_logprobs_asked_for(make_frontend):
    async with make_frontend(workers=1, script=by_seed()) as fe:
        body = {"prompt": "Hello", "max_tokens": 8, "seed": SEED, "best_of": 5, "n": 2, "logprobs": 1}
        r = await fe.client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        choices = r.json()["choices"]
        assert [c["index"] for c in choices] == [0, 1]
        assert choices[0]["text"] == WORDS[2] * 2
        assert choices[1]["text"] == WORDS[1] * 2  # tied with WORDS[3]: the earlier generated
        assert all(lp == pytest.approx(-0.1) for lp in choices[0]["logprobs"]["token_logprobs"])
        chat = await fe.client.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "hi"}],
                "seed": SEED,
                "best_of": 3,
                "max_tokens": 8,
            },
        )
        assert chat.status_code == 200, chat.text
        assert chat.json()["choices"][0]["message"]["content"] == WORDS[2] * 2


@pytest.mark.parametrize(
    "extra,words",
    [
        ({"best_of": 1, "n": 2}, "at least n"),
        ({"best_of": 3, "stream": True}, "cannot be streamed"),
        ({"best_of": 3, "use_beam_search": True}, "use_beam_search"),
        ({"best_of": 10_000}, "--max-n"),
    ],
)
async def test_best_of_rules_are_400s(make_frontend, extra, words):
    script = by_seed()
    async with make_frontend(workers=1, script=script) as fe:
        r = await fe.client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 4, **extra})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "best_of" and words in r.json()["error"]["message"]
        assert script.seen == []
