"""KV-cache events in the vLLM ZMQ wire format, shared by real engines and dyn's mocker.

On the wire (vLLM ``ZmqEventPublisher``; SGLang speaks the same):

- a ZMQ multipart message of exactly 3 frames: ``[topic, seq, payload]``; ``seq`` is an 8-byte
  big-endian unsigned counter of batches, starting at 0 per publisher;
- ``payload`` is msgpack of the batch as an array ``[ts: float, events: list, data_parallel_rank]``;
- each event is a tagged array whose first element is its type name:
  ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name]``,
  ``["BlockRemoved", block_hashes, medium]``, ``["AllBlocksCleared"]``.

The encoder writes exactly that. The decoder (``decode_event_batch``) is tolerant the way Dynamo's
is: it takes the tagged-array form or a map with a ``type`` key, SGLang's shorter ``BlockStored``
(ending at ``lora_id``), missing trailing fields, and ignores unknown trailing fields. Engine block
hashes may be signed 64-bit ints (reinterpreted as unsigned) or vLLM's sha256 bytes (reduced to
their low 64 bits, as vLLM's ``maybe_convert_block_hash`` does). Anything it cannot use
raises ``KvEventDecodeError`` naming what is wrong; it never raises anything else for bad bytes.
``decode_known_events`` is the forward-compatible variant a subscriber uses: events of a type it
does not know are dropped (and counted) instead of failing their whole batch.

``tier_of`` maps an event's ``medium`` string to the ``StorageTier`` whose index it belongs to.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from typing import Any

import msgspec

DEFAULT_TOPIC = "kv-events"
DEFAULT_MEDIUM = "GPU"
REPLAY_END_SEQ = (-1).to_bytes(8, "big", signed=True)
_SEQ = struct.Struct(">Q")
_U64 = (1 << 64) - 1


class KvEventDecodeError(ValueError):
    """A KV-event frame or payload that cannot be understood; the message says which part."""


class UnknownKvEventError(KvEventDecodeError):
    """An event whose type name this decoder does not know (a newer engine, most likely)."""


class StorageTier(enum.StrEnum):
    """Where a cached block lives; each tier has its own index (Dynamo's ``StorageTier``)."""

    DEVICE = "device"
    HOST_PINNED = "host_pinned"
    DISK = "disk"
    EXTERNAL = "external"


_TIER_OF_MEDIUM = {
    "GPU": StorageTier.DEVICE, "DEVICE": StorageTier.DEVICE,
    "CPU_PINNED": StorageTier.HOST_PINNED, "CPU_TIER1": StorageTier.HOST_PINNED,
    "CPU_TIER2": StorageTier.DISK, "DISK": StorageTier.DISK, "NVME": StorageTier.DISK,
    "EXTERNAL": StorageTier.EXTERNAL, "NETWORK": StorageTier.EXTERNAL,
    "REMOTE": StorageTier.EXTERNAL, "SHARED": StorageTier.EXTERNAL,
}


def tier_of(medium: str | None) -> StorageTier:
    """The tier an engine's ``medium`` names (case-insensitive); missing or unknown: device."""
    if not medium:
        return StorageTier.DEVICE
    return _TIER_OF_MEDIUM.get(medium.upper(), StorageTier.DEVICE)


class BlockStored(msgspec.Struct, tag=True, array_like=True, gc=False):
    """Full blocks stored in the cache, in prefix order; ``parent_block_hash`` precedes the first."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = DEFAULT_MEDIUM
    lora_name: str | None = None


class BlockRemoved(msgspec.Struct, tag=True, array_like=True, gc=False):
    """Blocks evicted from the cache."""

    block_hashes: list[int]
    medium: str | None = DEFAULT_MEDIUM


class AllBlocksCleared(msgspec.Struct, tag=True, array_like=True, gc=False):
    """The whole cache was reset."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KvEventBatch(msgspec.Struct, array_like=True, gc=False):
    """One published batch: every event of one engine step, for one data-parallel rank."""

    ts: float
    events: list[KvEvent]
    data_parallel_rank: int | None = None


_encoder = msgspec.msgpack.Encoder()


def encode_event_batch(batch: KvEventBatch) -> bytes:
    """The msgpack payload of a batch, exactly as vLLM writes it."""
    return _encoder.encode(batch)


def encode_seq(seq: int) -> bytes:
    """The 8-byte big-endian sequence frame."""
    return _SEQ.pack(seq)


def decode_seq(frame: bytes) -> int:
    """Parse a sequence frame; ``REPLAY_END_SEQ`` decodes to -1."""
    if len(frame) != 8:
        raise KvEventDecodeError(f"sequence frame must be 8 bytes, got {len(frame)}")
    if frame == REPLAY_END_SEQ:
        return -1
    return _SEQ.unpack(frame)[0]


def split_frames(frames: Sequence[bytes]) -> tuple[bytes, int, bytes]:
    """Check a received multipart message and return ``(topic, seq, payload)``."""
    if len(frames) != 3:
        raise KvEventDecodeError(
            f"a KV-event message has 3 frames (topic, seq, payload), got {len(frames)}"
        )
    topic, seq, payload = frames
    return bytes(topic), decode_seq(bytes(seq)), bytes(payload)


# --------------------------------------------------------------------------- tolerant decoding

_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                  "medium", "lora_name")
_REMOVED_FIELDS = ("block_hashes", "medium")


def _u64(value: Any, what: str) -> int:
    if isinstance(value, bytes) and value:  # vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0
        return int.from_bytes(value, "big") & _U64  # vLLM's own int form of a hash
    if isinstance(value, bool) or not isinstance(value, int):
        raise KvEventDecodeError(f"{what} must be an integer, got {type(value).__name__}")
    if value < -(1 << 63) or value > _U64:
        raise KvEventDecodeError(f"{what} {value} does not fit in 64 bits")
    return value & _U64


def _int_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list):
        raise KvEventDecodeError(f"{what} must be a list, got {type(value).__name__}")
    return [_u64(v, what) for v in value]


def _token_list(value: Any) -> list[int]:
    if not isinstance(value, list):
        raise KvEventDecodeError(f"token_ids must be a list, got {type(value).__name__}")
    out: list[int] = []
    for v in value:
        if isinstance(v, list) and v:  # Eagle bigrams [[a, b], ...]: keep the first of each pair
            v = v[0]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise KvEventDecodeError("token_ids must be non-negative integers")
        out.append(v)
    return out


def _opt_str(value: Any, what: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise KvEventDecodeError(f"{what} must be a string or null, got {type(value).__name__}")


def _fields(raw: Any, names: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
    """Normalise a tagged array or a map into ``(tag, {field: value})``."""
    if isinstance(raw, list):
        if not raw or not isinstance(raw[0], str):
            raise KvEventDecodeError("an event array must start with its type name")
        return raw[0], dict(zip(names, raw[1:]))  # extra trailing elements are ignored
    if isinstance(raw, dict):
        tag = raw.get("type")
        if not isinstance(tag, str):
            raise KvEventDecodeError("an event map needs a string 'type' key")
        return tag, {k: raw[k] for k in names if k in raw}
    raise KvEventDecodeError(f"an event must be an array or a map, got {type(raw).__name__}")


def decode_event(raw: Any) -> KvEvent:
    """Build one typed event from its decoded msgpack value."""
    tag = raw[0] if isinstance(raw, list) and raw else (raw.get("type") if isinstance(raw, dict) else None)
    if tag == "BlockStored":
        _, f = _fields(raw, _STORED_FIELDS)
        for required in ("block_hashes", "parent_block_hash", "token_ids", "block_size"):
            if required not in f:
                raise KvEventDecodeError(f"BlockStored is missing {required}")
        parent = f["parent_block_hash"]
        block_size = f["block_size"]
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise KvEventDecodeError("BlockStored block_size must be a positive integer")
        lora_id = f.get("lora_id")
        return BlockStored(
            block_hashes=_int_list(f["block_hashes"], "block_hashes"),
            parent_block_hash=None if parent is None else _u64(parent, "parent_block_hash"),
            token_ids=_token_list(f["token_ids"]),
            block_size=block_size,
            lora_id=lora_id if isinstance(lora_id, int) and not isinstance(lora_id, bool) else None,
            medium=_opt_str(f.get("medium"), "medium"),
            lora_name=_opt_str(f.get("lora_name"), "lora_name"),
        )
    if tag == "BlockRemoved":
        _, f = _fields(raw, _REMOVED_FIELDS)
        if "block_hashes" not in f:
            raise KvEventDecodeError("BlockRemoved is missing block_hashes")
        return BlockRemoved(
            block_hashes=_int_list(f["block_hashes"], "block_hashes"),
            medium=_opt_str(f.get("medium"), "medium"),
        )
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    if isinstance(tag, str):
        raise UnknownKvEventError(f"unknown KV event type {tag!r}")
    _fields(raw, ())  # raises the precise shape error
    raise KvEventDecodeError("malformed KV event")  # pragma: no cover


def decode_event_batch(payload: bytes) -> KvEventBatch:
    """Decode a batch payload in any form vLLM or SGLang writes (see the module docstring)."""
    return _decode_batch(payload, skip_unknown=False)[0]


def decode_known_events(payload: bytes) -> tuple[KvEventBatch, int]:
    """Like ``decode_event_batch``, but events of an unknown type are left out of the batch
    instead of failing it; returns the batch and how many events were left out."""
    return _decode_batch(payload, skip_unknown=True)


def _decode_batch(payload: bytes, *, skip_unknown: bool) -> tuple[KvEventBatch, int]:
    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise KvEventDecodeError(f"payload is not valid msgpack: {exc}") from None
    if isinstance(raw, dict):
        raw = [raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank", raw.get("attn_dp_rank"))]
    if not isinstance(raw, list) or len(raw) < 2:
        raise KvEventDecodeError("a batch must be an array [ts, events, data_parallel_rank]")
    ts, events = raw[0], raw[1]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise KvEventDecodeError("batch ts must be a number")
    if not isinstance(events, list):
        raise KvEventDecodeError("batch events must be a list")
    dp_rank = raw[2] if len(raw) > 2 else None
    if dp_rank is not None and (isinstance(dp_rank, bool) or not isinstance(dp_rank, int) or dp_rank < 0):
        raise KvEventDecodeError("batch data_parallel_rank must be a non-negative integer or null")
    decoded: list[KvEvent] = []
    unknown = 0
    for raw_event in events:
        try:
            decoded.append(decode_event(raw_event))
        except UnknownKvEventError:
            if not skip_unknown:
                raise
            unknown += 1
    return KvEventBatch(ts=float(ts), events=decoded, data_parallel_rank=dp_rank), unknown
