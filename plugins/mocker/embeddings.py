"""The mocker's pooler: deterministic embeddings of the model's hidden size, and class
probabilities for a classification model, per input or per token.

What a causal model's pooler sees at a token is the prompt up to that token, so each row here is
a function of a prefix of the ids alone (the same ids give the same rows in every process and
run; different ids give unrelated rows): standard Gaussian draws seeded with the prefix's hash.
An embedding is the row scaled to unit L2 norm, as a normalizing pooler (vLLM's default for
embedding models) returns it; without the pooler's activation (``use_activation: false``), the
draws as they are. A classifier's logits are 4 times the first coordinates of a unit row (one
class: the first of two), activated as vLLM's classifier heads do: their softmax, or for one
class (a cross-encoder) the sigmoid of its logit. The ``embed`` and ``classify`` tasks pool the
last token (vLLM's last-token pooling), so their vector is the last row of ``token_embed`` and
``token_classify``. A listwise ranker (``dyn.core.model.pooler.listwise_ranker``) answers only
the rows at its marker tokens, the documents' first and the query's last, as vLLM's
``JinaForRankingPool`` does. Rows are as wide as ``dyn.core.model.pooler.vector_width`` says (256
for dyn-tiny's embeddings).
"""

from __future__ import annotations

from array import array

import numpy as np
import xxhash

from dyn.core.messages import CLASSIFY_TASKS, TOKEN_TASKS, PoolingTask


def pooled(
    token_ids: list[int],
    task: PoolingTask,
    width: int,
    activation: bool = True,
    markers: tuple[int, int] | None = None,
) -> list[float]:
    """The pooler's output for one prompt (see the module docstring): ``width`` values (the
    hidden size, or the number of classes), one row per token laid end to end for a token task;
    with ``markers`` (a listwise ranker's document and query marker ids) the rows at those
    tokens only, the documents' first."""
    if task in TOKEN_TASKS:
        seeds = _prefix_seeds(token_ids)
        if markers is not None:
            document, query = markers
            at = [i for i, t in enumerate(token_ids) if t == document] + [
                i for i, t in enumerate(token_ids) if t == query
            ]
            seeds = [seeds[i] for i in at]
            if not seeds:
                return []
    else:
        seeds = [xxhash.xxh64_intdigest(array("q", token_ids).tobytes())]
    classify = task in CLASSIFY_TASKS
    drawn = 2 if classify and width == 1 else width
    draws = np.stack([np.random.default_rng(seed).standard_normal(drawn) for seed in seeds])
    if classify or activation:
        draws /= np.linalg.norm(draws, axis=1, keepdims=True)
    if classify:
        logits = 4.0 * draws[:, :width]
        if not activation:
            return logits.ravel().tolist()
        if width == 1:
            return (1.0 / (1.0 + np.exp(-logits))).ravel().tolist()
        weights = np.exp(logits - logits.max(axis=1, keepdims=True))
        return (weights / weights.sum(axis=1, keepdims=True)).ravel().tolist()
    return draws.ravel().tolist()


def _prefix_seeds(token_ids: list[int]) -> list[int]:
    """The xxh64 of each prefix of the ids' int64 bytes, the shortest first (one pass; the last
    is the whole prompt's seed)."""
    data = memoryview(array("q", token_ids).tobytes())
    state = xxhash.xxh64()
    seeds = []
    for at in range(0, len(data), 8):
        state.update(data[at : at + 8])
        seeds.append(state.intdigest())
    return seeds
