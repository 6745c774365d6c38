"""dyn.core.frontend.encode_thread: texts queued from event loops are encoded in one thread, in
batches, each waiter getting its own text's ids (or its own error), the loop free meanwhile."""

from __future__ import annotations

import asyncio
import threading

import pytest

from dyn.core.frontend.encode_thread import EncodeThread
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.model.info import load_model_info


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_dir(load_model_info(None, None).path)


class Recorder:
    """An encode_batch that notes each call's texts and thread, and may hold or fail."""

    def __init__(self, tokenizer: Tokenizer, fail: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.fail = fail
        self.calls: list[list[str]] = []
        self.threads: set[str] = set()
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, texts: list[str]) -> list[list[int]]:
        self.gate.wait(10)
        self.calls.append(list(texts))
        self.threads.add(threading.current_thread().name)
        if self.fail is not None and self.fail in texts:
            raise ValueError(f"cannot encode {self.fail!r}")
        return self.tokenizer._encode_batch(texts)


def test_each_waiter_gets_its_texts_ids_and_texts_queued_together_share_a_call(tokenizer: Tokenizer) -> None:
    thread = EncodeThread()
    encode = Recorder(tokenizer)
    texts = [f"prompt {i}: " + "word " * (i % 7) for i in range(200)]

    async def run() -> list[list[int]]:
        encode.gate.clear()  # the first call waits, so the rest queue up behind it
        first = thread.encode(encode, texts[0])
        rest = [thread.encode(encode, t) for t in texts[1:]]
        encode.gate.set()
        return [await first, *await asyncio.wait_for(asyncio.gather(*rest), 10)]

    assert asyncio.run(run()) == [tokenizer.encode_chat(t) for t in texts]
    assert encode.threads == {"dyn-encode"}
    assert [t for call in encode.calls for t in call] == texts  # in order, each once
    assert len(encode.calls) < len(texts) / 10


def test_a_text_that_fails_fails_only_its_own_waiter(tokenizer: Tokenizer) -> None:
    thread = EncodeThread()
    encode = Recorder(tokenizer, fail="bad")

    async def run() -> list[list[int] | BaseException]:
        encode.gate.clear()
        futures = [thread.encode(encode, t) for t in ("one", "bad", "two")]
        encode.gate.set()
        return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 10)

    one, bad, two = asyncio.run(run())
    assert one == tokenizer.encode_chat("one") and two == tokenizer.encode_chat("two")
    assert isinstance(bad, ValueError) and "bad" in str(bad)


def test_a_cancelled_waiter_is_skipped_and_the_loop_runs_while_the_thread_encodes(
    tokenizer: Tokenizer,
) -> None:
    thread = EncodeThread()
    encode = Recorder(tokenizer)

    async def run() -> list[int]:
        encode.gate.clear()
        gone = thread.encode(encode, "gone")
        kept = thread.encode(encode, "kept")
        gone.cancel()
        ticks = 0
        for _ in range(20):  # the loop turns while the encode thread is held
            await asyncio.sleep(0)
            ticks += 1
        assert ticks == 20 and not kept.done()
        encode.gate.set()
        return await asyncio.wait_for(kept, 10)

    assert asyncio.run(run()) == tokenizer.encode_chat("kept")


def test_waiters_on_several_event_loops_each_get_their_answers(tokenizer: Tokenizer) -> None:
    thread = EncodeThread()
    encode = Recorder(tokenizer)
    results: dict[int, list[list[int]]] = {}

    def loop_thread(n: int) -> None:
        async def run() -> list[list[int]]:
            texts = [f"loop {n} text {i}" for i in range(20)]
            return list(
                await asyncio.wait_for(asyncio.gather(*(thread.encode(encode, t) for t in texts)), 10)
            )

        results[n] = asyncio.run(run())

    threads = [threading.Thread(target=loop_thread, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == [0, 1, 2]
    for n, ids in results.items():
        assert ids == [tokenizer.encode_chat(f"loop {n} text {i}") for i in range(20)]


def test_a_broken_encoder_fails_its_batch_and_the_thread_goes_on(tokenizer: Tokenizer) -> None:
    thread = EncodeThread()

    def short(texts: list[str]) -> list[list[int]]:
        return []  # one list of ids too few: the batch cannot be answered text by text

    async def run() -> tuple[list[list[int] | BaseException], list[int]]:
        failed = await asyncio.wait_for(
            asyncio.gather(thread.encode(short, "a"), thread.encode(short, "b"), return_exceptions=True), 10
        )
        return failed, await asyncio.wait_for(thread.encode(tokenizer._encode_batch, "after"), 10)

    failed, after = asyncio.run(run())
    assert all(isinstance(f, ValueError) for f in failed)
    assert after == tokenizer.encode_chat("after")
