"""Request traces: the Mooncake JSONL superset (reference 9.5) and Alibaba Bailian rows.

One JSON object per line:

- Mooncake: ``{"timestamp": ms, "input_length": int, "output_length": int, "hash_ids": [int,...]}``.
  Each hash id stands for one ``block_size``-token block of the prompt (512 in the public traces)
  and covers its whole prefix, so equal leading ids mean a shared prefix.
- Multi-turn extension: ``session_id``; the first turn of a session is dated by ``timestamp`` (or
  ``created_time``), later turns by ``delay`` / ``delay_ms`` (ms after the previous turn of the
  same session completed).
- Bailian (``chat_id`` present): ``timestamp`` in seconds, 16-token hash ids; every row is read as
  an independent timed request (turns are already dated).
- dyn's agent traces (``dyn frontend --agent-trace-file``): Mooncake rows with sessions, whose
  ``block_size`` field states the tokens per hash id (``default_block_size`` reads it).

``read_trace`` validates every line and raises ``TraceError`` naming the file, line and field.
``TokenSynth`` turns hash ids into token ids the way the reference tools do: one deterministic
random block of tokens per distinct id, reused wherever the id appears, so shared ids give
shared token prefixes (an hour of a Mooncake trace has some 10^5 distinct ids, hence the bulk
draws and the bounded cache).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from hashlib import sha512
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import orjson

try:
    from dyn.core.bench import _mt
except ImportError:  # built without a C compiler: seeded_draws takes numpy's bulk draws
    _mt = None  # type: ignore[assignment]

MOONCAKE_BLOCK_SIZE = 512
MAX_TRACE_TOKENS = 1 << 24
"""The longest prompt or output a trace row may ask for (16,777,216 tokens)."""
BAILIAN_BLOCK_SIZE = 16


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, line and what to fix."""


class TraceRow(msgspec.Struct, frozen=True):
    """One request of a trace.

    ``timestamp_ms`` dates a request that is not a later turn (ms from the trace's start);
    ``delay_ms`` dates a later turn of ``session_id`` (after the previous turn completed).
    """

    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    timestamp_ms: float | None = None
    session_id: str | None = None
    delay_ms: float | None = None


def _number(obj: dict, key: str, where: str, *, integer: bool = False) -> float | int | None:
    value = obj.get(key)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or value < 0
        or (integer and not isinstance(value, int))
    ):
        kind = "a non-negative integer" if integer else "a non-negative number"
        raise TraceError(f"{where}: {key!r} must be {kind}, got {value!r}")
    return value


def parse_row(obj: object, where: str, sessions_seen: set[str]) -> TraceRow:
    """One decoded JSON line -> ``TraceRow``; ``where`` is ``"FILE:LINE"`` for errors."""
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: each line must be a JSON object")
    bailian = "chat_id" in obj
    input_length = _number(obj, "input_length", where, integer=True)
    output_length = _number(obj, "output_length", where, integer=True)
    if input_length is None:
        raise TraceError(f"{where}: missing 'input_length'")
    if output_length is None:
        raise TraceError(f"{where}: missing 'output_length'")
    if input_length == 0:
        raise TraceError(f"{where}: 'input_length' must be at least 1 (a prompt cannot be empty)")
    for key, length in (("input_length", input_length), ("output_length", output_length)):
        if length > MAX_TRACE_TOKENS:
            raise TraceError(
                f"{where}: {key!r} is {length:,} tokens; at most {MAX_TRACE_TOKENS:,} are taken "
                "(no model's context is longer, and a prompt is made token by token)"
            )
    hash_ids = obj.get("hash_ids", [])
    if not isinstance(hash_ids, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) for h in hash_ids
    ):
        raise TraceError(f"{where}: 'hash_ids' must be a list of integers")
    timestamp = _number(obj, "timestamp", where)
    if timestamp is None:
        timestamp = _number(obj, "created_time", where)
    if bailian and timestamp is not None:
        timestamp = timestamp * 1000.0
    session = None if bailian else obj.get("session_id")
    if session is not None and not isinstance(session, (str, int)):
        raise TraceError(f"{where}: 'session_id' must be a string or an integer")
    session = None if session is None else str(session)
    delay = _number(obj, "delay_ms", where)
    if delay is None:
        delay = _number(obj, "delay", where)
    later_turn = session is not None and session in sessions_seen
    timestamp_ms: float | None = None
    if later_turn:
        delay = delay or 0.0
    elif timestamp is None:
        raise TraceError(
            f"{where}: needs 'timestamp' (ms from the start of the trace)"
            + ("" if session is None else " on the first turn of a session")
        )
    else:
        timestamp_ms = float(timestamp)
    if session is not None:
        sessions_seen.add(session)
    return TraceRow(
        input_length=int(input_length),
        output_length=int(output_length),
        hash_ids=tuple(hash_ids),
        timestamp_ms=timestamp_ms,
        session_id=session,
        delay_ms=delay if later_turn else None,
    )


def read_trace(path: str | Path, *, limit: int | None = None) -> list[TraceRow]:
    """Every row of a JSONL trace (the first ``limit``), in file order; blank lines are skipped."""
    path = Path(path)
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from None
    rows: list[TraceRow] = []
    sessions: set[str] = set()
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise TraceError(f"{path}:{number}: not valid JSON ({exc})") from None
        rows.append(parse_row(obj, f"{path}:{number}", sessions))
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise TraceError(f"{path}: the trace has no requests")
    return rows


def default_block_size(rows: Sequence[TraceRow], path: str | Path | None = None) -> int:
    """The ``block_size`` the first row states (dyn's agent traces, ``--agent-trace-file``);
    else 512 for Mooncake traces, 16 when the file is a Bailian trace (its rows carry
    ``chat_id``)."""
    if path is not None:
        with open(path, "rb") as f:
            first = next((line for line in f if line.strip()), b"")
        try:
            stated = orjson.loads(first).get("block_size")
        except (orjson.JSONDecodeError, AttributeError):
            stated = None
        if isinstance(stated, int) and not isinstance(stated, bool) and stated > 0:
            return stated
        if b'"chat_id"' in first:
            return BAILIAN_BLOCK_SIZE
    return MOONCAKE_BLOCK_SIZE


CACHE_BLOCKS = 8192


def draws(rng: random.Random, count: int, low: int, high: int) -> np.ndarray:
    """``[rng.randrange(low, high) for _ in range(count)]`` as uint32, in bulk.

    ``randrange(low, high)`` (``high`` up to 2**32) is ``low + r`` with ``r`` the first of the Mersenne Twister's 32-bit
    outputs ``w`` for which ``w >> (32 - k) < high - low`` (``k = (high - low).bit_length()``,
    CPython's ``_randbelow``), and ``getrandbits(32 * m)`` hands out the next ``m`` outputs as
    little-endian words; ``rng`` is left wherever (callers use a generator for one sequence).
    """
    n = high - low
    k = n.bit_length()
    if count == 0:
        return np.zeros(0, np.uint32)
    if k > 32 or n <= 0 or high > 1 << 32:
        return np.fromiter((rng.randrange(low, high) for _ in range(count)), np.int64, count)
    shift = np.uint32(32 - k)
    parts: list[np.ndarray] = []
    need = count
    spread = (1 << k) / n  # words drawn per value accepted, on average (below 2)
    while need > 0:
        words = int(need * spread * 1.05) + 16  # one round almost always
        r = np.frombuffer(rng.getrandbits(32 * words).to_bytes(4 * words, "little"), "<u4") >> shift
        ok = r[r < n][:need]
        parts.append(ok)
        need -= len(ok)
    out = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return out + np.uint32(low)


def seed_words(text: str) -> bytes:
    """The 32-bit words, little-endian, that ``random.Random(text)`` seeds its Mersenne Twister
    with: those of the int made of the text's UTF-8 bytes and their SHA-512 (``random.seed``,
    version 2)."""
    raw = text.encode()
    n = int.from_bytes(raw + sha512(raw).digest(), "big")
    return n.to_bytes(4 * max(1, -(-n.bit_length() // 32)), "little")


def seeded_draws(text: str, count: int, low: int, high: int, ints: list[int]) -> list[int]:
    """``[ints[random.Random(text).randrange(low, high)] for _ in range(count)]`` (one generator):
    in C (``dyn.core.bench._mt``) where it was built, else through ``draws``. ``ints`` holds at
    least ``high`` ints; the result shares them."""
    if _mt is not None:
        out = _mt.draws(seed_words(text), count, low, high, ints)
        if out is not None:
            return out
    return [ints[v] for v in draws(random.Random(text), count, low, high).tolist()]


class TokenSynth:
    """Deterministic token ids for hash ids: each id -> ``block_size`` tokens in ``[low, vocab)``.

    Block ``h`` is ``random.Random(f"{seed}:{h}")``'s first ``block_size`` draws of
    ``randrange(low, vocab)`` (``seeded_draws``, or ``draws`` in bulk for a vocabulary over 2**20
    ids; the last ``cache_blocks`` blocks are kept, as lists of shared int objects that prompts
    are concatenated from, or as arrays for such a vocabulary). ``prompt(row)``
    concatenates the blocks of ``row.hash_ids`` and cuts or extends the result to
    ``row.input_length`` (tokens past the last block are unique to the request, drawn from
    ``salt``), so two rows with the same leading ids share exactly those blocks.

    ``plan(rows)`` says which prompts will be asked for (a replay knows its whole trace): each
    of their blocks is then kept from its first use to its last and dropped there, with no cap,
    so none is drawn twice (a cap smaller than the blocks of the conversations in flight would
    redraw them turn after turn); blocks outside the plan are not kept.
    """

    def __init__(
        self,
        block_size: int,
        vocab_size: int,
        *,
        seed: int = 0,
        low: int = 16,
        cache_blocks: int = CACHE_BLOCKS,
    ) -> None:
        if block_size < 1:
            raise ValueError("block size must be at least 1")
        if not low < vocab_size <= 1 << 32:
            raise ValueError(f"vocab size must exceed {low} and fit 32 bits")
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.seed = seed
        self.low = low
        self._cache: dict[int, np.ndarray] = {}
        self._cap = cache_blocks
        # a block's tokens as a list of shared int objects (one per vocabulary id): prompts are
        # built by list concatenation instead of converting every token of every prompt
        self._ints = list(range(vocab_size)) if vocab_size <= 1 << 20 else None
        self._lists: dict[int, list[int]] = {}
        self._uses: dict[int, int] | None = None
        """With a plan: the planned prompts' uses left of each block."""

    def plan(self, rows: Iterable[TraceRow]) -> None:
        """Keep each block of these rows' prompts from its first use to its last (see the class
        docstring); replaces any earlier plan."""
        uses: dict[int, int] = {}
        get = uses.get
        for row in rows:
            for h in self._used(row):
                uses[h] = get(h, 0) + 1
        self._uses = uses
        self._cache.clear()
        self._lists.clear()

    def _used(self, row: TraceRow) -> tuple[int, ...]:
        """The hash ids whose blocks make ``row``'s prompt."""
        n = row.input_length
        return row.hash_ids[: -(-n // self.block_size)] if n else ()

    def _keep(self, cache: dict[int, Any], hash_id: int, tokens: Any) -> None:
        if self._uses is None:
            if len(cache) >= self._cap:
                del cache[next(iter(cache))]
            cache[hash_id] = tokens
        elif hash_id in self._uses:
            cache[hash_id] = tokens

    def block(self, hash_id: int) -> np.ndarray:
        tokens = self._cache.get(hash_id)
        if tokens is None:
            rng = random.Random(f"{self.seed}:{hash_id}")
            tokens = draws(rng, self.block_size, self.low, self.vocab_size)
            self._keep(self._cache, hash_id, tokens)
        return tokens

    def _block_list(self, hash_id: int) -> list[int]:
        tokens = self._lists.get(hash_id)
        if tokens is None:
            assert self._ints is not None
            tokens = seeded_draws(
                f"{self.seed}:{hash_id}", self.block_size, self.low, self.vocab_size, self._ints
            )
            self._keep(self._lists, hash_id, tokens)
        return tokens

    def prompt(self, row: TraceRow, salt: object = None) -> list[int]:
        n = row.input_length
        used = self._used(row)
        if self._ints is not None:
            out: list[int] = []
            for h in used:
                out += self._block_list(h)
            if len(out) < n:
                tail = f"{self.seed}:tail:{salt}"
                out += seeded_draws(tail, n - len(out), self.low, self.vocab_size, self._ints)
            del out[n:]
        else:
            parts = [self.block(h) for h in used]
            have = len(used) * self.block_size
            if have < n:
                parts.append(
                    draws(random.Random(f"{self.seed}:tail:{salt}"), n - have, self.low, self.vocab_size)
                )
            out = np.concatenate(parts)[:n].tolist() if parts else []
        if self._uses is not None:
            self._used_once(used)
        return out

    def _used_once(self, used: tuple[int, ...]) -> None:
        uses = self._uses
        assert uses is not None
        for h in used:
            left = uses.get(h)
            if left is None:
                continue
            if left > 1:
                uses[h] = left - 1
            else:  # its last planned use
                del uses[h]
                self._lists.pop(h, None)
                self._cache.pop(h, None)


def theoretical_hit_rate(prompts: Iterable[Sequence[int]]) -> float:
    """Share of prompt blocks an infinite prefix cache would hold, taking prompts in order.

    Each prompt is a sequence of block ids with Mooncake's prefix meaning: a block hits when it
    and every block before it appeared, in that position, in an earlier prompt.
    """
    nodes: dict[tuple[int, int], int] = {}
    hits = total = 0
    for blocks in prompts:
        total += len(blocks)
        node, matching = 0, True
        for block in blocks:
            child = nodes.get((node, block))
            if child is None:
                matching = False
                child = nodes[(node, block)] = len(nodes) + 1
            elif matching:
                hits += 1
            node = child
    return hits / total if total else 0.0
