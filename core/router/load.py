"""Active load the router has booked on each (worker, dp_rank): decode blocks and prefill tokens.

The router books a request when it routes it (``add_request``), drops its prompt load on the first
output token (``mark_prefill_completed``) and everything on ``free``. From the bookings it projects
the load a candidate request would add to each rank (``potential_loads``), the inputs of the cost
model.

- **Blocks** are refcounted by hash per rank, so a block held by several active requests counts
  once ("assume KV reuse"; with it off the caller books random hashes, see ``tracking_hashes``).
  Output blocks (``add_output_tokens``) get random hashes; with an expected output length they
  decay: a block held only by that request counts ``max(0, 1 - generated/osl)``. The block count
  is the rounded sum.
- **Prefill tokens**: each booking adds ``isl - cached`` tokens to a FIFO; the oldest is the anchor.
  ``active_tokens = sum - anchor_full + anchor_remaining``; without a predicted prefill duration
  the anchor never decays, so this is the plain sum.
- **Prefix depth**: hashes must be chained sequence hashes (or unique random values), so a rank
  holding block ``i`` of a prompt holds blocks ``0..i``; the active prefix depth is found by
  bisection, O(log n) per rank.

- **Fleet arrays**: each rank has a slot in two arrays kept current on every booking change,
  its prefill-token sum (``prefill_sums``) and active block count (``block_counts``), and each
  booking's first tracked hash is indexed (``ranks_holding``), so a router can score the ranks a
  request touches one by one and all the others at once (``dyn.core.router.kv``'s fast path).
- **Holder masks** (once ``index_holders`` is called, for fleets that size): every booked prompt
  hash maps to the rank slots holding it (``dyn.core.router.holders.HolderMap``), so the active
  prefix depth of every rank at once (``prefix_depths``) is a bisection over depths, as the KV
  index answers overlaps.

Everything here is pure bookkeeping: times are passed in (``now``) or read from ``clock``.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from dyn.core.router.block_refs import BlockRefs
from dyn.core.router.holders import HolderMap

WorkerKey = tuple[int, int]
"""(worker instance id, dp rank)."""


def tracking_hashes(seq_hashes: Sequence[int], assume_kv_reuse: bool, rng: random.Random) -> list[int]:
    """The hashes to book for a request: its sequence hashes when KV reuse is assumed, else one
    random 64-bit value per block so it never shares active blocks with another request."""
    if assume_kv_reuse:
        return list(seq_hashes)
    return [rng.getrandbits(64) for _ in seq_hashes]


class PotentialLoads(NamedTuple):
    """What each candidate rank would carry if it took the request."""

    decode_blocks: dict[WorkerKey, int]
    prefill_tokens: dict[WorkerKey, int]


class _Booking:
    """One active request on one rank."""

    __slots__ = (
        "blocks",
        "expected_output_tokens",
        "first",
        "isl_tokens",
        "output_tokens",
        "prompt_blocks",
        "request_id",
        "started_at",
        "total_blocks",
        "worker",
    )

    def __init__(
        self,
        request_id: str,
        worker: WorkerKey,
        blocks: list[int],
        isl_tokens: int,
        expected_output_tokens: int | None,
        started_at: float,
    ) -> None:
        self.request_id = request_id
        self.worker = worker
        self.blocks = blocks
        self.isl_tokens = isl_tokens
        self.expected_output_tokens = expected_output_tokens
        self.started_at = started_at
        self.total_blocks = -1  # ceil((isl + output) / block_size) at the last output update
        self.output_tokens = 0
        self.prompt_blocks = len(blocks)
        """The booked prompt's blocks, at the head of ``blocks`` (output blocks follow)."""
        self.first = blocks[0] if blocks else None
        """The first tracked hash (indexed by ``ActiveLoad.ranks_holding``); output blocks never are."""


class ActiveSequences:
    """The bookings of one (worker, dp_rank): refcounted blocks, the prefill FIFO, requests."""

    __slots__ = (
        "_anchor_since",
        "_deficit",
        "_fractions",
        "_prefill_sum",
        "_prefills",
        "refs",
        "requests",
    )

    def __init__(self) -> None:
        self.refs = BlockRefs()
        self._fractions: dict[int, float] = {}  # block -> weight < 1, for decaying sole holders
        self._deficit = 0.0  # sum of (1 - weight) over _fractions
        # request id -> (tokens, expected prefill seconds or None); insertion order is the FIFO
        self._prefills: dict[str, tuple[int, float | None]] = {}
        self._prefill_sum = 0
        self._anchor_since = 0.0
        self.requests: set[str] = set()

    # ------------------------------------------------------------ blocks

    @property
    def active_blocks(self) -> int:
        """Distinct active blocks, decaying ones counted fractionally, rounded half up."""
        return math.floor(len(self.refs) - self._deficit + 0.5)

    def add_blocks(self, blocks: Iterable[int]) -> None:
        refs = self.refs
        if not self._fractions:  # nothing decays: plain counting (in C where it was built)
            refs.add(blocks)
            return
        for h in blocks:
            n = refs.get(h, 0)
            refs.set(h, n + 1)
            if n == 1 and h in self._fractions:  # shared now: counts fully
                self._drop_fraction(h)

    def remove_blocks(self, blocks: Iterable[int]) -> None:
        refs = self.refs
        if not self._fractions:
            refs.remove(blocks)
            return
        for h in blocks:
            n = refs.get(h, 0)
            if n <= 1:
                refs.pop(h, None)
                if h in self._fractions:
                    self._drop_fraction(h)
            else:
                refs.set(h, n - 1)

    def set_decay(self, blocks: Iterable[int], weight: float) -> None:
        """Count each of ``blocks`` held by one request only as ``weight`` (in [0, 1])."""
        refs, fractions = self.refs, self._fractions
        deficit = self._deficit
        for h in blocks:
            if refs.get(h) == 1:
                deficit += fractions.get(h, 1.0) - weight
                fractions[h] = weight
        self._deficit = deficit

    def _drop_fraction(self, h: int) -> None:
        self._deficit -= 1.0 - self._fractions.pop(h)
        if not self._fractions:
            self._deficit = 0.0  # no float drift once nothing decays

    def prefix_depth(self, seq_hashes: Sequence[int]) -> int:
        """How many leading ``seq_hashes`` are active here (chained hashes: bisection)."""
        return self.refs.prefix_depth(seq_hashes)

    # ------------------------------------------------------------ prefill tokens

    def add_prefill(self, request_id: str, tokens: int, expected_secs: float | None, now: float) -> None:
        if not self._prefills:
            self._anchor_since = now
        self._prefills[request_id] = (tokens, expected_secs)
        self._prefill_sum += tokens

    def remove_prefill(self, request_id: str, now: float) -> bool:
        """Drop the request's prompt tokens; whether they had a predicted duration (could decay)."""
        prefills = self._prefills
        entry = prefills.get(request_id)
        if entry is None:
            return False
        was_anchor = next(iter(prefills)) == request_id
        del prefills[request_id]
        self._prefill_sum -= entry[0]
        if was_anchor:
            self._anchor_since = now
        return _decays(entry[1])

    @property
    def prefill_sum(self) -> int:
        """The prefill tokens booked here, none decayed."""
        return self._prefill_sum

    def decaying_prefills(self) -> int:
        return sum(1 for _, expected in self._prefills.values() if _decays(expected))

    def active_tokens(self, now: float) -> int:
        """Prefill tokens still ahead of this rank; only the anchor (oldest) can decay."""
        if not self._prefills:
            return 0
        full, expected = self._prefills[next(iter(self._prefills))]
        if not expected or expected <= 0:
            return self._prefill_sum
        left = min(max(1.0 - (now - self._anchor_since) / expected, 0.0), 1.0)
        return self._prefill_sum - full + math.ceil(full * left)


def _decays(expected_secs: float | None) -> bool:
    return expected_secs is not None and expected_secs > 0


_NO_BOOKINGS = ActiveSequences()  # read-only stand-in for a rank with no bookings yet


class ActiveLoad:
    """Bookings on every (worker, dp_rank) the router knows, keyed by ``WorkerKey``.

    Unknown request ids are ignored by ``mark_prefill_completed``, ``free`` and
    ``add_output_tokens`` (a finished stream may race a stale expiry or a removed worker).
    """

    def __init__(
        self, *, rng: random.Random | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ranks: dict[WorkerKey, ActiveSequences] = {}
        self._bookings: dict[str, _Booking] = {}
        self._rng = rng or random.Random()
        self._clock = clock
        self._slots: dict[WorkerKey, int] = {}
        self._free_slots: list[int] = []
        self.prefill_sums = np.zeros(16, np.int64)
        """Per rank slot: its ``ActiveSequences.prefill_sum`` (0 for a free slot)."""
        self.block_counts = np.zeros(16, np.int64)
        """Per rank slot: its ``ActiveSequences.active_blocks`` (0 for a free slot)."""
        self._firsts: dict[int, dict[WorkerKey, int]] = {}
        self._holders: HolderMap | None = None
        """Booked prompt hash -> the slots holding it (None: not kept)."""
        self.decaying = 0
        """Booked prompts with a predicted prefill duration: while any is, ``active_tokens`` may
        fall below ``prefill_sums`` as time passes."""

    # ------------------------------------------------------------ workers

    def add_worker(self, worker: WorkerKey) -> None:
        self._seqs(worker)

    def _seqs(self, key: WorkerKey) -> ActiveSequences:
        """The rank's bookings, the rank (and its array slot) added if new."""
        seqs = self._ranks.get(key)
        if seqs is None:
            seqs = self._ranks[key] = ActiveSequences()
            if self._free_slots:
                slot = self._free_slots.pop()
            else:
                slot = len(self._slots)
                if slot == len(self.prefill_sums):
                    self.prefill_sums = np.concatenate([self.prefill_sums, np.zeros(slot, np.int64)])
                    self.block_counts = np.concatenate([self.block_counts, np.zeros(slot, np.int64)])
            self._slots[key] = slot
        return seqs

    def remove_worker(self, instance_id: int) -> list[str]:
        """Forget every rank of ``instance_id`` and its bookings; returns the dropped request ids."""
        dropped: list[str] = []
        for key in [k for k in self._ranks if k[0] == instance_id]:
            seqs = self._ranks.pop(key)
            self.decaying -= seqs.decaying_prefills()
            slot = self._slots.pop(key)
            for request_id in seqs.requests:
                booking = self._bookings.pop(request_id, None)
                if booking is not None:
                    self._unindex_first(booking)
                    if self._holders is not None:
                        for h in booking.blocks:
                            self._holders.drop(h, slot)
                dropped.append(request_id)
            self.prefill_sums[slot] = self.block_counts[slot] = 0
            self._free_slots.append(slot)
        return dropped

    def slots(self, keys: Iterable[WorkerKey]) -> np.ndarray:
        """The array slots of ``keys`` (known ranks), in order: an index into ``prefill_sums``
        and ``block_counts``."""
        return np.fromiter((self._slots[k] for k in keys), np.intp)

    def ranks_holding(self, first_hash: int) -> Iterable[WorkerKey]:
        """The ranks with an active booking whose first tracked hash is ``first_hash``: with
        chained (or random) hashes, the only ranks where a request starting with that hash has a
        nonzero ``prefix_depth`` (two 64-bit hashes colliding aside)."""
        holders = self._firsts.get(first_hash)
        return holders.keys() if holders else ()

    @property
    def holders_indexed(self) -> bool:
        return self._holders is not None

    def index_holders(self) -> None:
        """Keep the holder masks from now on (built from the bookings there are)."""
        self._holders = HolderMap()
        for booking in self._bookings.values():
            self._holders.hold(booking.blocks[: booking.prompt_blocks], self._slots[booking.worker], 0)

    def prefix_depths(self, seq_hashes: Sequence[int]) -> np.ndarray | None:
        """Per slot, how many leading ``seq_hashes`` are active on that rank (``prefix_depth``
        for every rank at once, from the holder masks); None when they are not kept."""
        if self._holders is None:
            return None
        return self._holders.prefix_depths(seq_hashes, len(self.prefill_sums))

    def _sync(self, key: WorkerKey, seqs: ActiveSequences) -> None:
        slot = self._slots[key]
        self.prefill_sums[slot] = seqs.prefill_sum
        self.block_counts[slot] = seqs.active_blocks

    def _unindex_first(self, booking: _Booking) -> None:
        if booking.first is None:
            return
        holders = self._firsts[booking.first]
        n = holders[booking.worker] - 1
        if n:
            holders[booking.worker] = n
        else:
            del holders[booking.worker]
            if not holders:
                del self._firsts[booking.first]

    def workers(self) -> list[WorkerKey]:
        return list(self._ranks)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._bookings

    def __len__(self) -> int:
        return len(self._bookings)

    def worker_of(self, request_id: str) -> WorkerKey | None:
        booking = self._bookings.get(request_id)
        return booking.worker if booking else None

    # ------------------------------------------------------------ lifecycle

    def add_request(
        self,
        request_id: str,
        worker: WorkerKey,
        seq_hashes: Sequence[int],
        isl_tokens: int,
        cached_tokens: int,
        expected_output_tokens: int | None,
        track_prefill_tokens: bool,
        now: float,
        *,
        expected_prefill_secs: float | None = None,
    ) -> None:
        """Book a routed request on ``worker`` (a rank not seen before is added). Booking an id
        that is already booked replaces the earlier booking."""
        if request_id in self._bookings:
            self.free(request_id, now=now)
        seqs = self._seqs(worker)
        blocks = list(seq_hashes)
        if self._holders is not None:
            self._holders.hold(blocks, self._slots[worker], seqs.prefix_depth(blocks))
        seqs.add_blocks(blocks)
        seqs.requests.add(request_id)
        booking = self._bookings[request_id] = _Booking(
            request_id, worker, blocks, isl_tokens, expected_output_tokens, now
        )
        if booking.first is not None:
            holders = self._firsts.setdefault(booking.first, {})
            holders[worker] = holders.get(worker, 0) + 1
        if track_prefill_tokens:
            tokens = isl_tokens - min(cached_tokens, isl_tokens)
            if tokens > 0:
                seqs.add_prefill(request_id, tokens, expected_prefill_secs, now)
                self.decaying += _decays(expected_prefill_secs)
        self._sync(worker, seqs)

    def mark_prefill_completed(self, request_id: str, *, now: float | None = None) -> None:
        """The first output token arrived: the request's prompt no longer loads its rank."""
        booking = self._bookings.get(request_id)
        if booking is not None:
            seqs = self._ranks[booking.worker]
            self.decaying -= seqs.remove_prefill(request_id, self._clock() if now is None else now)
            self._sync(booking.worker, seqs)

    def free(self, request_id: str, *, now: float | None = None) -> None:
        """The request ended (any reason); idempotent."""
        booking = self._bookings.pop(request_id, None)
        if booking is None:
            return
        seqs = self._ranks[booking.worker]
        self.decaying -= seqs.remove_prefill(request_id, self._clock() if now is None else now)
        seqs.remove_blocks(booking.blocks)
        if self._holders is not None:
            prompt = booking.blocks[: booking.prompt_blocks]
            self._holders.unhold(prompt, self._slots[booking.worker], seqs.prefix_depth(prompt))
        seqs.requests.discard(request_id)
        self._unindex_first(booking)
        self._sync(booking.worker, seqs)

    def free_prefixed(self, prefix: str) -> list[str]:
        """Free every booking whose id starts with ``prefix`` (a departed peer router's);
        returns their ids."""
        gone = [rid for rid in self._bookings if rid.startswith(prefix)]
        for request_id in gone:
            self.free(request_id)
        return gone

    def expire_stale(self, now: float, max_age: float) -> list[str]:
        """Free bookings older than ``max_age`` seconds (never finished); returns their ids."""
        stale = [rid for rid, b in self._bookings.items() if now - b.started_at > max_age]
        for request_id in stale:
            self.free(request_id, now=now)
        return stale

    def add_output_tokens(self, request_id: str, cumulative_output_tokens: int, block_size: int) -> None:
        """Output progress (``--router-track-output-blocks``): each time
        ``ceil((isl + generated) / block_size)`` grows, book one more block with a random hash
        and, when the expected output length is known, decay the request's unshared blocks."""
        booking = self._bookings.get(request_id)
        if booking is None:
            return
        booking.output_tokens = cumulative_output_tokens
        total = -(-(booking.isl_tokens + cumulative_output_tokens) // block_size)
        if booking.total_blocks < 0:
            booking.total_blocks = -(-booking.isl_tokens // block_size)
        grown = total - booking.total_blocks
        if grown <= 0:
            return
        booking.total_blocks = total
        new = [self._rng.getrandbits(64) for _ in range(grown)]
        booking.blocks.extend(new)
        seqs = self._ranks[booking.worker]
        seqs.add_blocks(new)
        osl = booking.expected_output_tokens
        if osl is not None:
            weight = max(0.0, 1.0 - cumulative_output_tokens / max(osl, 1))
            seqs.set_decay(booking.blocks, weight)
        self._sync(booking.worker, seqs)

    # ------------------------------------------------------------ reading

    def active_decode_blocks(self, worker: WorkerKey) -> int:
        seqs = self._ranks.get(worker)
        return seqs.active_blocks if seqs else 0

    def active_tokens(self, worker: WorkerKey, now: float | None = None) -> int:
        """Active prefill tokens on ``worker`` at ``now`` (the clock when omitted)."""
        seqs = self._ranks.get(worker)
        if seqs is None:
            return 0
        return seqs.active_tokens(self._clock() if now is None else now)

    active_prefill_tokens = active_tokens

    def num_requests(self, worker: WorkerKey) -> int:
        seqs = self._ranks.get(worker)
        return len(seqs.requests) if seqs else 0

    def potential_loads(
        self,
        workers: Iterable[WorkerKey],
        seq_hashes: Sequence[int],
        isl_tokens: int,
        cached_tokens: Mapping[WorkerKey, int],
        track_prefill_tokens: bool,
        now: float,
    ) -> PotentialLoads:
        """Per candidate rank: decode blocks ``active + n_blocks - active_prefix_depth`` and
        prefill tokens ``active_tokens + isl - cached`` (0 when prefill tokens are not tracked).
        ``seq_hashes`` are the hashes the request would book (see ``tracking_hashes``)."""
        n_blocks = len(seq_hashes)
        decode: dict[WorkerKey, int] = {}
        prefill: dict[WorkerKey, int] = {}
        for key in workers:
            seqs = self._ranks.get(key, _NO_BOOKINGS)
            decode[key] = seqs.active_blocks + n_blocks - seqs.prefix_depth(seq_hashes)
            if track_prefill_tokens:
                prefill[key] = seqs.active_tokens(now) + isl_tokens - cached_tokens.get(key, 0)
            else:
                prefill[key] = 0
        return PotentialLoads(decode, prefill)
