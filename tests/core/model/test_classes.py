"""``class_labels``: a sequence classifier's class names from its config.json."""

from __future__ import annotations

import json

from dyn.core.model import load_model_info
from dyn.core.model.classes import class_labels
from tests.classifier_model import LABELS, make_classifier_model


def test_a_classifiers_id2label_in_index_order_and_other_models_none(tmp_path):
    d = make_classifier_model(tmp_path / "cls")
    assert class_labels(load_model_info(d)) == LABELS
    config = json.loads((d / "config.json").read_text())
    config["id2label"] = {"1": "b", "0": "a", "x": "bad"}
    config["num_labels"] = 3
    (d / "config.json").write_text(json.dumps(config))
    assert class_labels(load_model_info(d)) == ["a", "b", None]
    del config["id2label"], config["num_labels"]
    (d / "config.json").write_text(json.dumps(config))
    assert class_labels(load_model_info(d)) == [None, None]  # transformers' default head
    assert class_labels(load_model_info(None, None)) is None  # a causal LM
