"""How wide a pooling model's vectors are, read from its ``config.json``: an embedding has the
model's hidden size (vLLM's embed pooler without a projector), a classifier's output one value
per class (``dyn.core.model.classes``).
"""

from __future__ import annotations

import functools

from dyn.core.messages import CLASSIFY_TASKS, PoolingTask
from dyn.core.model.classes import class_labels
from dyn.core.model.info import ModelInfo, read_model_json

DEFAULT_HIDDEN_SIZE = 256
"""For a model directory whose config.json states no hidden size."""
_SIZE_KEYS = ("hidden_size", "d_model", "n_embd", "dim")


def hidden_size(model: ModelInfo) -> int:
    """The model's hidden size (its embedding size), from config.json; ``DEFAULT_HIDDEN_SIZE``
    when the file or the field is missing."""
    config = read_model_json(str(model.path), model.path / "config.json", required=False) or {}
    for key in _SIZE_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return DEFAULT_HIDDEN_SIZE


@functools.lru_cache(maxsize=64)
def vector_width(model: ModelInfo, task: PoolingTask) -> int:
    """How many values one vector of ``task`` holds (one row, for a token task): the number of
    classes for a classifier's tasks, else the hidden size; read once per model and task."""
    if task in CLASSIFY_TASKS:
        return len(class_labels(model) or ())
    return hidden_size(model)
