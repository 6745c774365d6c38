"""``ResponsesWire``: a generation written as a Responses API response, streamed or whole.

Output items come in the order the model wrote them: its reasoning (a ``reasoning`` item whose
``content`` holds one ``reasoning_text``, with ``encrypted_content`` when the request's ``include``
asks for it), its text (a ``message`` with one ``output_text``), then a ``function_call`` per tool
call. A stream opens an item when its first piece arrives and closes the open one then (so its
events never interleave): ``response.created`` and ``response.in_progress``; per item
``response.output_item.added``, its deltas (``response.content_part.added``,
``response.output_text.delta``/``response.reasoning_text.delta`` ... ``.done``,
``response.content_part.done``; ``response.function_call_arguments.delta`` ... ``.done``) and
``response.output_item.done``; last ``response.completed``, ``response.incomplete`` (the output
reached ``max_output_tokens``: ``incomplete_details.reason`` says so, and the last item is
``incomplete``) or ``response.failed`` (the engine failed: the response's ``error``). Every event
is ``event: TYPE`` and ``data: {"type": TYPE, "sequence_number": N, ...}``, N counting from 0; no
``[DONE]`` follows, as OpenAI sends none.

A response with no output at all is one empty message. The final response, unary or streamed,
is stored (``ResponseStore``) unless the request said ``store: false``, with the conversation a
``previous_response_id`` continues.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import msgspec
import orjson

from dyn.core.frontend.apis.responses.adapter import ENCRYPTED_INCLUDE, ChatTurn, seal_reasoning
from dyn.core.frontend.apis.responses.protocol import (
    FunctionCallItem,
    IncompleteDetails,
    InputTokensDetails,
    MessageItem,
    OutputItem,
    OutputText,
    OutputTokensDetails,
    ReasoningEcho,
    ReasoningItem,
    ReasoningText,
    ResponseError,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
    TextConfig,
)
from dyn.core.frontend.apis.responses.store import ResponseStore
from dyn.core.frontend.choice import Choice
from dyn.core.frontend.generation import ChoiceEnd, Generation, Wire
from dyn.core.frontend.output import OutputDelta, ToolCallDelta
from dyn.core.protocol.errors import ApiError

log = logging.getLogger(__name__)

_PREFIXES = {"reasoning": "rs", "message": "msg", "function_call": "fc"}
_LOGPROBS_HEAD = b'{"content":'
_EMPTY_PART = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
_TEXT_DELTA_HEAD = (
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":'
)


class _Item:
    """An output item being written: its pieces of text (or arguments) and logprobs."""

    __slots__ = (
        "kind",
        "index",
        "id",
        "id_json",
        "delta_middle",
        "parts",
        "logprobs",
        "call_id",
        "name",
        "namespace",
        "status",
    )

    def __init__(
        self,
        kind: str,
        index: int,
        response_id: str,
        call: ToolCallDelta | None = None,
        namespace: str | None = None,
    ) -> None:
        self.kind = kind
        self.index = index
        self.id = f"{_PREFIXES[kind]}_{response_id.removeprefix('resp_')}_{index}"
        self.id_json = msgspec.json.encode(self.id)
        """The id as a JSON string (a client's request id may hold quotes)."""
        self.delta_middle = b',"item_id":%s,"output_index":%d,"content_index":0,"delta":' % (
            self.id_json,
            index,
        )
        """What a text delta event of this item holds between its number and its text."""
        self.parts: list[str] = []
        self.logprobs: list[bytes] = []
        """Pieces of the JSON array of the text's logprobs, each without its brackets."""
        self.call_id = (call.id or "") if call is not None else ""
        self.name = (call.name or "") if call is not None else ""
        self.namespace = namespace
        """The ``namespace`` tool group of the called function."""
        self.status = "in_progress"

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def output(self, sealed: bool) -> OutputItem:
        """The item as the response lists it; ``sealed``: reasoning with its ``encrypted_content``."""
        if self.kind == "message":
            lps = msgspec.Raw(b"[" + b",".join(self.logprobs) + b"]")
            return MessageItem(id=self.id, status=self.status, content=[OutputText(self.text, logprobs=lps)])
        if self.kind == "reasoning":
            text = self.text
            return ReasoningItem(
                id=self.id,
                content=[ReasoningText(text)],
                encrypted_content=seal_reasoning(text) if sealed else None,
                status=self.status,
            )
        return FunctionCallItem(
            id=self.id,
            call_id=self.call_id,
            name=self.name,
            arguments=self.text,
            status=self.status,
            namespace=self.namespace,
        )


class ResponsesWire(Wire):
    """One response (a single choice) of ``turn``'s request, kept in ``store`` when it asks."""

    def __init__(
        self, gen: Generation, req: ResponsesRequest, turn: ChatTurn, store: ResponseStore | None
    ) -> None:
        super().__init__(gen)
        self.req = req
        self.turn = turn
        self.store = store
        self.response_id = "resp_" + gen.ctx.request_id
        self.sealed = ENCRYPTED_INCLUDE in (req.include or ())
        self.seq = 0
        self.items: list[_Item] = []
        self.open: _Item | None = None
        self.calls: dict[int, _Item] = {}
        """Tool-call index -> its item."""
        self._echo: ResponseObject | None = None

    # ----------------------------------------------------------------- streaming

    def opening(self) -> bytes:
        response = msgspec.Raw(msgspec.json.encode(self._response("in_progress", [])))
        return self._event("response.created", response=response) + self._event(
            "response.in_progress", response=response
        )

    def text(self, choice: Choice, text: str, logprobs: bytes | None) -> bytes:
        item = self.open
        if item is None or item.kind != "message" or logprobs or not text:
            return self._add("message", text, logprobs) if text else b""
        # nearly every token: text without logprobs into the open message, in one call
        item.parts.append(text)
        return self._text_delta(item, text, b"")

    def delta(self, choice: Choice, delta: OutputDelta | None, logprobs: bytes | None) -> bytes:
        return self._write(delta, logprobs) if delta is not None else b""

    def finish(self, choice: Choice, end: ChoiceEnd) -> bytes:
        if choice.output is None:
            out = self._add("message", end.text, end.logprobs) if end.text else b""
        else:
            out = self._write(end.delta, end.logprobs) if end.delta is not None else b""
        if not self.items:
            out += self._open("message")
        return out + self._close("incomplete" if end.reason == "length" else "completed")

    def closing(self) -> bytes:
        status = "incomplete" if self.items and self.items[-1].status == "incomplete" else "completed"
        body = self._finished(status, [item.output(self.sealed) for item in self.items])
        return self._event(f"response.{status}", response=msgspec.Raw(body))

    def failed(self, error: ApiError) -> bytes:
        for item in self.items:
            if item.status == "in_progress":
                item.status = "incomplete"
        output = [item.output(self.sealed) for item in self.items]
        body = self._finished("failed", output, ResponseError("server_error", error.message))
        return self._event("response.failed", response=msgspec.Raw(body))

    def _write(self, delta: OutputDelta, logprobs: bytes | None) -> bytes:
        """The events of one delta: reasoning, then text, then tool-call pieces."""
        content, reasoning, calls = delta
        out = self._add("reasoning", reasoning, None) if reasoning else b""
        if content:
            out += self._add("message", content, logprobs)
        for call in calls:
            item = self.calls.get(call.index)
            if item is None or call.name is not None:
                out += self._open("function_call", call)
                item = self.calls[call.index] = self.items[-1]
            if call.arguments:
                item.parts.append(call.arguments)
                out += self._event(
                    "response.function_call_arguments.delta",
                    item_id=item.id,
                    output_index=item.index,
                    delta=call.arguments,
                )
        return out

    def _add(self, kind: str, text: str, logprobs: bytes | None) -> bytes:
        """A piece of reasoning or message text, in the open item of its kind (opened if need be)."""
        item = self.open
        out = b""
        if item is None or item.kind != kind:
            out = self._open(kind)
            item = self.open
            assert item is not None
        item.parts.append(text)
        if kind == "reasoning":
            return out + self._event(
                "response.reasoning_text.delta",
                item_id=item.id,
                output_index=item.index,
                content_index=0,
                delta=text,
            )
        lps = _logprob_list(logprobs)
        if lps:
            item.logprobs.append(lps)
        return out + self._text_delta(item, text, lps)

    def _text_delta(self, item: _Item, text: str, logprobs: bytes) -> bytes:
        """``response.output_text.delta``, the event of nearly every token, written directly."""
        seq = self.seq
        self.seq = seq + 1
        return b'%s%d%s%s,"logprobs":[%s]}\n\n' % (
            _TEXT_DELTA_HEAD,
            seq,
            item.delta_middle,
            orjson.dumps(text),
            logprobs,
        )

    def _open(self, kind: str, call: ToolCallDelta | None = None) -> bytes:
        """Close the open item and open one of ``kind`` (the last of ``items``): the events."""
        out = self._close("completed")
        item = self._item(kind, len(self.items), call)
        self.items.append(item)
        self.open = item
        if item.kind == "function_call":
            return out + self._event(
                "response.output_item.added", output_index=item.index, item=item.output(False)
            )
        part = {"type": "reasoning_text", "text": ""} if item.kind == "reasoning" else _EMPTY_PART
        shell: OutputItem
        if item.kind == "reasoning":
            shell = ReasoningItem(id=item.id, content=[], status="in_progress")
        else:
            shell = MessageItem(id=item.id, status="in_progress", content=[])
        return (
            out
            + self._event("response.output_item.added", output_index=item.index, item=shell)
            + self._event(
                "response.content_part.added",
                item_id=item.id,
                output_index=item.index,
                content_index=0,
                part=part,
            )
        )

    def _close(self, status: str) -> bytes:
        """The events that end the open item (none when no item is open)."""
        item = self.open
        if item is None:
            return b""
        self.open = None
        item.status = status
        done = item.output(self.sealed)
        where = {"item_id": item.id, "output_index": item.index}
        if isinstance(done, FunctionCallItem):
            out = self._event(
                "response.function_call_arguments.done", **where, name=item.name, arguments=done.arguments
            )
        elif isinstance(done, ReasoningItem):
            thought = done.content[0]
            out = self._event("response.reasoning_text.done", **where, content_index=0, text=thought.text)
            out += self._event("response.content_part.done", **where, content_index=0, part=thought)
        else:
            text = done.content[0]
            out = self._event(
                "response.output_text.done", **where, content_index=0, text=text.text, logprobs=text.logprobs
            )
            out += self._event("response.content_part.done", **where, content_index=0, part=text)
        return out + self._event("response.output_item.done", output_index=item.index, item=done)

    def _event(self, kind: str, **fields: object) -> bytes:
        seq = self.seq
        self.seq += 1
        data = msgspec.json.encode({"type": kind, "sequence_number": seq, **fields})
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    # ----------------------------------------------------------------- unary

    async def body(self) -> list[bytes]:
        gen = self.gen
        choice = gen.choices[0]
        logprobs = _logprob_list(await gen.unary_logprobs(choice))
        content, reasoning, calls, reason = gen.outcome(choice)
        items: list[_Item] = []

        def add(kind: str, text: str, call: ToolCallDelta | None = None) -> _Item:
            item = self._item(kind, len(items), call)
            item.parts.append(text)
            item.status = "completed"
            items.append(item)
            return item

        if reasoning:
            add("reasoning", reasoning)
        if content or not (reasoning or calls):
            message = add("message", content or "")
            if logprobs:
                message.logprobs.append(logprobs)
        for i, call in enumerate(calls):
            add("function_call", call.function.arguments, ToolCallDelta(i, call.id, call.function.name, ""))
        status = "completed"
        if reason == "length":
            items[-1].status = status = "incomplete"
        return [self._finished(status, [item.output(self.sealed) for item in items])]

    # ----------------------------------------------------------------- the response

    def _item(self, kind: str, index: int, call: ToolCallDelta | None) -> _Item:
        namespace = self.turn.namespaces.get(call.name) if call is not None and call.name else None
        return _Item(kind, index, self.response_id, call, namespace)

    # ----------------------------------------------------------------- background

    def progress_body(self, status: str) -> bytes:
        """The response as it stands before its output (``queued`` or ``in_progress``)."""
        return msgspec.json.encode(self._response(status, []))

    def store_progress(self, status: str) -> None:
        """Keep the response at ``status`` in the store (with its input, for ``input_items``)
        until ``_finished`` replaces it."""
        if self.store is not None:
            self._keep(self.progress_body(status), [])

    def stop(self, status: str, error: ApiError | None = None) -> bytes:
        """End the response without its output: ``cancelled``, or ``failed`` with ``error``."""
        failure = ResponseError("server_error", error.message) if error is not None else None
        return self._finished(status, [], failure)

    def _finished(self, status: str, output: list[OutputItem], error: ResponseError | None = None) -> bytes:
        """The final response, encoded and kept in the store when the request asks."""
        response = self._response(status, output, error)
        body = msgspec.json.encode(response)
        if self.req.store is not False and self.store is not None:
            self._keep(body, output)
        return body

    def _keep(self, body: bytes, output: list[OutputItem]) -> None:
        """Store ``body`` with the conversation: the history's bytes as stored, then this turn's
        input and ``output`` (only those encoded here)."""
        assert self.store is not None
        turn = self.turn
        new = msgspec.json.encode([*turn.items[turn.history_len :], *output])
        self.store.put(
            self.response_id, body, _joined(turn.history_json, new), (turn.history_len, len(turn.items))
        )

    def _response(
        self, status: str, output: list[OutputItem], error: ResponseError | None = None
    ) -> ResponseObject:
        usage = None
        if status not in ("queued", "in_progress"):
            info = self.gen.usage()
            details = info.prompt_tokens_details
            usage = ResponseUsage(
                info.prompt_tokens,
                InputTokensDetails(details.cached_tokens if details is not None else 0),
                info.completion_tokens,
                OutputTokensDetails(),
                info.total_tokens,
            )
        if self._echo is None:
            self._echo = self._request_echo()
        return msgspec.structs.replace(
            self._echo,
            status=status,
            error=error,
            incomplete_details=IncompleteDetails("max_output_tokens") if status == "incomplete" else None,
            output=output,
            usage=usage,
        )

    def _request_echo(self) -> ResponseObject:
        """The response's fields that echo the request, built once per response (a stream writes
        the response object three times). ``instructions`` and ``tools`` are encoded once here:
        an agent's are kilobytes (Codex sends about 10 KB of instructions and 20 tools)."""
        req, gen = self.req, self.gen
        reasoning = req.reasoning
        text = req.text or TextConfig()
        if text.format is None:
            text = TextConfig({"type": "text"}, text.verbosity)
        instructions = msgspec.Raw(msgspec.json.encode(req.instructions)) if req.instructions else None
        return ResponseObject(
            id=self.response_id,
            created_at=gen.ctx.created,
            status="in_progress",
            background=bool(req.background),
            instructions=cast(str | None, instructions),
            max_output_tokens=req.max_output_tokens,
            max_tool_calls=req.max_tool_calls,
            metadata=req.metadata or {},
            model=gen.service.model_name,
            output=[],
            parallel_tool_calls=req.parallel_tool_calls is not False,
            previous_response_id=req.previous_response_id,
            prompt_cache_key=req.prompt_cache_key,
            reasoning=ReasoningEcho(reasoning.effort, reasoning.summary) if reasoning else ReasoningEcho(),
            safety_identifier=req.safety_identifier,
            service_tier=req.service_tier if req.service_tier not in (None, "auto") else "default",
            store=req.store is not False,
            temperature=req.temperature,
            text=text,
            tool_choice=req.tool_choice or "auto",
            tools=cast(list[Any], msgspec.Raw(msgspec.json.encode(req.tools or []))),
            top_logprobs=req.top_logprobs or 0,
            top_p=req.top_p,
            truncation=req.truncation or "disabled",
            user=req.user,
        )


def _joined(first: bytes, second: bytes) -> bytes:
    """Two JSON arrays (as msgspec writes them: no whitespace around the brackets) as one."""
    if first == b"[]":
        return second
    if second == b"[]":
        return first
    return first[:-1] + b"," + second[1:]


def _logprob_list(logprobs: bytes | None) -> bytes:
    """The entries of chat's ``{"content": [...]}`` logprobs (the same objects the Responses API
    lists), without the array's brackets; b"" for none."""
    if not logprobs or not logprobs.startswith(_LOGPROBS_HEAD):
        return b""
    return logprobs[len(_LOGPROBS_HEAD) :].strip()[1:-2].strip()
