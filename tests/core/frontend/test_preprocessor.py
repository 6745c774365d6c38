"""dyn.core.frontend.preprocessor's async entry points: small requests are preprocessed inline
(a short chat prompt tokenized in the encode thread), large ones in a few worker threads, so the
event loop keeps running while the largest prompt the caps allow is rendered and tokenized."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import anyio
import msgspec
import pytest

from dyn.core.frontend.limits import RequestLimits
from dyn.core.frontend.preprocessor import INLINE_WORK_BYTES, PREPROCESS_THREADS, Preprocessor
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.model.info import load_model_info
from dyn.core.protocol.errors import ApiError
from dyn.core.protocol.openai import ChatCompletionRequest, CompletionRequest


class WatchedTokenizer(Tokenizer):
    """dyn-tiny's tokenizer, noting which threads encode and how many at once."""

    threads: list[str]
    batch_threads: list[str]
    """Where ``_encode_batch`` and ``_encode_batch_special`` ran (the encode thread's calls, and
    the prefix cache's)."""
    running = 0
    most = 0
    delay = 0.0
    lock = threading.Lock()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._watched(super().encode, text, add_special_tokens)

    def encode_chat(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._watched(super().encode_chat, text, add_special_tokens)

    def _encode_batch(self, texts: list[str]) -> list[list[int]]:
        WatchedTokenizer.batch_threads.append(threading.current_thread().name)
        return super()._encode_batch(texts)

    def _encode_batch_special(self, texts: list[str]) -> list[list[int]]:
        WatchedTokenizer.batch_threads.append(threading.current_thread().name)
        return super()._encode_batch_special(texts)

    def _watched(self, encode, text: str, add_special_tokens: bool) -> list[int]:
        cls = WatchedTokenizer
        with cls.lock:
            cls.threads.append(threading.current_thread().name)
            cls.running += 1
            cls.most = max(cls.most, cls.running)
        try:
            if cls.delay:
                time.sleep(cls.delay)
            return encode(text, add_special_tokens)
        finally:
            with cls.lock:
                cls.running -= 1


@pytest.fixture
def pre() -> Preprocessor:
    WatchedTokenizer.threads, WatchedTokenizer.most, WatchedTokenizer.delay = [], 0, 0.0
    WatchedTokenizer.batch_threads = []
    info = load_model_info(None, None)
    return Preprocessor(info, WatchedTokenizer.from_dir(info.path), limits=RequestLimits())


def chat(content: Any, **body: Any) -> ChatCompletionRequest:
    return msgspec.convert(
        {"messages": [{"role": "user", "content": content}], "max_tokens": 1, **body}, ChatCompletionRequest
    )


def test_small_inline_large_in_a_thread(pre: Preprocessor) -> None:
    main = threading.current_thread().name

    async def run() -> None:
        prompt = await pre.chat_async(chat("hello"))
        assert prompt.token_ids == pre.chat(chat("hello")).token_ids
        WatchedTokenizer.threads = []
        assert WatchedTokenizer.batch_threads == ["dyn-encode", main]  # the second: pre.chat
        small = msgspec.convert({"prompt": ["hello", [1, 2]], "max_tokens": 1}, CompletionRequest)
        prompts = await pre.completions_async(small)
        assert [p.token_ids for p in prompts] == [p.token_ids for p in pre.completions(small)]
        assert prompts[1].token_ids == [1, 2] and prompts[1].pretokenized
        assert WatchedTokenizer.threads == [main]  # pre.completions; the async one encoded in:
        assert WatchedTokenizer.batch_threads[-1] == "dyn-encode"
        await pre.chat_async(chat("word " * INLINE_WORK_BYTES))
        batch = {"prompt": ["word " * INLINE_WORK_BYTES] * 2, "max_tokens": 1}
        await pre.completions_async(msgspec.convert(batch, CompletionRequest))
        assert len(WatchedTokenizer.threads) == 4 and main not in WatchedTokenizer.threads[1:]
        # long stop strings are work too: their matcher is built off the loop
        await pre.chat_async(chat("hi", stop=["x" * 4000, "y" * 4000]))
        assert WatchedTokenizer.threads[-1] != main

    anyio.run(run)


def test_bounds_are_checked_before_the_thread(pre: Preprocessor) -> None:
    async def run() -> None:
        with pytest.raises(ApiError) as caught:
            await pre.chat_async(chat("x" * (pre.prompt_bytes + 1)))
        assert "--max-prompt-bytes" in caught.value.message
        assert WatchedTokenizer.threads == []

    anyio.run(run)


def test_threads_are_bounded(pre: Preprocessor) -> None:
    WatchedTokenizer.delay = 0.2

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(3 * PREPROCESS_THREADS):
                tg.start_soon(pre.chat_async, chat("word " * INLINE_WORK_BYTES))

    anyio.run(run)
    assert WatchedTokenizer.most == PREPROCESS_THREADS


def test_speculative_prefix_is_skipped_when_the_threads_are_busy(pre: Preprocessor) -> None:
    request = chat("hello")

    async def run() -> None:
        assert await pre.next_turn_prefix_async(request, "hi there") is not None
        WatchedTokenizer.delay = 0.5
        async with anyio.create_task_group() as tg:
            for _ in range(PREPROCESS_THREADS):
                tg.start_soon(pre.chat_async, chat("word " * INLINE_WORK_BYTES))
            with anyio.fail_after(5):
                while pre._threads().borrowed_tokens < PREPROCESS_THREADS:
                    await anyio.sleep(0.01)
            assert await pre.next_turn_prefix_async(request, "hi there") is None

    anyio.run(run)


def test_the_loop_keeps_running_while_the_largest_prompt_is_preprocessed(pre: Preprocessor) -> None:
    """The largest prompt the default caps accept, in one message: the loop is never held for
    250 ms (its heartbeat keeps beating) while it is rendered and tokenized, about 5 s of work
    here that would hold it for seconds inline (100 ms was exceeded once, 129 ms, on a loaded
    2-core machine with the suite's other worker beside it)."""
    text = ("All work and no play makes Jack a dull boy. " * (pre.prompt_bytes // 45))[
        : pre.prompt_bytes - 100
    ]
    request = chat(text, max_tokens=None)
    gaps: list[float] = []

    async def heartbeat(done: anyio.Event) -> None:
        last = time.perf_counter()
        while not done.is_set():
            await anyio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    async def run() -> None:
        done = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(heartbeat, done)
            try:
                with pytest.raises(ApiError, match="maximum context length"):  # 4 MiB is > 131072 tokens
                    await pre.chat_async(request)
            finally:
                done.set()

    start = time.perf_counter()
    anyio.run(run)
    assert WatchedTokenizer.threads and WatchedTokenizer.threads[0] != threading.current_thread().name
    assert time.perf_counter() - start > 0.05 and len(gaps) > 5  # real work happened while the loop beat
    assert max(gaps) < 0.25, max(gaps)


def test_token_ids_outside_the_vocabulary_are_refused(pre: Preprocessor) -> None:
    vocab = pre.info.vocab_size
    for ids in ([vocab], [1, -1]):
        with pytest.raises(ApiError, match=rf"prompt token ids must be in \[0, {vocab}\)"):
            pre.completions(msgspec.convert({"prompt": ids, "max_tokens": 1}, CompletionRequest))
    with pytest.raises(ApiError, match="prompt token ids must be in"):
        pre.chat(chat("hi", nvext={"token_data": [vocab]}))  # negative ones fail decoding
    assert pre.chat(chat("hi", nvext={"token_data": [vocab - 1]})).token_ids == [vocab - 1]


def test_a_tokenizer_larger_than_the_models_vocabulary_has_its_ids_checked() -> None:
    info = load_model_info(None, None)
    tokenizer = Tokenizer.from_dir(info.path)
    pre = Preprocessor(dataclasses.replace(info, vocab_size=10), tokenizer, limits=RequestLimits())
    with pytest.raises(ApiError, match=r"prompt token ids must be in \[0, 10\)"):
        pre.chat(chat("hello there"))
