"""Giving the heap's free memory back: a real glibc heap, and the periodic loop."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from dyn.core import memory

pytestmark = pytest.mark.anyio


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


def test_malloc_trim_gives_back_memory_freed_below_a_live_chunk():
    trim = memory.malloc_trim()
    if trim is None:
        pytest.skip("this C library has no malloc_trim")
    chunks = [bytearray(8192) for _ in range(6000)]  # ~48 MB of heap chunks, every page touched
    top = chunks[-1]  # still alive: free() alone cannot give back what lies below it
    del chunks
    before = rss_kib()
    trim()
    assert before - rss_kib() > 20_000
    assert len(top) == 8192


async def test_trim_periodically_trims_every_interval_until_cancelled(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(memory, "malloc_trim", lambda: lambda: calls.append(1) or 0)
    with anyio.move_on_after(0.5):
        await memory.trim_periodically(0.05)
    assert 3 <= len(calls) <= 10


async def test_trim_periodically_does_nothing_without_malloc_trim(monkeypatch):
    monkeypatch.setattr(memory, "malloc_trim", lambda: None)
    with anyio.fail_after(1):
        await memory.trim_periodically(0.01)  # returns at once
