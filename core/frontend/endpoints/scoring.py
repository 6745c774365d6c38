"""``POST /score`` (and ``/v1/score``) and ``POST /rerank`` (and ``/v1/rerank``, ``/v2/rerank``):
vLLM's scoring endpoints on the workers that embed (the shapes are in ``dyn.core.protocol.scoring``).

Every query and document is tokenized as a completion prompt (special tokens added, as vLLM's
scoring does), cut to its first ``max_tokens_per_query`` / ``max_tokens_per_doc`` tokens when
those are set, truncated by ``truncate_prompt_tokens``, bounded and embedded in one request to one
worker as ``dyn.core.frontend.pooling`` says; one query is embedded once however many documents it
is scored against. A pair's score is the cosine similarity of the two vectors. ``usage`` counts the
tokens embedded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dyn.core.frontend import pooling
from dyn.core.frontend.endpoints.generate import warn_ignored
from dyn.core.protocol.errors import bad_request
from dyn.core.protocol.scoring import (
    Pairs,
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
    ScoringFields,
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
    """Each document's score against its query, and the number of tokens embedded."""
    pooling.check_model(service)
    preprocessor = service.preprocessor
    context = preprocessor.info.context_length
    for name, value in (
        ("max_tokens_per_query", req.max_tokens_per_query),
        ("max_tokens_per_doc", req.max_tokens_per_doc),
    ):
        if value >= context:
            raise bad_request(f"{name} ({value}) must be less than max_model_len ({context}).", param=name)
    pooling.check_count(len(pairs.queries) + len(pairs.documents), preprocessor, pairs.names[1])
    queries = await _prompts(preprocessor, pairs.queries, req.max_tokens_per_query, pairs.names[0])
    documents = await _prompts(preprocessor, pairs.documents, req.max_tokens_per_doc, pairs.names[1])
    prompts = pooling.truncated(queries + documents, req.truncate_prompt_tokens, req.truncation_side, context)
    tokens = pooling.check_lengths(prompts, context, pairs.names[1])
    vectors = await pooling.embed(service, prompts, api)
    return pair_scores(vectors[: len(queries)], vectors[len(queries) :]), tokens


async def _prompts(preprocessor: Preprocessor, texts: list[str], first: int, param: str) -> list[list[int]]:
    """``texts`` tokenized with special tokens, each cut to the text of its first ``first``
    tokens when ``first`` is set (vLLM cuts the text at that token's end, then tokenizes it)."""
    if first:
        pieces = await pooling.tokenize_texts(preprocessor, texts, False, param)
        tokenizer = preprocessor.tokenizer
        texts = [
            tokenizer.decode(ids[:first], skip_special_tokens=False) if len(ids) > first else text
            for text, ids in zip(texts, pieces, strict=True)
        ]
    return await pooling.tokenize_texts(preprocessor, texts, True, param)


SCORE = pooling.AdmittedJsonEndpoint("/score", _score)
SCORE_V1 = pooling.AdmittedJsonEndpoint("/v1/score", _score)
RERANK = pooling.AdmittedJsonEndpoint("/rerank", _rerank)
RERANK_V1 = pooling.AdmittedJsonEndpoint("/v1/rerank", _rerank)
RERANK_V2 = pooling.AdmittedJsonEndpoint("/v2/rerank", _rerank)
