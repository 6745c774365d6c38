"""Giving the heap's free memory back to the operating system, and keeping the cyclic garbage
collector off the objects a service keeps for its whole life.

glibc's malloc returns freed memory to the system only from the top of its heap; chunks freed
below a live one stay in the process. A frontend under load frees as much as it allocates, in
objects of every size, so its resident memory creeps up with free chunks: 30-35 MB of it at 128
concurrent streams, which ``malloc_trim(0)`` gives back in about 3 ms (docs/benchmarks.md).
``trim_periodically`` does that every ``TRIM_INTERVAL_S`` in a worker thread (the event loop goes
on meanwhile). Where there is no glibc (macOS, musl) it does nothing.

``settle_heap`` is for a service about to serve: under load, Python's default collector
thresholds (a young collection every 700 net new container objects) ran a full collection every
second or so over every object the process had, modules and all, about 40 ms each, and the
young ones ~2,000 times in 10 s: about a tenth of the frontend's CPU at 128 streams, measured
with ``gc.callbacks`` (docs/benchmarks.md). Requests free almost everything they allocate by
reference counting, so collecting rarely costs little memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
from collections.abc import Callable

import anyio
import anyio.to_thread

TRIM_INTERVAL_S = 1.0
GC_THRESHOLDS = (10_000, 20, 10)
"""Net new container objects between young collections, then young collections per middle one,
middle ones per full one (CPython's defaults: 700, 10, 10)."""


def settle_heap() -> None:
    """Move every object alive now out of the collector's sight (``gc.freeze``: what the process
    has built so far is kept for its life) and collect less often (``GC_THRESHOLDS``)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def malloc_trim() -> Callable[[], int] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


async def trim_periodically(interval_s: float = TRIM_INTERVAL_S) -> None:
    """Give free heap memory back every ``interval_s`` seconds until cancelled."""
    trim = malloc_trim()
    if trim is None:
        return
    while True:
        await anyio.sleep(interval_s)
        await anyio.to_thread.run_sync(trim)
