"""KV-cache events in the vLLM ZMQ wire format, shared by real engines and dyn's mocker.

On the wire (vLLM ``ZmqEventPublisher``; SGLang speaks the same):

- a ZMQ multipart message of exactly 3 frames: ``[topic, seq, payload]``; ``seq`` is an 8-byte
  big-endian unsigned counter of batches, starting at 0 per publisher;
- ``payload`` is msgpack of the batch as an array ``[ts: float, events: list, data_parallel_rank]``;
- each event is a tagged array whose first element is its type name:
  ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name]``,
  ``["BlockRemoved", block_hashes, medium]``, ``["AllBlocksCleared"]``.

The encoder writes exactly that. The decoder (``decode_event_batch``, msgspec tagged-union
decoders) is tolerant the way Dynamo's is: it takes the tagged-array form or a map with a ``type``
key, SGLang's shorter ``BlockStored`` (ending at ``lora_id``), missing trailing fields (their
defaults: ``medium`` GPU), and ignores unknown trailing fields and keys. Engine block
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
from typing import Annotated, Any, Required, TypedDict

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
    "GPU": StorageTier.DEVICE,
    "DEVICE": StorageTier.DEVICE,
    "CPU": StorageTier.HOST_PINNED,
    "CPU_PINNED": StorageTier.HOST_PINNED,
    "CPU_TIER1": StorageTier.HOST_PINNED,
    "CPU_TIER2": StorageTier.DISK,
    "DISK": StorageTier.DISK,
    "NVME": StorageTier.DISK,
    "STORAGE": StorageTier.DISK,
    "EXTERNAL": StorageTier.EXTERNAL,
    "NETWORK": StorageTier.EXTERNAL,
    "REMOTE": StorageTier.EXTERNAL,
    "SHARED": StorageTier.EXTERNAL,
}


def tier_of(medium: str | None) -> StorageTier:
    """The tier an engine's ``medium`` names (case-insensitive); missing or unknown: device.

    Dynamo's table plus vLLM's offloading media, ``CPU`` (host) and ``STORAGE`` (disk), which
    Dynamo would take for device blocks: vLLM's CPU offloading connector publishes exactly those.
    """
    if not medium:
        return StorageTier.DEVICE
    return _TIER_OF_MEDIUM.get(medium.upper(), StorageTier.DEVICE)


class BlockStored(msgspec.Struct, tag=True, array_like=True, gc=False):
    """Full blocks stored in the cache, in prefix order; ``parent_block_hash`` precedes the first."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[Annotated[int, msgspec.Meta(ge=0)]]
    block_size: Annotated[int, msgspec.Meta(ge=0)]
    """0 (with no token ids) in vLLM's offloading placeholders: decoded, never indexed."""
    lora_id: int | None = None
    medium: str | None = DEFAULT_MEDIUM
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    """One entry per block (None, or a tuple of keys), as vLLM publishes them: the LoRA name,
    ``(mm_identifier, offset)`` pairs, the cache salt. The multimodal identifiers enter the
    router's block hashes (``dyn.core.kv.hashing.event_block_keys``)."""


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
    data_parallel_rank: Annotated[int, msgspec.Meta(ge=0)] | None = None


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
        raise KvEventDecodeError(f"a KV-event message has 3 frames (topic, seq, payload), got {len(frames)}")
    topic, seq, payload = frames
    return bytes(topic), decode_seq(bytes(seq)), bytes(payload)


# --------------------------------------------------------------------------- tolerant decoding
#
# Two typed msgspec decoders, no hand validation: the batch as vLLM writes it by default (tagged
# arrays, int hashes) decodes straight into the public structs in one call; anything else (maps,
# sha256 bytes hashes, Eagle bigrams, an odd lora_id, unknown events) is decoded event by event
# into wider wire structs, which are then normalised into the public ones.

_NonNegative = Annotated[int, msgspec.Meta(ge=0)]
_Positive = Annotated[int, msgspec.Meta(gt=0)]
_Hash = int | bytes
_Token = _NonNegative | list[_NonNegative]


class _StoredWire(msgspec.Struct, gc=False):
    """``BlockStored`` as engines send it; the array and map forms below differ only in shape."""

    block_hashes: list[_Hash]
    parent_block_hash: _Hash | None
    token_ids: list[_Token]
    block_size: _NonNegative  # 0: an offloading placeholder, refused by the converter alone
    lora_id: Any = None
    medium: str | None = DEFAULT_MEDIUM
    lora_name: str | None = None
    extra_keys: list[Any] | None = None


class _RemovedWire(msgspec.Struct, gc=False):
    block_hashes: list[_Hash]
    medium: str | None = DEFAULT_MEDIUM


class _StoredArray(_StoredWire, tag="BlockStored", array_like=True):
    pass


class _RemovedArray(_RemovedWire, tag="BlockRemoved", array_like=True):
    pass


class _ClearedArray(msgspec.Struct, tag="AllBlocksCleared", array_like=True, gc=False):
    pass


class _StoredMap(_StoredWire, tag="BlockStored", tag_field="type"):
    pass


class _RemovedMap(_RemovedWire, tag="BlockRemoved", tag_field="type"):
    pass


class _ClearedMap(msgspec.Struct, tag="AllBlocksCleared", tag_field="type", gc=False):
    pass


class _RawBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: _NonNegative | None = None


class _RawBatchMap(TypedDict, total=False):
    ts: Required[float]
    events: Required[list[msgspec.Raw]]
    data_parallel_rank: _NonNegative | None
    attn_dp_rank: _NonNegative | None  # SGLang's name for it


_KNOWN = frozenset(("BlockStored", "BlockRemoved", "AllBlocksCleared"))
_batch_decoder = msgspec.msgpack.Decoder(KvEventBatch)
_raw_batch_decoder = msgspec.msgpack.Decoder(_RawBatch | _RawBatchMap)
_array_event_decoder = msgspec.msgpack.Decoder(_StoredArray | _RemovedArray | _ClearedArray)
_map_event_decoder = msgspec.msgpack.Decoder(_StoredMap | _RemovedMap | _ClearedMap)
_ARRAY_MARKERS = frozenset((*range(0x90, 0xA0), 0xDC, 0xDD))
_MAP_MARKERS = frozenset((*range(0x80, 0x90), 0xDE, 0xDF))


def _u64(value: int | bytes) -> int:
    if isinstance(value, bytes):
        if not value:
            raise KvEventDecodeError("a block hash must be an integer or non-empty bytes")
        return int.from_bytes(value, "big") & _U64  # vLLM's own int form of a sha256 hash
    return value & _U64


def _hashes(values: list[Any]) -> list[int]:
    """Engine block hashes as unsigned 64-bit ints (msgspec already bounded ints to 64 bits)."""
    try:
        if not values or min(values) >= 0:
            return values
    except TypeError:  # bytes hashes (sha256), alone or mixed with ints
        pass
    return [_u64(v) for v in values]


def _tokens(values: list[Any]) -> list[int]:
    """Token ids, with Eagle's bigrams ``[[a, b], ...]`` reduced to the first of each pair."""
    try:
        if not values or type(min(values)) is int:
            return values
    except TypeError:  # ints and bigrams mixed
        pass
    out = []
    for v in values:
        if isinstance(v, list):
            if not v:
                raise KvEventDecodeError("token_ids must be non-negative integers or non-empty pairs")
            v = v[0]
        out.append(v)
    return out


def _public(wire: Any) -> KvEvent:
    if isinstance(wire, _StoredWire):
        parent = wire.parent_block_hash
        lora_id = wire.lora_id
        return BlockStored(
            block_hashes=_hashes(wire.block_hashes),
            parent_block_hash=None if parent is None else _u64(parent),
            token_ids=_tokens(wire.token_ids),
            block_size=wire.block_size,
            lora_id=lora_id if isinstance(lora_id, int) and not isinstance(lora_id, bool) else None,
            medium=wire.medium,
            lora_name=wire.lora_name,
            extra_keys=wire.extra_keys if isinstance(wire.extra_keys, list) else None,
        )
    if isinstance(wire, _RemovedWire):
        return BlockRemoved(block_hashes=_hashes(wire.block_hashes), medium=wire.medium)
    return AllBlocksCleared()


def _decode_event(raw: msgspec.Raw) -> KvEvent:
    """One event in either form; UnknownKvEventError when only its type name is not known."""
    view = memoryview(raw)
    marker = view[0] if len(view) else -1
    if marker in _ARRAY_MARKERS:
        decoder, form = _array_event_decoder, "array"
    elif marker in _MAP_MARKERS:
        decoder, form = _map_event_decoder, "map"
    else:
        got = type(msgspec.msgpack.decode(raw)).__name__
        raise KvEventDecodeError(f"an event must be an array or a map, got {got}")
    try:
        return _public(decoder.decode(raw))
    except msgspec.ValidationError as exc:
        tag = _tag(msgspec.msgpack.decode(raw))
        if isinstance(tag, str) and tag not in _KNOWN:
            raise UnknownKvEventError(f"unknown KV event type {tag!r}") from None
        if not isinstance(tag, str):
            where = "start with its type name" if form == "array" else "have a string 'type' key"
            raise KvEventDecodeError(f"an event {form} must {where}") from None
        raise KvEventDecodeError(f"{tag}: {exc}") from None


def _tag(value: Any) -> Any:
    if isinstance(value, list):
        return value[0] if value else None
    return value.get("type")


def decode_event_batch(payload: bytes) -> KvEventBatch:
    """Decode a batch payload in any form vLLM or SGLang writes (see the module docstring)."""
    return _decode_batch(payload, skip_unknown=False)[0]


def decode_known_events(payload: bytes) -> tuple[KvEventBatch, int]:
    """Like ``decode_event_batch``, but events of an unknown type are left out of the batch
    instead of failing it; returns the batch and how many events were left out."""
    return _decode_batch(payload, skip_unknown=True)


def _decode_batch(payload: bytes, *, skip_unknown: bool) -> tuple[KvEventBatch, int]:
    try:
        batch = _batch_decoder.decode(payload)
    except msgspec.DecodeError:  # ValidationError included: not vLLM's default form, go event by event
        return _decode_event_by_event(payload, skip_unknown)
    for event in batch.events:
        if event.__class__ is not AllBlocksCleared:  # signed hashes become unsigned
            # mypy narrows only on "is", not "is not": the other event types have block_hashes
            hashes = event.block_hashes  # type: ignore[union-attr]
            if hashes and min(hashes) < 0:
                event.block_hashes = [h & _U64 for h in hashes]  # type: ignore[union-attr]
            if event.__class__ is BlockStored and event.parent_block_hash is not None:
                event.parent_block_hash &= _U64
    return batch, 0


def _decode_event_by_event(payload: bytes, skip_unknown: bool) -> tuple[KvEventBatch, int]:
    try:
        raw = _raw_batch_decoder.decode(payload)
    except msgspec.ValidationError as exc:
        raise KvEventDecodeError(
            f"a batch must be an array [ts, events, data_parallel_rank] or a map of them: {exc}"
        ) from None
    except msgspec.DecodeError as exc:
        raise KvEventDecodeError(f"payload is not valid msgpack: {exc}") from None
    if isinstance(raw, dict):
        raw = _RawBatch(raw["ts"], raw["events"], raw.get("data_parallel_rank", raw.get("attn_dp_rank")))
    decoded: list[KvEvent] = []
    unknown = 0
    for raw_event in raw.events:
        try:
            decoded.append(_decode_event(raw_event))
        except UnknownKvEventError:
            if not skip_unknown:
                raise
            unknown += 1
    return KvEventBatch(ts=raw.ts, events=decoded, data_parallel_rank=raw.data_parallel_rank), unknown
