"""Short texts tokenized off the event loop, in batches: ``EncodeThread``.

The Rust tokenizer releases the GIL while it encodes, so a text tokenized in another thread costs
the event loop only handing the text over and taking its ids back. A short chat prompt costs
50-100 us to encode, the largest part of the frontend loop's work per request, and a thread hop
per text (anyio's, ~50 us) would cost as much again. So one thread per process takes every text
queued since it last looked, encodes them in one call per tokenizer, and hands the ids back to
each waiting event loop in one callback: the hop is shared by all the texts queued meanwhile, and
while the thread encodes, the loop serves other requests.

Contract: ``await ENCODE_THREAD.encode(encode_batch, text)`` returns ``encode_batch([text])[0]``,
or raises what encoding that text alone raised. Texts are encoded in the order they were queued.
A waiter cancelled meanwhile gets nothing (its ids are dropped). The thread starts on first use
(again if it ever died), is a daemon, and keeps no text once it has answered.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

EncodeBatch = Callable[[list[str]], list[list[int]]]
"""Encodes texts, as ``Tokenizer._encode_batch`` (the Rust tokenizer, GIL released)."""

MAX_BATCH = 256
"""Texts encoded in one call at most; more wait for the next call."""

_Item = tuple[EncodeBatch, str, "asyncio.Future[list[int]]"]


class EncodeThread:
    """See the module docstring."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        """Nothing queued and no thread yet (also in a forked child, which has no such thread)."""
        self._pending: list[_Item] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    def encode(self, encode_batch: EncodeBatch, text: str) -> asyncio.Future[list[int]]:
        """The ids of ``text``, as a future of the running event loop."""
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._pending.append((encode_batch, text, future))
            first = len(self._pending) == 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="dyn-encode", daemon=True)
                self._thread.start()
        if first:  # else the thread was woken already and takes this text with the others
            self._ready.set()
        return future

    def _run(self) -> None:
        while True:
            self._ready.wait()
            with self._lock:
                batch = self._pending[:MAX_BATCH]
                del self._pending[:MAX_BATCH]
                if not self._pending:
                    self._ready.clear()
            if not batch:
                continue
            try:
                results = _encoded(batch)
            except Exception as exc:  # a bug here must not leave the batch's requests waiting
                log.exception("encoding %d prompts failed", len(batch))
                results = [(future, exc) for _, _, future in batch]
            _answer(results)


def _encoded(batch: list[_Item]) -> list[tuple[asyncio.Future[list[int]], list[int] | BaseException]]:
    """Each item's ids (or the exception encoding it alone raised), one call per tokenizer."""
    by_encoder: dict[EncodeBatch, list[_Item]] = {}
    for item in batch:
        by_encoder.setdefault(item[0], []).append(item)
    out: list[tuple[asyncio.Future[list[int]], list[int] | BaseException]] = []
    for encode_batch, items in by_encoder.items():
        try:
            ids = encode_batch([text for _, text, _ in items])
        except Exception:  # find the text that fails; the others still get their ids
            for _, text, future in items:
                try:
                    out.append((future, encode_batch([text])[0]))
                except Exception as exc:
                    out.append((future, exc))
            continue
        out.extend((future, i) for (_, _, future), i in zip(items, ids, strict=True))
    return out


def _answer(results: list[tuple[asyncio.Future[list[int]], list[int] | BaseException]]) -> None:
    """Hand each result to its future, one callback per event loop."""
    by_loop: dict[
        asyncio.AbstractEventLoop, list[tuple[asyncio.Future[list[int]], list[int] | BaseException]]
    ] = {}
    for future, result in results:
        by_loop.setdefault(future.get_loop(), []).append((future, result))
    for loop, answers in by_loop.items():
        try:
            loop.call_soon_threadsafe(_deliver, answers)
        except RuntimeError:  # the loop closed meanwhile: nobody waits for these
            log.debug("dropped %d encodings for a closed event loop", len(answers))


def _deliver(answers: list[tuple[asyncio.Future[list[int]], list[int] | BaseException]]) -> None:
    for future, result in answers:
        if future.done():  # cancelled while it waited
            continue
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)


ENCODE_THREAD = EncodeThread()
"""The process's encode thread."""
os.register_at_fork(after_in_child=ENCODE_THREAD._reset)
