"""The KV-event wire format, checked with a msgpack decoder written here from the spec.

Format (vLLM ZmqEventPublisher): 3 frames [topic, seq as 8-byte big-endian, payload]; payload is
msgpack [ts, events, data_parallel_rank]; events are tagged arrays:
["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name],
["BlockRemoved", block_hashes, medium], ["AllBlocksCleared"]. SGLang's BlockStored ends at lora_id.
"""

import struct

import pytest

from dyn.core.kv.events import (
    REPLAY_END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventBatch,
    KvEventDecodeError,
    decode_event_batch,
    decode_seq,
    encode_event_batch,
    encode_seq,
    split_frames,
)

# ----------------------------------------------------------------- an independent msgpack codec


def mp_decode(buf: bytes):
    value, end = _mp(buf, 0)
    assert end == len(buf), "trailing bytes after the msgpack value"
    return value


def _mp(b: bytes, i: int):
    t = b[i]
    if t <= 0x7F:
        return t, i + 1
    if t >= 0xE0:
        return t - 0x100, i + 1
    if 0x90 <= t <= 0x9F:
        return _mp_array(b, i + 1, t & 0x0F)
    if 0x80 <= t <= 0x8F:
        return _mp_map(b, i + 1, t & 0x0F)
    if 0xA0 <= t <= 0xBF:
        n = t & 0x1F
        return b[i + 1 : i + 1 + n].decode(), i + 1 + n
    fixed = {0xC0: None, 0xC2: False, 0xC3: True}
    if t in fixed:
        return fixed[t], i + 1
    ints = {
        0xCC: ">B",
        0xCD: ">H",
        0xCE: ">I",
        0xCF: ">Q",
        0xD0: ">b",
        0xD1: ">h",
        0xD2: ">i",
        0xD3: ">q",
        0xCA: ">f",
        0xCB: ">d",
    }
    if t in ints:
        fmt = ints[t]
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, b[i + 1 : i + 1 + size])[0], i + 1 + size
    if t in (0xD9, 0xDA, 0xDB):
        size = {0xD9: 1, 0xDA: 2, 0xDB: 4}[t]
        n = int.from_bytes(b[i + 1 : i + 1 + size], "big")
        start = i + 1 + size
        return b[start : start + n].decode(), start + n
    if t in (0xDC, 0xDD):
        size = 2 if t == 0xDC else 4
        return _mp_array(b, i + 1 + size, int.from_bytes(b[i + 1 : i + 1 + size], "big"))
    raise AssertionError(f"unexpected msgpack type byte {t:#x}")


def _mp_array(b, i, n):
    out = []
    for _ in range(n):
        v, i = _mp(b, i)
        out.append(v)
    return out, i


def _mp_map(b, i, n):
    out = {}
    for _ in range(n):
        k, i = _mp(b, i)
        v, i = _mp(b, i)
        out[k] = v
    return out, i


def mp_encode(v) -> bytes:
    """Just enough msgpack to write what an SGLang or foreign publisher would."""
    if v is None:
        return b"\xc0"
    if v is True or v is False:
        return b"\xc3" if v else b"\xc2"
    if isinstance(v, int):
        if 0 <= v <= 0x7F:
            return bytes([v])
        if v < 0:
            return b"\xd3" + struct.pack(">q", v)
        return b"\xcf" + struct.pack(">Q", v)
    if isinstance(v, float):
        return b"\xcb" + struct.pack(">d", v)
    if isinstance(v, str):
        raw = v.encode()
        return b"\xd9" + bytes([len(raw)]) + raw
    if isinstance(v, bytes):
        return b"\xc4" + bytes([len(v)]) + v
    if isinstance(v, list):
        return b"\xdc" + struct.pack(">H", len(v)) + b"".join(mp_encode(x) for x in v)
    if isinstance(v, dict):
        return bytes([0x80 | len(v)]) + b"".join(mp_encode(k) + mp_encode(x) for k, x in v.items())
    raise TypeError(v)


# ----------------------------------------------------------------- our encoder, read by hand


def test_encoded_batch_has_vllm_layout():
    batch = KvEventBatch(
        ts=12.5,
        events=[
            BlockStored([2**64 - 1, 7], None, list(range(8)), 4, None, "GPU", None),
            BlockStored([9], 7, [1, 2, 3, 4], 4, None, "GPU", None),
            BlockRemoved([7, 9]),
            AllBlocksCleared(),
        ],
        data_parallel_rank=3,
    )
    decoded = mp_decode(encode_event_batch(batch))
    assert decoded == [
        12.5,
        [
            # ... lora_id, medium, lora_name, extra_keys (vLLM 0.32's per-block extra keys)
            ["BlockStored", [2**64 - 1, 7], None, list(range(8)), 4, None, "GPU", None, None],
            ["BlockStored", [9], 7, [1, 2, 3, 4], 4, None, "GPU", None, None],
            ["BlockRemoved", [7, 9], "GPU"],
            ["AllBlocksCleared"],
        ],
        3,
    ]


def test_sequence_frame_is_8_byte_big_endian():
    assert encode_seq(1) == b"\x00" * 7 + b"\x01"
    assert encode_seq(2**40 + 5) == struct.pack(">Q", 2**40 + 5)
    assert decode_seq(struct.pack(">Q", 258)) == 258
    assert decode_seq(REPLAY_END_SEQ) == -1
    with pytest.raises(KvEventDecodeError, match="8 bytes"):
        decode_seq(b"\x01\x02")


# ----------------------------------------------------------------- foreign bytes, read by our decoder


def test_decodes_sglang_short_block_stored_and_ignores_trailing_fields():
    payload = mp_encode(
        [
            1.0,
            [
                ["BlockStored", [11, 12], None, [1, 2, 3, 4], 2, None],  # SGLang: ends at lora_id
                [
                    "BlockStored",
                    [13],
                    12,
                    [5, 6],
                    2,
                    None,
                    "CPU_PINNED",
                    "lora-a",
                    None,
                    None,
                    0,
                    "full",
                    0,
                    "x",
                ],
                ["BlockRemoved", [11], "GPU", 0, "full"],
                ["AllBlocksCleared", "extra"],
            ],
        ]
    )
    batch = decode_event_batch(payload)
    assert batch.data_parallel_rank is None
    short, long_, removed, cleared = batch.events
    assert short == BlockStored([11, 12], None, [1, 2, 3, 4], 2, None)  # medium: the default, GPU
    assert long_.medium == "CPU_PINNED" and long_.lora_name == "lora-a" and long_.parent_block_hash == 12
    assert removed == BlockRemoved([11], "GPU")
    assert cleared == AllBlocksCleared()


def test_decodes_map_form_and_signed_hashes():
    payload = mp_encode(
        {
            "ts": 2.0,
            "events": [
                {
                    "type": "BlockStored",
                    "block_hashes": [-1],
                    "parent_block_hash": -2,
                    "token_ids": [1, 2],
                    "block_size": 2,
                    "medium": "GPU",
                    "future_field": 1,
                }
            ],
            "data_parallel_rank": 1,
        }
    )
    batch = decode_event_batch(payload)
    (ev,) = batch.events
    assert ev.block_hashes == [2**64 - 1] and ev.parent_block_hash == 2**64 - 2
    assert batch.data_parallel_rank == 1


def test_decodes_vllm_032_map_events_with_sha256_bytes_hashes():
    """vLLM 0.32 sends ``KVCacheEvent``s as maps (tag=True, not array_like) with its new tail
    fields; with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`` the hashes are sha256 bytes."""
    digest = bytes(range(24, 56))  # 32 bytes
    payload = mp_encode(
        [
            3.0,
            [
                {
                    "type": "BlockStored",
                    "block_hashes": [digest],
                    "parent_block_hash": None,
                    "token_ids": [1, 2],
                    "block_size": 2,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": None,
                    "extra_keys": [None],
                    "group_idx": 0,
                    "kv_cache_spec_kind": "full_attention",
                }
            ],
            0,
        ]
    )
    (ev,) = decode_event_batch(payload).events
    assert ev.block_hashes == [int.from_bytes(digest, "big") & (2**64 - 1)]
    assert ev.token_ids == [1, 2] and ev.medium == "GPU" and ev.extra_keys == [None]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([1.0], "array \\[ts, events"),
        (["x", []], "Expected `float`, got `str` - at `\\$\\[0\\]`"),
        ([1.0, [["Bogus"]]], "unknown KV event type"),
        ([1.0, [["BlockStored", [1]]]], "BlockStored: Expected `array` of at least length 5, got 2"),
        ([1.0, [["BlockStored", [1], None, [1], -1, None]]], "Expected `int` >= 0 - at `\\$\\[4\\]`"),
        ([1.0, [["BlockStored", ["h"], None, [1], 1, None]]], "Expected `int \\| bytes`, got `str`"),
        ([1.0, [["BlockStored", [1], None, [-1], 1, None]]], "Expected `int` >= 0"),
        ([1.0, [["BlockStored", [b""], None, [1], 1, None]]], "non-empty bytes"),
        ([1.0, [["BlockStored", [1], None, [[]], 1, None]]], "non-empty pairs"),
        ([1.0, [[1, 2]]], "must start with its type name"),
        ([1.0, [{"block_hashes": [1]}]], "string 'type' key"),
        ([1.0, [7]], "must be an array or a map"),
        ([1.0, [], -1], "Expected `int` >= 0 - at `\\$\\[2\\]`"),
    ],
)
def test_malformed_payloads_raise_a_clear_error(value, message):
    with pytest.raises(KvEventDecodeError, match=message):
        decode_event_batch(mp_encode(value))


def test_garbage_bytes_and_wrong_frame_count_raise_a_clear_error():
    with pytest.raises(KvEventDecodeError, match="not valid msgpack"):
        decode_event_batch(b"\xc1\xff")
    with pytest.raises(KvEventDecodeError, match="3 frames"):
        split_frames([b"kv-events", encode_seq(0)])
    topic, seq, payload = split_frames([b"kv-events", encode_seq(5), b"\x90"])
    assert (topic, seq, payload) == (b"kv-events", 5, b"\x90")


def test_round_trip_through_our_own_decoder():
    batch = KvEventBatch(3.0, [BlockStored([1, 2], 0, [1] * 8, 4, None, "GPU", None), BlockRemoved([1])], 0)
    assert decode_event_batch(encode_event_batch(batch)) == batch
