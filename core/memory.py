"""Giving the heap's free memory back to the operating system, and keeping the cyclic garbage
collector off the objects a service keeps for its whole life.

glibc's malloc returns freed memory to the system only from the top of its heap; chunks freed
below a live one stay in the process. A frontend under load frees as much as it allocates, in
objects of every size, so its resident memory creeps up with free chunks: 30-35 MB of it at 128
concurrent streams, which ``malloc_trim(0)`` gives back in about 3 ms (docs/benchmarks.md).
``trim_periodically`` does that every ``TRIM_INTERVAL_S`` in a worker thread (the event loop goes
on meanwhile). Where there is no glibc (macOS, musl) it does nothing.

``heap_bytes`` (glibc's ``mallinfo2``) measures what a library call kept, where the library
says nothing of its own memory (llguidance's grammars, ``dyn.core.protocol.grammar``); ``trim``
hands freed memory back at once.

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


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks")
        + ("fordblks", "keepcost")
    ]


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _glibc()
_MALLINFO2 = getattr(_LIBC, "mallinfo2", None)  # glibc 2.33 and newer
if _MALLINFO2 is not None:
    _MALLINFO2.restype = _MallInfo2


def malloc_trim() -> Callable[[], int] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none."""
    if _LIBC is None:
        return None
    trim = _LIBC.malloc_trim
    return lambda: trim(0)


def trim() -> None:
    """Give the heap's free memory back now (``malloc_trim(0)``; nothing without glibc)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def heap_bytes() -> int:
    """Bytes malloc has handed out and not taken back, over all arenas (glibc's ``mallinfo2``);
    0 where that is unknown. Python objects count too (pymalloc's arenas aside): a difference
    around a library call is that call's, plus whatever other threads allocated meanwhile."""
    if _MALLINFO2 is None:
        return 0
    info = _MALLINFO2()
    return int(info.uordblks + info.hblkhd)


async def trim_periodically(interval_s: float = TRIM_INTERVAL_S) -> None:
    """Give free heap memory back every ``interval_s`` seconds until cancelled."""
    trim = malloc_trim()
    if trim is None:
        return
    while True:
        await anyio.sleep(interval_s)
        await anyio.to_thread.run_sync(trim)
