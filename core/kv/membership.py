"""What KV-event ingestion needs of a membership source: workers joining and leaving.

The index follows the workers; it does not know who tracks them. A membership source (the
router's ``WorkerPool``, the offline replay's fixed pool, a test's fake) calls every listener with
``(member, True)`` when a worker joins (and at once for each current one when the listener is
added) and ``(member, False)`` when it leaves; a member carries the worker's discovery record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from dyn.core.messages import WorkerRecord


class Member(Protocol):
    """A worker as its membership source reports it."""

    @property
    def record(self) -> WorkerRecord: ...


MembershipListener = Callable[[Member, bool], None]
"""Called with ``(member, joined)``: ``joined`` is False when the worker left."""


class Membership(Protocol):
    """A source of workers joining and leaving."""

    def add_listener(self, listener: MembershipListener) -> None:
        """Hear every later change; current members are reported as joined at once."""
