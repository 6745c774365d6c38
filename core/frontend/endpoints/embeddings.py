"""``POST /v1/embeddings``: OpenAI's embeddings endpoint as vLLM serves it (the shapes are in
``dyn.core.protocol.embeddings``).

Inputs are tokenized here (text as a completion prompt, ``messages`` through the frontend's
chat template path exactly as ``/tokenize`` renders them) and bounded before any worker sees
them: at most ``--max-prompts`` inputs and ``--max-prompt-bytes`` of text, every token id in the
vocabulary, each input at most the context length after ``truncate_prompt_tokens``, and at most
``MAX_EMBED_TOKENS`` tokens in all (400s that say what to fix). The request counts under
``--max-inflight`` as a generation does, since it costs the engine a prefill.

All inputs go in one ``EmbedRequest`` to one worker that lists ``embed`` in its features,
the least busy (fewest requests in flight on its client; ties in turn): pooling has no decode and
reuses no KV across requests that the frontend could exploit, so it is not KV-routed. A worker
that fails before answering is replaced by the next one. No worker at all is a 503 (as for
generation); live workers none of which embed is a 404, as vLLM answers when the served model is
not an embedding model (it does not register the route then).
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING

from dyn.core.engine import FEATURE_EMBED
from dyn.core.frontend import limits as bounds
from dyn.core.frontend.endpoints.base import Call
from dyn.core.frontend.endpoints.generate import warn_ignored
from dyn.core.frontend.endpoints.json_post import JsonEndpoint
from dyn.core.messages import EmbedReply, EmbedRequest
from dyn.core.protocol.embeddings import (
    MAX_EMBED_TOKENS,
    EmbeddingRequest,
    EmbeddingResponse,
    embedding_inputs,
    embedding_request,
    embedding_response,
)
from dyn.core.protocol.errors import ApiError, bad_request, unavailable
from dyn.core.protocol.openai import ChatCompletionRequest, check_chat
from dyn.core.router.pool import Worker
from dyn.core.transport.request_plane import RemoteError, WorkerUnavailable

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp
    from dyn.core.frontend.preprocessor import Preprocessor
    from dyn.core.frontend.service import OpenAIService

log = logging.getLogger(__name__)

EMBED_TIMEOUT_S = 300.0
"""Longest the frontend waits for a worker's vectors (a silence timeout, when set, ends it sooner)."""
_turn = itertools.count()
_ids = itertools.count()


async def _embeddings(app: FrontendApp, body: bytes) -> EmbeddingResponse:
    req = embedding_request(body)
    warn_ignored(body, EmbeddingRequest, "to /v1/embeddings")
    service = app.models.resolve(req.model)
    if service.lora_name is not None:
        raise bad_request(
            f"'{service.model_name}' is a LoRA adapter: embed with its base model instead", param="model"
        )
    prompts = await _tokenized(service.preprocessor, req)
    reply = await _embed(service, prompts)
    if len(reply.embeddings) != len(prompts):
        raise ApiError(500, f"the worker returned {len(reply.embeddings)} vectors for {len(prompts)} inputs")
    tokens = sum(len(p) for p in prompts)
    return embedding_response(
        service.model_name, reply.embeddings, tokens, req.encoding_format, req.endianness
    )


async def _tokenized(preprocessor: Preprocessor, req: EmbeddingRequest) -> list[list[int]]:
    """Every input as token ids, truncated and bounded (see the module docstring)."""
    info, limits = preprocessor.info, preprocessor.limits
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
        if len(items) > limits.max_prompts:
            raise bad_request(
                f"input holds {len(items)} inputs; this server embeds at most {limits.max_prompts} "
                "per request (raise it with --max-prompts, or split the request)",
                param="input",
            )
        if isinstance(items[0], str):
            texts: list[str] = items
            if bounds.json_size(texts, preprocessor.prompt_bytes) > preprocessor.prompt_bytes:
                raise bad_request(
                    f"the input text of this request is more than {preprocessor.prompt_bytes} bytes, "
                    "the most this server accepts (raise it with --max-prompt-bytes, or split the request)",
                    param="input",
                )
            special = req.add_special_tokens is not False
            prompts = [await preprocessor.tokenize_text_async(t, special) for t in texts]
        else:
            prompts = items
            _check_vocab(prompts, info.vocab_size)
        param = "input"
    prompts = _truncated(prompts, req, info.context_length)
    total = 0
    for i, ids in enumerate(prompts):
        where = param if len(prompts) == 1 else f"{param}[{i}]"
        if not ids:
            raise bad_request(f"{where} is empty after tokenization; send some text", param=where)
        if len(ids) > info.context_length:
            raise bad_request(
                f"This model's maximum context length is {info.context_length} tokens. However, "
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
    return prompts


def _check_vocab(prompts: list[list[int]], vocab_size: int) -> None:
    for i, ids in enumerate(prompts):
        for j, token in enumerate(ids):
            if not 0 <= token < vocab_size:
                where = f"input[{i}][{j}]" if len(prompts) > 1 else f"input[{j}]"
                raise bad_request(
                    f"{where} is {token}, not in the vocabulary: token ids must be in [0, {vocab_size})",
                    param=where,
                )


def _truncated(prompts: list[list[int]], req: EmbeddingRequest, context_length: int) -> list[list[int]]:
    keep = req.truncate_prompt_tokens
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
    if req.truncation_side == "right":
        return [ids[:keep] for ids in prompts]
    return [ids[-keep:] if len(ids) > keep else ids for ids in prompts]


def _embedders(service: OpenAIService) -> list[Worker]:
    """The model's live workers that embed, least busy first (ties in turn); a 503 with no worker
    at all, a 404 when none of them embeds."""
    workers = service.router.pool.workers()
    if not workers:
        raise unavailable(f"no workers serve {service.model_name} now; retry after the Retry-After seconds")
    able = [w for w in workers if FEATURE_EMBED in w.record.features and w.client.healthy]
    if not able:
        raise ApiError(
            404,
            f"The model '{service.model_name}' does not support the Embeddings API: its workers "
            "only generate. Start workers that embed: dyn worker vllm --runner pooling (or dyn "
            "worker mocker --runner pooling, or dyn serve --runner pooling).",
            param="model",
            code="embeddings_not_supported",
        )
    start = next(_turn) % len(able)
    turned = able[start:] + able[:start]
    return sorted(turned, key=lambda w: w.client.in_flight)


async def _embed(service: OpenAIService, prompts: list[list[int]]) -> EmbedReply:
    failures: list[str] = []
    for worker in _embedders(service):
        request = EmbedRequest(f"embed-{next(_ids):x}", prompts)
        try:
            return await worker.client.embed(request, EMBED_TIMEOUT_S)
        except WorkerUnavailable as exc:
            log.warning("embedding on worker %d failed, trying another: %s", worker.instance_id, exc)
            failures.append(str(exc))
        except TimeoutError:
            raise unavailable(
                f"worker {worker.instance_id} did not answer within {EMBED_TIMEOUT_S:g} s"
            ) from None
        except RemoteError as exc:
            if exc.code == "bad_request":
                raise bad_request(exc.reply.message) from None
            raise ApiError(500, f"engine error: {exc.reply.message}", code=exc.code) from None
    raise unavailable(f"every worker that embeds failed: {'; '.join(failures)}")


class _EmbeddingsEndpoint(JsonEndpoint):
    """A ``JsonEndpoint`` counted under ``--max-inflight``, as the generating endpoints are."""

    async def serve(self, app: FrontendApp, call: Call) -> None:
        with app.admit():
            await super().serve(app, call)


ENDPOINT = _EmbeddingsEndpoint("/v1/embeddings", _embeddings)
