"""The mocker's embeddings (``--runner pooling``) and their trip over the request plane.

What is simulated: vLLM's ``--runner pooling`` (``vllm/config/model.py``: a pooling runner embeds
and does not generate) with its default normalizing embed pooler (``vllm/pooling_params.py``:
``use_activation`` defaults to true for ``embed``), on dyn's embedded ``dyn-tiny`` (hidden size
256 in its ``config.json``). The cost is the mocker's prefill timing model (``timing.prefill_ms``).
"""

from __future__ import annotations

import math
import time
from contextlib import asynccontextmanager

import anyio
import pytest

from dyn.core.config import DiscoveryConfig
from dyn.core.engine import FEATURE_CLASSIFY, FEATURE_EMBED, FEATURE_POOLING_ONLY, EngineError
from dyn.core.messages import EmbedRequest, GenerateRequest
from dyn.core.model import load_model_info
from dyn.core.model.pooler import RANKER_WIDTH, RANKING_TOKEN_IDS, hidden_size
from dyn.core.transport.request_plane import RemoteError, WorkerClient
from dyn.core.worker.host import WorkerHost
from dyn.core.worker.settings import WorkerSettings
from dyn.plugins.mocker import embeddings
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.engine import MockerEngine
from dyn.plugins.mocker.timing import prefill_ms
from tests.classifier_model import LABELS, make_classifier_model, make_colbert, make_listwise_ranker
from tests.memory_discovery import memory_store

pytestmark = pytest.mark.anyio


def norm(vector: list[float]) -> float:
    return math.sqrt(math.fsum(v * v for v in vector))


def test_vectors_are_unit_norm_of_the_hidden_size_and_a_function_of_the_ids():
    model = load_model_info(None, None)
    size = hidden_size(model)
    assert size == 256
    a, b = embeddings.pooled([1, 2, 3], "embed", size), embeddings.pooled([1, 2, 4], "embed", size)
    assert len(a) == size and abs(norm(a) - 1.0) < 1e-12
    assert a == embeddings.pooled([1, 2, 3], "embed", size) and a != b
    assert abs(sum(x * y for x, y in zip(a, b, strict=True))) < 0.3  # unrelated inputs, unrelated vectors


def rows(flat: list[float], width: int) -> list[list[float]]:
    return [flat[i : i + width] for i in range(0, len(flat), width)]


def test_token_tasks_answer_a_row_per_token_each_a_function_of_its_prefix():
    """``token_embed`` and ``token_classify``: one row per token, each what the task gives the
    prompt up to that token (a causal model's pooler at that position), so the last row is the
    whole prompt's ``embed`` or ``classify`` vector (last-token pooling) and two prompts that
    share a prefix share its rows."""
    abc, abd = (rows(embeddings.pooled(ids, "token_embed", 8), 8) for ids in ([1, 2, 3], [1, 2, 4]))
    assert len(abc) == 3 and all(abs(norm(r) - 1.0) < 1e-12 for r in abc)
    assert abc[:2] == abd[:2] and abc[2] != abd[2]
    assert abc[1] == embeddings.pooled([1, 2], "embed", 8) and abc[2] == embeddings.pooled(
        [1, 2, 3], "embed", 8
    )
    raw = rows(embeddings.pooled([1, 2, 3], "token_embed", 8, activation=False), 8)
    assert [v / norm(r) for r in raw for v in r] == pytest.approx([v for r in abc for v in r])
    assert any(abs(norm(r) - 1.0) > 0.1 for r in raw)
    probs = rows(embeddings.pooled([5, 6, 7], "token_classify", 3), 3)
    assert len(probs) == 3 and all(math.isclose(math.fsum(r), 1.0) for r in probs)
    assert probs[-1] == pytest.approx(embeddings.pooled([5, 6, 7], "classify", 3))
    scores = embeddings.pooled([5, 6, 7], "token_classify", 1)
    assert len(scores) == 3 and all(0.0 < v < 1.0 for v in scores)


def test_a_listwise_rankers_rows_are_at_its_markers_the_documents_first():
    """vLLM's ``JinaForRankingPool``: the rows at the document markers, in order, then the query
    marker's, each the prompt's row at that token; none for a prompt without markers."""
    doc, query = RANKING_TOKEN_IDS
    prompt = [7, doc, 8, query, 9, doc]
    every = rows(embeddings.pooled(prompt, "token_embed", 8), 8)
    marked = rows(embeddings.pooled(prompt, "token_embed", 8, markers=RANKING_TOKEN_IDS), 8)
    assert marked == [every[1], every[5], every[3]]
    assert embeddings.pooled([7, 8], "token_embed", 8, markers=RANKING_TOKEN_IDS) == []


async def test_a_listwise_ranker_engine_embeds_its_markers_only(tmp_path):
    model = load_model_info(make_listwise_ranker(tmp_path / "jina"))
    doc, query = RANKING_TOKEN_IDS
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            engine = MockerEngine(MockerConfig(runner="pooling", speedup_ratio=1000), model)
            await tg.start(engine.run)
            (vector,) = await engine.embed([[5, doc, 6, doc, query]], "token_embed")
            with pytest.raises(EngineError, match="pools per token only"):
                await engine.embed([[1]], "embed")
            tg.cancel_scope.cancel()
    assert len(vector) == 3 * RANKER_WIDTH  # vLLM's, whatever config.json says


def test_runner_is_checked():
    with pytest.raises(ValueError, match="--runner must be one of"):
        MockerConfig(runner="embed").validate()


@asynccontextmanager
async def running(config: MockerConfig):
    engine = MockerEngine(config, load_model_info(None, None))
    async with anyio.create_task_group() as tg:
        await tg.start(engine.run)
        yield engine
        tg.cancel_scope.cancel()


async def test_embedding_costs_a_simulated_prefill_and_passes_the_scheduler():
    prompt = list(range(5, 2005))
    async with running(MockerConfig(runner="pooling", speedup_ratio=1.0)) as engine:
        assert engine.info.features[-2:] == [FEATURE_EMBED, FEATURE_POOLING_ONLY]
        started = time.monotonic()
        (vector,) = await engine.embed([prompt])
        elapsed = time.monotonic() - started
        assert elapsed >= 0.9 * prefill_ms(len(prompt)) / 1000  # about 48 ms for 2000 tokens
        assert engine.passes >= 1 and vector == embeddings.pooled(prompt, "embed", 256)
        with pytest.raises(EngineError) as refused:
            async for _ in engine.generate(GenerateRequest("g", [1, 2])):
                pass
        assert refused.value.code == "unsupported" and "--runner pooling" in str(refused.value)
    small = MockerConfig(runner="pooling", num_gpu_blocks=4, block_size=16)
    async with running(small) as engine:
        with pytest.raises(EngineError) as too_big:  # the scheduler's KV bound holds for embeddings
            await engine.embed([[1] * 10, [1] * 100])
        assert too_big.value.code == "bad_request"


@asynccontextmanager
async def host_client(tmp_path, config: MockerConfig):
    store = memory_store(tmp_path, "t")
    host = WorkerHost(
        MockerEngine(config, load_model_info(None, None)),
        engine_name="mocker",
        model_name="dyn-tiny",
        store=store,
        settings=WorkerSettings(discovery=DiscoveryConfig(namespace="t")),
    )
    stop = anyio.Event()
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(host.run, stop)
            (record,) = await store.list()
            async with WorkerClient(record.endpoints.request) as client:
                yield record, client
            stop.set()


async def test_embed_requests_travel_the_request_plane(tmp_path):
    async with host_client(tmp_path / "pool", MockerConfig(runner="pooling", speedup_ratio=100)) as (
        record,
        client,
    ):
        assert FEATURE_EMBED in record.features and FEATURE_POOLING_ONLY in record.features
        reply = await client.embed(EmbedRequest("e1", [[1, 2, 3], [4]]), timeout_s=10)
        assert reply.request_id == "e1" and reply.prompt_tokens == 4
        assert reply.embeddings == [embeddings.pooled(p, "embed", 256) for p in ([1, 2, 3], [4])]
        raw = await client.embed(EmbedRequest("e3", [[1, 2, 3]], activation=False), timeout_s=10)
        (vector,) = raw.embeddings
        assert norm(vector) > 2  # 256 standard Gaussian draws: about 16
        assert [v / norm(vector) for v in vector] == pytest.approx(reply.embeddings[0])
        tokens = await client.embed(EmbedRequest("e4", [[1, 2, 3], [4]], "token_embed"), timeout_s=10)
        assert [len(v) for v in tokens.embeddings] == [3 * 256, 256]
        assert (
            tokens.embeddings[0][-256:] == reply.embeddings[0] and tokens.embeddings[1] == reply.embeddings[1]
        )
        with pytest.raises(RemoteError, match="token_classify task"):
            await client.embed(EmbedRequest("e5", [[1]], "token_classify"), timeout_s=10)
        with pytest.raises(RemoteError) as refused:
            async for _ in client.generate(GenerateRequest("g", [1])):
                pass
        assert refused.value.code == "unsupported"
    async with host_client(tmp_path / "gen", MockerConfig(speedup_ratio=100)) as (record, client):
        assert FEATURE_EMBED not in record.features
        with pytest.raises(RemoteError) as unsupported:
            await client.embed(EmbedRequest("e2", [[1]]), timeout_s=10)
        assert unsupported.value.code == "unsupported" and "generate-only" in str(unsupported.value)


async def test_a_classifier_answers_class_probabilities_and_other_models_refuse(tmp_path):
    """A pooling mocker on a classification model lists ``classify`` and answers each input with
    probabilities over its classes (summing to 1, the same for the same ids); on another model
    the task is refused as unsupported."""
    model = load_model_info(make_classifier_model(tmp_path / "cls"))
    engine = MockerEngine(MockerConfig(runner="pooling", speedup_ratio=1000), model)
    assert FEATURE_CLASSIFY in engine.info.features
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(engine.run)
            probs = await engine.embed([[5, 6, 7], [8], [5, 6, 7]], "classify")
            (logits,) = await engine.embed([[5, 6, 7]], "classify", activation=False)
            (per_token,) = await engine.embed([[5, 6, 7]], "token_classify")
            with pytest.raises(EngineError, match="classification model"):
                await engine.embed([[1]], "token_embed")
            plain = MockerEngine(
                MockerConfig(runner="pooling", speedup_ratio=1000), load_model_info(None, None)
            )
            await tg.start(plain.run)
            for task in ("classify", "token_classify"):
                with pytest.raises(EngineError, match="not a classification model"):
                    await plain.embed([[1]], task)
            tg.cancel_scope.cancel()
    assert all(len(p) == len(LABELS) and math.isclose(math.fsum(p), 1.0) for p in probs)
    assert probs[0] == probs[2] != probs[1]
    assert len(per_token) == 3 * len(LABELS) and per_token[-len(LABELS) :] == probs[0]
    softmax = [math.exp(v) / math.fsum(math.exp(w) for w in logits) for v in logits]
    assert softmax == pytest.approx(probs[0]) and not math.isclose(math.fsum(logits), 1.0)


def test_a_one_class_classifier_answers_a_sigmoid_score_that_varies_with_the_input():
    """A cross-encoder's one class: vLLM activates one logit with a sigmoid, so the answer is a
    probability in (0, 1) of its own, not a softmax's constant 1."""
    scores = [embeddings.pooled([i, i + 1, 7], "classify", 1) for i in range(50)]
    assert all(len(s) == 1 and 0.0 < s[0] < 1.0 for s in scores)
    assert len({s[0] for s in scores}) == 50 and embeddings.pooled([3, 4, 7], "classify", 1) == scores[3]
    assert min(s[0] for s in scores) < 0.3 and max(s[0] for s in scores) > 0.7
    logit = embeddings.pooled([3, 4, 7], "classify", 1, activation=False)[0]
    assert 1.0 / (1.0 + math.exp(-logit)) == pytest.approx(scores[3][0])


async def test_per_token_models_pool_with_their_token_task_only(tmp_path):
    """A token classifier classifies each token and a ColBERT model embeds each token
    (``colbert_dim`` wide); neither answers one vector per input, as vLLM serves neither's."""
    ner = load_model_info(
        make_classifier_model(tmp_path / "ner", architectures=["BertForTokenClassification"])
    )
    colbert = load_model_info(make_colbert(tmp_path / "colbert", dim=8))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            engines = [
                MockerEngine(MockerConfig(runner="pooling", speedup_ratio=1000), m) for m in (ner, colbert)
            ]
            for engine in engines:
                await tg.start(engine.run)
            (rows,) = await engines[0].embed([[5, 6, 7]], "token_classify")
            (vectors,) = await engines[1].embed([[5, 6, 7]], "token_embed")
            for engine, task in zip(engines, ("classify", "embed"), strict=True):
                with pytest.raises(EngineError, match="pools per token only"):
                    await engine.embed([[1]], task)
            tg.cancel_scope.cancel()
    assert len(rows) == 3 * len(LABELS) and len(vectors) == 3 * 8
