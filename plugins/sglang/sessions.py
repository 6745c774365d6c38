"""dyn's record of the SGLang streaming sessions a worker opened, and how each turn is sent.

SGLang's streaming session (``--enable-streaming-session``; ``Session.create_req`` in
``python/sglang/srt/session/session_controller.py``, 0.5.23) keeps one conversation's KV between
turns: a request with ``session_params={"id": ...}`` has its ``input_ids`` *appended* to the
session's history (the last turn's prompt and every id it generated, stop token included). It
allows one turn at a time, no rewind, and is reaped ``timeout`` seconds after it was opened or its
last turn *started* (``Session.last_active_time``, set in ``create_req``; a turn still running
then is closed when it ends).

dyn's ``GenerateRequest`` carries the whole prompt, so the table turns a session turn into:

- ``first``: nothing held yet: the whole prompt, with the session (it goes through the radix
  cache and its KV then stays with the session);
- ``append``: the prompt starts with the held history (and is longer): only the new ids;
- ``restart``: it does not (a chat template that re-renders the reply differently, a dropped
  thinking section): the engine closes and reopens the session, then sends the whole prompt;
- ``ordinary``: the session is not open here (never opened, closed, or idle past its timeout
  by dyn's clock) or already has a turn running: the whole prompt without the session, as the
  mocker does.

dyn's idle clock starts no later than SGLang's: at the open (taken before SGLang is asked) and
when a turn is planned (before SGLang's ``create_req``), never when a turn ends; and an idle
entry is dropped ``EXPIRY_MARGIN_S`` before its timeout, so dyn's entry never outlives SGLang's
session. SGLang can still drop a session dyn thinks open (a close from elsewhere); the engine
then resends the turn as an ordinary request and forgets the session.

A turn that finishes (stop or length) leaves ``history = prompt + generated ids``; an aborted or
failed one leaves it unknown, so the next turn restarts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_TIMEOUT_S = 300.0
"""Idle timeout of a session opened without one (``nvext.session_control``'s default)."""
EXPIRY_MARGIN_S = 1.0
CAPACITY_OF_STR_LEN = 65536
"""``OpenSessionReqInput.capacity_of_str_len`` (required, unused by streaming sessions); Dynamo's value."""


@dataclass
class SessionEntry:
    timeout_s: float
    last_used: float
    """When the session was opened or its last turn was planned (SGLang's idle clock starts later)."""
    history: list[int] | None = None
    """Token ids SGLang holds for the session; ``None`` before the first turn or when unknown."""
    busy: bool = False
    started: bool = False
    """A turn was sent with the session (so an unknown history means: restart)."""


@dataclass(frozen=True)
class TurnPlan:
    """How to send one request: ``kind`` is first, append, restart or ordinary; ``input_ids`` what
    to send; ``session_id`` the session to name (``None``: an ordinary request)."""

    kind: str
    input_ids: list[int]
    session_id: str | None = None


class SessionTable:
    """The streaming sessions open on one engine, by dyn's bookkeeping."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: dict[str, SessionEntry] = {}

    def get(self, session_id: str) -> SessionEntry | None:
        """The live entry of ``session_id`` (an idled-out one is forgotten)."""
        entry = self._entries.get(session_id)
        if entry is None:
            return None
        if not entry.busy and self._clock() > entry.last_used + entry.timeout_s - EXPIRY_MARGIN_S:
            del self._entries[session_id]
            return None
        return entry

    def now(self) -> float:
        """The table's clock (take it before asking SGLang to open a session)."""
        return self._clock()

    def opened(self, session_id: str, timeout_s: float, since: float | None = None) -> None:
        """Record an open session, idle since ``since`` (default: now)."""
        self._entries[session_id] = SessionEntry(timeout_s, self._clock() if since is None else since)

    def closed(self, session_id: str) -> bool:
        """Forget ``session_id``; True if it was live."""
        live = self.get(session_id) is not None
        self._entries.pop(session_id, None)
        return live

    def plan(self, session_id: str | None, token_ids: list[int]) -> TurnPlan:
        """How to send a request naming ``session_id``; a session turn marks its entry busy."""
        entry = self.get(session_id) if session_id else None
        if entry is None or entry.busy:
            return TurnPlan("ordinary", token_ids)
        entry.busy = True
        entry.last_used = self._clock()
        held = entry.history
        if held is not None and len(token_ids) > len(held) and token_ids[: len(held)] == held:
            return TurnPlan("append", token_ids[len(held) :], session_id)
        if held is None and not entry.started:
            entry.started = True
            return TurnPlan("first", token_ids, session_id)
        return TurnPlan("restart", token_ids, session_id)

    def finished(self, plan: TurnPlan, prompt: list[int], output_ids: list[int] | None) -> None:
        """Record a session turn's end: ``output_ids`` when it finished, ``None`` when aborted or
        failed (the history is then unknown)."""
        if plan.session_id is None:
            return
        entry = self._entries.get(plan.session_id)
        if entry is None:
            return
        entry.busy = False
        entry.started = True  # last_used stays the turn's start, as SGLang's idle clock
        entry.history = [*prompt, *output_ids] if output_ids is not None else None

    def __len__(self) -> int:
        return sum(1 for sid in list(self._entries) if self.get(sid) is not None)

    def held_tokens(self) -> int:
        """Tokens of history held across the live sessions (as far as dyn knows)."""
        return sum(
            len(e.history or ()) for sid, e in list(self._entries.items()) if self.get(sid) is not None
        )
