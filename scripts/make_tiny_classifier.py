#!/usr/bin/env python3
"""Write `dyn-tiny-classifier`: a random-weight Llama sequence classifier (three classes) small
enough for vLLM on a CPU, for tests of `/classify`.

Usage: python scripts/make_tiny_classifier.py OUT_DIR

Needs torch and transformers (the venv of scripts/provision_vllm_cpu.sh has them). The model is
transformers' `LlamaForSequenceClassification` over dyn-tiny-llama's Llama (scripts/make_tiny_llama.py)
with `id2label` naming its classes negative, neutral and positive; vLLM serves it with
`--runner pooling` and its `classify` task. The weights are random (seeded): the probabilities are
noise, but they come from vLLM's classification pooler.
"""

from __future__ import annotations

import sys
from pathlib import Path

NAME = "dyn-tiny-classifier"
SEED = 0
LABELS = ("negative", "neutral", "positive")


def generate(out_dir: str | Path) -> Path:
    """Write the model directory into ``out_dir`` (created if needed) and return its path."""
    from make_tiny_llama import (
        llama_config,
        save_random_model,
        tiny_tokenizer,
    )  # this script's directory is on sys.path
    from transformers import LlamaForSequenceClassification

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(str(out))
    config = llama_config(tokenizer)
    config.num_labels = len(LABELS)
    config.id2label = dict(enumerate(LABELS))
    config.label2id = {label: i for i, label in enumerate(LABELS)}
    return save_random_model(LlamaForSequenceClassification, config, out, SEED)


if __name__ == "__main__":
    from make_tiny_llama import one_directory_main  # this script's directory is on sys.path

    sys.exit(one_directory_main(sys.argv[1:], generate, NAME, __doc__))
