"""Pooling model directories for the tests that need one without weights (the frontend and the
mocker read only its JSON files): dyn-tiny with a ``LlamaForSequenceClassification``
``config.json`` naming three classes, or one (a cross-encoder: ``make_cross_encoder``), or an
``HF_ColBERT`` one (a late-interaction model: ``make_colbert``), or a ``JinaForRanking`` one (a
listwise ranker: ``make_listwise_ranker``)."""

from __future__ import annotations

import importlib.util
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


def make_jina_vl_reranker(directory: Path) -> Path:
    """jina-reranker-m0's architecture (``JinaVLForRanking``, one class, its own score template)
    over dyn-tiny's tokenizer, for its text path."""
    return make_classifier_model(directory, ["LABEL_0"], num_labels=1, architectures=["JinaVLForRanking"])


def make_colbert(directory: Path, dim: int = 16) -> Path:
    """A late-interaction (ColBERT) model, its token embeddings ``dim`` wide (``colbert_dim``)."""
    shutil.copytree(TINY_MODEL_DIR, directory)
    config = json.loads((directory / "config.json").read_text())
    config["architectures"] = ["HF_ColBERT"]
    config["colbert_dim"] = dim
    (directory / "config.json").write_text(json.dumps(config))
    return directory


RANKER_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "make_tiny_jina_ranker.py"


def make_listwise_ranker(directory: Path) -> Path:
    """A listwise ranker (jina-reranker-v3's architecture) with the tokenizer of
    ``scripts/make_tiny_jina_ranker.py``: dyn-tiny's with the document and query markers at the
    ids the model's pooler embeds."""
    spec = importlib.util.spec_from_file_location("make_tiny_jina_ranker", RANKER_SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    shutil.copytree(TINY_MODEL_DIR, directory)
    script.write_ranking_tokenizer(directory)
    config = json.loads((directory / "config.json").read_text())
    config.update(architectures=["JinaForRanking"], embedding_size=8, vocab_size=script.VOCAB_SIZE)
    (directory / "config.json").write_text(json.dumps(config))
    return directory
