import struct

import pytest
import xxhash

from dyn.core.kv.hashing import XXH3_SEED, block_hashes, extend_sequence_hash, lora_seed, sequence_hashes


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
