"""Listwise rerankers: jina-reranker-v3 (vLLM 0.32's ``JinaForRanking``) reads a query and its
documents in one prompt and embeds one token per document and one for the query; a document's
score is the cosine similarity of its embedding and the query's. What vLLM's
``JinaRankingIOProcessor`` does, for ``/score``, ``/rerank`` and ``/pooling``.

Contract:
- The prompt is the model's ranking prompt (``ranking_prompt``): a Qwen3 chat turn whose system
  message sets the task, the documents each in a ``<passage id="i">`` element ending in the
  document marker ``<|embed_token|>``, the query in a ``<query>`` element ending in the query
  marker ``<|rerank_token|>``, an ``<instruct>`` element when an instruction is given, and an
  empty thinking block. The markers are removed from the texts first (as vLLM does), so a text
  cannot add one; one that the removal itself joins is caught by the count below.
- One query against N documents is one prompt of all N (``ranking_groups``); N queries paired
  with N documents are N prompts of one document each.
- The model's pooler answers the ``token_embed`` rows at the markers' token ids
  (``dyn.core.model.pooler.RANKING_TOKEN_IDS``), the documents' first and the query's last; a
  tokenized prompt that does not hold exactly one id per document and one for the query (the
  tokenizer maps the markers elsewhere, or ``truncate_prompt_tokens`` cut one off) is a 400 before
  any worker is asked (``check_markers``).
"""

from __future__ import annotations

import numpy as np

from dyn.core.model.pooler import RANKING_TOKEN_IDS
from dyn.core.protocol.errors import bad_request

DOCUMENT_MARKER = "<|embed_token|>"
QUERY_MARKER = "<|rerank_token|>"
_SYSTEM = (
    "<|im_start|>system\n"
    "You are a search relevance expert who can determine a ranking of the passages based on how "
    "relevant they are to the query. If the query is a question, how relevant a passage is depends "
    "on how well it answers the question. If not, try to analyze the intent of the query and assess "
    "how well each passage satisfies the intent. If an instruction is provided, you should follow "
    "the instruction when determining the ranking.<|im_end|>\n<|im_start|>user\n"
)
_END = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def ranking_prompt(query: str, documents: list[str], instruction: str | None = None) -> str:
    """The ranking prompt of ``query`` over ``documents`` (see the module docstring)."""
    query = _unmarked(query)
    lines = [
        f"I will provide you with {len(documents)} passages, each indicated by a numerical identifier. "
        f"Rank the passages based on their relevance to query: {query}\n"
    ]
    if instruction:
        lines.append(f"<instruct>\n{_unmarked(instruction)}\n</instruct>\n")
    passages = (
        f'<passage id="{i}">\n{_unmarked(d)}{DOCUMENT_MARKER}\n</passage>' for i, d in enumerate(documents)
    )
    lines.append("\n".join(passages) + "\n")
    lines.append(f"<query>\n{query}{QUERY_MARKER}\n</query>")
    return _SYSTEM + "".join(lines) + _END


def ranking_groups(queries: list[str], documents: list[str]) -> list[tuple[str, list[str]]]:
    """The (query, documents) of each prompt: one of every document for a single query, else
    one per (query, document) pair."""
    if len(queries) == 1:
        return [(queries[0], documents)]
    return [(q, [d]) for q, d in zip(queries, documents, strict=True)]


def check_markers(prompt: list[int], documents: int, where: str) -> None:
    """A 400 naming ``where`` unless the tokenized ``prompt`` holds one document marker id per
    document and one query marker id."""
    document_id, query_id = RANKING_TOKEN_IDS
    found = (prompt.count(document_id), prompt.count(query_id))
    if found != (documents, 1):
        raise bad_request(
            f"{where}'s ranking prompt tokenizes to {found[0]} document and {found[1]} query marker "
            f"tokens (ids {document_id} and {query_id}) where the model embeds {documents} and 1: the "
            "served tokenizer does not map <|embed_token|> and <|rerank_token|> to those ids, or "
            "truncate_prompt_tokens cut the prompt; send fewer or shorter documents",
            param=where,
        )


def scores(rows: list[float], documents: int) -> list[float]:
    """Each document's score from one prompt's rows (``documents`` rows, then the query's, end to
    end, of equal width): the cosine similarity of its row and the query's, as vLLM computes it
    (float32, each norm at least 1e-8)."""
    embeds = np.asarray(rows, dtype=np.float32).reshape(documents + 1, -1)
    query, docs = embeds[-1], embeds[:-1]
    norms = np.maximum(np.linalg.norm(docs, axis=1), 1e-8) * max(float(np.linalg.norm(query)), 1e-8)
    return [float(s) for s in (docs @ query) / norms]


def _unmarked(text: str) -> str:
    """``text`` without the two marker strings."""
    return text.replace(DOCUMENT_MARKER, "").replace(QUERY_MARKER, "")
