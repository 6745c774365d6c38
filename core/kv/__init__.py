"""dyn.core.kv: block and sequence hashing, the KV-event wire codec (and, later, the radix indexer)."""

from dyn.core.kv.hashing import XXH3_SEED, block_hashes, sequence_hashes

__all__ = ["XXH3_SEED", "block_hashes", "sequence_hashes"]
