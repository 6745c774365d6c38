import hashlib
import random
import struct

import pytest
import xxhash

from dyn.core.kv.hashing import (
    XXH3_SEED,
    MediaSpan,
    block_hashes,
    event_block_keys,
    extend_sequence_hash,
    lora_seed,
    media_block_keys,
    mm_key,
    sequence_hashes,
)


def reference_block_hash(tokens, seed=XXH3_SEED):
    return xxhash.xxh3_64_intdigest(struct.pack(f"<{len(tokens)}I", *tokens), seed=seed)


def test_only_full_blocks_are_hashed_as_le_u32():
    tokens = [1, 2, 3, 4, 5, 6, 7, 2**32 - 1, 9]
    assert block_hashes(tokens, 4) == [reference_block_hash(tokens[0:4]), reference_block_hash(tokens[4:8])]
    assert block_hashes(tokens[:3], 4) == []


def test_lora_is_mixed_into_the_seed_not_the_data():
    seed = (XXH3_SEED + xxhash.xxh3_64_intdigest(b"adapter", seed=0)) % 2**64
    assert lora_seed("adapter") == seed
    assert block_hashes([1, 2], 2, "adapter") == [reference_block_hash([1, 2], seed)]
    assert block_hashes([1, 2], 2, "") == block_hashes([1, 2], 2)


def test_sequence_hashes_chain_with_fixed_seed():
    local = block_hashes(list(range(12)), 4)
    seq = sequence_hashes(local)
    assert seq[0] == local[0]
    assert seq[1] == xxhash.xxh3_64_intdigest(struct.pack("<QQ", seq[0], local[1]), seed=XXH3_SEED)
    assert seq[2] == extend_sequence_hash(seq[1], local[2])
    assert sequence_hashes([]) == []


def test_block_size_must_be_positive():
    with pytest.raises(ValueError, match="block_size"):
        block_hashes([1], 0)


# Fixed vectors from NVIDIA Dynamo 1.6.1 itself, produced once with the anchor's venv
# (../shared/anchor/install.sh) by:
#   rng = random.Random(7)   # the two seeded sequences below, drawn in this order
#   dynamo._core.compute_block_hash_for_seq(tokens, block_size, lora_name=lora)
_rng = random.Random(7)
_SEEDED_16 = [_rng.randrange(0, 152000) for _ in range(200)]
_SEEDED_64 = [_rng.randrange(0, 2**32) for _ in range(130)]
DYNAMO_VECTORS = [
    (list(range(10)), 4, None, [9143094415614847814, 12124091508212882195]),
    ([0, 2**32 - 1, 2**31, 1, 7], 2, None, [82595646164830710, 15192166924611705880]),
    (
        _SEEDED_16,
        16,
        None,
        [
            9703090353016538247,
            2447902649232434588,
            2740232996443728605,
            6802683928447940948,
            15009743590188707908,
            16191877740338339062,
            13895406819070655718,
            14365668698865364440,
            7564890587082179632,
            18020159212308157215,
            1281541376044379934,
            16917061043362018874,
        ],
    ),
    (_SEEDED_64, 64, None, [16534611448645346567, 13902037091290312146]),
    (list(range(10)), 4, "adapter-a", [6665157333201000639, 11721812545976571723]),
    (list(range(10)), 4, "", [9143094415614847814, 12124091508212882195]),
    ([1, 2, 3], 4, None, []),
]


@pytest.mark.parametrize(("tokens", "block_size", "lora", "expected"), DYNAMO_VECTORS)
def test_block_hashes_equal_dynamos(tokens, block_size, lora, expected):
    assert block_hashes(tokens, block_size, lora) == expected


IMAGE = hashlib.sha256(b"an image").hexdigest()
OTHER = hashlib.sha256(b"another image").hexdigest()


def test_a_block_with_placeholders_hashes_its_tokens_then_its_items_keys_sorted():
    """Dynamo's multimodal block hash: the tokens as LE u32, then each key as LE u64 ascending,
    same seed; a key is the identifier's first 16 hex characters."""
    tokens = list(range(12))
    spans = [MediaSpan(5, 2, mm_key(OTHER)), MediaSpan(2, 4, mm_key(IMAGE))]
    keys = media_block_keys(spans, 4, 3)
    assert keys == {0: [mm_key(IMAGE)], 1: [mm_key(OTHER), mm_key(IMAGE)]}
    got = block_hashes(tokens, 4, extra=keys)
    plain = block_hashes(tokens, 4)
    both = sorted([int(IMAGE[:16], 16), int(OTHER[:16], 16)])
    expected_1 = xxhash.xxh3_64_intdigest(struct.pack("<4I2Q", *tokens[4:8], *both), seed=XXH3_SEED)
    assert got == [got[0], expected_1, plain[2]] and got[0] != plain[0]
    assert media_block_keys(spans, 4, 2, first_block=1) == {0: [mm_key(OTHER), mm_key(IMAGE)]}


def test_vllms_extra_keys_give_the_hashes_a_request_with_the_same_media_gives():
    """vLLM publishes per block a tuple of the LoRA name, (identifier, offset) pairs and the
    cache salt; only 64-hex identifiers count."""
    tokens = list(range(12))
    extra_keys = [None, ("adapter", (IMAGE, 2), "salt"), [(IMAGE, 2)]]
    from_event = block_hashes(tokens, 4, extra=event_block_keys(extra_keys, 3))
    from_request = block_hashes(tokens, 4, extra=media_block_keys([MediaSpan(5, 7, mm_key(IMAGE))], 4, 3))
    assert from_event == from_request
    assert mm_key("not-a-hash") is None and mm_key(IMAGE.upper()) == mm_key(IMAGE) and mm_key(7) is None
    assert event_block_keys([("adapter",), None], 2) == {}


native = pytest.importorskip("dyn.core.kv._xxh3", reason="the C extension was not built here")


def test_the_c_hashes_equal_the_python_ones_for_every_block_size_it_takes():
    from dyn.core.kv.hashing import block_hashes_py

    rng = random.Random(11)
    # 12 to 240 bytes: XXH3's 9-16, 17-128 and 129-240 classes; then its long form, in one and in
    # several 1,024-byte blocks of stripes
    for block_size in [*range(3, 61), 61, 64, 100, 128, 255, 256, 257, 512, 1000, 1024]:
        for _ in range(8):
            tokens = [
                rng.randrange(2**32) for _ in range(block_size * rng.randrange(4) + rng.randrange(block_size))
            ]
            lora = rng.choice([None, "adapter-a", f"lora{rng.randrange(99)}"])
            got = native.block_hashes(tokens, block_size, lora_seed(lora))
            assert got == block_hashes_py(tokens, block_size, lora)
            assert lora is not None or got == [
                reference_block_hash(tokens[i : i + block_size])
                for i in range(0, len(tokens) - block_size + 1, block_size)
            ]


def test_the_c_sequence_hashes_equal_the_python_ones():
    from dyn.core.kv.hashing import sequence_hashes_py

    rng = random.Random(12)
    for n in range(12):
        local = [rng.choice([0, 2**64 - 1, rng.randrange(2**64)]) for _ in range(n)]
        assert native.sequence_hashes(local, XXH3_SEED) == sequence_hashes_py(local)


@pytest.mark.parametrize(
    ("tokens", "block_size"),
    [
        ((1, 2, 3), 3),
        ([1, -2, 3], 3),
        ([1, 2, 2**32], 3),
        ([1, 2, "3"], 3),
        ([1, 2, 3], 2),
        ([1] * 1025, 1025),
    ],
)
def test_what_the_c_path_does_not_take_goes_to_python_with_pythons_result_or_error(tokens, block_size):
    from dyn.core.kv.hashing import block_hashes_py

    assert native.block_hashes(tokens, block_size, XXH3_SEED) is None
    try:
        expected = block_hashes_py(tokens, block_size)
    except (OverflowError, TypeError) as exc:
        with pytest.raises(type(exc)):
            block_hashes(tokens, block_size)
    else:
        assert block_hashes(tokens, block_size) == expected


def test_sequence_hashes_of_values_out_of_u64_go_to_python():
    assert native.sequence_hashes([1, -1], XXH3_SEED) is None
    assert sequence_hashes([-5]) == [-5]
    with pytest.raises(struct.error):
        sequence_hashes([1, -1])
