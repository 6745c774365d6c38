"""Streaming sessions (SGLang's ``--enable-streaming-session`` / ``SessionAwareCache``).

A session slot keeps one conversation's KV between turns so later turns append instead of
going through the prefix cache:

- ``open(id, timeout_s)`` makes an empty slot, idle-closed at ``last use + timeout_s`` (opening an
  open one refreshes its timeout and returns False).
- **Turn 1** (empty slot) is an ordinary request: prefix-cache hits, stores, ``BlockStored``. When
  it finishes its sequence (prompt + output, every block it holds) stays with the slot instead of
  being released; its cached blocks stay referenced, so they are never evicted.
- **Later turns**: a prompt that starts with the tokens whose KV the slot holds (sequential
  append; same LoRA) adopts that KV when it is added: ``held`` of its tokens count as cached
  (at least one token is still computed) and the new tokens go into blocks outside the prefix
  cache (no ``BlockStored``, not matchable by other requests). A chat client resends the reply
  as text, which may tokenize differently from the ids the engine generated: then the whole
  blocks of the common prefix are kept (the rest of the slot's KV is freed) when they cover at
  least turn 1's stored blocks. A prompt sharing less restarts the slot: its KV is released
  (cached blocks become ordinary evictable cache) and the turn takes the turn-1 path.
- A turn that **finishes** leaves its whole sequence with the slot. A turn that is **preempted**
  or **aborted** gives back only what it added: the KV the slot lent it (``base_blocks``) stays
  held, so nothing is lost or freed twice; a preempted turn resumes on it, an aborted one leaves
  the slot as it was before the turn (turn 1 holds nothing of the slot's, so it releases as usual).
- ``close(id)`` releases the slot's KV; while a turn runs, the release happens when it ends.
- ``reap_due()`` closes idle slots past their deadline (the engine calls it every pass and at
  least every second).
- A request naming a session that is not open, or whose slot already has a turn running, is
  served as an ordinary request (logged at debug), never failed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from dyn.plugins.mocker.kv_cache import KvBlockManager, KvSequence

if TYPE_CHECKING:
    from dyn.plugins.mocker.scheduler import SimRequest

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300.0
"""Idle timeout of a session opened without one (``nvext.session_control``'s default)."""


class SessionSlot:
    """One open session. ``seq`` is the KV held while idle; ``held_len`` the tokens it covers
    (also while lent to the running ``turn``)."""

    __slots__ = ("session_id", "timeout_s", "deadline", "seq", "held_len", "turn", "closed")

    def __init__(self, session_id: str, timeout_s: float, deadline: float) -> None:
        self.session_id = session_id
        self.timeout_s = timeout_s
        self.deadline = deadline
        self.seq: KvSequence | None = None
        self.held_len = 0
        self.turn: SimRequest | None = None
        self.closed = False


class StreamingSessions:
    """The open session slots of one scheduler, holding KV in its block manager."""

    def __init__(self, kv: KvBlockManager, clock: Callable[[], float]) -> None:
        self._kv = kv
        self._now = clock
        self._slots: dict[str, SessionSlot] = {}
        self._next_deadline = float("inf")

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._slots

    @property
    def held_tokens(self) -> int:
        """Tokens of KV the open slots hold (or lend to their running turn)."""
        return sum(slot.held_len for slot in self._slots.values())

    def slot(self, session_id: str) -> SessionSlot | None:
        return self._slots.get(session_id)

    # ------------------------------------------------------------------ control calls

    def open(self, session_id: str, timeout_s: float) -> bool:
        """Open a slot; False (timeout refreshed) when it is already open."""
        if timeout_s <= 0:
            timeout_s = DEFAULT_TIMEOUT_S
        slot = self._slots.get(session_id)
        created = slot is None
        if slot is None:
            slot = self._slots[session_id] = SessionSlot(session_id, timeout_s, 0.0)
        slot.timeout_s = timeout_s
        self._touch(slot)
        return created

    def close(self, session_id: str) -> bool:
        """Close a slot and release its KV (when its running turn ends, if one runs)."""
        slot = self._slots.pop(session_id, None)
        if slot is None:
            return False
        slot.closed = True
        if slot.turn is None:
            self._release(slot)
        return True

    def reap_due(self) -> int:
        """Close idle slots past their deadline; returns how many."""
        now = self._now()
        if now < self._next_deadline:
            return 0
        reaped = 0
        nearest = float("inf")
        for slot in list(self._slots.values()):
            if slot.turn is not None:
                continue
            if slot.deadline <= now:
                log.debug("streaming session %s idle past its timeout; closing it", slot.session_id)
                self.close(slot.session_id)
                reaped += 1
            elif slot.deadline < nearest:
                nearest = slot.deadline
        self._next_deadline = nearest
        return reaped

    # ------------------------------------------------------------------ turns

    def attach(self, req: SimRequest) -> None:
        """Bind a new request naming ``req.session_id`` to its slot (see the module docstring)."""
        sid = req.session_id
        slot = self._slots.get(sid)  # type: ignore[arg-type]
        if slot is None:
            log.debug("session %s is not open; serving %s as an ordinary request", sid, req.request_id)
            return
        if slot.turn is not None:
            log.debug(
                "session %s already runs %s; serving %s as an ordinary request",
                sid,
                slot.turn.request_id,
                req.request_id,
            )
            return
        slot.turn = req
        req.slot = slot
        self._touch(slot)
        seq = slot.seq
        if seq is None:
            return
        n = self._reusable(seq, slot.held_len, req)
        tokens = req.tokens
        if n:
            slot.held_len = n
            slot.seq = None
            seq.tokens = tokens
            del seq.hashes[seq.num_registered :]
            seq.outside = True
            req.kv = seq
            req.held = min(n, len(tokens) - 1)
            req.base_blocks = seq.num_blocks
        else:
            log.debug(
                "turn %s of session %s shares too little with its KV; restarting the session",
                req.request_id,
                sid,
            )
            self._release(slot)

    def _reusable(self, seq: KvSequence, held: int, req: SimRequest) -> int:
        """How many of the slot's ``held`` tokens ``req`` reuses: all of them when its prompt
        appends to them; else the whole blocks of their common prefix, when those cover at least
        the blocks turn 1 stored (the slot's KV beyond them is freed); else 0 (restart)."""
        if seq.lora_name != req.lora_name:
            return 0
        tokens = req.tokens
        if len(tokens) >= held and tokens[:held] == seq.tokens[:held]:
            return held
        common = 0
        for a, b in zip(seq.tokens[:held], tokens):
            if a != b:
                break
            common += 1
        blocks = common // self._kv.block_size
        if blocks == 0 or blocks < seq.num_registered:
            return 0
        self._kv.truncate(seq, blocks)
        return blocks * self._kv.block_size

    def turn_ended(self, req: SimRequest, finished: bool) -> None:
        """``req`` (a turn bound to a slot) finished, or was aborted when ``finished`` is False."""
        slot = req.slot
        assert slot is not None
        req.slot = None
        slot.turn = None
        kv = self._kv
        if slot.closed:
            kv.release(req.kv)
            return
        if finished:
            slot.seq = req.kv
            slot.held_len = req.num_computed
        elif req.base_blocks:
            kv.truncate(req.kv, req.base_blocks)
            slot.seq = req.kv
        else:
            kv.release(req.kv)
        req.base_blocks = 0
        self._touch(slot)

    # ------------------------------------------------------------------ internals

    def _touch(self, slot: SessionSlot) -> None:
        slot.deadline = self._now() + slot.timeout_s
        if slot.deadline < self._next_deadline:
            self._next_deadline = slot.deadline

    def _release(self, slot: SessionSlot) -> None:
        if slot.seq is not None:
            self._kv.release(slot.seq)
            slot.seq = None
        slot.held_len = 0
