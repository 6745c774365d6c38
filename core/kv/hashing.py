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
from array import array
from collections.abc import Sequence

import xxhash

XXH3_SEED = 1337
_U64 = (1 << 64) - 1
_PAIR = struct.Struct("<QQ")
_xxh3 = xxhash.xxh3_64_intdigest


def lora_seed(lora_name: str | None) -> int:
    """The XXH3 seed for a block hash; an empty or missing LoRA name means no LoRA."""
    if not lora_name:
        return XXH3_SEED
    return (XXH3_SEED + _xxh3(lora_name.encode("utf-8"), seed=0)) & _U64


def block_hashes(tokens: Sequence[int], block_size: int, lora_name: str | None = None) -> list[int]:
    """Local (content) hash of every full block of ``tokens``."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    seed = lora_seed(lora_name)
    n_full = len(tokens) // block_size * block_size
    if n_full == 0:
        return []
    data = array("I", tokens[:n_full])
    if data.itemsize != 4:  # pragma: no cover - every platform we support has a 4-byte 'I'
        raise RuntimeError("array('I') is not 32-bit here")
    if struct.pack("=I", 1) != struct.pack("<I", 1):  # pragma: no cover - big-endian host
        data.byteswap()
    raw = memoryview(data).cast("B")
    step = 4 * block_size
    return [_xxh3(raw[i : i + step], seed=seed) for i in range(0, len(raw), step)]


def sequence_hashes(local_hashes: Sequence[int]) -> list[int]:
    """Chain local block hashes into sequence hashes (each identifies a whole prefix)."""
    out: list[int] = []
    prev = None
    for h in local_hashes:
        prev = h if prev is None else _xxh3(_PAIR.pack(prev, h), seed=XXH3_SEED)
        out.append(prev)
    return out


def extend_sequence_hash(parent: int | None, local_hash: int) -> int:
    """The sequence hash of one more block after a prefix whose last sequence hash is ``parent``."""
    if parent is None:
        return local_hash
    return _xxh3(_PAIR.pack(parent, local_hash), seed=XXH3_SEED)
