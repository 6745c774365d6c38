"""``use_beam_search`` in-process, over fake workers that answer each one-token step with the top
logprobs of a small hand-made language model whose distribution depends on the tokens so far.

The model is built so that greedy decoding and beam search disagree: after the prompt " self" is
the likeliest token (0.5) but every token after it is unlikely (0.26 at best), while " def"
(0.4) is followed by " return" at 0.9. A search of width 2 finds " def return" (0.36) ahead of
" self if" (0.13); width 1 is greedy. The algorithm and its ranking are vLLM's
(``vllm/entrypoints/generate/beam_search/online.py`` and ``utils.py``, 0.32): each step asks for
``2 * n`` top logprobs, a beam that picks EOS is complete (its text leaves the EOS out), and the
results are ranked by cumulative logprob / (prompt + output length) ** length_penalty.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator

import pytest

from dyn.core.frontend.beam_search import MAX_BEAM_STEP_REQUESTS
from dyn.core.messages import GenerateRequest, TokenChunk, TokenLogprobs
from tests.core.frontend.fake_workers import Batch, finish, token_ids

pytestmark = pytest.mark.anyio

PROMPT = [10, 11]
EOS = 4
SELF, DEF, RETURN, IF, FOR, NONE = (
    token_ids(w)[0] for w in (" self", " def", " return", " if", " for", " None")
)

MODEL: dict[tuple[int, ...], list[tuple[int, float]]] = {
    (): [(SELF, 0.5), (DEF, 0.4), (FOR, 0.06), (NONE, 0.04)],
    (SELF,): [(IF, 0.26), (FOR, 0.25), (NONE, 0.25), (RETURN, 0.24)],
    (DEF,): [(RETURN, 0.9), (IF, 0.05), (FOR, 0.03), (NONE, 0.02)],
}
FLAT = [(IF, 0.3), (FOR, 0.3), (NONE, 0.2), (RETURN, 0.2)]


def language_model(table: dict[tuple[int, ...], list[tuple[int, float]]]):
    """A worker script: one token after the request's prompt, with the top logprobs ``table``
    gives for the tokens after ``PROMPT`` (``FLAT`` for a context it does not list)."""
    seen: list[GenerateRequest] = []

    async def script(request: GenerateRequest) -> AsyncIterator[Batch]:
        seen.append(request)
        context = tuple(request.token_ids[len(PROMPT) :])
        ranked = table.get(context, FLAT)[: request.logprobs or 1]
        ids = [t for t, _ in ranked]
        lps = [math.log(p) for _, p in ranked]
        yield [TokenChunk(request.request_id, [ids[0]], [TokenLogprobs(lps[0], ids, lps, 1)])]
        yield [finish(request, "length", 1)]

    script.seen = seen  # type: ignore[attr-defined]
    return script


async def beam(fe, n: int, max_tokens: int = 2, **extra) -> dict:
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "n": n, "use_beam_search": True, **extra}
    r = await fe.client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def text(*ids: int) -> str:
    from tests.core.frontend.fake_workers import tokenizer

    return tokenizer().decode(list(ids))


async def test_beam_search_finds_the_likelier_sequence_that_greedy_misses(make_frontend):
    model = language_model(MODEL)
    async with make_frontend(workers=2, script=model) as fe:
        body = await beam(fe, n=2)
        assert [c["text"] for c in body["choices"]] == [text(DEF, RETURN), text(SELF, IF)]
        assert [c["finish_reason"] for c in body["choices"]] == ["length", "length"]
        assert body["usage"]["completion_tokens"] == 4 and body["usage"]["prompt_tokens"] == 2
        steps = model.seen
        assert all(s.stop.max_tokens == 1 and s.logprobs == 4 for s in steps)  # 2n top logprobs a step
        assert [len(s.token_ids) for s in steps] == [2, 3, 3]  # the prompt, then each of 2 beams
        assert {tuple(s.token_ids[2:]) for s in steps[1:]} == {(SELF,), (DEF,)}

        greedy = await beam(fe, n=1)
        assert [c["text"] for c in greedy["choices"]] == [text(SELF, IF)]


async def test_logprobs_are_each_chosen_tokens_and_sum_to_the_beams_score(make_frontend):
    async with make_frontend(workers=1, script=language_model(MODEL)) as fe:
        body = await beam(fe, n=2, logprobs=2)
        best = body["choices"][0]["logprobs"]
        assert best["token_logprobs"] == pytest.approx([math.log(0.4), math.log(0.9)])
        assert list(best["top_logprobs"][0]) == [text(SELF), text(DEF)]  # the 2 asked for


async def test_a_beam_that_picks_eos_is_complete_and_its_text_leaves_eos_out(make_frontend):
    table = {**MODEL, (): [(EOS, 0.7), (SELF, 0.2), (DEF, 0.05), (FOR, 0.05)]}
    async with make_frontend(workers=1, script=language_model(table)) as fe:
        body = await beam(fe, n=2)
        first, second = body["choices"]
        assert (first["text"], first["finish_reason"]) == ("", "stop")
        assert (second["text"], second["finish_reason"]) == (text(SELF, IF), "length")
        body = await beam(fe, n=2, ignore_eos=True)
        assert all(c["finish_reason"] == "length" for c in body["choices"])


async def test_length_penalty_ranks_by_score_per_token(make_frontend):
    """A short complete beam against a longer live one: with length_penalty 0 the raw cumulative
    logprob ranks them, with a large one the longer beam's per-token score wins."""
    table = {
        **MODEL,
        (): [(EOS, 0.45), (SELF, 0.45), (DEF, 0.05), (FOR, 0.05)],
        (SELF,): [(IF, 0.99)] + FLAT[1:],
    }
    async with make_frontend(workers=1, script=language_model(table)) as fe:
        plain = await beam(fe, n=2, max_tokens=2, length_penalty=0.0)
        assert plain["choices"][0]["text"] == ""  # log .45 > log(.45 * .99)
        long = await beam(fe, n=2, max_tokens=2, length_penalty=4.0)
        assert long["choices"][0]["text"] == text(SELF, IF)


async def test_streamed_chat_gets_each_beam_whole(make_frontend):
    async with make_frontend(workers=1, script=language_model(MODEL)) as fe:
        body = {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
            "n": 2,
            "use_beam_search": True,
            "stream": True,
        }
        r = await fe.client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        content = {0: "", 1: ""}
        for event in events:
            for choice in event["choices"]:
                content[choice["index"]] += choice["delta"].get("content") or ""
        # the chat prompt is not PROMPT, so every step is the model's flat distribution
        assert content == {0: text(IF, IF), 1: text(IF, FOR)}
        assert r.text.rstrip().endswith("data: [DONE]")


@pytest.mark.parametrize(
    "extra,param,words",
    [
        ({"n": 11}, "n", "at most 20 (--max-logprobs)"),
        ({"prompt_logprobs": 1}, "prompt_logprobs", "with beam search"),
        ({"response_format": {"type": "json_object"}}, "use_beam_search", "structured output"),
        (
            {"nvext": {"session_control": {"session_id": "s", "action": "open"}}},
            "nvext.session_control",
            "beam",
        ),
    ],
)
async def test_what_beam_search_cannot_do_is_a_400(make_frontend, extra, param, words):
    async with make_frontend(workers=1, script=language_model(MODEL)) as fe:
        body = {"prompt": PROMPT, "max_tokens": 2, "use_beam_search": True, **extra}
        r = await fe.client.post("/v1/completions", json=body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param and words in r.json()["error"]["message"]


async def test_a_search_is_bounded_in_engine_requests(make_frontend):
    """n * max_tokens one-token requests at most: one request cannot flood the workers."""
    model = language_model(MODEL)
    async with make_frontend(workers=1, script=model) as fe:
        for extra in ({"n": 4, "max_tokens": MAX_BEAM_STEP_REQUESTS // 4 + 1}, {"n": 2, "max_tokens": None}):
            body = {"prompt": PROMPT, "use_beam_search": True, **extra}
            r = await fe.client.post("/v1/completions", json=body)
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["param"] == "max_tokens" and "n * max_tokens <=" in error["message"]
        assert model.seen == []
