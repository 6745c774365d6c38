"""``/score``, ``/rerank`` (each path vLLM serves them at) and ``/pooling`` in-process over fake
workers that embed.

Shapes: vLLM 0.32's ``vllm/entrypoints/pooling/scoring/protocol.py`` (score: ``queries`` with
``documents`` or ``items``, ``data_1``/``data_2``, ``text_1``/``text_2``; rerank: ``query``,
``documents``, ``top_n``; responses ``ScoreResponse`` and ``RerankResponse``), its
``scoring/utils.py`` (the 1:1, 1:N, N:N rule and its messages) and ``scoring/io_processor.py``
(a bi-encoder's score is the cosine similarity of the two embeddings; ``max_tokens_per_*`` must be
below max_model_len), and ``pooling/pooling/protocol.py`` for ``/pooling``. The fake workers answer
``fake_vector(ids)`` per input, so every expected score is computed from the token ids.
"""

from __future__ import annotations

import base64
import math
import struct

import pytest

from dyn.core.engine import FEATURE_CLASSIFY, FEATURE_EMBED
from dyn.core.frontend.limits import RequestLimits
from dyn.core.frontend.listwise import ranking_prompt
from dyn.core.frontend.tokenizer import Tokenizer
from tests.classifier_model import (
    LABELS,
    make_classifier_model,
    make_colbert,
    make_cross_encoder,
    make_jina_vl_reranker,
    make_listwise_ranker,
)
from tests.core.frontend.fake_workers import fake_probs, fake_vector, row_ends

pytestmark = pytest.mark.anyio

EMBED = [FEATURE_EMBED]
CLASSIFY = [FEATURE_EMBED, FEATURE_CLASSIFY]


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def score_of(tokenizer, query: str, document: str) -> float:
    return cosine(fake_vector(tokenizer.encode(query)), fake_vector(tokenizer.encode(document)))


DOCS = ["The capital of France is Paris.", "Bananas are yellow.", "Paris is in France."]
QUERY = "Where is Paris?"


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
async def test_rerank_orders_the_documents_by_cosine_similarity(make_frontend, tokenizer, path):
    async with make_frontend(workers=1, features={1: EMBED}) as fe:
        r = await fe.client.post(path, json={"model": "dyn-tiny", "query": QUERY, "documents": DOCS})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["id"].startswith("score-") and body["model"] == "dyn-tiny"
        expected = sorted(
            ((i, score_of(tokenizer, QUERY, d)) for i, d in enumerate(DOCS)), key=lambda x: -x[1]
        )
        assert [x["index"] for x in body["results"]] == [i for i, _ in expected]
        assert [x["relevance_score"] for x in body["results"]] == pytest.approx([s for _, s in expected])
        assert [x["document"] for x in body["results"]] == [
            {"text": DOCS[i], "multi_modal": None} for i, _ in expected
        ]
        ids = [tokenizer.encode(t) for t in [QUERY, *DOCS]]
        assert fe.fleet[1].embeds[-1].prompts == ids  # one request, the query once
        tokens = sum(len(i) for i in ids)
        assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}

        r = await fe.client.post(path, json={"query": QUERY, "documents": DOCS, "top_n": 2})
        assert [x["index"] for x in r.json()["results"]] == [i for i, _ in expected[:2]]
        r = await fe.client.post(path, json={"query": QUERY, "documents": DOCS[0]})
        assert [x["index"] for x in r.json()["results"]] == [0]


@pytest.mark.parametrize(
    "names", [("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2")]
)
@pytest.mark.parametrize("path", ["/score", "/v1/score"])
async def test_score_pairs_one_query_with_each_document_or_n_with_n(make_frontend, tokenizer, names, path):
    first, second = names
    async with make_frontend(workers=1, features={1: EMBED}) as fe:
        r = await fe.client.post(path, json={first: QUERY, second: DOCS})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "list" and body["id"].startswith("score-")
        assert [d["object"] for d in body["data"]] == ["score"] * 3
        assert [d["index"] for d in body["data"]] == [0, 1, 2]
        assert [d["score"] for d in body["data"]] == pytest.approx(
            [score_of(tokenizer, QUERY, d) for d in DOCS]
        )
        queries = ["Where is Paris?", "What colour are bananas?", "Is Paris French?"]
        r = await fe.client.post(path, json={first: queries, second: DOCS})
        assert [d["score"] for d in r.json()["data"]] == pytest.approx(
            [score_of(tokenizer, q, d) for q, d in zip(queries, DOCS, strict=True)]
        )
        assert r.json()["usage"]["completion_tokens"] == 0


async def test_max_tokens_per_doc_and_query_keep_each_texts_first_tokens(make_frontend, tokenizer):
    async with make_frontend(workers=1, features={1: EMBED}) as fe:
        doc = "one two three four five six seven eight"
        r = await fe.client.post(
            "/score",
            json={"queries": QUERY, "documents": [doc], "max_tokens_per_doc": 3, "max_tokens_per_query": 2},
        )
        assert r.status_code == 200, r.text
        first_three = tokenizer.decode(tokenizer.encode(doc, add_special_tokens=False)[:3], False)
        first_two = tokenizer.decode(tokenizer.encode(QUERY, add_special_tokens=False)[:2], False)
        assert fe.fleet[1].embeds[-1].prompts == [tokenizer.encode(first_two), tokenizer.encode(first_three)]
        r = await fe.client.post(
            "/rerank", json={"query": QUERY, "documents": [doc], "truncate_prompt_tokens": 2}
        )
        assert [len(p) for p in fe.fleet[1].embeds[-1].prompts] == [2, 2]


@pytest.mark.parametrize(
    "path,body,param,words",
    [
        ("/score", {"queries": ["a", "b"], "documents": ["x", "y", "z"]}, "documents", "1:1, 1:N or N:N"),
        ("/score", {"queries": "a"}, "queries", "none was"),
        ("/score", {"queries": "a", "documents": ["x"], "items": ["y"]}, "queries", "more than one"),
        ("/score", {"queries": [], "documents": ["x"]}, "queries", "At least one text element"),
        ("/score", {"queries": "a", "documents": []}, "documents", "At least one text_pair"),
        (
            "/score",
            {"queries": "a", "documents": [{"content": [{"type": "image_url"}]}]},
            "documents[0]",
            "scores text only",
        ),
        ("/score", {"text_1": 5, "text_2": "x"}, "text_1", "a int"),
        ("/score", {"queries": "a", "documents": "x", "max_tokens_per_doc": -1}, "max_tokens_per_doc", ""),
        ("/rerank", {"query": ["a", "b"], "documents": ["x"]}, "query", "one query per request"),
        ("/rerank", {"documents": ["x"]}, "query", "send 'query'"),
        ("/rerank", {"query": "a", "documents": ["x"], "top_n": -1}, "top_n", ""),
        (
            "/rerank",
            {"query": "a", "documents": ["x"], "max_tokens_per_query": 10**6},
            "max_tokens_per_query",
            "less than max_model_len",
        ),
        ("/pooling", {"input": "x", "task": "embedding"}, "task", "not a pooling task"),
    ],
)
async def test_bad_requests_are_400s_that_name_the_field(make_frontend, path, body, param, words):
    async with make_frontend(workers=1, features={1: EMBED}) as fe:
        r = await fe.client.post(path, json=body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param, error
        assert words in error["message"]
        assert fe.fleet[1].embeds == []


async def test_inputs_are_bounded_by_count_and_bytes(make_frontend):
    limits = RequestLimits(max_prompts=4, max_prompt_bytes=64)
    async with make_frontend(workers=1, features={1: EMBED}, limits=limits) as fe:
        r = await fe.client.post("/rerank", json={"query": "q", "documents": ["d"] * 4})
        assert r.status_code == 400 and "--max-prompts" in r.json()["error"]["message"]
        r = await fe.client.post("/score", json={"queries": "q", "documents": ["x" * 40, "y" * 40]})
        assert r.status_code == 400 and "--max-prompt-bytes" in r.json()["error"]["message"]
        assert fe.fleet[1].embeds == []


async def test_generating_workers_answer_404_naming_the_api(make_frontend):
    async with make_frontend(workers=1) as fe:
        r = await fe.client.post("/rerank", json={"query": "q", "documents": ["d"]})
        assert r.status_code == 404 and "does not support the Rerank API" in r.json()["error"]["message"]
        r = await fe.client.post("/score", json={"queries": "q", "documents": ["d"]})
        assert r.status_code == 404 and "does not support the Score API" in r.json()["error"]["message"]
        r = await fe.client.post("/pooling", json={"input": "x"})
        assert r.status_code == 404 and "does not support the Pooling API" in r.json()["error"]["message"]


async def test_pooling_answers_the_embed_task_as_pooling_objects(make_frontend, tokenizer):
    async with make_frontend(workers=1, features={1: EMBED}) as fe:
        for task in ({}, {"task": "embed"}):
            r = await fe.client.post("/pooling", json={"input": ["a b", "c"], **task})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["id"].startswith("pool-") and body["object"] == "list"
            ids = [tokenizer.encode(t) for t in ("a b", "c")]
            assert body["data"] == [
                {"index": i, "data": fake_vector(x), "object": "pooling"} for i, x in enumerate(ids)
            ]
            assert body["usage"]["prompt_tokens"] == sum(len(x) for x in ids)
        r = await fe.client.post("/pooling", json={"input": [3, 4], "encoding_format": "base64"})
        raw = base64.b64decode(r.json()["data"][0]["data"])
        assert list(struct.unpack("<4f", raw)) == fake_vector([3, 4])


def prefix_rows(pool, ids: list[int]) -> list[list[float]]:
    return [pool(ids[:end]) for end in range(1, len(ids) + 1)]


async def test_pooling_token_tasks_answer_a_row_per_token(make_frontend, tokenizer, tmp_path):
    """vLLM's ``token_embed`` and ``token_classify``: each input's rows, one per token, as lists
    in ``float`` format and all the values in one base64 string; a classifier's own task is
    ``classify``; a task the model does not pool with is a 404, an unknown or removed name a 400
    that names the four."""
    async with make_frontend(workers=1, features={1: EMBED}) as fe:
        r = await fe.client.post("/pooling", json={"input": ["a b", "c"], "task": "token_embed"})
        assert r.status_code == 200, r.text
        ids = [tokenizer.encode(t) for t in ("a b", "c")]
        assert [d["data"] for d in r.json()["data"]] == [prefix_rows(fake_vector, x) for x in ids]
        assert r.json()["usage"]["prompt_tokens"] == sum(len(x) for x in ids)
        assert fe.fleet[1].embeds[-1].task == "token_embed"
        r = await fe.client.post(
            "/pooling", json={"input": [3, 4], "task": "token_embed", "encoding_format": "base64"}
        )
        raw = base64.b64decode(r.json()["data"][0]["data"])
        assert list(struct.unpack("<8f", raw)) == fake_vector([3]) + fake_vector([3, 4])
        r = await fe.client.post("/pooling", json={"input": "x", "task": "token_classify"})
        assert r.status_code == 404 and "not a classification model" in r.json()["error"]["message"]
        for task, words in (
            ("encode", "use token_embed or token_classify"),
            ("score", "use classify"),
            ("x", ""),
        ):
            r = await fe.client.post("/pooling", json={"input": "x", "task": task})
            error = r.json()["error"]
            assert r.status_code == 400 and error["param"] == "task", r.text
            assert (
                words in error["message"]
                and "embed, classify, token_embed, token_classify" in error["message"]
            )
    model = str(make_classifier_model(tmp_path / "cls"))
    async with make_frontend(workers=1, features={1: CLASSIFY}, model_path=model) as fe:
        r = await fe.client.post("/pooling", json={"input": [7, 1, 2]})
        assert (
            r.json()["data"][0]["data"] == fake_probs([7, 1, 2]) and fe.fleet[1].embeds[-1].task == "classify"
        )
        r = await fe.client.post("/pooling", json={"input": [7, 1, 2], "task": "token_classify"})
        assert r.json()["data"][0]["data"] == prefix_rows(fake_probs, [7, 1, 2])


async def test_pooling_token_rows_are_bounded_by_the_response_size(make_frontend):
    """dyn-tiny embeds in 256 values a token: 100 tokens' rows are at least 128,000 bytes."""
    limits = RequestLimits(max_response_bytes=100_000)
    async with make_frontend(workers=1, features={1: EMBED}, limits=limits) as fe:
        r = await fe.client.post("/pooling", json={"input": [5] * 100, "task": "token_embed"})
        error = r.json()["error"]
        assert (
            r.status_code == 400 and "--max-response-bytes" in error["message"] and error["param"] == "input"
        )
        assert fe.fleet[1].embeds == []
        r = await fe.client.post("/pooling", json={"input": [5] * 100})  # one vector: not bounded so
        assert r.status_code == 200, r.text
        r = await fe.client.post("/pooling", json={"input": [5] * 50, "task": "token_embed"})
        assert r.status_code == 200 and len(r.json()["data"][0]["data"]) == 50


async def test_classify_answers_probabilities_and_the_likeliest_label(make_frontend, tokenizer, tmp_path):
    """vLLM's ``/classify``: per input its class probabilities, ``num_classes`` and the name of
    the likeliest class from the model's ``id2label``; only workers that classify are asked, and
    ``/pooling`` with ``task: classify`` gives the same probabilities."""
    model = str(make_classifier_model(tmp_path / "cls"))
    features = {1: EMBED, 2: [*EMBED, FEATURE_CLASSIFY]}
    async with make_frontend(workers=2, features=features, model_path=model) as fe:
        r = await fe.client.post("/classify", json={"input": [[7, 1, 2], [1, 2, 9]]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["id"].startswith("classify-") and body["object"] == "list"
        assert [d["probs"] for d in body["data"]] == [fake_probs([7, 1, 2]), fake_probs([1, 2, 9])]
        assert [d["label"] for d in body["data"]] == [LABELS[1], LABELS[2]]
        assert {d["num_classes"] for d in body["data"]} == {3} and body["usage"]["prompt_tokens"] == 6
        assert fe.fleet[1].embeds == [] and fe.fleet[2].embeds[-1].task == "classify"
        r = await fe.client.post("/pooling", json={"input": [7, 1, 2], "task": "classify"})
        assert r.json()["data"][0]["data"] == fake_probs([7, 1, 2])
        text = await fe.client.post("/classify", json={"input": "a fine day"})
        assert text.status_code == 200 and len(text.json()["data"]) == 1
    async with make_frontend(workers=1, features={1: EMBED}) as fe:
        r = await fe.client.post("/classify", json={"input": "x"})
        assert r.status_code == 404 and "not a classification model" in r.json()["error"]["message"]


async def test_a_one_class_classifier_scores_each_pair_as_a_cross_encoder(make_frontend, tokenizer, tmp_path):
    """vLLM's cross-encoder scoring: each (query, document) is one input, the tokenizer's pair
    encoding, classified; its score is the one class's probability."""
    model = str(make_cross_encoder(tmp_path / "reranker"))
    async with make_frontend(workers=1, features={1: CLASSIFY}, model_path=model) as fe:
        r = await fe.client.post("/rerank", json={"query": QUERY, "documents": DOCS})
        assert r.status_code == 200, r.text
        pairs = [tokenizer.encode_pair(QUERY, d) for d in DOCS]
        (asked,) = fe.fleet[1].embeds
        assert asked.task == "classify" and asked.prompts == pairs
        expected = sorted(((i, fake_probs(ids)[0]) for i, ids in enumerate(pairs)), key=lambda x: -x[1])
        body = r.json()
        assert [x["index"] for x in body["results"]] == [i for i, _ in expected]
        assert [x["relevance_score"] for x in body["results"]] == pytest.approx([p for _, p in expected])
        assert body["usage"]["prompt_tokens"] == sum(len(ids) for ids in pairs)
        r = await fe.client.post("/score", json={"queries": [QUERY, "Bananas?"], "documents": DOCS[:2]})
        assert r.status_code == 200, r.text
        ids = [tokenizer.encode_pair(QUERY, DOCS[0]), tokenizer.encode_pair("Bananas?", DOCS[1])]
        assert [d["score"] for d in r.json()["data"]] == pytest.approx([fake_probs(i)[0] for i in ids])
        r = await fe.client.post(
            "/score", json={"queries": QUERY, "documents": DOCS[:1], "use_activation": False}
        )
        assert r.status_code == 200 and fe.fleet[1].embeds[-1].activation is False


async def test_a_model_with_its_own_score_template_writes_each_pair_with_it(
    make_frontend, tokenizer, tmp_path
):
    """jina-reranker-m0 (``JinaVLForRanking``) as vLLM 0.32 scores text with it: a one-class
    classifier whose pair is its own template (the document, then the query) tokenized with
    special tokens, its score token (id 100) appended after ``truncate_prompt_tokens``; a served
    ``--chat-template`` renders the pair instead, the score token still last."""
    model = str(make_jina_vl_reranker(tmp_path / "m0"))
    async with make_frontend(workers=1, features={1: CLASSIFY}, model_path=model) as fe:
        r = await fe.client.post("/rerank", json={"query": QUERY, "documents": DOCS[:2]})
        assert r.status_code == 200, r.text
        texts = [f"**Document**:\n{d}\n**Query**:\n{QUERY}" for d in DOCS[:2]]
        prompts = [tokenizer.encode(t) + [100] for t in texts]
        assert fe.fleet[1].embeds[-1].task == "classify" and fe.fleet[1].embeds[-1].prompts == prompts
        scores = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        assert [scores[0], scores[1]] == pytest.approx([fake_probs(p)[0] for p in prompts])
        body = {
            "queries": QUERY,
            "documents": DOCS[:1],
            "truncate_prompt_tokens": 5,
            "truncation_side": "right",
        }
        r = await fe.client.post("/score", json=body)
        assert r.status_code == 200 and fe.fleet[1].embeds[-1].prompts == [prompts[0][:5] + [100]], r.text
        r = await fe.client.post("/classify", json={"input": [[3, 4]]})
        assert r.status_code == 200 and fe.fleet[1].embeds[-1].prompts == [[3, 4]]
    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }} {% endfor %}"
    async with make_frontend(
        workers=1, features={1: CLASSIFY}, model_path=model, chat_template=template
    ) as fe:
        r = await fe.client.post("/score", json={"queries": "q", "documents": ["d"]})
        assert r.status_code == 200, r.text
        assert fe.fleet[1].embeds[-1].prompts == [tokenizer.encode("[query] q [document] d ") + [100]]


async def test_a_cross_encoder_without_a_separator_scores_the_texts_joined(
    make_frontend, tokenizer, tmp_path
):
    """``use_sep_token: false`` (an LLM used as a reranker): the query and document as one text."""
    model = str(make_cross_encoder(tmp_path / "reranker", use_sep_token=False))
    async with make_frontend(workers=1, features={1: CLASSIFY}, model_path=model) as fe:
        r = await fe.client.post("/score", json={"queries": QUERY, "documents": DOCS[0]})
        assert r.status_code == 200, r.text
        assert fe.fleet[1].embeds[-1].prompts == [tokenizer.encode(QUERY + DOCS[0])]


SCORE_TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    "{% if instruction is defined %}[{{ instruction }}]{% endif %}"
    "{% if fail is defined %}{{ raise_exception('no good') }}{% endif %}"
)


async def test_a_served_chat_template_renders_each_pair_as_vllm_scores_with_it(
    make_frontend, tokenizer, tmp_path
):
    """vLLM's score template: with ``--chat-template`` a cross-encoder's pair is the template's
    rendering of a ``query`` and a ``document`` message, the request's ``instruction`` (unless its
    ``chat_template_kwargs`` set one) among the variables, tokenized with special tokens."""
    model = str(make_cross_encoder(tmp_path / "reranker"))
    served = {"features": {1: CLASSIFY}, "model_path": model}
    async with make_frontend(workers=1, chat_template=SCORE_TEMPLATE, **served) as fe:
        r = await fe.client.post(
            "/rerank", json={"query": QUERY, "documents": DOCS[:2], "instruction": "Strict"}
        )
        assert r.status_code == 200, r.text
        expected = [
            tokenizer.encode(f"<query>{QUERY}</query><document>{d}</document>[Strict]") for d in DOCS[:2]
        ]
        assert fe.fleet[1].embeds[-1].prompts == expected
        body = {
            "queries": QUERY,
            "documents": DOCS[0],
            "instruction": "a",
            "chat_template_kwargs": {"instruction": "b"},
        }
        r = await fe.client.post("/score", json=body)
        assert r.status_code == 200, r.text
        assert fe.fleet[1].embeds[-1].prompts == [
            tokenizer.encode(f"<query>{QUERY}</query><document>{DOCS[0]}</document>[b]")
        ]
        for kwargs, words in (({"tools": []}, "tools"), ({"fail": 1}, "no good")):
            r = await fe.client.post(
                "/score", json={"queries": "q", "documents": "d", "chat_template_kwargs": kwargs}
            )
            error = r.json()["error"]
            assert (
                r.status_code == 400
                and error["param"] == "chat_template_kwargs"
                and words in error["message"]
            )
    async with make_frontend(workers=1, **served) as fe:  # no template given: the pair encoding
        r = await fe.client.post("/score", json={"queries": QUERY, "documents": DOCS[0], "instruction": "x"})
        assert r.status_code == 200 and fe.fleet[1].embeds[-1].prompts == [
            tokenizer.encode_pair(QUERY, DOCS[0])
        ]


async def test_score_template_renderings_are_bounded_in_time_and_size(make_frontend, tmp_path, monkeypatch):
    """All of one request's renderings share ``--max-render-seconds``; the rendered text in all
    is bounded by what one request may pool."""
    from dyn.core.frontend import score_template

    model = str(make_cross_encoder(tmp_path / "reranker"))
    slow = "{% for i in range(90000) %}{% endfor %}{{ messages[0].content }}"
    limits = RequestLimits(max_render_seconds=0.05)
    async with make_frontend(
        workers=1, features={1: CLASSIFY}, model_path=model, chat_template=slow, limits=limits
    ) as fe:
        r = await fe.client.post("/rerank", json={"query": "q", "documents": ["d"] * 50})
        assert r.status_code == 400 and "--max-render-seconds" in r.json()["error"]["message"], r.text
        monkeypatch.setattr(score_template, "MAX_RENDERED_CHARS", 20)
    async with make_frontend(
        workers=1, features={1: CLASSIFY}, model_path=model, chat_template=SCORE_TEMPLATE
    ) as fe:
        r = await fe.client.post("/rerank", json={"query": "q", "documents": ["d", "e"]})
        assert r.status_code == 400 and "split the request" in r.json()["error"]["message"], r.text
        assert fe.fleet[1].embeds == []


def maxsim_of(query_rows: list[list[float]], document_rows: list[list[float]]) -> float:
    return sum(max(sum(a * b for a, b in zip(q, d, strict=True)) for d in document_rows) for q in query_rows)


async def test_a_late_interaction_model_scores_by_maxsim_over_token_embeddings(
    make_frontend, tokenizer, tmp_path
):
    """vLLM's late-interaction scoring on a ColBERT model: queries and documents pooled with the
    ``token_embed`` task, each pair scored by MaxSim over their rows; ``/pooling`` defaults to
    ``token_embed`` there, and one vector per input (``/v1/embeddings``, the ``embed`` task) is
    refused."""
    model = str(make_colbert(tmp_path / "colbert"))
    async with make_frontend(workers=1, features={1: EMBED}, model_path=model) as fe:
        r = await fe.client.post("/rerank", json={"query": QUERY, "documents": DOCS})
        assert r.status_code == 200, r.text
        (asked,) = fe.fleet[1].embeds
        query, *docs = [tokenizer.encode(t) for t in (QUERY, *DOCS)]
        assert asked.task == "token_embed" and asked.prompts == [query, *docs]
        scores = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        q_rows = prefix_rows(fake_vector, query)
        expected = [maxsim_of(q_rows, prefix_rows(fake_vector, d)) for d in docs]
        assert [scores[i] for i in range(3)] == pytest.approx(expected, rel=1e-5)
        r = await fe.client.post("/pooling", json={"input": [3, 4]})
        assert r.json()["data"][0]["data"] == prefix_rows(fake_vector, [3, 4])
        r = await fe.client.post("/pooling", json={"input": [3, 4], "task": "embed"})
        assert r.status_code == 400 and "pools per token only" in r.json()["error"]["message"]
        r = await fe.client.post("/v1/embeddings", json={"input": "x"})
        error = r.json()["error"]
        assert (
            r.status_code == 404
            and "late-interaction" in error["message"]
            and "token_embed" in error["message"]
        )


async def test_a_token_classifier_pools_per_token_only(make_frontend, tmp_path):
    """A ``*ForTokenClassification`` model (vLLM's default task for it: ``token_classify``):
    ``/pooling`` answers each token's probabilities; ``/classify`` is a 404 and scoring a 400,
    both saying what to send."""
    model = str(make_classifier_model(tmp_path / "ner", architectures=["BertForTokenClassification"]))
    async with make_frontend(workers=1, features={1: CLASSIFY}, model_path=model) as fe:
        r = await fe.client.post("/pooling", json={"input": [7, 1, 2]})
        assert r.json()["data"][0]["data"] == prefix_rows(fake_probs, [7, 1, 2])
        assert fe.fleet[1].embeds[-1].task == "token_classify"
        r = await fe.client.post("/classify", json={"input": "x"})
        error = r.json()["error"]
        assert (
            r.status_code == 404
            and "token classification" in error["message"]
            and "token_classify" in error["message"]
        )
        r = await fe.client.post("/pooling", json={"input": "x", "task": "classify"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "task"
        r = await fe.client.post("/rerank", json={"query": "q", "documents": ["d"]})
        assert r.status_code == 400 and "token_classify" in r.json()["error"]["message"]
        assert len(fe.fleet[1].embeds) == 1


async def test_maxsim_work_is_bounded_before_any_worker_is_asked(make_frontend, tmp_path, monkeypatch):
    from dyn.core.frontend.endpoints import scoring

    monkeypatch.setattr(scoring, "MAX_MAXSIM_WORK", 1000)
    model = str(make_colbert(tmp_path / "colbert"))
    async with make_frontend(workers=1, features={1: EMBED}, model_path=model) as fe:
        r = await fe.client.post("/score", json={"queries": "a b c d", "documents": ["e f g h i j k"] * 4})
        assert r.status_code == 400 and "MaxSim" in r.json()["error"]["message"], r.text
        assert fe.fleet[1].embeds == []


async def test_a_classifier_of_several_classes_cannot_score(make_frontend, tmp_path):
    model = str(make_classifier_model(tmp_path / "cls"))
    async with make_frontend(workers=1, features={1: CLASSIFY}, model_path=model) as fe:
        r = await fe.client.post("/rerank", json={"query": QUERY, "documents": DOCS})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (
            error["param"] == "model" and "/classify" in error["message"] and "3 classes" in error["message"]
        )
        assert fe.fleet[1].embeds == []


async def test_a_cross_encoders_pairs_are_bounded_by_count_and_bytes(make_frontend, tmp_path):
    model = str(make_cross_encoder(tmp_path / "reranker"))
    limits = RequestLimits(max_prompts=2, max_prompt_bytes=4096)
    async with make_frontend(workers=1, features={1: CLASSIFY}, model_path=model, limits=limits) as fe:
        r = await fe.client.post("/rerank", json={"query": QUERY, "documents": DOCS})
        assert r.status_code == 400 and "--max-prompts" in r.json()["error"]["message"]
        r = await fe.client.post("/rerank", json={"query": QUERY, "documents": ["x" * 5000]})
        assert r.status_code == 400 and "--max-prompt-bytes" in r.json()["error"]["message"]
        assert fe.fleet[1].embeds == []


def ranker_rows(ids: list[int]) -> list[list[float]]:
    """The fake worker's rows of a ranking prompt: at each document marker, then the query's."""
    return [fake_vector(ids[:end]) for end in row_ends(ids)]


async def test_a_listwise_ranker_reads_the_query_and_its_documents_in_one_prompt(make_frontend, tmp_path):
    """jina-reranker-v3 as vLLM 0.32 serves it (``JinaRankingIOProcessor``): one query and its
    documents are one ranking prompt, pooled with ``token_embed``; its rows are the documents'
    embeddings and the query's last, and a document scores the cosine of its row and the
    query's. N queries with N documents are N prompts; the instruction comes from
    ``chat_template_kwargs``; marker strings in the texts are removed; ``/pooling`` reads its
    texts as documents then the query; ``/v1/embeddings`` is a 404."""
    model = make_listwise_ranker(tmp_path / "jina")
    tok = Tokenizer.from_dir(model)
    async with make_frontend(workers=1, features={1: EMBED}, model_path=str(model)) as fe:
        r = await fe.client.post("/rerank", json={"query": QUERY, "documents": DOCS})
        assert r.status_code == 200, r.text
        (asked,) = fe.fleet[1].embeds
        ids = tok.encode(ranking_prompt(QUERY, DOCS))
        assert asked.task == "token_embed" and asked.prompts == [ids]
        *docs, query = ranker_rows(ids)
        scores = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        assert [scores[i] for i in range(3)] == pytest.approx([cosine(d, query) for d in docs], rel=1e-5)
        assert r.json()["usage"]["total_tokens"] == len(ids)

        body = {"queries": ["q1", "q2"], "documents": ["d1 <|embed_token|>", "d2"]}
        body["chat_template_kwargs"] = {"instruction": "Prefer short passages."}
        r = await fe.client.post("/score", json=body)
        assert r.status_code == 200, r.text
        prompts = fe.fleet[1].embeds[-1].prompts
        texts = [ranking_prompt(q, [d], "Prefer short passages.") for q, d in (("q1", "d1 "), ("q2", "d2"))]
        assert (
            prompts == [tok.encode(t) for t in texts] and "<instruct>\nPrefer short passages.\n" in texts[0]
        )
        assert [x["score"] for x in r.json()["data"]] == pytest.approx(
            [cosine(*ranker_rows(p)) for p in prompts], rel=1e-5
        )

        r = await fe.client.post("/pooling", json={"input": ["d1", "d2", "the query"]})
        assert r.status_code == 200, r.text
        assert r.json()["data"][0]["data"] == ranker_rows(
            tok.encode(ranking_prompt("the query", ["d1", "d2"]))
        )
        for body, param in (({"input": ["only one"]}, "input"), ({"input": [[1, 2], [3]]}, "input")):
            r = await fe.client.post("/pooling", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
            assert "the documents and then the query" in r.json()["error"]["message"]
        r = await fe.client.post("/pooling", json={"input": ["a", "b"], "task": "embed"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "task"
        r = await fe.client.post("/v1/embeddings", json={"input": "x"})
        assert r.status_code == 404 and "listwise ranking" in r.json()["error"]["message"]


async def test_a_ranking_prompt_that_loses_a_marker_is_a_400(make_frontend, tmp_path):
    """``truncate_prompt_tokens`` that cuts the query's marker off, a marker the removal of another
    joins, or a tokenizer that does not map the markers to the ids the model embeds: a 400 before
    any worker is asked."""
    model = make_listwise_ranker(tmp_path / "jina")
    async with make_frontend(workers=1, features={1: EMBED}, model_path=str(model)) as fe:
        body = {"query": QUERY, "documents": DOCS, "truncate_prompt_tokens": 20, "truncation_side": "right"}
        r = await fe.client.post("/rerank", json=body)
        assert r.status_code == 400 and "0 query marker tokens" in r.json()["error"]["message"], r.text
        joined = "<|embed_<|rerank_token|>token|>"  # removing the inner marker joins the outer one
        r = await fe.client.post("/rerank", json={"query": QUERY, "documents": [joined]})
        assert r.status_code == 400 and "2 document and 1 query" in r.json()["error"]["message"], r.text
        assert fe.fleet[1].embeds == []
    plain = make_colbert(tmp_path / "plain")  # dyn-tiny's tokenizer: no marker ids
    config = (plain / "config.json").read_text().replace("HF_ColBERT", "JinaForRanking")
    (plain / "config.json").write_text(config)
    async with make_frontend(workers=1, features={1: EMBED}, model_path=str(plain)) as fe:
        r = await fe.client.post("/rerank", json={"query": QUERY, "documents": DOCS})
        assert r.status_code == 400 and "does not map <|embed_token|>" in r.json()["error"]["message"], r.text


async def test_a_listwise_rankers_inputs_are_bounded_by_count_and_bytes(make_frontend, tmp_path):
    """Scoring and ``/pooling`` on a listwise ranker count the query and documents under
    ``--max-prompts`` and their text under ``--max-prompt-bytes`` before any prompt is built."""
    model = make_listwise_ranker(tmp_path / "jina")
    limits = RequestLimits(max_prompts=3, max_prompt_bytes=4096)
    async with make_frontend(workers=1, features={1: EMBED}, model_path=str(model), limits=limits) as fe:
        r = await fe.client.post("/rerank", json={"query": QUERY, "documents": DOCS})
        assert r.status_code == 400 and "--max-prompts" in r.json()["error"]["message"], r.text
        r = await fe.client.post("/pooling", json={"input": ["d1", "d2", "d3", "q"]})
        assert r.status_code == 400 and "--max-prompts" in r.json()["error"]["message"], r.text
        r = await fe.client.post("/pooling", json={"input": ["x" * 5000, "q"]})
        assert r.status_code == 400 and "--max-prompt-bytes" in r.json()["error"]["message"], r.text
        r = await fe.client.post("/rerank", json={"query": QUERY, "documents": ["x" * 5000]})
        assert r.status_code == 400 and "--max-prompt-bytes" in r.json()["error"]["message"], r.text
        assert fe.fleet[1].embeds == []
