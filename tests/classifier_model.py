"""Pooling model directories for the tests that need one without weights (the frontend and the
mocker read only its JSON files): dyn-tiny with a ``LlamaForSequenceClassification``
``config.json`` naming three classes, or one (a cross-encoder: ``make_cross_encoder``), or an
``HF_ColBERT`` one (a late-interaction model: ``make_colbert``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dyn.core.model import TINY_MODEL_DIR

LABELS = ["negative", "neutral", "positive"]


def make_classifier_model(directory: Path, labels: list[str] = LABELS, **config_fields) -> Path:
    """Write the model (its classes ``labels``, ``config_fields`` added to its config) into
    ``directory`` and return it."""
    shutil.copytree(TINY_MODEL_DIR, directory)
    config = json.loads((directory / "config.json").read_text())
    config["architectures"] = ["LlamaForSequenceClassification"]
    config["id2label"] = {str(i): name for i, name in enumerate(labels)}
    config["label2id"] = {name: i for i, name in enumerate(labels)}
    config.update(config_fields)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def make_cross_encoder(directory: Path, **config_fields) -> Path:
    """A one-class classifier: vLLM scores pairs with it (a cross-encoder, a reranker)."""
    return make_classifier_model(directory, ["LABEL_0"], num_labels=1, **config_fields)


def make_colbert(directory: Path, dim: int = 16) -> Path:
    """A late-interaction (ColBERT) model, its token embeddings ``dim`` wide (``colbert_dim``)."""
    shutil.copytree(TINY_MODEL_DIR, directory)
    config = json.loads((directory / "config.json").read_text())
    config["architectures"] = ["HF_ColBERT"]
    config["colbert_dim"] = dim
    (directory / "config.json").write_text(json.dumps(config))
    return directory
