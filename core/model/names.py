"""A served model's names: the one it registers and answers with, and its aliases.

vLLM's ``--served-model-name`` takes several names: a request may use any of them, and the first
is the model's own name (in responses, metrics and discovery). dyn also has ``--model-name``
(Dynamo's flag, one name); the two are one setting.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_NAMES = 16
"""Most names one model may be served under."""
MAX_NAME_CHARS = 256
"""Longest served model name."""


def served_names(
    model_name: str | None, served_model_name: Sequence[str] = ()
) -> tuple[str | None, tuple[str, ...]]:
    """``(name, aliases)`` from ``--model-name`` and ``--served-model-name``: the name is
    ``--model-name`` when given (None: the model directory's name), else the first served name;
    the aliases are the other served names, in order, without repeats.

    ``ValueError`` names what to fix: an empty, over-long or whitespace-padded name, more than
    ``MAX_NAMES`` names, or a ``--model-name`` that is not the first served name.
    """
    names = list(dict.fromkeys(served_model_name))
    if len(names) > MAX_NAMES:
        raise ValueError(f"--served-model-name takes at most {MAX_NAMES} names, got {len(names)}")
    for name in [*names, *([model_name] if model_name is not None else [])]:
        if not name or name != name.strip() or len(name) > MAX_NAME_CHARS:
            raise ValueError(
                f"a served model name must be 1 to {MAX_NAME_CHARS} characters without leading or "
                f"trailing whitespace, got {name!r}"
            )
    if not names:
        return model_name, ()
    if model_name is not None and model_name != names[0]:
        raise ValueError(
            f"--model-name {model_name!r} and --served-model-name {names[0]!r} disagree: the first "
            "served name is the model's name; give one of the two flags"
        )
    return names[0], tuple(names[1:])
