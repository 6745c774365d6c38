"""``POST /score`` (and ``/v1/score``) and ``POST /rerank`` (and ``/v1/rerank``, ``/v2/rerank``):
vLLM's scoring endpoints on pooling workers (the shapes are in ``dyn.core.protocol.scoring``), the
two ways vLLM scores, chosen by the served model:

- **Bi-encoder** (a model that embeds): every query and document is tokenized as a completion
  prompt (special tokens added, as vLLM's scoring does), truncated by ``truncate_prompt_tokens``,
  bounded and embedded in one request to one worker as ``dyn.core.frontend.pooling`` says; one
  query is embedded once however many documents it is scored against. A pair's score is the
  cosine similarity of the two vectors.
- **Late interaction** (a ColBERT model, ``dyn.core.model.pooler.late_interaction``): the same
  inputs pooled with the ``token_embed`` task, a row per token (bounded by
  ``--max-response-bytes`` as ``/pooling``'s rows are), and a pair's score is ColBERT's MaxSim of
  the two inputs' rows, as vLLM's late-interaction scoring computes it (in a thread, at most
  ``MAX_MAXSIM_WORK`` products a request).
- **Cross-encoder** (a classifier with one class, ``dyn.core.model.classes``): each (query,
  document) pair is one input, the tokenizer's pair encoding (or the two texts joined, for a model
  whose config says ``use_sep_token: false``; or, when the server was given a ``--chat-template``,
  the pair rendered by it with the request's ``instruction`` and ``chat_template_kwargs``:
  ``dyn.core.frontend.score_template``; or the model's own score template, jina-reranker-m0's:
  ``dyn.core.model.classes.own_score_template``, whose score token ends every pair), classified
  by the worker; a pair's score is the
  class's probability (the sigmoid of its logit, as vLLM's classifier head activates one class).
  A classifier with more classes cannot score (vLLM fails it: the score must be a scalar): a 400
  that sends its inputs to ``/classify``. ``use_activation: false`` scores with the raw logit,
  as vLLM's does.
- **Listwise** (jina-reranker-v3, ``dyn.core.model.pooler.listwise_ranker``): the query and its
  documents in one ranking prompt (one prompt per pair for N queries), pooled with ``token_embed``,
  one row per document and one for the query; a document's score is the cosine similarity of the
  two (``dyn.core.frontend.listwise``). The instruction is ``chat_template_kwargs``'s or the
  request's ``instruction``.

Each way each query and document is first cut to the text of its first
``max_tokens_per_query`` / ``max_tokens_per_doc`` tokens when those are set, and ``usage`` counts
the tokens pooled.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import anyio.to_thread

from dyn.core.frontend import listwise, pooling, score_template
from dyn.core.frontend.endpoints.generate import warn_ignored
from dyn.core.model.classes import own_score_template, pair_with_separator, token_classifier
from dyn.core.model.pooler import late_interaction, listwise_ranker, vector_width
from dyn.core.protocol.errors import bad_request
from dyn.core.protocol.scoring import (
    Pairs,
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
    ScoringFields,
    maxsim,
    pair_scores,
    rerank_request,
    rerank_response,
    score_request,
    score_response,
)

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp
    from dyn.core.frontend.preprocessor import Preprocessor
    from dyn.core.frontend.service import OpenAIService


async def _score(app: FrontendApp, body: bytes) -> ScoreResponse:
    req, pairs = score_request(body)
    warn_ignored(body, ScoreRequest, "to /score")
    service = app.models.resolve(req.model)
    scores, tokens = await _scores(service, req, pairs, "Score")
    return score_response(service.model_name, scores, tokens)


async def _rerank(app: FrontendApp, body: bytes) -> RerankResponse:
    req, pairs = rerank_request(body)
    warn_ignored(body, RerankRequest, "to /rerank")
    service = app.models.resolve(req.model)
    scores, tokens = await _scores(service, req, pairs, "Rerank")
    return rerank_response(service.model_name, pairs.documents, scores, req.top_n, tokens)


async def _scores(
    service: OpenAIService, req: ScoringFields, pairs: Pairs, api: str
) -> tuple[list[float], int]:
    """Each document's score against its query, and the number of tokens pooled."""
    pooling.check_model(service)
    preprocessor = service.preprocessor
    context = preprocessor.info.context_length
    for name, value in (
        ("max_tokens_per_query", req.max_tokens_per_query),
        ("max_tokens_per_doc", req.max_tokens_per_doc),
    ):
        if value >= context:
            raise bad_request(f"{name} ({value}) must be less than max_model_len ({context}).", param=name)
    if token_classifier(preprocessor.info):
        raise bad_request(
            f"'{service.model_name}' classifies each token: it does not score pairs; send its "
            "inputs to /pooling with the token_classify task",
            param="model",
        )
    if listwise_ranker(preprocessor.info):
        return await _listwise(service, req, pairs, api)
    classes = pooling.model_classes(preprocessor.info)
    if classes is not None:
        return await _cross_encoded(service, req, pairs, api, len(classes))
    pooling.check_count(len(pairs.queries) + len(pairs.documents), preprocessor, pairs.names[1])
    queries = await _cut(preprocessor, pairs.queries, req.max_tokens_per_query, pairs.names[0])
    documents = await _cut(preprocessor, pairs.documents, req.max_tokens_per_doc, pairs.names[1])
    queries_ids = await pooling.tokenize_texts(preprocessor, queries, True, pairs.names[0])
    documents_ids = await pooling.tokenize_texts(preprocessor, documents, True, pairs.names[1])
    prompts = pooling.truncated(
        queries_ids + documents_ids, req.truncate_prompt_tokens, req.truncation_side, context
    )
    tokens = pooling.check_lengths(prompts, context, pairs.names[1])
    n = len(queries)
    if not late_interaction(preprocessor.info):
        vectors = await pooling.embed(service, prompts, api)
        return pair_scores(vectors[:n], vectors[n:]), tokens
    width = vector_width(preprocessor.info, "token_embed")
    pooling.check_token_rows(sum(map(len, prompts)), width, preprocessor, pairs.names[1])
    _check_maxsim_work(prompts[:n], prompts[n:], width)
    rows = await pooling.embed(service, prompts, api, "token_embed")
    width = len(rows[0]) // len(prompts[0])  # the worker's own, should the config not say it
    measure = functools.partial(maxsim, width=width)
    return await anyio.to_thread.run_sync(pair_scores, rows[:n], rows[n:], measure), tokens


def _check_maxsim_work(queries: list[list[int]], documents: list[list[int]], width: int) -> None:
    """A 400 when MaxSim over every pair would take more than ``MAX_MAXSIM_WORK`` products."""
    if len(queries) == 1:
        work = len(queries[0]) * sum(len(d) for d in documents) * width
    else:
        work = sum(len(q) * len(d) for q, d in zip(queries, documents, strict=True)) * width
    if work > MAX_MAXSIM_WORK:
        raise bad_request(
            f"scoring these pairs by MaxSim takes {work} products of token embeddings, more than the "
            f"{MAX_MAXSIM_WORK} this server computes for one request: send fewer or shorter documents",
            param="documents",
        )


async def _cross_encoded(
    service: OpenAIService, req: ScoringFields, pairs: Pairs, api: str, classes: int
) -> tuple[list[float], int]:
    """The cross-encoder's scores (see the module docstring)."""
    preprocessor = service.preprocessor
    if classes != 1:
        raise bad_request(
            f"'{service.model_name}' is a classifier of {classes} classes: a score is one class's "
            "probability, so only a one-class classifier (a cross-encoder) scores; send its inputs "
            "to /classify",
            param="model",
        )
    queries = await _cut(preprocessor, pairs.queries, req.max_tokens_per_query, pairs.names[0])
    documents = await _cut(preprocessor, pairs.documents, req.max_tokens_per_doc, pairs.names[1])
    paired = [(queries[0] if len(queries) == 1 else queries[i], d) for i, d in enumerate(documents)]
    own = own_score_template(preprocessor.info)
    if preprocessor.template_given:
        kwargs = score_template.template_kwargs(req.chat_template_kwargs, req.instruction)
        prompts = await score_template.tokenize_scored(preprocessor, paired, kwargs, pairs.names[1])
    elif own is not None:
        texts = [own.text.format(query=q, document=d) for q, d in paired]
        prompts = await pooling.tokenize_texts(preprocessor, texts, True, pairs.names[1])
    else:
        separator = pair_with_separator(preprocessor.info)
        prompts = await pooling.tokenize_pairs(preprocessor, paired, separator, pairs.names[1])
    context = preprocessor.info.context_length
    prompts = pooling.truncated(prompts, req.truncate_prompt_tokens, req.truncation_side, context)
    if own is not None and own.suffix:  # after truncation, as vLLM appends it
        prompts = [[*ids, *own.suffix] for ids in prompts]
    tokens = pooling.check_lengths(prompts, context, pairs.names[1])
    scores = await pooling.embed(service, prompts, api, "classify", req.use_activation is not False)
    return [s[0] for s in scores], tokens


async def _listwise(
    service: OpenAIService, req: ScoringFields, pairs: Pairs, api: str
) -> tuple[list[float], int]:
    """The listwise ranker's scores (see the module docstring)."""
    preprocessor = service.preprocessor
    pooling.check_texts(pairs.queries + pairs.documents, preprocessor, pairs.names[1])
    queries = await _cut(preprocessor, pairs.queries, req.max_tokens_per_query, pairs.names[0])
    documents = await _cut(preprocessor, pairs.documents, req.max_tokens_per_doc, pairs.names[1])
    instruction = score_template.template_kwargs(req.chat_template_kwargs, req.instruction).get("instruction")
    groups = listwise.ranking_groups(queries, documents)
    texts = [listwise.ranking_prompt(query, docs, instruction) for query, docs in groups]
    counts = [len(docs) for _, docs in groups]
    prompts, tokens = await pooling.tokenize_ranked(
        preprocessor, texts, counts, req.truncate_prompt_tokens, req.truncation_side, pairs.names[1]
    )
    rows = [n + 1 for n in counts]
    embeds = await pooling.embed(service, prompts, api, "token_embed", rows=rows)
    return [
        s
        for values, (_, docs) in zip(embeds, groups, strict=True)
        for s in listwise.scores(values, len(docs))
    ], tokens


async def _cut(preprocessor: Preprocessor, texts: list[str], first: int, param: str) -> list[str]:
    """``texts``, each cut to the text of its first ``first`` tokens when ``first`` is set (vLLM
    cuts the text at that token's end, then tokenizes it)."""
    if not first:
        return texts
    pieces = await pooling.tokenize_texts(preprocessor, texts, False, param)
    tokenizer = preprocessor.tokenizer
    return [
        tokenizer.decode(ids[:first], skip_special_tokens=False) if len(ids) > first else text
        for text, ids in zip(texts, pieces, strict=True)
    ]


MAX_MAXSIM_WORK = 1 << 31
"""Most products of token embeddings one request's MaxSim scores may take (about a second of
float32 matrix products here)."""

SCORE = pooling.AdmittedJsonEndpoint("/score", _score)
SCORE_V1 = pooling.AdmittedJsonEndpoint("/v1/score", _score)
RERANK = pooling.AdmittedJsonEndpoint("/rerank", _rerank)
RERANK_V1 = pooling.AdmittedJsonEndpoint("/v1/rerank", _rerank)
RERANK_V2 = pooling.AdmittedJsonEndpoint("/v2/rerank", _rerank)
