"""Request priority, converted in this one place.

The client's priority has one meaning on every backend: ``nvext.agent_hints.priority``, larger is
more important (SGLang's default reading, and the router queue's). vLLM's own top-level
``priority`` field keeps vLLM's reading (smaller is more important) and is turned around when no
agent hint is given. Each engine then gets the value in its own convention, which its worker
advertises in discovery (``WorkerRecord.priority_order``): vLLM and SGLang with
``--schedule-low-priority-values-first`` schedule smaller values first (``lower_first``), SGLang by
default larger ones (``higher_first``).
"""

from __future__ import annotations

from dyn.core.protocol.openai import _GenerationRequest


def request_priority(req: _GenerationRequest) -> int | None:
    """The request's priority, larger is more important; ``None`` when the client gave none."""
    hints = req.nvext.agent_hints if req.nvext is not None else None
    if hints is not None and hints.priority is not None:
        return hints.priority
    return -req.priority if req.priority else None


def engine_priority(priority: int | None, order: str) -> int | None:
    """``priority`` (larger is more important) in an engine's convention ``order``
    (``lower_first`` or ``higher_first``); ``None`` stays ``None`` (the engine's default)."""
    if priority is None:
        return None
    return priority if order == "higher_first" else -priority
