"""``POST /v1/responses`` (``CREATE``); ``GET`` and ``DELETE /v1/responses/{id}``,
``GET /v1/responses/{id}/input_items`` and ``POST /v1/responses/{id}/cancel`` (``STORED``).

``CREATE`` is a ``GenerateEndpoint``: the request is adapted into a chat request (``adapter``),
continuing the stored conversation of its ``previous_response_id`` (unknown or evicted: a 404
naming the field), prepared by ``OpenAIService.prepare_chat`` and written by ``ResponsesWire``.
With ``truncation: "auto"`` a conversation over the context loses its oldest turns
(``truncation``); ``background: true`` answers at once and generates after (``background``);
``item_reference`` items are read from the store (``references``), ``input_file`` parts as
text (``files``).
Its ``prompt_cache_key`` is the request's session identity when no header gave one (and it is
one: ``session_identity.checked``). The app's ``ResponseStore`` (``FrontendApp.response_store``)
keeps what ``store`` asks to keep. Errors the chat path raises name the Responses request's
fields (``text.format``, ``max_output_tokens``, ``input``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING, Any

import msgspec

from dyn.core.asgi import JSON, respond
from dyn.core.frontend.apis.responses.adapter import ChatTurn, chat_request
from dyn.core.frontend.apis.responses.background import resume_point
from dyn.core.frontend.apis.responses.files import with_files_read
from dyn.core.frontend.apis.responses.input_items import input_items_page
from dyn.core.frontend.apis.responses.protocol import DeletedResponse, ResponsesRequest
from dyn.core.frontend.apis.responses.references import with_references_resolved
from dyn.core.frontend.apis.responses.truncation import prepare_truncated, too_long
from dyn.core.frontend.apis.responses.wire import ResponsesWire
from dyn.core.frontend.endpoints.base import Call, Endpoint
from dyn.core.frontend.endpoints.generate import GenerateEndpoint, send_events, until_disconnect
from dyn.core.frontend.generation import Generation, RequestContext
from dyn.core.frontend.service import OpenAIService
from dyn.core.frontend.session_identity import checked
from dyn.core.protocol.errors import ApiError, bad_request
from dyn.core.protocol.openai import ChatCompletionRequest

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp

log = logging.getLogger(__name__)

_CONVERSATION = msgspec.json.Decoder(list[Any])


async def prepare(
    app: FrontendApp, service: OpenAIService, req: ResponsesRequest, ctx: RequestContext
) -> Generation:
    """``req`` as a generation written by ``ResponsesWire`` (see the module docstring)."""
    store = app.response_store
    app.background_responses.check(req)
    history, history_json = None, b"[]"
    if req.previous_response_id is not None:
        if req.previous_response_id in app.background_responses:
            raise bad_request(
                f"previous response {req.previous_response_id[:256]} is still running in the "
                "background; continue it once GET /v1/responses/{id} says it has ended",
                param="previous_response_id",
            )
        stored = store.get(req.previous_response_id)
        if stored is None:
            raise ApiError(
                404,
                f"Previous response with id '{req.previous_response_id[:256]}' not found: it was never "
                "stored (store: false), was deleted, or expired or was evicted from this frontend's "
                "response store; send the whole conversation as input instead",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        history, history_json = _CONVERSATION.decode(stored.conversation), stored.conversation
    if isinstance(req.input, list):
        req.input = await with_files_read(
            with_references_resolved(req.input, store), service.media, app.file_store
        )
    turn = chat_request(req, history, history_json)
    _warn_dropped(turn, ctx.request_id)
    if ctx.session_id is None and req.prompt_cache_key:
        ctx.session_id = _session_id(req.prompt_cache_key)

    def prepare_chat(chat: ChatCompletionRequest) -> Awaitable[Generation]:
        return service.prepare_chat(
            chat, ctx, lambda gen: ResponsesWire(gen, req, turn, store), "responses", "Responses"
        )

    try:
        try:
            return await prepare_chat(turn.chat)
        except ApiError as exc:
            if req.truncation != "auto" or not too_long(exc):
                raise
            return await prepare_truncated(turn.chat, service.preprocessor, prepare_chat, exc, ctx.request_id)
    except ApiError as exc:
        raise _in_responses_terms(exc) from None


_CHAT_FIELDS = (
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("max_tokens", "max_output_tokens"),
    ("messages", "input"),
)
"""A chat request's field -> the Responses request's that it came from (prefixes)."""


def _in_responses_terms(exc: ApiError) -> ApiError:
    """``exc`` naming the field of the Responses request rather than the chat request's (a
    message's index is the chat message's, which need not be the input item's: only ``input``)."""
    param = exc.param
    for chat, ours in _CHAT_FIELDS:
        if param is not None and (param == chat or param.startswith((chat + ".", chat + "["))):
            exc.param = ours if chat == "messages" else ours + param[len(chat) :]
            if exc.message.startswith(param) and chat != "messages":
                exc.message = exc.param + exc.message[len(param) :]
            exc.args = (exc.message,)
            break
    return exc


def _session_id(prompt_cache_key: str) -> str | None:
    """The key as the request's session id; None when it cannot be one (OpenAI takes any string
    as a cache key: such a request runs without a session, never a 400)."""
    try:
        return checked(prompt_cache_key, "prompt_cache_key")
    except ApiError:
        return None


def _warn_dropped(turn: ChatTurn, request_id: str) -> None:
    if turn.dropped_tools:
        log.warning(
            "request %s: tools this server cannot run were ignored: %s",
            request_id,
            ", ".join(sorted(set(turn.dropped_tools))),
        )
    if turn.dropped_items:
        log.warning(
            "request %s: input items this server cannot use were dropped: %s",
            request_id,
            ", ".join(
                f"{kind} x{turn.dropped_items.count(kind)}" for kind in sorted(set(turn.dropped_items))
            ),
        )


class StoredEndpoint(Endpoint):
    """``GET /v1/responses/{id}``: the stored response (``?stream=true``: its events, those of a
    streamed background response, ``background``); ``DELETE``: forget it (cancelled first,
    if it runs in the background); ``GET /v1/responses/{id}/input_items``: its input items
    (``input_items``); ``POST /v1/responses/{id}/cancel``: stop it (``background``). 404 when
    the store does not hold it (never stored, deleted, expired or evicted)."""

    path = "/v1/responses/"
    methods = ("GET", "DELETE", "POST")
    prefix = True

    async def serve(self, app: FrontendApp, call: Call) -> None:
        response_id, _, rest = call.scope["path"].removeprefix(self.path).partition("/")
        store = app.response_store
        method = call.scope["method"]
        if (rest, method) not in (("", "GET"), ("", "DELETE"), ("input_items", "GET"), ("cancel", "POST")):
            raise ApiError(404, f"no route for {method} {call.scope['path'][:256]}; see /openapi.json")
        stored = store.get(response_id)
        if stored is None:
            raise _not_found(response_id)
        background = app.background_responses
        query = call.scope.get("query_string", b"")
        if rest == "" and method == "GET":
            starting_after = resume_point(query)
            if starting_after is not None:
                events = background.events(response_id, starting_after)
                await until_disconnect(send_events(call, call.extra, events), call)
                return
        if rest == "cancel":
            body = await background.cancel(response_id)
        elif rest == "input_items":
            body = input_items_page(stored, response_id, query)
        elif method == "DELETE":
            if response_id in background:
                await background.cancel(response_id)
            store.delete(response_id)
            background.forget(response_id)
            body = msgspec.json.encode(DeletedResponse(response_id))
        else:
            body = stored.body
        await respond(call.send, 200, body, call.extra + [JSON])


def _not_found(response_id: str) -> ApiError:
    return ApiError(
        404,
        f"Response with id '{response_id[:256]}' not found (never stored, deleted, or expired from "
        "this frontend's response store)",
        param="response_id",
        code="response_not_found",
    )


def _detach(app: FrontendApp, req: ResponsesRequest, gen: Generation) -> bytes | AsyncIterator[bytes] | None:
    """A background request's generation, started on its own (``background``)."""
    return app.background_responses.start(app, gen) if req.background else None


CREATE = GenerateEndpoint("/v1/responses", ResponsesRequest, prepare, _detach)
STORED = StoredEndpoint()
