"""``POST /v1/embeddings`` (OpenAI's embeddings endpoint as vLLM serves it), ``POST /pooling``
(vLLM's pooling endpoint, the same inputs answered as ``pooling`` objects) and ``POST /classify``
(vLLM's, on a classification model: each input's class probabilities, the likeliest class's name
from the model's ``id2label``); the shapes are in ``dyn.core.protocol.embeddings``.

Inputs are tokenized here (text as a completion prompt, ``messages`` through the frontend's
chat template path exactly as ``/tokenize`` renders them), bounded and embedded by one worker as
``dyn.core.frontend.pooling`` says. ``/pooling`` pools with the ``embed`` task (the default) or
``classify`` (a classification model's probabilities): any other ``task`` is a 400 that says so.
``use_activation: false`` answers the pooler's output before its activation, as vLLM does: an
embedding not normalized, the classes' logits in place of their probabilities.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dyn.core.frontend import pooling
from dyn.core.frontend.endpoints.generate import warn_ignored
from dyn.core.messages import PoolingTask
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
from dyn.core.protocol.errors import bad_request
from dyn.core.protocol.openai import ChatCompletionRequest, check_chat

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp
    from dyn.core.frontend.preprocessor import Preprocessor
    from dyn.core.frontend.service import OpenAIService


async def _embeddings(app: FrontendApp, body: bytes) -> EmbeddingResponse:
    req = embedding_request(body, EmbeddingRequest)
    warn_ignored(body, EmbeddingRequest, "to /v1/embeddings")
    service = app.models.resolve(req.model)
    vectors, tokens = await _vectors(service, req, "Embeddings")
    return embedding_response(service.model_name, vectors, tokens, req.encoding_format, req.endianness)


async def _pooling(app: FrontendApp, body: bytes) -> PoolingResponse:
    req = embedding_request(body, PoolingRequest)
    warn_ignored(body, PoolingRequest, "to /pooling")
    if req.task not in (None, "embed", "classify"):
        raise bad_request(
            f"task {req.task!r} is not served: dyn's pooling workers pool with the 'embed' task "
            "(one vector per input) and, on a classification model, 'classify'; send one of "
            "them or leave it out",
            param="task",
        )
    service = app.models.resolve(req.model)
    task: PoolingTask = "classify" if req.task == "classify" else "embed"
    vectors, tokens = await _vectors(service, req, "Pooling", task)
    return pooling_response(service.model_name, vectors, tokens, req.encoding_format, req.endianness)


async def _classify(app: FrontendApp, body: bytes) -> ClassificationResponse:
    req = embedding_request(body, EmbeddingRequest)
    warn_ignored(body, EmbeddingRequest, "to /classify")
    service = app.models.resolve(req.model)
    probabilities, tokens = await _vectors(service, req, "Classification", "classify")
    labels = pooling.model_classes(service.preprocessor.info) or []
    return classification_response(service.model_name, probabilities, labels, tokens)


async def _vectors(
    service: OpenAIService, req: EmbeddingRequest, api: str, task: PoolingTask = "embed"
) -> tuple[list[list[float]], int]:
    """The request's inputs pooled with ``task`` (with the pooler's activation unless
    ``use_activation`` is false), and the number of tokens they held."""
    pooling.check_model(service)
    prompts = await _tokenized(service.preprocessor, req)
    vectors = await pooling.embed(service, prompts, api, task, req.use_activation is not False)
    return vectors, sum(len(p) for p in prompts)


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
