"""What a pooling model's ``config.json`` says about its vectors: how wide they are (an embedding
has the model's hidden size, vLLM's embed pooler without a projector; a classifier's output one
value per class, ``dyn.core.model.classes``), and whether it is a late-interaction (ColBERT)
model, which pools per token only: vLLM scores its pairs by MaxSim over the tokens' embeddings.
"""

from __future__ import annotations

import functools

from dyn.core.messages import CLASSIFY_TASKS, PoolingTask
from dyn.core.model.classes import class_labels, token_classifier
from dyn.core.model.info import ModelInfo, read_model_json

LATE_INTERACTION_ARCHITECTURES = frozenset(
    ("HF_ColBERT", "ColBERTModernBertModel", "ColBERTJinaRobertaModel", "ColBERTLfm2Model")
)
"""vLLM 0.32's text ColBERT architectures (its registry); the multimodal ones (ColPali, ColQwen)
take images, which dyn's pooling inputs do not."""
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


_COLBERT_DIM_KEYS = ("colbert_dim", "dim", "projection_dim")
"""Where vLLM's ColBERT models read their projection's width, in its order."""
RANKER_WIDTH = 512
"""A listwise ranker's embedding width: vLLM sets every ``JinaForRanking``'s projector to 512
values (its ``JinaForRankingConfig``), whatever its config.json says."""
LISTWISE_ARCHITECTURES = frozenset(("JinaForRanking",))
"""Listwise rerankers (vLLM 0.32's ``JinaForRanking``, jina-reranker-v3): the query and its
documents in one prompt, one embedding at each marker token (``dyn.core.frontend.listwise``)."""
RANKING_TOKEN_IDS = (151670, 151671)
"""The ids of a listwise ranker's document and query marker tokens, ``<|embed_token|>`` and
``<|rerank_token|>`` in Qwen3's vocabulary: its pooler embeds the tokens with these ids, the
documents' first and the query's last, as vLLM's ``JinaForRankingPool`` fixes them."""


@functools.lru_cache(maxsize=64)
def vector_width(model: ModelInfo, task: PoolingTask) -> int:
    """How many values one vector of ``task`` holds (one row, for a token task): the number of
    classes for a classifier's tasks; a late-interaction model's projection width (its
    ``colbert_dim``, ``dim`` or ``projection_dim``, as vLLM reads it), ``RANKER_WIDTH`` for a
    listwise ranker; else the hidden size.
    Read once per model and task."""
    if task in CLASSIFY_TASKS:
        return len(class_labels(model) or ())
    if listwise_ranker(model):
        return RANKER_WIDTH
    if late_interaction(model):
        config = read_model_json(str(model.path), model.path / "config.json", required=False) or {}
        for key in _COLBERT_DIM_KEYS:
            value = config.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return hidden_size(model)


def late_interaction(model: ModelInfo) -> bool:
    """Whether the model is a late-interaction (ColBERT) model: one of its ``architectures`` is
    in ``LATE_INTERACTION_ARCHITECTURES``."""
    return not _architectures(model).isdisjoint(LATE_INTERACTION_ARCHITECTURES)


def listwise_ranker(model: ModelInfo) -> bool:
    """Whether the model is a listwise ranker: one of its ``architectures`` is in
    ``LISTWISE_ARCHITECTURES``."""
    return not _architectures(model).isdisjoint(LISTWISE_ARCHITECTURES)


@functools.lru_cache(maxsize=64)
def _architectures(model: ModelInfo) -> frozenset[str]:
    """The ``architectures`` config.json names (none when it names none); read once per model."""
    config = read_model_json(str(model.path), model.path / "config.json", required=False) or {}
    architectures = config.get("architectures")
    return (
        frozenset(a for a in architectures if isinstance(a, str))
        if isinstance(architectures, list)
        else frozenset()
    )


def per_token_task(model: ModelInfo) -> PoolingTask | None:
    """The token task a model pools with alone: ``token_embed`` for a late-interaction model or a
    listwise ranker, ``token_classify`` for a token classifier; None for one that answers one
    vector per input."""
    if late_interaction(model) or listwise_ranker(model):
        return "token_embed"
    return "token_classify" if token_classifier(model) else None
