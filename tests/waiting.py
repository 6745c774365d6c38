"""Deadline waits for tests: poll a condition until it holds or a deadline passes, instead of
sleeping a fixed time and hoping it happened meanwhile. A timeout fails the test saying what was
awaited."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import anyio

T = TypeVar("T")


def poll_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns something truthy, and return
    that; ``AssertionError`` naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


async def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.01) -> T:
    """``poll_until`` for async tests: sleeps without blocking the event loop."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await anyio.sleep(interval)
