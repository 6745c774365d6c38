"""A classification model directory for the tests that need one without weights (the frontend
and the mocker read only its JSON files): dyn-tiny with a ``LlamaForSequenceClassification``
``config.json`` naming three classes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dyn.core.model import TINY_MODEL_DIR

LABELS = ["negative", "neutral", "positive"]


def make_classifier_model(directory: Path) -> Path:
    """Write the model into ``directory`` and return it."""
    shutil.copytree(TINY_MODEL_DIR, directory)
    config = json.loads((directory / "config.json").read_text())
    config["architectures"] = ["LlamaForSequenceClassification"]
    config["id2label"] = {str(i): name for i, name in enumerate(LABELS)}
    config["label2id"] = {name: i for i, name in enumerate(LABELS)}
    (directory / "config.json").write_text(json.dumps(config))
    return directory
