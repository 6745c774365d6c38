"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API.

Both answer every error on their path in Anthropic's shape (``errors``), the app's own 401, 404,
413, 415 and 503 included. A Messages request is adapted into a chat request (``adapter``),
prepared by ``OpenAIService.prepare_chat`` like any chat completion (one validation, template,
tokenizer, routing) and written by ``MessagesWire``; its ``context_management`` edits apply to
its conversation first (``context_editing``), and both endpoints say what they cleared. PDF
documents are read into text before either (``documents``); for a chat template that refuses a
system message after the first turns, such messages are folded into user turns
(``adapter.fold_late_system``). ``count_tokens`` tokenizes the same chat
request as ``/tokenize`` does: its count is the prompt a Messages request with the same body
sends (``usage`` input + cache read + cache creation). The query (Claude Code's ``?beta=true``)
and the ``anthropic-version`` and ``anthropic-beta`` headers are accepted, whatever they hold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from dyn.core.frontend.apis.anthropic import errors
from dyn.core.frontend.apis.anthropic.adapter import FieldNames, adapt, fold_late_system
from dyn.core.frontend.apis.anthropic.context_editing import edited, edits_of
from dyn.core.frontend.apis.anthropic.documents import read_documents
from dyn.core.frontend.apis.anthropic.protocol import (
    ContextManagementResponse,
    CountTokensContextManagement,
    CountTokensRequest,
    CountTokensResponse,
    MessageParam,
    MessagesRequest,
)
from dyn.core.frontend.apis.anthropic.wire import MessagesWire
from dyn.core.frontend.endpoints.generate import GenerateEndpoint, warn_ignored
from dyn.core.frontend.endpoints.json_post import JsonEndpoint
from dyn.core.frontend.generation import Generation, RequestContext
from dyn.core.protocol.errors import ApiError
from dyn.core.protocol.openai import ChatCompletionRequest, check_chat, decode_request
from dyn.core.protocol.tools import tool_plan

if TYPE_CHECKING:
    from dyn.core.frontend.app import FrontendApp
    from dyn.core.frontend.service import OpenAIService


class MessagesEndpoint(GenerateEndpoint):
    """A generating endpoint whose errors are Anthropic's."""

    def error_body(self, exc: ApiError) -> bytes:
        return errors.encoded(exc)


class CountTokensEndpoint(JsonEndpoint):
    """``count_tokens``, whose errors are Anthropic's."""

    def error_body(self, exc: ApiError) -> bytes:
        return errors.encoded(exc)


async def _prepare(
    app: FrontendApp, service: OpenAIService, req: MessagesRequest, ctx: RequestContext
) -> Generation:
    await read_documents(req.messages, service.media, app.file_store)
    context, _ = await _edit_context(service, req)
    chat, names = _adapted(service, req)
    try:
        return await service.prepare_chat(
            chat, ctx, lambda gen: MessagesWire(gen, context), "messages", "Messages"
        )
    except ApiError as exc:
        raise names.renamed(exc) from None


async def _count_tokens(app: FrontendApp, body: bytes) -> CountTokensResponse:
    req = decode_request(body, CountTokensRequest)
    warn_ignored(body, CountTokensRequest, "to /v1/messages/count_tokens")
    service = app.models.resolve(req.model)
    await read_documents(req.messages, service.media, app.file_store)
    _, original = await _edit_context(service, req)
    chat, names = _adapted(service, req)
    try:
        check_chat(chat, service.outputs.max_logprobs)
        tool_plan(chat.tools, chat.tool_choice, chat.parallel_tool_calls)
        tokens = await service.preprocessor.tokenize_chat_async(chat)
    except ApiError as exc:
        raise names.renamed(exc) from None
    context = CountTokensContextManagement(original) if original is not None else None
    return CountTokensResponse(len(tokens), context)


def _adapted(service: OpenAIService, req: CountTokensRequest) -> tuple[ChatCompletionRequest, FieldNames]:
    """``adapt(req)``, its later system messages folded for a template that refuses them."""
    chat, names = adapt(req)
    if not service.preprocessor.accepts_late_system():
        chat.messages = fold_late_system(chat.messages)
    return chat, names


async def _edit_context(
    service: OpenAIService, req: CountTokensRequest
) -> tuple[ContextManagementResponse | None, int | None]:
    """Apply ``req``'s context edits to its messages (in place); what they cleared (None when
    the request sent no ``context_management``) and the prompt's tokens before them (None when
    nothing was cleared)."""
    if req.context_management is None:
        return None, None
    edits = edits_of(req.context_management)

    async def count(messages: list[MessageParam]) -> int:
        chat, names = _adapted(service, msgspec.structs.replace(req, messages=messages))
        try:
            return len(await service.preprocessor.tokenize_chat_async(chat))
        except ApiError as exc:
            raise names.renamed(exc) from None

    req.messages, applied, original = await edited(req.messages, edits, count)
    return ContextManagementResponse(applied), original


MESSAGES = MessagesEndpoint("/v1/messages", MessagesRequest, _prepare)
COUNT_TOKENS = CountTokensEndpoint("/v1/messages/count_tokens", _count_tokens)
PATHS = frozenset({MESSAGES.path, COUNT_TOKENS.path})
"""The paths ``--no-enable-anthropic-api`` turns off."""
