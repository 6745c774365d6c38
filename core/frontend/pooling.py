"""Work for the workers that pool (``embed`` in their features; ``classify`` too for a
classification model): what ``/v1/embeddings``, ``/pooling``, ``/classify``, ``/score`` and
``/rerank`` share.

Inputs are tokenized here and bounded before any worker sees them: at most ``--max-prompts``
inputs and ``--max-prompt-bytes`` of text, every token id in the vocabulary, each input at most the
context length after truncation, and at most ``MAX_EMBED_TOKENS`` tokens in all (400s that say what
to fix). A request counts under ``--max-inflight`` as a generation does, since it costs the engine
a prefill (``AdmittedJsonEndpoint``).

All inputs go in one ``EmbedRequest`` to one worker that lists ``embed`` in its features, the least
busy (fewest requests in flight on its client; ties in turn): pooling has no decode and reuses no KV
across requests that the frontend could exploit, so it is not KV-routed. A worker that fails before
answering is replaced by the next one. No worker at all is a 503 (as for generation); live workers
none of which embed is a 404 naming the API, as vLLM answers when the served model is not a pooling
model (it does not register the route then).
"""

from __future__ import annotations

import functools
import itertools
import logging
from typing import TYPE_CHECKING, Literal

import anyio.to_thread

from dyn.core.engine import FEATURE_CLASSIFY, pooling_feature
from dyn.core.frontend import limits as bounds
from dyn.core.frontend import listwise
from dyn.core.frontend.endpoints.base import Call
from dyn.core.frontend.endpoints.json_post import JsonEndpoint
from dyn.core.messages import TOKEN_TASKS, EmbedReply, EmbedRequest, PoolingTask
from dyn.core.model.classes import class_labels
from dyn.core.model.info import ModelInfo
from dyn.core.model.pooler import vector_width
from dyn.core.protocol.embeddings import MAX_EMBED_TOKENS
from dyn.core.protocol.errors import ApiError, bad_request, unavailable
from dyn.core.router.pool import Worker
from dyn.core.transport.request_plane import RemoteError, WorkerUnavailable

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp
    from dyn.core.frontend.preprocessor import Preprocessor
    from dyn.core.frontend.service import OpenAIService

log = logging.getLogger(__name__)

VALUE_BYTES = 5
"""Fewest bytes one pooled value adds to a JSON response (a float32 in base64 takes 5.3
characters, its decimal digits more): what bounds a token task's rows before they are asked for."""
EMBED_TIMEOUT_S = 300.0
"""Longest the frontend waits for a worker's vectors (a silence timeout, when set, ends it sooner)."""
_turn = itertools.count()
_ids = itertools.count()


def check_count(count: int, preprocessor: Preprocessor, param: str) -> None:
    """A 400 naming ``param`` for more than ``--max-prompts`` inputs."""
    most = preprocessor.limits.max_prompts
    if count > most:
        raise bad_request(
            f"{param} holds {count} inputs; this server pools at most {most} per request "
            "(raise it with --max-prompts, or split the request)",
            param=param,
        )


def check_texts(texts: list[str] | list[tuple[str, str]], preprocessor: Preprocessor, param: str) -> None:
    """A 400 naming ``param`` for more than ``--max-prompts`` inputs or more than
    ``--max-prompt-bytes`` of text in all."""
    check_count(len(texts), preprocessor, param)
    if bounds.json_size(texts, preprocessor.prompt_bytes) > preprocessor.prompt_bytes:
        raise bad_request(
            f"the {param} text of this request is more than {preprocessor.prompt_bytes} bytes, "
            "the most this server accepts (raise it with --max-prompt-bytes, or split the request)",
            param=param,
        )


async def tokenize_texts(
    preprocessor: Preprocessor, texts: list[str], add_special_tokens: bool, param: str
) -> list[list[int]]:
    """``texts`` tokenized as completion prompts, bounded by ``check_texts``."""
    check_texts(texts, preprocessor, param)
    return [await preprocessor.tokenize_text_async(t, add_special_tokens) for t in texts]


async def tokenize_pairs(
    preprocessor: Preprocessor, pairs: list[tuple[str, str]], separator: bool, param: str
) -> list[list[int]]:
    """Each (query, document) pair as one cross-encoder input, bounded by ``check_texts``: the
    tokenizer's pair encoding when ``separator``, else the two texts joined and tokenized with
    special tokens (``dyn.core.model.classes.pair_with_separator``). Tokenized in a thread."""
    check_texts(pairs, preprocessor, param)
    tokenizer = preprocessor.tokenizer

    def encode() -> list[list[int]]:
        if separator:
            return [tokenizer.encode_pair(query, document) for query, document in pairs]
        return [tokenizer.encode(query + document) for query, document in pairs]

    return await anyio.to_thread.run_sync(encode)


async def tokenize_ranked(
    preprocessor: Preprocessor,
    texts: list[str],
    documents: list[int],
    truncate: int | None,
    side: Literal["left", "right"] | None,
    param: str,
) -> tuple[list[list[int]], int]:
    """The ranking prompts ``texts`` (of ``documents[i]`` documents each) tokenized with special
    tokens, truncated by ``truncate_prompt_tokens``, and bounded as every pooled input is, their
    answer too (``param`` names them in a 400); and the number of tokens in all."""
    prompts = await tokenize_texts(preprocessor, texts, True, param)
    context = preprocessor.info.context_length
    prompts = truncated(prompts, truncate, side, context)
    tokens = check_lengths(prompts, context, param)
    for i, (prompt, count) in enumerate(zip(prompts, documents, strict=True)):
        listwise.check_markers(prompt, count, param if len(prompts) == 1 else f"{param}[{i}]")
    width = vector_width(preprocessor.info, "token_embed")
    check_token_rows(sum(documents) + len(documents), width, preprocessor, param)
    return prompts, tokens


@functools.lru_cache(maxsize=64)
def model_classes(info: ModelInfo) -> list[str | None] | None:
    """The served model's class names by index (``dyn.core.model.classes.class_labels``; None:
    not a classifier), read once per model."""
    return class_labels(info)


def check_vocab(prompts: list[list[int]], vocab_size: int, param: str = "input") -> None:
    """A 400 naming the first token id outside ``[0, vocab_size)``."""
    for i, ids in enumerate(prompts):
        for j, token in enumerate(ids):
            if not 0 <= token < vocab_size:
                where = f"{param}[{i}][{j}]" if len(prompts) > 1 else f"{param}[{j}]"
                raise bad_request(
                    f"{where} is {token}, not in the vocabulary: token ids must be in [0, {vocab_size})",
                    param=where,
                )


def truncated(
    prompts: list[list[int]],
    keep: int | None,
    side: Literal["left", "right"] | None,
    context_length: int,
) -> list[list[int]]:
    """vLLM's ``truncate_prompt_tokens`` (``keep``; -1: the context length) on each input, from
    the side ``side`` does not cut (default left: the last tokens are kept)."""
    if keep is None:
        return prompts
    if keep == -1:
        keep = context_length
    elif keep > context_length:
        raise bad_request(
            f"truncate_prompt_tokens={keep} cannot be greater than max_model_len = {context_length}. "
            "Please request a smaller truncation size.",
            param="truncate_prompt_tokens",
        )
    if keep == 0:
        raise bad_request(
            "truncate_prompt_tokens=0 would embed nothing: send a positive count, or -1 for the "
            "context length",
            param="truncate_prompt_tokens",
        )
    if side == "right":
        return [ids[:keep] for ids in prompts]
    return [ids[-keep:] if len(ids) > keep else ids for ids in prompts]


def check_lengths(prompts: list[list[int]], context_length: int, param: str) -> int:
    """A 400 for an empty input, one longer than the context, or more than ``MAX_EMBED_TOKENS``
    in all (``param`` names them); the number of tokens in all."""
    total = 0
    for i, ids in enumerate(prompts):
        where = param if len(prompts) == 1 else f"{param}[{i}]"
        if not ids:
            raise bad_request(f"{where} is empty after tokenization; send some text", param=where)
        if len(ids) > context_length:
            raise bad_request(
                f"This model's maximum context length is {context_length} tokens. However, "
                f"{where} holds {len(ids)} tokens to embed. Shorten it, or send "
                "truncate_prompt_tokens (-1 keeps the last context length of tokens).",
                param=where,
                code="context_length_exceeded",
            )
        total += len(ids)
    if total > MAX_EMBED_TOKENS:
        raise bad_request(
            f"this request embeds {total} tokens in all; this server embeds at most "
            f"{MAX_EMBED_TOKENS} per request: split the inputs over several requests",
            param=param,
        )
    return total


def check_token_rows(rows: int, width: int, preprocessor: Preprocessor, param: str) -> None:
    """A 400 naming ``param`` when a token task's answer (``rows`` rows of ``width`` values: one
    per token, or per marker for a listwise ranker) could be larger than ``--max-response-bytes``."""
    values = rows * width
    limit = preprocessor.limits.max_response_bytes
    if values * VALUE_BYTES > limit:
        raise bad_request(
            f"this request's answer would hold {values} values ({rows} rows of {width}), more than "
            f"the {limit} bytes this server returns in one response: send fewer "
            "or shorter inputs, or raise --max-response-bytes",
            param=param,
        )


def check_model(service: OpenAIService) -> None:
    """A 400 when the request's ``model`` names a LoRA adapter (pooling runs on base models)."""
    if service.lora_name is not None:
        raise bad_request(
            f"'{service.model_name}' is a LoRA adapter: send pooling requests to its base model",
            param="model",
        )


def _embedders(service: OpenAIService, api: str, task: PoolingTask) -> list[Worker]:
    """The model's live workers that pool with ``task``, least busy first (ties in turn); a 503
    with no worker at all, a 404 naming ``api`` when none of them does."""
    workers = service.router.pool.workers()
    if not workers:
        raise unavailable(f"no workers serve {service.model_name} now; retry after the Retry-After seconds")
    feature = pooling_feature(task)
    able = [w for w in workers if feature in w.record.features and w.client.healthy]
    if not able:
        if feature == FEATURE_CLASSIFY:
            what = "it is not a classification model (serve one with --runner pooling)"
        elif any(FEATURE_CLASSIFY in w.record.features for w in workers):
            what = (
                "it is a classification model: send its inputs to /classify (or to /pooling with "
                "the classify or token_classify task)"
            )
        else:
            what = (
                "its workers only generate. Start workers that embed: dyn worker vllm --runner "
                "pooling (or dyn worker mocker --runner pooling, or dyn serve --runner pooling)."
            )
        raise ApiError(
            404,
            f"The model '{service.model_name}' does not support the {api} API: {what}",
            param="model",
            code=f"{api.lower()}_not_supported",
        )
    start = next(_turn) % len(able)
    turned = able[start:] + able[:start]
    return sorted(turned, key=lambda w: w.client.in_flight)


async def embed(
    service: OpenAIService,
    prompts: list[list[int]],
    api: str,
    task: PoolingTask = "embed",
    activation: bool = True,
    rows: list[int] | None = None,
) -> list[list[float]]:
    """One vector per prompt for ``task`` (an embedding, or a classifier's class probabilities;
    for a token task, rows end to end: one per token, or ``rows[i]`` for prompt i of a model
    that embeds only some tokens; without ``activation``, vLLM's
    ``use_activation: false``: not normalized, the logits), from
    the least busy worker that pools so (see the module docstring); ``api`` names the API in the
    404 for a model whose workers do not."""
    failures: list[str] = []
    for worker in _embedders(service, api, task):
        request = EmbedRequest(f"embed-{next(_ids):x}", prompts, task, activation)
        try:
            reply: EmbedReply = await worker.client.embed(request, EMBED_TIMEOUT_S)
        except WorkerUnavailable as exc:
            log.warning("embedding on worker %d failed, trying another: %s", worker.instance_id, exc)
            failures.append(str(exc))
            continue
        except TimeoutError:
            raise unavailable(
                f"worker {worker.instance_id} did not answer within {EMBED_TIMEOUT_S:g} s"
            ) from None
        except RemoteError as exc:
            if exc.code == "bad_request":
                raise bad_request(exc.reply.message) from None
            raise ApiError(500, f"engine error: {exc.reply.message}", code=exc.code) from None
        if len(reply.embeddings) != len(prompts):
            raise ApiError(
                500, f"the worker returned {len(reply.embeddings)} vectors for {len(prompts)} inputs"
            )
        if task in TOKEN_TASKS:
            counts = rows if rows is not None else [len(ids) for ids in prompts]
            for vector, count in zip(reply.embeddings, counts, strict=True):
                if not vector or len(vector) % count:
                    raise ApiError(500, f"the worker returned {len(vector)} values for {count} rows")
        return reply.embeddings
    raise unavailable(f"every worker that embeds failed: {'; '.join(failures)}")


class AdmittedJsonEndpoint(JsonEndpoint):
    """A ``JsonEndpoint`` counted under ``--max-inflight``, as the generating endpoints are."""

    async def serve(self, app: FrontendApp, call: Call) -> None:
        with app.admit():
            await super().serve(app, call)
