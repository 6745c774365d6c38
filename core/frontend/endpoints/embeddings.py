"""``POST /v1/embeddings`` (OpenAI's embeddings endpoint as vLLM serves it), ``POST /pooling``
(vLLM's pooling endpoint, the same inputs answered as ``pooling`` objects) and ``POST /classify``
(vLLM's, on a classification model: each input's class probabilities, the likeliest class's name
from the model's ``id2label``); the shapes are in ``dyn.core.protocol.embeddings``.

Inputs are tokenized here (text as a completion prompt, ``messages`` through the frontend's
chat template path exactly as ``/tokenize`` renders them), bounded and embedded by one worker as
``dyn.core.frontend.pooling`` says. ``/pooling`` pools with the request's ``task``, by default the
model's own (``classify`` on a classification model; ``token_embed`` on a late-interaction
(ColBERT) model and ``token_classify`` on a token classifier, which pool per token only and
answer neither ``/v1/embeddings`` nor ``/classify``; else ``embed``): ``embed`` and ``classify``
answer one vector per input, ``token_embed`` and ``token_classify`` one row per token of each
input (its embedding, or its class probabilities), bounded by ``--max-response-bytes`` before
the worker is asked (the rows' floats in ``float`` format; all of them in one base64 string, as
vLLM encodes a tensor). Any other ``task`` is a 400 that names the four. On a listwise ranker
(jina-reranker-v3) ``/pooling`` reads its texts as vLLM does, the documents then the query, in one
ranking prompt, and answers one row per document and the query's last
(``dyn.core.frontend.listwise``).
``use_activation: false`` answers the pooler's output before its activation, as vLLM does: an
embedding not normalized, the classes' logits in place of their probabilities.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dyn.core.frontend import listwise, pooling
from dyn.core.frontend.endpoints.generate import warn_ignored
from dyn.core.messages import POOLING_TASKS, TOKEN_TASKS, PoolingTask
from dyn.core.model.pooler import listwise_ranker, per_token_task, vector_width
from dyn.core.protocol.embeddings import (
    ClassificationResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    PoolingRequest,
    PoolingResponse,
    classification_response,
    embedding_inputs,
    embedding_request,
    embedding_response,
    pooling_response,
)
from dyn.core.protocol.errors import ApiError, bad_request
from dyn.core.protocol.openai import ChatCompletionRequest, check_chat

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp
    from dyn.core.frontend.preprocessor import Preprocessor
    from dyn.core.frontend.service import OpenAIService


REMOVED_TASKS = {
    "score": "The score task was removed from vLLM's pooling tasks; use classify instead.",
    "encode": "The encode task was removed from vLLM's pooling tasks; use token_embed or token_classify instead.",
}
"""vLLM's word for the pooling task names it no longer takes."""


def _per_token_refusal(service: OpenAIService, api: str) -> ApiError | None:
    """For a model that pools per token only (``per_token_task``), the 404 of an API that answers
    one vector per input, as vLLM serves no such route for it; else None."""
    info = service.preprocessor.info
    task = per_token_task(info)
    if task is None:
        return None
    kind = (
        "token classification"
        if task == "token_classify"
        else "listwise ranking"
        if listwise_ranker(info)
        else "late-interaction (ColBERT)"
    )
    return ApiError(
        404,
        f"The model '{service.model_name}' does not support the {api} API: it is a {kind} model, "
        f"which pools per token: send its inputs to /pooling with the {task} task"
        + (", or score pairs with /score or /rerank" if task == "token_embed" else ""),
        param="model",
        code=f"{api.lower()}_not_supported",
    )


async def _embeddings(app: FrontendApp, body: bytes) -> EmbeddingResponse:
    req = embedding_request(body, EmbeddingRequest)
    warn_ignored(body, EmbeddingRequest, "to /v1/embeddings")
    service = app.models.resolve(req.model)
    if refused := _per_token_refusal(service, "Embeddings"):
        raise refused
    vectors, tokens, _ = await _vectors(service, req, "Embeddings")
    return embedding_response(service.model_name, vectors, tokens, req.encoding_format, req.endianness)


async def _pooling(app: FrontendApp, body: bytes) -> PoolingResponse:
    req = embedding_request(body, PoolingRequest)
    warn_ignored(body, PoolingRequest, "to /pooling")
    service = app.models.resolve(req.model)
    task = _pooling_task(req.task, service)
    rows: list[int] | None
    if listwise_ranker(service.preprocessor.info):
        vectors, tokens, rows = await _ranked(service, req, task)
    else:
        vectors, tokens, lengths = await _vectors(service, req, "Pooling", task)
        rows = lengths if task in TOKEN_TASKS else None
    return pooling_response(service.model_name, vectors, tokens, req.encoding_format, req.endianness, rows)


def _pooling_task(task: str | None, service: OpenAIService) -> PoolingTask:
    """The request's pooling task, by default the model's own as vLLM picks it (a per-token
    model's token task, else a classifier classifies and any other model embeds); a 400 for a
    task the model cannot take or any other name, with vLLM's word for the tasks it removed."""
    info = service.preprocessor.info
    own = per_token_task(info)
    if task is None:
        return own or ("classify" if pooling.model_classes(info) is not None else "embed")
    if own is not None and task in ("embed", "classify"):
        raise bad_request(
            f"'{service.model_name}' pools per token only: send the {own} task, or leave it out",
            param="task",
        )
    if task in POOLING_TASKS:
        return task
    removed = REMOVED_TASKS.get(task, f"task {task!r} is not a pooling task.")
    raise bad_request(
        f"{removed} Send one of {', '.join(POOLING_TASKS)} (embed and token_embed on an embedding "
        "model, classify and token_classify on a classifier), or leave it out for the model's own.",
        param="task",
    )


async def _ranked(
    service: OpenAIService, req: EmbeddingRequest, task: PoolingTask
) -> tuple[list[list[float]], int, list[int]]:
    """``/pooling`` on a listwise ranker, as vLLM's: ``input`` is the documents, then the query
    (two texts at least), read as one ranking prompt (``dyn.core.frontend.listwise``) whose rows
    are the documents' embeddings and the query's last; the rows, the tokens, the row count."""
    if task != "token_embed":
        raise bad_request(
            f"'{service.model_name}' is a listwise ranker: it pools with token_embed only", param="task"
        )
    items = embedding_inputs(req) if req.messages is None else []
    if len(items) < 2 or not isinstance(items[0], str):
        raise bad_request(
            f"'{service.model_name}' is a listwise ranker: send input as a list of texts, the "
            "documents and then the query (two at least), or score them with /rerank",
            param="messages" if req.messages is not None else "input",
        )
    pooling.check_model(service)
    preprocessor = service.preprocessor
    pooling.check_texts(items, preprocessor, "input")
    text = listwise.ranking_prompt(items[-1], items[:-1])
    prompts, tokens = await pooling.tokenize_ranked(
        preprocessor, [text], [len(items) - 1], req.truncate_prompt_tokens, req.truncation_side, "input"
    )
    rows = [len(items)]
    vectors = await pooling.embed(service, prompts, "Pooling", task, req.use_activation is not False, rows)
    return vectors, tokens, rows


async def _classify(app: FrontendApp, body: bytes) -> ClassificationResponse:
    req = embedding_request(body, EmbeddingRequest)
    warn_ignored(body, EmbeddingRequest, "to /classify")
    service = app.models.resolve(req.model)
    if refused := _per_token_refusal(service, "Classification"):
        raise refused
    probabilities, tokens, _ = await _vectors(service, req, "Classification", "classify")
    labels = pooling.model_classes(service.preprocessor.info) or []
    return classification_response(service.model_name, probabilities, labels, tokens)


async def _vectors(
    service: OpenAIService, req: EmbeddingRequest, api: str, task: PoolingTask = "embed"
) -> tuple[list[list[float]], int, list[int]]:
    """The request's inputs pooled with ``task`` (with the pooler's activation unless
    ``use_activation`` is false), the number of tokens they held, and each one's length. A
    token task's rows are bounded by ``--max-response-bytes`` before they are asked for."""
    pooling.check_model(service)
    preprocessor = service.preprocessor
    prompts = await _tokenized(preprocessor, req)
    if task in TOKEN_TASKS:
        width = vector_width(preprocessor.info, task)
        pooling.check_token_rows(
            sum(map(len, prompts)), width, preprocessor, "messages" if req.messages else "input"
        )
    vectors = await pooling.embed(service, prompts, api, task, req.use_activation is not False)
    lengths = [len(p) for p in prompts]
    return vectors, sum(lengths), lengths


async def _tokenized(preprocessor: Preprocessor, req: EmbeddingRequest) -> list[list[int]]:
    """Every input as token ids, truncated and bounded (see ``dyn.core.frontend.pooling``)."""
    info = preprocessor.info
    if req.messages is not None:
        chat = ChatCompletionRequest(
            messages=req.messages,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            add_special_tokens=bool(req.add_special_tokens),
            chat_template=req.chat_template,
            chat_template_kwargs=req.chat_template_kwargs,
            tools=req.tools,
            documents=req.documents,
        )
        check_chat(chat)
        prompts = [await preprocessor.tokenize_chat_async(chat)]
        param = "messages"
    else:
        items = embedding_inputs(req)
        param = "input"
        if isinstance(items[0], str):
            special = req.add_special_tokens is not False
            prompts = await pooling.tokenize_texts(preprocessor, items, special, param)
        else:
            prompts = items
            pooling.check_count(len(prompts), preprocessor, param)
            pooling.check_vocab(prompts, info.vocab_size)
    prompts = pooling.truncated(prompts, req.truncate_prompt_tokens, req.truncation_side, info.context_length)
    pooling.check_lengths(prompts, info.context_length, param)
    return prompts


ENDPOINT = pooling.AdmittedJsonEndpoint("/v1/embeddings", _embeddings)
POOLING = pooling.AdmittedJsonEndpoint("/pooling", _pooling)
CLASSIFY = pooling.AdmittedJsonEndpoint("/classify", _classify)
