"""The OpenAPI 3.1 document served at ``GET /openapi.json``, generated from the protocol types
(``msgspec.json.schema_components``) so it cannot drift from what the server decodes.

The types carry the shapes and the integer ranges the wire takes; ``VALUE_RULES`` adds the value
rules ``check_generation`` / ``check_chat`` / ``check_completion`` apply after decoding (ranges,
at least one message with a role, a non-empty prompt, the served model's name, the parameters
refused as not supported yet), so a client or a fuzzer that follows the document sends requests
the server accepts. ``/tokenize`` takes one of its two request shapes (``oneOf``), ``/detokenize``
token ids in the vocabulary, at most the context length of them, ``/v1/embeddings`` ``input`` or
``messages`` (``oneOf``: ``EmbeddingInputRequest``, ``EmbeddingChatRequest``).
The Responses and Messages APIs add their parts (``dyn.core.frontend.apis.*.openapi``).
``tests/reliability/test_schemathesis.py`` fuzzes the server from it.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec

import dyn.core
from dyn.core.frontend.apis.anthropic.openapi import openapi_paths as anthropic_paths
from dyn.core.frontend.apis.files.openapi import openapi_paths as files_paths
from dyn.core.frontend.apis.responses.openapi import openapi_paths as responses_paths
from dyn.core.frontend.beam_search import MAX_BEAM_STEP_REQUESTS
from dyn.core.protocol.embeddings import (
    ClassificationResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    PoolingResponse,
)
from dyn.core.protocol.errors import ErrorResponse
from dyn.core.protocol.openai import (
    DEFAULT_MAX_LOGPROBS,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelList,
)
from dyn.core.protocol.scoring import (
    SCORE_PAIRS,
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
)
from dyn.core.protocol.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
)

_REF = "#/components/schemas/{name}"

_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {
            "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}, {"type": "null"}]
        },
    },
}
_NOT_SUPPORTED = "Not supported by this server yet: a request that sets it is refused with a 400."


def value_rules(max_logprobs: int = DEFAULT_MAX_LOGPROBS) -> dict[str, dict[str, dict[str, Any]]]:
    """Per request schema, per field: JSON Schema keywords for the field's non-null form."""
    logprobs: dict[str, Any] = {"minimum": 0, "maximum": max_logprobs}
    shared: dict[str, dict[str, Any]] = {
        "n": {"minimum": 1, "maximum": 128},
        "max_tokens": {"minimum": 1},
        "temperature": {"minimum": 0, "maximum": 2},
        "top_p": {"exclusiveMinimum": 0, "maximum": 1},
        "top_k": {"minimum": -1},
        "min_p": {"minimum": 0, "maximum": 1},
        "repetition_penalty": {"exclusiveMinimum": 0, "maximum": 2},
        "presence_penalty": {"minimum": -2, "maximum": 2},
        "frequency_penalty": {"minimum": -2, "maximum": 2},
        "min_tokens": {"minimum": 0},
        "truncate_prompt_tokens": {"minimum": 1},
        "prompt_logprobs": logprobs,
        "use_beam_search": {
            "description": f"n beams, run by the frontend: n * max_tokens at most {MAX_BEAM_STEP_REQUESTS}, "
            "2n at most the server's --max-logprobs, not with a structured output."
        },
        "logit_bias": {
            "propertyNames": {"pattern": "^(0|[1-9][0-9]{0,9})$"},
            "description": "Token id -> bias added to its logit; a bias beyond +-100 is clamped to it.",
        },
        "allowed_token_ids": {"minItems": 1, "items": {"minimum": 0}},
        "guided_decoding_backend": {
            "enum": ["auto"],
            "description": "Only 'auto': the worker's engine chooses its structured-output backend.",
        },
    }
    return {
        "ChatCompletionRequest": {
            **shared,
            "messages": {"minItems": 1, "items": _MESSAGE},
            "max_completion_tokens": {"minimum": 1},
            "top_logprobs": {**logprobs, "description": "Needs logprobs=true."},
        },
        "CompletionRequest": {
            **shared,
            "logprobs": logprobs,
        },
    }


_NULL_ONLY = ("suffix",)


def _prompt(vocab_size: int | None) -> dict[str, Any]:
    """``check_completion``'s prompt shapes: text, token ids, or a batch of either."""
    token: dict[str, Any] = {"type": "integer", "minimum": 0}
    if vocab_size is not None:
        token["maximum"] = vocab_size - 1
    ids = {"type": "array", "minItems": 1, "items": token}
    return {
        "anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "minItems": 1, "items": {"type": "string"}},
            ids,
            {"type": "array", "minItems": 1, "items": ids},
        ],
        "description": "Text, token ids, or a batch of either (not mixed)",
    }


def _tighten(schema: dict[str, Any], rules: dict[str, Any]) -> None:
    """Add ``rules`` to the non-null form(s) of a property schema (``anyOf [T, null]`` or ``T``);
    keywords that do not apply to a form's type are harmless in JSON Schema and kept out anyway."""
    forms = [f for f in schema.get("anyOf", [schema]) if f.get("type") != "null"]
    for form in forms:
        kind = form.get("type")
        for keyword, value in rules.items():
            if keyword in ("minLength", "maxLength") and kind != "string":
                continue
            if keyword in ("minItems", "maxItems", "items") and kind != "array":
                continue
            if keyword in ("maxProperties", "propertyNames") and kind != "object":
                continue
            form[keyword] = copy.deepcopy(value)


def _post(summary: str, request: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """A JSON-in, JSON-out operation (``/tokenize``, ``/detokenize``)."""
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, **_json(request)},
            "responses": {"200": {"description": "OK", **_json(response)}, **_errors()},
        }
    }


def _tokenize_rules(
    components: dict[str, Any], model: str | None, context_length: int | None, vocab_size: int | None
) -> None:
    """The value rules of the tokenize requests: the served model's name, at least one message
    (with a role), token ids in the vocabulary and at most the context length of them."""
    for name in ("TokenizeCompletionRequest", "TokenizeChatRequest", "DetokenizeRequest"):
        properties = components[name]["properties"]
        if model is not None:
            _tighten(properties["model"], {"enum": [model]})
    _tighten(components["TokenizeChatRequest"]["properties"]["messages"], {"minItems": 1, "items": _MESSAGE})
    token: dict[str, Any] = {"type": "integer", "minimum": 0}
    if vocab_size is not None:
        token["maximum"] = vocab_size - 1
    ids: dict[str, Any] = {"items": token}
    if context_length is not None:
        ids["maxItems"] = context_length
    _tighten(components["DetokenizeRequest"]["properties"]["tokens"], ids)


def _scoring_requests(
    components: dict[str, Any], model: str | None, context_length: int | None
) -> dict[str, Any]:
    """The score and rerank requests with their value rules: texts as strings (one or a
    non-empty list), the served model's name, token limits below the context length; the score
    request as the ``oneOf`` of its four spellings of the pair (``dyn.core.protocol.scoring``).
    Returns the score request's schema."""
    text = {"type": "string"}
    texts = {"anyOf": [text, {"type": "array", "minItems": 1, "items": text}]}
    for name in ("ScoreRequest", "RerankRequest"):
        properties = components[name]["properties"]
        if model is not None:
            _tighten(properties["model"], {"enum": [model]})
        truncate: dict[str, Any] = {"minimum": 1}
        if context_length is not None:
            truncate["maximum"] = context_length
            for field in ("max_tokens_per_query", "max_tokens_per_doc"):
                _tighten(properties[field], {"maximum": context_length - 1})
        _tighten(properties["truncate_prompt_tokens"], truncate)
    rerank = components["RerankRequest"]
    rerank["properties"].update(query=text, documents=texts)
    rerank["required"] = ["query", "documents"]
    base = components.pop("ScoreRequest")
    every = {name for pair in SCORE_PAIRS for name in pair}
    shared = {k: v for k, v in base["properties"].items() if k not in every}
    shapes = []
    for first, second in SCORE_PAIRS:
        shape = f"Score{first.title().replace('_', '')}{second.title().replace('_', '')}Request"
        components[shape] = {
            **base,
            "title": shape,
            "properties": {**shared, first: texts, second: texts},
            "required": [first, second],
        }
        shapes.append({"$ref": _REF.format(name=shape)})
    return {"oneOf": shapes}


def _embedding_requests(
    components: dict[str, Any], model: str | None, context_length: int | None, vocab_size: int | None
) -> dict[str, Any]:
    """``EmbeddingRequest`` as its two shapes (``input`` or ``messages``, never both), with the
    value rules ``dyn.core.protocol.embeddings`` applies; returns the ``oneOf`` of the two."""
    base = components.pop("EmbeddingRequest")
    properties = base["properties"]
    if model is not None:
        _tighten(properties["model"], {"enum": [model]})
    properties["dimensions"] = {
        "type": "null",
        "default": None,
        "description": "No model dyn serves declares Matryoshka embeddings: a request that sets it is "
        "refused with a 400.",
    }
    truncate: dict[str, Any] = {"minimum": 1}
    if context_length is not None:
        truncate["maximum"] = context_length
    _tighten(properties["truncate_prompt_tokens"], truncate)
    token: dict[str, Any] = {"type": "integer", "minimum": 0}
    if vocab_size is not None:
        token["maximum"] = vocab_size - 1
    ids: dict[str, Any] = {"type": "array", "minItems": 1, "items": token}
    if context_length is not None:
        ids["maxItems"] = context_length
    text = {"type": "string", "minLength": 1}
    chat_only = (
        "add_generation_prompt",
        "continue_final_message",
        "chat_template",
        "chat_template_kwargs",
        "tools",
        "documents",
    )
    plain = {k: v for k, v in properties.items() if k not in ("messages", *chat_only)}
    plain["input"] = {
        "anyOf": [
            text,
            {"type": "array", "minItems": 1, "items": text},
            ids,
            {"type": "array", "minItems": 1, "items": ids},
        ],
        "description": "Text, token ids, or a batch of either (not mixed)",
    }
    chat = {k: v for k, v in properties.items() if k != "input"}
    chat["messages"] = {"type": "array", "minItems": 1, "items": _MESSAGE}
    components["EmbeddingInputRequest"] = {
        **base,
        "properties": plain,
        "required": ["input"],
        "title": "EmbeddingInputRequest",
    }
    components["EmbeddingChatRequest"] = {
        **base,
        "properties": chat,
        "required": ["messages"],
        "title": "EmbeddingChatRequest",
    }
    return {
        "oneOf": [{"$ref": _REF.format(name=n)} for n in ("EmbeddingInputRequest", "EmbeddingChatRequest")]
    }


def _json(ref: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": ref}}}


def _errors() -> dict[str, Any]:
    ref = {"$ref": _REF.format(name="ErrorResponse")}
    return {
        str(code): {"description": text, **_json(ref)}
        for code, text in (
            (400, "Invalid request"),
            (401, "Missing or wrong API key"),
            (404, "Unknown model or worker"),
            (415, "The body is not application/json"),
            (503, "No worker available, or the frontend is at --max-inflight; retry after Retry-After"),
        )
    }


def _generate(summary: str, request: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    stream = {
        "text/event-stream": {
            "schema": {
                "type": "string",
                "description": "SSE 'data:' events of chunk objects, then 'data: [DONE]'",
            }
        }
    }
    return {
        "post": {
            "summary": summary,
            "parameters": [
                {
                    "name": "x-request-id",
                    "in": "header",
                    "required": False,
                    "schema": {"type": "string", "pattern": "^[!-~]{1,256}$"},
                    "description": "Request id (1 to 256 visible ASCII characters), echoed on the response",
                },
                {
                    "name": "x-worker-instance-id",
                    "in": "header",
                    "required": False,
                    "schema": {"type": "integer", "minimum": 0},
                    "description": "Route to this worker instance",
                },
            ],
            "requestBody": {"required": True, **_json(request)},
            "responses": {
                "200": {
                    "description": "Completion (JSON), or SSE when stream=true",
                    "content": {**_json(response)["content"], **stream},
                },
                **_errors(),
            },
        }
    }


def openapi_document(
    model: str | None = None,
    *,
    context_length: int | None = None,
    vocab_size: int | None = None,
    max_logprobs: int = DEFAULT_MAX_LOGPROBS,
) -> dict[str, Any]:
    """The document; with ``model`` the requests' ``model`` is that name (or omitted), with
    ``context_length`` ``max_tokens`` is at most that, with ``vocab_size`` token ids are below it."""
    schemas, components = msgspec.json.schema_components(
        [
            ChatCompletionRequest,
            ChatCompletionResponse,
            CompletionRequest,
            CompletionResponse,
            ModelList,
            ErrorResponse,
            TokenizeCompletionRequest,
            TokenizeChatRequest,
            TokenizeResponse,
            DetokenizeRequest,
            DetokenizeResponse,
            EmbeddingRequest,
            EmbeddingResponse,
            PoolingResponse,
            ClassificationResponse,
            ScoreRequest,
            ScoreResponse,
            RerankRequest,
            RerankResponse,
        ],
        ref_template=_REF,
    )
    chat_req, chat_resp, cmpl_req, cmpl_resp, models, error = schemas[:6]
    tok_text, tok_chat, tok_resp, detok_req, detok_resp = schemas[6:11]
    embed_resp, pool_resp, classify_resp, _, score_resp, rerank_req, rerank_resp = schemas[12:19]
    embed_req = _embedding_requests(components, model, context_length, vocab_size)
    score_req = _scoring_requests(components, model, context_length)
    _tokenize_rules(components, model, context_length, vocab_size)
    for name, rules in value_rules(max_logprobs).items():
        properties = components[name]["properties"]
        if model is not None:
            rules = {**rules, "model": {"enum": [model]}}
        if context_length is not None:
            for field in ("max_tokens", "max_completion_tokens"):
                if field in properties:
                    rules = {**rules, field: {**rules[field], "maximum": context_length}}
        if vocab_size is not None:
            token = {"type": "integer", "minimum": 0, "maximum": vocab_size - 1}
            rules = {
                **rules,
                "stop_token_ids": {"items": token},
                "allowed_token_ids": {"minItems": 1, "items": token},
            }
        for field, keywords in rules.items():
            _tighten(properties[field], keywords)
        for field in _NULL_ONLY:
            if field in properties:
                properties[field] = {"type": "null", "default": None, "description": _NOT_SUPPORTED}
        if "prompt" in properties:
            properties["prompt"] = _prompt(vocab_size)
    if vocab_size is not None:
        _tighten(
            components["NvExt"]["properties"]["token_data"],
            {"minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": vocab_size - 1}},
        )
    plain = {"200": {"description": "OK"}}
    responses, responses_schemas = responses_paths(model)
    messages, messages_schemas = anthropic_paths(model)
    files, files_schemas = files_paths()
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "dyn frontend",
            "version": dyn.core.__version__,
            "description": "OpenAI-compatible API with vLLM's extra parameters and nvext.",
        },
        "paths": {
            "/v1/chat/completions": _generate("Chat completion", chat_req, chat_resp),
            "/v1/completions": _generate("Text completion", cmpl_req, cmpl_resp),
            **responses,
            **messages,
            **files,
            "/v1/models": {
                "get": {
                    "summary": "Served models",
                    "responses": {"200": {"description": "Models", **_json(models)}},
                }
            },
            "/tokenize": _post(
                "Token ids of a text prompt, or of chat messages rendered as a chat completion renders them",
                {"oneOf": [tok_text, tok_chat]},
                tok_resp,
            ),
            "/detokenize": _post("Text of token ids (special tokens kept)", detok_req, detok_resp),
            "/tokenizer_info": {
                "get": {
                    "summary": "The tokenizer's configuration (with --enable-tokenizer-info-endpoint)",
                    "responses": {"200": {"description": "Its tokenizer_config.json, as vLLM answers it"}},
                }
            },
            "/v1/embeddings": _post(
                "Embeddings of text, token ids or one chat conversation (workers that embed)",
                embed_req,
                embed_resp,
            ),
            "/pooling": _post(
                "vLLM's pooling: the embeddings request with a task (embed, classify, token_embed, "
                "token_classify; by default the model's own), answered as pooling objects",
                embed_req,
                pool_resp,
            ),
            "/classify": _post(
                "Each input's class probabilities and the likeliest class's name (workers serving "
                "a classification model)",
                embed_req,
                classify_resp,
            ),
            **dict.fromkeys(
                ("/score", "/v1/score"),
                _post(
                    "Each query's score against each document, 1:N or N:N: the cosine of their "
                    "embeddings, a ColBERT model's MaxSim, or a cross-encoder's probability",
                    score_req,
                    score_resp,
                ),
            ),
            **dict.fromkeys(
                ("/rerank", "/v1/rerank", "/v2/rerank"),
                _post(
                    "Documents ordered by their score against the query (as /score scores "
                    "them), the best first",
                    rerank_req,
                    rerank_resp,
                ),
            ),
            "/health": {
                "get": {
                    "summary": "200 when requests can be served (healthy or degraded), 503 with the "
                    "reason when none can",
                    "responses": plain,
                }
            },
            "/live": {"get": {"summary": "The process is up", "responses": plain}},
            "/metrics": {"get": {"summary": "Prometheus text format", "responses": plain}},
        },
        "components": {
            "schemas": {
                **components,
                "ErrorResponse": components.get("ErrorResponse", error),
                **responses_schemas,
                **messages_schemas,
                **files_schemas,
            }
        },
    }
