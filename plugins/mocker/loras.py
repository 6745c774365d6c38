"""The mocker's simulated LoRA adapters (``--lora-modules``, ``--max-loras``,
``--lora-load-time-ms``).

What a user sees of vLLM's adapters, without weights: a request names an adapter it serves or is
refused (``bad_request``, naming the ones it serves); at most ``max_loras`` adapters are resident,
the least recently used is evicted to load another, and loading one delays the requests that need
it by the load time (divided by the speedup ratio), as vLLM's first request to a cold adapter
waits for its weights. Each adapter's blocks are hashed with its name (``KvSequence.lora_name``),
so its prefix cache and KV events are its own.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import anyio

from dyn.core.engine import EngineError
from dyn.core.model.lora import LoraModule


class SimulatedLoras:
    """The adapters of one mocker worker and which of them are resident."""

    def __init__(self, modules: Sequence[LoraModule], max_loras: int, load_time_s: float) -> None:
        self.paths = {m.name: m.path for m in modules}
        self.max_loras = max_loras
        self.load_time_s = load_time_s
        self._resident: OrderedDict[str, None] = OrderedDict()
        self._loading: dict[str, anyio.Event] = {}
        self.loads = 0
        """Adapters loaded so far (evictions make an adapter load again)."""

    async def ensure(self, lora_name: str | None) -> None:
        """Return once ``lora_name`` is resident (None or empty: the base model, at once);
        ``EngineError`` (``bad_request``) for an adapter this worker does not serve."""
        if not lora_name:
            return
        if lora_name not in self.paths:
            served = ", ".join(self.paths) or "none (start it with --lora-modules NAME=PATH)"
            raise EngineError(
                f"this worker serves no LoRA adapter {lora_name!r}; it serves: {served}", code="bad_request"
            )
        while lora_name not in self._resident:
            loading = self._loading.get(lora_name)
            if loading is not None:
                await loading.wait()
                continue
            self._loading[lora_name] = done = anyio.Event()
            try:
                await anyio.sleep(self.load_time_s)
                while len(self._resident) >= self.max_loras:
                    self._resident.popitem(last=False)
                self._resident[lora_name] = None
                self.loads += 1
            finally:
                del self._loading[lora_name]
                done.set()
        self._resident.move_to_end(lora_name)
