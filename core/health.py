"""What the ``GET /health`` of every dyn service says, in one shape (frontend, ``dyn router``,
``dyn indexer``): a readiness probe that tells the truth.

- ``unhealthy`` (answered 503) when no request could succeed now, with the ``reason``;
- ``degraded`` (200) when requests succeed but worse than configured, with the causes in
  ``degraded`` (one line each);
- ``healthy`` (200) otherwise.

A service decides what fails or degrades it; ``verdict`` only turns that into the body's head.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dyn.core.router.policy import Router

UNHEALTHY_STATUS = 503


def unroutable(router: Router, model_name: str) -> str | None:
    """Why no request for ``model_name`` could be routed by ``router`` now (its own reason, or no
    live worker in its pool), or None."""
    reason = router.unroutable()
    if reason is None and not router.pool.workers():
        reason = f"no live worker serves model {model_name!r}"
    return reason


def verdict(down: Mapping[str, str], degraded: Sequence[str], served: int) -> tuple[int, dict[str, object]]:
    """The HTTP status and the head of a ``/health`` body for a service that serves ``served``
    things (models, or 1), of which those in ``down`` (name -> why) cannot be served now, while
    ``degraded`` says what is worse than configured. Every one down is ``unhealthy``; some down,
    or anything degraded, ``degraded`` (those down listed in ``unroutable``)."""
    if served and len(down) >= served:
        return UNHEALTHY_STATUS, {"status": "unhealthy", "reason": "; ".join(dict.fromkeys(down.values()))}
    if down or degraded:
        causes = [*degraded, *(f"{name!r} cannot be served: {why}" for name, why in down.items())]
        body: dict[str, object] = {"status": "degraded", "degraded": causes}
        if down:
            body["unroutable"] = dict(down)
        return 200, body
    return 200, {"status": "healthy"}
