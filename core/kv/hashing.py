"""Block and sequence hashes, byte-for-byte as Dynamo computes them.

- ``block_hashes``: XXH3-64 of each *full* block's tokens as little-endian u32, seed 1337; a
  LoRA name is mixed into the seed (``1337 + xxh3_64(name, seed=0)`` mod 2**64), not the data.
  A trailing partial block is not hashed.
- ``sequence_hashes``: the chain ``seq[0] = local[0]``,
  ``seq[i] = xxh3_64(le_u64(seq[i-1]) || le_u64(local[i]), seed=1337)``; the LoRA is already
  inside ``local``, so the chain seed is always 1337.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from itertools import islice, repeat

import xxhash

XXH3_SEED = 1337
_U64 = (1 << 64) - 1
_PAIR = struct.Struct("<QQ")
_xxh3 = xxhash.xxh3_64_intdigest
_BIG_ENDIAN = sys.byteorder == "big"


def lora_seed(lora_name: str | None) -> int:
    """The XXH3 seed for a block hash; an empty or missing LoRA name means no LoRA."""
    if not lora_name:
        return XXH3_SEED
    return (XXH3_SEED + _xxh3(lora_name.encode("utf-8"), seed=0)) & _U64


def block_hashes(tokens: Sequence[int], block_size: int, lora_name: str | None = None) -> list[int]:
    """Local (content) hash of every full block of ``tokens``."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    n_blocks = len(tokens) // block_size
    if n_blocks == 0:
        return []
    try:
        data = array("I", tokens)
    except OverflowError:  # only the full blocks must be u32 token ids; a partial tail is not hashed
        data = array("I", tokens[: n_blocks * block_size])
    if data.itemsize != 4:  # pragma: no cover - every platform we support has a 4-byte 'I'
        raise RuntimeError("array('I') is not 32-bit here")
    if _BIG_ENDIAN:  # pragma: no cover - big-endian host
        data.byteswap()
    raw = data.tobytes()
    # C-level passes (map) instead of a Python loop: slicing and hashing cost ~100 ns a block; a
    # partial tail block is never reached (the seeds run out first)
    return list(
        map(
            _xxh3,
            map(raw.__getitem__, _block_slices(n_blocks, 4 * block_size)),
            repeat(lora_seed(lora_name), n_blocks),
        )
    )


_SLICES: dict[int, tuple[slice, ...]] = {}


def _block_slices(n_blocks: int, step: int) -> tuple[slice, ...]:
    """At least ``n_blocks`` consecutive byte ranges of ``step`` bytes, from 0 (kept per step)."""
    slices = _SLICES.get(step, ())
    if len(slices) < n_blocks:
        n = max(n_blocks, 2 * len(slices), 1024)
        slices = _SLICES[step] = tuple(slice(i, i + step) for i in range(0, n * step, step))
    return slices


def sequence_hashes(local_hashes: Sequence[int]) -> list[int]:
    """Chain local block hashes into sequence hashes (each identifies a whole prefix)."""
    if not local_hashes:
        return []
    prev = local_hashes[0]
    out = [prev]
    append, pack = out.append, _PAIR.pack
    for h in islice(local_hashes, 1, None):
        prev = _xxh3(pack(prev, h), XXH3_SEED)
        append(prev)
    return out


def extend_sequence_hash(parent: int | None, local_hash: int) -> int:
    """The sequence hash of one more block after a prefix whose last sequence hash is ``parent``."""
    if parent is None:
        return local_hash
    return _xxh3(_PAIR.pack(parent, local_hash), seed=XXH3_SEED)
