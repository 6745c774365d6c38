"""``POST /score`` and ``POST /rerank`` (and their ``/v1/`` and ``/v2/rerank`` spellings): vLLM's
request and response shapes (``vllm/entrypoints/pooling/scoring/protocol.py``, 0.32).

A score request pairs one or more queries with documents: ``queries`` with ``documents`` or
``items``, or ``data_1``/``data_2``, or ``text_1``/``text_2`` (vLLM's older names), each a string
or a list of strings. One query is scored against every document (1:N); N queries against N
documents pair by position (N:N). A rerank request is one ``query`` and its ``documents``;
the results come sorted by ``relevance_score``, the best first, the first ``top_n`` when it is set.

How a pair is scored (the cosine of two embeddings, or a cross-encoder's probability) is the
endpoint's (``dyn.core.frontend.endpoints.scoring``). Inputs are text: vLLM's multimodal inputs
(``{"content": [...]}``) are refused. ``instruction`` and ``chat_template_kwargs`` feed a
cross-encoder's score template, which applies only when the server is given a
``--chat-template`` (``dyn.core.frontend.score_template``); otherwise they are ignored, as vLLM
ignores them. ``use_activation`` does not change a cosine. Unknown fields are ignored, as vLLM
ignores them.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal

import msgspec
import numpy as np

from dyn.core.protocol.errors import bad_request
from dyn.core.protocol.openai import decode_request

NonNegative = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]


class ScoringFields(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """What score and rerank requests share (vLLM's ``ScoringRequestMixin``)."""

    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: Annotated[int, msgspec.Meta(ge=-1, le=2**31 - 1)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    max_tokens_per_query: NonNegative = 0
    """Each query's first this many tokens are scored (0: all of them)."""
    max_tokens_per_doc: NonNegative = 0
    """Each document's first this many tokens are scored (0: all of them)."""
    instruction: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    use_activation: bool | None = None
    request_id: str | None = None


class ScoreRequest(ScoringFields, kw_only=True, forbid_unknown_fields=False):
    queries: Any = None
    documents: Any = None
    items: Any = None
    data_1: Any = None
    data_2: Any = None
    text_1: Any = None
    text_2: Any = None


class RerankRequest(ScoringFields, kw_only=True, forbid_unknown_fields=False):
    query: Any = None
    documents: Any = None
    top_n: NonNegative = 0
    """How many of the best results to return (0: all)."""


SCORE_PAIRS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2"))
"""The names a score request may give its two inputs (vLLM's four request shapes)."""


class Pairs(msgspec.Struct, frozen=True):
    """A scoring request's texts: ``queries`` (one, or as many as ``documents``) and the
    ``documents`` they are scored against; ``names``: the request's names for the two."""

    queries: list[str]
    documents: list[str]
    names: tuple[str, str]


def score_request(body: bytes) -> tuple[ScoreRequest, Pairs]:
    """Decode a ``/score`` body (a 400 for what ``decode_request`` refuses) and its pairs."""
    req: ScoreRequest = decode_request(body, ScoreRequest)
    given = [
        names
        for names in SCORE_PAIRS
        if getattr(req, names[0]) is not None and getattr(req, names[1]) is not None
    ]
    if len(given) != 1:
        spelled = ", ".join(f"{a}/{b}" for a, b in SCORE_PAIRS)
        raise bad_request(
            f"send one pair of inputs to score: one of {spelled} "
            f"({'none was' if not given else 'more than one was'} given)",
            param="queries",
        )
    first, second = given[0]
    return req, _pairs(getattr(req, first), getattr(req, second), (first, second))


def rerank_request(body: bytes) -> tuple[RerankRequest, Pairs]:
    """Decode a ``/rerank`` body (a 400 for what ``decode_request`` refuses) and its pairs."""
    req: RerankRequest = decode_request(body, RerankRequest)
    if req.query is None or req.documents is None:
        raise bad_request(
            "send 'query' (a string) and 'documents' (a string or a list of strings) to rerank",
            param="query" if req.query is None else "documents",
        )
    if isinstance(req.query, list):
        raise bad_request("query is one string: rerank one query per request", param="query")
    return req, _pairs(req.query, req.documents, ("query", "documents"))


def _pairs(first: Any, second: Any, names: tuple[str, str]) -> Pairs:
    queries = _texts(first, names[0])
    documents = _texts(second, names[1])
    if not queries:
        raise bad_request("At least one text element must be given", param=names[0])
    if not documents:
        raise bad_request("At least one text_pair element must be given", param=names[1])
    if len(queries) > 1 and len(queries) != len(documents):
        raise bad_request(
            f"Input lengths must be either 1:1, 1:N or N:N: {len(queries)} {names[0]} cannot pair "
            f"with {len(documents)} {names[1]}",
            param=names[1],
        )
    return Pairs(queries, documents, names)


def _texts(value: Any, name: str) -> list[str]:
    items = value if isinstance(value, list) else [value]
    for i, item in enumerate(items):
        if not isinstance(item, str):
            where = name if items is not value else f"{name}[{i}]"
            what = (
                "a multimodal input ({'content': [...]}); dyn scores text only"
                if isinstance(item, dict)
                else f"a {type(item).__name__}"
            )
            raise bad_request(f"{where} is {what}: send a string or a list of strings", param=where)
    return items


def cosine(a: list[float], b: list[float]) -> float:
    """The cosine similarity of two vectors (0.0 when either is all zeros)."""
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return dot / norms if norms else 0.0


def maxsim(query_rows: list[float], document_rows: list[float], width: int) -> float:
    """ColBERT's MaxSim of two inputs' token embeddings (each ``width`` values a row, rows end to
    end): for each query token its best dot product with a document token, summed, as vLLM's
    late-interaction scoring computes it (in float32)."""
    query = np.asarray(query_rows, dtype=np.float32).reshape(-1, width)
    document = np.asarray(document_rows, dtype=np.float32).reshape(-1, width)
    return float((query @ document.T).max(axis=1).sum())


def pair_scores(
    query_vectors: list[list[float]],
    document_vectors: list[list[float]],
    measure: Callable[[list[float], list[float]], float] = cosine,
) -> list[float]:
    """Each document's score against its query (the one query, or the query at its position) by
    ``measure``."""
    if len(query_vectors) == 1:
        return [measure(query_vectors[0], d) for d in document_vectors]
    return [measure(q, d) for q, d in zip(query_vectors, document_vectors, strict=True)]


class ScoreUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0
    prompt_tokens_details: None = None


class ScoreData(msgspec.Struct):
    index: int
    score: float
    object: str = "score"


class ScoreResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    data: list[ScoreData]
    usage: ScoreUsage
    object: str = "list"


class RerankDocument(msgspec.Struct):
    text: str | None = None
    multi_modal: None = None


class RerankResult(msgspec.Struct):
    index: int
    document: RerankDocument
    relevance_score: float


class RerankUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(msgspec.Struct):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


def score_response(model: str, scores: list[float], prompt_tokens: int) -> ScoreResponse:
    return ScoreResponse(
        id=f"score-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=model,
        data=[ScoreData(i, s) for i, s in enumerate(scores)],
        usage=ScoreUsage(prompt_tokens, prompt_tokens),
    )


def rerank_response(
    model: str, documents: list[str], scores: list[float], top_n: int, prompt_tokens: int
) -> RerankResponse:
    """The documents by score, the best first (ties in the order sent), the first ``top_n``
    (0: all)."""
    results = [
        RerankResult(i, RerankDocument(d), s) for i, (d, s) in enumerate(zip(documents, scores, strict=True))
    ]
    results.sort(key=lambda r: r.relevance_score, reverse=True)
    if 0 < top_n < len(results):
        results = results[:top_n]
    return RerankResponse(
        id=f"score-{uuid.uuid4().hex}",
        model=model,
        usage=RerankUsage(prompt_tokens, prompt_tokens),
        results=results,
    )
