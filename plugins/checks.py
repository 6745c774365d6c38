"""Checks the engine plugins' configs share."""

from __future__ import annotations

from collections.abc import Mapping


def check_at_least_one(values: Mapping[str, int | None]) -> None:
    """``ValueError`` naming the first flag in ``values`` (flag to its value; None: not given)
    whose value is below 1."""
    for name, value in values.items():
        if value is not None and value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
