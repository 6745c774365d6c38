"""The mocker's embeddings: deterministic unit vectors of the model's hidden size.

A vector depends on its input's token ids only (the same ids give the same vector in every
process and run; different ids give unrelated vectors), drawn from a Gaussian seeded with the
ids' hash and scaled to unit L2 norm, as a normalizing pooler (vLLM's default for embedding
models) returns them. The size is the model's ``hidden_size`` from its ``config.json`` (256 for
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


def class_probabilities(token_ids: list[int], count: int) -> list[float]:
    """A classifier's answer for ``token_ids``, a function of the ids alone: ``count``
    probabilities summing to 1 (the softmax of logits drawn as ``unit_vector``'s are), or for one
    class (a cross-encoder) the sigmoid of one such logit, as vLLM's classifier heads activate."""
    if count == 1:
        return [1.0 / (1.0 + math.exp(-4.0 * unit_vector(token_ids, 2)[0]))]
    logits = [4.0 * v for v in unit_vector(token_ids, count)]
    top = max(logits)
    weights = [math.exp(v - top) for v in logits]
    total = math.fsum(weights)
    return [w / total for w in weights]


def unit_vector(token_ids: list[int], size: int) -> list[float]:
    """The embedding of ``token_ids``: ``size`` floats of L2 norm 1, a function of the ids alone."""
    seed = xxhash.xxh64_intdigest(array("q", token_ids).tobytes())
    gauss = random.Random(seed).gauss
    values = [gauss(0.0, 1.0) for _ in range(size)]
    norm = math.sqrt(math.fsum(v * v for v in values)) or 1.0
    return [v / norm for v in values]
