"""Block and sequence hashes, byte-for-byte as Dynamo computes them.

- ``block_hashes``: XXH3-64 of each *full* block's tokens as little-endian u32, seed 1337; a
  LoRA name is mixed into the seed (``1337 + xxh3_64(name, seed=0)`` mod 2**64), not the data.
  A trailing partial block is not hashed.
- Multimodal: a block that holds placeholder tokens of images (audio, video) hashes its tokens
  followed by the items' keys as little-endian u64, sorted ascending, with the same seed. A key is
  the first 16 hex characters of the item's 64-hex-character identifier (``mm_key``); a block holds
  an item when their token ranges overlap, as vLLM gives a block the ``extra_keys`` of the items
  it overlaps. Requests carry ``MediaSpan``s, KV events ``extra_keys`` (``event_block_keys``).
- ``sequence_hashes``: the chain ``seq[0] = local[0]``,
  ``seq[i] = xxh3_64(le_u64(seq[i-1]) || le_u64(local[i]), seed=1337)``; the LoRA is already
  inside ``local``, so the chain seed is always 1337.

Both loops run in C (``dyn.core.kv._xxh3``, built at install where a C compiler is found) for
blocks of 3 to 1,024 tokens given as a list; everything else, and every install without the
extension, takes the Python path below, which gives the same hashes (tests/core/kv compare them).
"""

from __future__ import annotations

import re
import struct
import sys
from array import array
from collections.abc import Mapping, Sequence
from itertools import islice, repeat
from typing import Any, NamedTuple

import xxhash

try:
    from dyn.core.kv import _xxh3 as _native
except ImportError:  # built without a C compiler: the Python paths below serve
    _native = None  # type: ignore[assignment]

XXH3_SEED = 1337
_U64 = (1 << 64) - 1
_PAIR = struct.Struct("<QQ")
_xxh3 = xxhash.xxh3_64_intdigest
_BIG_ENDIAN = sys.byteorder == "big"


_MM_ID = re.compile(r"[0-9a-fA-F]{64}")


class MediaSpan(NamedTuple):
    """Where one multimodal item's placeholder tokens are (``offset``, ``length``) and its
    ``key`` (``mm_key`` of its identifier)."""

    offset: int
    length: int
    key: int


def mm_key(identifier: Any) -> int | None:
    """The u64 a multimodal identifier adds to a block hash: the first 16 hex characters of a
    64-hex-character string; None for anything else (other extra keys count for nothing)."""
    if isinstance(identifier, str) and _MM_ID.fullmatch(identifier):
        return int(identifier[:16], 16)
    return None


def media_block_keys(
    media: Sequence[MediaSpan], block_size: int, n_blocks: int, first_block: int = 0
) -> dict[int, list[int]]:
    """Block index (from 0 for block ``first_block``) -> the keys of the items it overlaps, for
    the ``n_blocks`` blocks from ``first_block`` on."""
    out: dict[int, list[int]] = {}
    for span in media:
        if span.length <= 0:
            continue
        first = max(span.offset // block_size, first_block)
        last = min((span.offset + span.length - 1) // block_size, first_block + n_blocks - 1)
        for block in range(first, last + 1):
            out.setdefault(block - first_block, []).append(span.key)
    return out


def event_block_keys(extra_keys: Sequence[Any] | None, n_blocks: int) -> dict[int, list[int]]:
    """Block index -> the multimodal keys in a vLLM ``BlockStored`` event's ``extra_keys`` (one
    entry per block: None, or a sequence of keys, maybe nested one level)."""
    out: dict[int, list[int]] = {}
    for i, entry in enumerate(islice(extra_keys or (), n_blocks)):
        if not isinstance(entry, (list, tuple)):
            entry = (entry,)
        keys = []
        for item in entry:
            for value in item if isinstance(item, (list, tuple)) else (item,):
                key = mm_key(value)
                if key is not None:
                    keys.append(key)
        if keys:
            out[i] = keys
    return out


def lora_seed(lora_name: str | None) -> int:
    """The XXH3 seed for a block hash; an empty or missing LoRA name means no LoRA."""
    if not lora_name:
        return XXH3_SEED
    return (XXH3_SEED + _xxh3(lora_name.encode("utf-8"), seed=0)) & _U64


def block_hashes(
    tokens: Sequence[int],
    block_size: int,
    lora_name: str | None = None,
    extra: Mapping[int, Sequence[int]] | None = None,
) -> list[int]:
    """Local (content) hash of every full block of ``tokens``; ``extra``: block index -> the
    multimodal keys of that block (``media_block_keys``, ``event_block_keys``)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if _native is not None and not extra:
        hashes = _native.block_hashes(tokens, block_size, lora_seed(lora_name))
        if hashes is not None:
            return hashes
    return block_hashes_py(tokens, block_size, lora_name, extra)


def block_hashes_py(
    tokens: Sequence[int],
    block_size: int,
    lora_name: str | None = None,
    extra: Mapping[int, Sequence[int]] | None = None,
) -> list[int]:
    """``block_hashes`` in Python only (any block size, any sequence, multimodal keys)."""
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
    seed = lora_seed(lora_name)
    # C-level passes (map) instead of a Python loop: slicing and hashing cost ~100 ns a block; a
    # partial tail block is never reached (the seeds run out first)
    hashes = list(
        map(
            _xxh3,
            map(raw.__getitem__, _block_slices(n_blocks, 4 * block_size)),
            repeat(seed, n_blocks),
        )
    )
    if extra:
        step = 4 * block_size
        for i, keys in extra.items():
            if 0 <= i < n_blocks and keys:
                ordered = sorted(k & _U64 for k in keys)
                block = raw[i * step : (i + 1) * step] + struct.pack(f"<{len(ordered)}Q", *ordered)
                hashes[i] = _xxh3(block, seed)
    return hashes


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
    if _native is not None:
        hashes = _native.sequence_hashes(local_hashes, XXH3_SEED)
        if hashes is not None:
            return hashes
    return sequence_hashes_py(local_hashes)


def sequence_hashes_py(local_hashes: Sequence[int]) -> list[int]:
    """``sequence_hashes`` in Python only."""
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
