"""A classification model's classes, read from its ``config.json`` as transformers' sequence
classification heads state them: ``id2label`` (index -> name) or else ``num_labels``.

A model is a classifier when one of its ``architectures`` ends in ``ForSequenceClassification``
or ``ForTokenClassification``, or is one vLLM registers as a sequence classifier under another
name (``NAMED_CLASSIFIERS``) (its class names, else ``None`` for a class without one; a token
classifier, ``token_classifier``, classifies each token only); ``class_labels`` returns None for
any other model. A classifier with one class is a cross-encoder: it scores a (query, document) pair,
written by the model's own score template where it has one (``own_score_template``), else as the
tokenizer writes a pair of texts unless its config says ``use_sep_token: false``
(``pair_with_separator``), as vLLM's cross-encoder scoring reads it.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from dyn.core.model.info import ModelInfo, read_model_json

_CLASSIFIERS = ("ForSequenceClassification", "ForTokenClassification")
NAMED_CLASSIFIERS = frozenset(("JinaVLForRanking",))
"""Sequence classifiers vLLM 0.32 registers under a name without the suffix."""
MAX_CLASSES = 1 << 16
"""More classes than this is a broken config (and would be a large vector per input)."""


def class_labels(info: ModelInfo) -> list[str | None] | None:
    """The name of each class by index (None where the config names none), or None when the
    model is not a sequence classifier."""
    config = read_model_json(str(info.path), info.path / "config.json", required=False) or {}
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or not any(
        isinstance(a, str) and (a.endswith(_CLASSIFIERS) or a in NAMED_CLASSIFIERS) for a in architectures
    ):
        return None
    id2label = config.get("id2label")
    names: dict[int, str] = {}
    if isinstance(id2label, dict):
        for key, value in id2label.items():
            if isinstance(key, str) and key.isascii() and key.isdigit() and isinstance(value, str):
                names[int(key)] = value
    count = config.get("num_labels")
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        count = max(names, default=-1) + 1 or 2  # transformers' default head has 2 classes
    count = min(count, MAX_CLASSES)
    return [names.get(i) for i in range(count)]


@functools.lru_cache(maxsize=64)
def token_classifier(info: ModelInfo) -> bool:
    """Whether the model classifies each token (an ``architectures`` entry ending in
    ``ForTokenClassification``: vLLM pools it with ``token_classify`` only)."""
    config = read_model_json(str(info.path), info.path / "config.json", required=False) or {}
    architectures = config.get("architectures")
    return isinstance(architectures, list) and any(
        isinstance(a, str) and a.endswith("ForTokenClassification") for a in architectures
    )


@functools.lru_cache(maxsize=64)
def pair_with_separator(info: ModelInfo) -> bool:
    """Whether a cross-encoder's (query, document) input is the tokenizer's pair encoding (its
    separator tokens between them: ``use_sep_token``, default true, or the deprecated
    ``use_pad_token``), rather than the two texts joined (an LLM used as a reranker)."""
    config = read_model_json(str(info.path), info.path / "config.json", required=False) or {}
    for key in ("use_pad_token", "use_sep_token"):
        if isinstance(value := config.get(key), bool):
            return value
    return True


class ScoreTemplate(NamedTuple):
    """A cross-encoder's own way of writing a (query, document) pair, as vLLM's model class
    states it: ``text`` with ``{query}`` and ``{document}`` filled in (its ``get_score_template``),
    tokenized with special tokens, then ``suffix`` appended (its ``post_process_tokens``, which
    vLLM applies to every pair the model scores, templated or not)."""

    text: str
    suffix: tuple[int, ...]


SCORE_TEMPLATES = {
    "JinaVLForRanking": ScoreTemplate("**Document**:\n{document}\n**Query**:\n{query}", (100,)),
}
"""jina-reranker-m0's: its document before its query, and its score token (id 100) last."""


@functools.lru_cache(maxsize=64)
def own_score_template(info: ModelInfo) -> ScoreTemplate | None:
    """The model's own score template (``SCORE_TEMPLATES``, by its ``architectures``), or None."""
    config = read_model_json(str(info.path), info.path / "config.json", required=False) or {}
    architectures = config.get("architectures")
    if not isinstance(architectures, list):
        return None
    return next(
        (SCORE_TEMPLATES[a] for a in architectures if isinstance(a, str) and a in SCORE_TEMPLATES), None
    )
