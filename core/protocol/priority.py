"""Request priority, converted in this one place.

The client's priority has one meaning on every backend: ``nvext.agent_hints.priority``, larger is
more important (SGLang's default reading, and the router queue's). vLLM's own top-level
``priority`` field keeps vLLM's reading (smaller is more important) and is turned around when no
agent hint is given. Each engine then gets the value in its own convention, which its worker
advertises in discovery (``WorkerRecord.priority_order``): vLLM and SGLang with
``--schedule-low-priority-values-first`` schedule smaller values first (``lower_first``), SGLang by
default larger ones (``higher_first``). This is the ``dyn`` convention, and Dynamo's since 1.1
(ai-dynamo/dynamo#7492: its router queue jumps by ``max(priority, 0)``, its vLLM worker negates).

The frontend's ``--priority-convention dynamo`` serves clients tuned for Dynamo 1.0 + vLLM
(ai-dynamo/dynamo#6348): the value (``agent_hints.priority``, else the top-level ``priority``) is
forwarded to the engine as it is, so with vLLM a smaller value is served first, and the router
queue does not read it (Dynamo 1.0's queue ordered by ``latency_sensitivity`` only).
"""

from __future__ import annotations

from typing import Literal

from dyn.core.protocol.openai import _GenerationRequest

Convention = Literal["dyn", "dynamo"]
CONVENTIONS: tuple[Convention, ...] = ("dyn", "dynamo")


def request_priority(req: _GenerationRequest, convention: Convention = "dyn") -> int | None:
    """The request's priority, ``None`` when the client gave none: in the ``dyn`` convention
    larger is more important; in ``dynamo`` it is the client's value as sent."""
    hints = req.nvext.agent_hints if req.nvext is not None else None
    if hints is not None and hints.priority is not None:
        return hints.priority
    if not req.priority:
        return None
    return req.priority if convention == "dynamo" else -req.priority


def engine_priority(priority: int | None, order: str, convention: Convention = "dyn") -> int | None:
    """``request_priority``'s value in an engine's convention ``order`` (``lower_first`` or
    ``higher_first``); ``None`` stays ``None`` (the engine's default). In the ``dynamo``
    convention the value is forwarded as it is, whatever the engine's order."""
    if priority is None:
        return None
    if convention == "dynamo":
        return priority
    return priority if order == "higher_first" else -priority


def queue_priority(priority: int | None, convention: Convention = "dyn") -> int | None:
    """What the router queue orders by (larger jumps further ahead): the hint's priority in the
    ``dyn`` convention, nothing in ``dynamo`` (its value's meaning is the engine's)."""
    return priority if convention == "dyn" else None
