"""The mocker's embeddings: deterministic unit vectors of the model's hidden size.

A vector depends on its input's token ids only (the same ids give the same vector in every
process and run; different ids give unrelated vectors), drawn from a Gaussian seeded with the
ids' hash and scaled to unit L2 norm, as a normalizing pooler (vLLM's default for embedding
models) returns them; without the pooler's activation (``use_activation: false``), the Gaussian
draws as they are. The size is the model's ``hidden_size`` from its ``config.json`` (256 for
dyn-tiny).
"""

from __future__ import annotations

import math
import random
from array import array

import xxhash

from dyn.core.model import ModelInfo
from dyn.core.model.info import read_model_json

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


def class_logits(token_ids: list[int], count: int) -> list[float]:
    """A classifier's logits for ``token_ids``, a function of the ids alone: ``count`` of them,
    each 4 times a coordinate of a unit vector (one class: the first of two)."""
    return [4.0 * v for v in unit_vector(token_ids, 2 if count == 1 else count)[:count]]


def class_probabilities(token_ids: list[int], count: int) -> list[float]:
    """``class_logits`` activated as vLLM's classifier heads do: their softmax, or for one class
    (a cross-encoder) the sigmoid of its logit."""
    logits = class_logits(token_ids, count)
    if count == 1:
        return [1.0 / (1.0 + math.exp(-logits[0]))]
    top = max(logits)
    weights = [math.exp(v - top) for v in logits]
    total = math.fsum(weights)
    return [w / total for w in weights]


def raw_vector(token_ids: list[int], size: int) -> list[float]:
    """The embedding of ``token_ids`` before its normalization: ``size`` standard Gaussian draws
    seeded with the ids' hash (``unit_vector`` is this scaled to norm 1)."""
    seed = xxhash.xxh64_intdigest(array("q", token_ids).tobytes())
    gauss = random.Random(seed).gauss
    return [gauss(0.0, 1.0) for _ in range(size)]


def unit_vector(token_ids: list[int], size: int) -> list[float]:
    """The embedding of ``token_ids``: ``size`` floats of L2 norm 1, a function of the ids alone."""
    values = raw_vector(token_ids, size)
    norm = math.sqrt(math.fsum(v * v for v in values)) or 1.0
    return [v / norm for v in values]
