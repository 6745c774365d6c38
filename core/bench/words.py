"""Synthetic text for chat prompts: common English words, about one token each for BPE tokenizers.

``TextSynth`` turns a block id into ``block_size`` words, deterministic for a seed, so equal block
ids give equal text (the workloads' shared prefixes); ``WORDS`` is the vocabulary.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

WORDS = tuple(
    "the of and to in is that it for on with as was at by be this from or an are not have which "
    "you one but all they were their there can has more will would about been what when who some "
    "into so out up time other like than only then its also new could these two may first any way "
    "over most such made after".split()
)


class TextSynth:
    """Block id -> ``block_size`` words, deterministic for a seed (about one token per word)."""

    def __init__(self, block_size: int, seed: int) -> None:
        self.block_size = block_size
        self.seed = seed

    def block(self, block_id: int) -> str:
        rng = random.Random(f"{self.seed}:text:{block_id}")
        return " ".join(rng.choice(WORDS) for _ in range(self.block_size))

    def text(self, block_ids: Sequence[int]) -> str:
        return " ".join(self.block(b) for b in block_ids)
