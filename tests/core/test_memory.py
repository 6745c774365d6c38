"""Giving the heap's free memory back (a real glibc heap, and the periodic loop), and the
collector's settings for serving."""

from __future__ import annotations

import subprocess
import sys
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


def test_settle_heap_hides_what_exists_from_the_collector_which_still_collects_new_cycles():
    """In a process of its own: the collector's state is the process's."""
    program = """
import gc, weakref
from dyn.core import memory

kept = [[i] for i in range(50_000)]  # lists are always tracked
memory.settle_heap()
assert gc.get_threshold() == memory.GC_THRESHOLDS, gc.get_threshold()
assert gc.get_freeze_count() > 50_000 and len(gc.get_objects()) < 1_000, len(gc.get_objects())

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a
gone = weakref.ref(a)
del a, b
gc.collect()
assert gone() is None
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
