"""Configuration of the mocker engine; flag names and defaults mirror Dynamo's mocker."""

from __future__ import annotations

import msgspec

PREEMPTION_MODES = ("lifo", "fifo")


class MockerConfig(msgspec.Struct, kw_only=True, frozen=True):
    """One simulated worker's engine settings.

    ``speedup_ratio`` divides every simulated pass time (``decode_speedup_ratio`` divides decode
    time on top); a ratio <= 0 means no scaling, i.e. the raw model time.
    """

    block_size: int = 64
    num_gpu_blocks: int = 16384
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    preemption_mode: str = "lifo"
    speedup_ratio: float = 1.0
    decode_speedup_ratio: float = 1.0

    def validate(self) -> "MockerConfig":
        """Raise ``ValueError`` with a sentence saying what to fix; return self when fine."""
        for name in ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"--preemption-mode must be one of {', '.join(PREEMPTION_MODES)}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.block_size:
            raise ValueError("--max-num-batched-tokens must be at least --block-size")
        return self
