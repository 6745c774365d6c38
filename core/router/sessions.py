"""``SessionAffinity``: sticky sessions, session id -> (worker, dp rank), with a sliding TTL.

Reference 4.2 (Dynamo's StickySessionRouter store). A binding is ``router_only`` (made by
``bind``: the router keeps the session on one worker, the engine knows nothing) or
``engine_backed`` (made by ``open``: the worker holds a streaming session for it). ``resolve``
refreshes the TTL (the window slides on every turn); ``peek`` does not. An expired binding is
never returned: ``peek``/``resolve`` drop it, and ``expire`` hands every expired binding to the
caller (whose reaper closes the engine-backed ones on their worker).

Bounded: at most ``max_sessions`` bindings (Dynamo's cap, 65,536); binding one more evicts the
least recently used, which ``expire`` hands over like an expired one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class Binding:
    instance_id: int
    dp_rank: int | None
    ttl_s: float
    expires_at: float
    engine_backed: bool


MAX_SESSIONS = 65_536


class SessionAffinity:
    def __init__(self, clock: Callable[[], float] = time.monotonic, max_sessions: int = MAX_SESSIONS) -> None:
        self._clock = clock
        self.max_sessions = max_sessions
        self._bindings: dict[str, Binding] = {}
        self._expired: list[tuple[str, Binding]] = []

    def __len__(self) -> int:
        return len(self._bindings)

    def bind(
        self, session_id: str, instance_id: int, dp_rank: int | None, ttl_s: float, *, engine_backed: bool
    ) -> Binding:
        """Bind (or rebind) ``session_id``; the TTL starts now."""
        binding = Binding(instance_id, dp_rank, ttl_s, self._clock() + ttl_s, engine_backed)
        bindings = self._bindings
        bindings.pop(session_id, None)
        if len(bindings) >= self.max_sessions:
            oldest = next(iter(bindings))
            self._expired.append((oldest, bindings.pop(oldest)))
        bindings[session_id] = binding
        if self._expired:  # an expiry not reaped yet must not close the session bound anew
            self._expired = [(sid, b) for sid, b in self._expired if sid != session_id]
        return binding

    def peek(self, session_id: str) -> Binding | None:
        """The live binding, without refreshing it."""
        binding = self._bindings.get(session_id)
        if binding is not None and binding.expires_at <= self._clock():
            self._expired.append((session_id, self._bindings.pop(session_id)))
            return None
        return binding

    def resolve(self, session_id: str) -> Binding | None:
        """The live binding, its TTL refreshed (the session was used now)."""
        binding = self.peek(session_id)
        if binding is not None:
            binding.expires_at = self._clock() + binding.ttl_s
            self._bindings[session_id] = self._bindings.pop(session_id)  # now the most recently used
        return binding

    def unbind(self, session_id: str) -> Binding | None:
        """Remove the binding and return it (``None`` if there was none or it had expired)."""
        return self.peek(session_id) and self._bindings.pop(session_id)

    def expire(self) -> list[tuple[str, Binding]]:
        """Remove and return every binding past its TTL, with those dropped by lookups since."""
        now = self._clock()
        for sid, binding in list(self._bindings.items()):
            if binding.expires_at <= now:
                self._expired.append((sid, self._bindings.pop(sid)))
        expired, self._expired = self._expired, []
        return expired
