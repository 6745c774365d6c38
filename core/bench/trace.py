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

``read_trace`` validates every line and raises ``TraceError`` naming the file, line and field.
``TokenSynth`` turns hash ids into token ids the way the reference tools do: one deterministic
random block of tokens per distinct id, reused wherever the id appears, so shared ids give
shared token prefixes.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from pathlib import Path

import msgspec
import orjson

MOONCAKE_BLOCK_SIZE = 512
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
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 \
            or (integer and not isinstance(value, int)):
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
    for key, value in (("input_length", input_length), ("output_length", output_length)):
        if value is None:
            raise TraceError(f"{where}: missing {key!r}")
    hash_ids = obj.get("hash_ids", [])
    if not isinstance(hash_ids, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) for h in hash_ids):
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
    if later_turn:
        delay = delay or 0.0
    elif timestamp is None:
        raise TraceError(f"{where}: needs 'timestamp' (ms from the start of the trace)"
                         + ("" if session is None else " on the first turn of a session"))
    if session is not None:
        sessions_seen.add(session)
    return TraceRow(input_length=int(input_length), output_length=int(output_length),
                    hash_ids=tuple(hash_ids), timestamp_ms=None if later_turn else float(timestamp),
                    session_id=session, delay_ms=delay if later_turn else None)


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
    """512 for Mooncake traces; 16 when the file is a Bailian trace (its rows carry ``chat_id``)."""
    if path is not None:
        with open(path, "rb") as f:
            first = next((line for line in f if line.strip()), b"")
        if b'"chat_id"' in first:
            return BAILIAN_BLOCK_SIZE
    return MOONCAKE_BLOCK_SIZE


class TokenSynth:
    """Deterministic token ids for hash ids: each id -> ``block_size`` tokens in ``[low, vocab)``.

    ``prompt(row)`` concatenates the blocks of ``row.hash_ids`` and cuts or extends the result to
    ``row.input_length`` (tokens past the last block are unique to the request, drawn from
    ``salt``), so two rows with the same leading ids share exactly those blocks.
    """

    def __init__(self, block_size: int, vocab_size: int, *, seed: int = 0, low: int = 16) -> None:
        if block_size < 1:
            raise ValueError("block size must be at least 1")
        if vocab_size <= low:
            raise ValueError(f"vocab size must exceed {low}")
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.seed = seed
        self.low = low
        self._blocks: dict[int, list[int]] = {}

    def block(self, hash_id: int) -> list[int]:
        tokens = self._blocks.get(hash_id)
        if tokens is None:
            rng = random.Random(f"{self.seed}:{hash_id}")
            tokens = [rng.randrange(self.low, self.vocab_size) for _ in range(self.block_size)]
            self._blocks[hash_id] = tokens
        return tokens

    def prompt(self, row: TraceRow, salt: object = None) -> list[int]:
        tokens: list[int] = []
        for hash_id in row.hash_ids:
            if len(tokens) >= row.input_length:
                break
            tokens.extend(self.block(hash_id))
        del tokens[row.input_length:]
        if len(tokens) < row.input_length:
            rng = random.Random(f"{self.seed}:tail:{salt}")
            tokens.extend(rng.randrange(self.low, self.vocab_size)
                          for _ in range(row.input_length - len(tokens)))
        return tokens


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
