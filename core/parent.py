"""A child process that stops when the process that started it dies.

``dyn serve`` starts every child with its own pid in ``PARENT_ENV``; each ``dyn`` command calls
``follow_parent`` first, so a supervisor killed with SIGKILL (no chance to stop its children) leaves
no orphan frontend or worker behind. The frontend's HTTP worker processes follow their supervisor
the same way (``die_with_parent``). Kept apart from ``dyn.core.serve`` so that every process can
call it without importing the supervisor (and httpx).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "DYN_SERVE_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def follow_parent() -> None:
    """In a child of ``dyn serve`` (``PARENT_ENV`` set): ask Linux to SIGTERM this process when
    the supervisor dies, and stop at once if it died already. A no-op elsewhere."""
    parent = os.environ.get(PARENT_ENV)
    if parent:
        die_with_parent(int(parent))


def die_with_parent(parent: int) -> None:
    """Ask Linux to SIGTERM this process when process ``parent`` dies, and stop at once if it
    died already. A no-op off Linux."""
    if not sys.platform.startswith("linux"):
        return
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:  # the supervisor died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)
