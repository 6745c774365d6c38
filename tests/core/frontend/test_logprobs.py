"""Logprobs in OpenAI's chat and completions shapes, and vLLM's prompt_logprobs."""

from __future__ import annotations

import math
import random

import anyio
import anyio.lowlevel
import orjson
import pytest

from dyn.core.frontend import logprobs as logprobs_module
from dyn.core.frontend.logprobs import ChatLogprobs, CompletionLogprobs, TokenTexts, prompt_logprobs_json
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.messages import TokenLogprobs
from dyn.core.model import TINY_MODEL_DIR

TOK = Tokenizer.from_dir(TINY_MODEL_DIR)
TEXTS = TokenTexts(TOK)


def test_token_texts_and_exact_bytes():
    ids = TOK.encode("héllo wörld", add_special_tokens=False)
    assert TEXTS.text(TOK.encode(" world", add_special_tokens=False)[0]).startswith(" ")
    # the bytes of every token, joined, are the UTF-8 of the text, even where a token splits a character
    assert bytes(b for i in ids for b in TEXTS.bytes(i)) == "héllo wörld".encode()
    eot = TOK.token_to_id("<|eot_id|>")
    assert TEXTS.text(eot) == "<|eot_id|>" and bytes(TEXTS.bytes(eot)) == b"<|eot_id|>"


def test_chat_shape():
    ids = TOK.encode("a b", add_special_tokens=False)
    lps = [TokenLogprobs(-0.5, [ids[0], 7], [-0.5, -1.5]), TokenLogprobs(-math.inf, [3], [-0.1])]
    got = orjson.loads(ChatLogprobs.encode(ChatLogprobs(TEXTS, 1).entries(ids[:2], lps)))
    first, second = got["content"]
    assert first["token"] == TEXTS.text(ids[0]) and first["logprob"] == -0.5
    assert first["bytes"] == TEXTS.bytes(ids[0])
    assert first["top_logprobs"] == [
        {"token": TEXTS.text(ids[0]), "logprob": -0.5, "bytes": TEXTS.bytes(ids[0])}
    ]
    assert second["logprob"] == -9999.0  # -inf has no JSON spelling; vLLM sends -9999.0


def test_completion_shape_and_offsets_continue_across_chunks():
    ids = TOK.encode("x = 1\ny = 2", add_special_tokens=False)
    lps = [TokenLogprobs(-1.0, [t], [-1.0]) for t in ids]
    fmt = CompletionLogprobs(TEXTS, 2, offset=3)
    a = orjson.loads(fmt.encode(ids[:2], lps[:2]))
    b = orjson.loads(fmt.encode(ids[2:], lps[2:]))
    tokens = a["tokens"] + b["tokens"]
    assert "".join(tokens) == "x = 1\ny = 2"
    offsets = a["text_offset"] + b["text_offset"]
    assert offsets[0] == 3 and all(
        offsets[i + 1] == offsets[i] + len(tokens[i]) for i in range(len(tokens) - 1)
    )
    assert a["top_logprobs"][0] == {TEXTS.text(ids[0]): -1.0}


def test_prompt_logprobs_shape():
    ids = TOK.encode("hello there", add_special_tokens=False)
    lps = [None] + [TokenLogprobs(-2.0, [5, t], [-0.5, -2.0], rank=2) for t in ids[1:]]
    got = orjson.loads(anyio.run(prompt_logprobs_json, TEXTS, ids, lps, 1))
    assert got[0] is None
    entry = got[1]
    assert entry[str(ids[1])] == {"logprob": -2.0, "rank": 2, "decoded_token": TEXTS.text(ids[1])}
    assert entry["5"] == {"logprob": -0.5, "rank": 1, "decoded_token": TEXTS.text(5)}


def _random_logprobs(count: int, top: int, seed: int = 0) -> tuple[list[int], list[TokenLogprobs]]:
    rng = random.Random(seed)
    ids = [rng.randrange(4000) for _ in range(count)]
    lps = [
        TokenLogprobs(-rng.random() * 5, [rng.randrange(4000) for _ in range(top)], [-rng.random() * 9] * top)
        for _ in ids
    ]
    return ids, lps


@pytest.mark.parametrize("count", [0, 1, 7, 50])
def test_whole_responses_are_encoded_in_slices_with_the_same_json(monkeypatch, count):
    """A unary response's logprobs, encoded a few entries at a time with the event loop served in
    between, are the JSON the one-call encoders give (the slices are joined, offsets continue)."""
    monkeypatch.setattr(logprobs_module, "SLICE_ENTRIES", 9)  # 3 tokens of 1 + 2 entries per slice
    ids, lps = _random_logprobs(count, 2)
    chat = ChatLogprobs(TEXTS, 2)
    assert orjson.loads(anyio.run(chat.encode_whole, ids, lps)) == orjson.loads(
        chat.encode(chat.entries(ids, lps))
    )
    whole = anyio.run(CompletionLogprobs(TEXTS, 2, offset=5).encode_whole, ids, lps)
    assert orjson.loads(whole) == orjson.loads(CompletionLogprobs(TEXTS, 2, offset=5).encode(ids, lps))
    prompt_lps: list[TokenLogprobs | None] = [None, *lps[1:]]
    got = orjson.loads(anyio.run(prompt_logprobs_json, TEXTS, ids, prompt_lps, 2))
    assert len(got) == count and (count == 0 or got[0] is None)


def test_slices_yield_to_the_event_loop_between_them(monkeypatch):
    """Another task runs between two slices: a response of many thousands of entries never holds
    the event loop for the whole of its encoding."""
    monkeypatch.setattr(logprobs_module, "SLICE_ENTRIES", 21)  # one token of 1 + 20 entries
    ids, lps = _random_logprobs(40, 20)
    ticks = 0

    async def main() -> None:
        nonlocal ticks
        done = anyio.Event()

        async def tick() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            tg.start_soon(tick)
            await anyio.lowlevel.checkpoint()
            await ChatLogprobs(TEXTS, 20).encode_whole(ids, lps)
            done.set()

    anyio.run(main)
    assert ticks >= 39  # one turn of the other task per slice boundary
