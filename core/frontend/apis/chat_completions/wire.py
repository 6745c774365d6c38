"""``ChunkWire``: a generation written as chat completion or text completion chunks and bodies.

Streaming is the hot path (one event per engine message per choice): the chunks come from one
``StreamEncoder`` per request (``chunks``). The unary body is encoded choice by choice, so that a
body of tens of megabytes (``n`` x logprobs) is never encoded or copied in one piece.
"""

from __future__ import annotations

import anyio.lowlevel
import msgspec

from dyn.core.frontend import nvext as nvext_out
from dyn.core.frontend.apis.chat_completions.chunks import DONE, StreamEncoder, chat_delta, error_event
from dyn.core.frontend.choice import Choice
from dyn.core.frontend.generation import ChoiceEnd, Generation, Wire
from dyn.core.frontend.output import OutputDelta
from dyn.core.protocol.errors import ApiError
from dyn.core.protocol.openai import (
    ChatChoice,
    ChatCompletionResponse,
    ChatMessageOut,
    CompletionChoice,
    CompletionResponse,
)


class ChunkWire(Wire):
    """Chat completion chunks when the request came with messages, else text completion ones."""

    def __init__(self, gen: Generation) -> None:
        super().__init__(gen)
        self.response_id = ("chatcmpl-" if gen.chat else "cmpl-") + gen.ctx.request_id
        self.enc = StreamEncoder(self.response_id, gen.ctx.created, gen.service.model_name, gen.chat)
        self.streams_prompt_logprobs = not gen.chat
        self.reasoning_field = gen.service.outputs.reasoning_field_name
        opts = gen.req.stream_options
        forced = gen.service.outputs.force_include_usage
        self.include_usage = forced or (opts is not None and opts.include_usage)
        """The stream ends with a usage chunk (``stream_options.include_usage``)."""
        self.continuous = forced or (opts is not None and opts.include_usage and opts.continuous_usage_stats)
        """Every choice chunk carries its running usage (``continuous_usage_stats``, as vLLM)."""

    def _counted(self, choice: Choice, event: bytes) -> bytes:
        """``event`` with the choice's usage so far (called only when ``continuous``)."""
        return self.enc.with_usage(event, len(choice.prompt.token_ids), choice.timing.tokens)

    def start(self, choice: Choice) -> bytes:
        gen = self.gen
        events = [self.enc.role(choice.index, gen.role)] if gen.chat else []
        if gen.echo_texts is not None:
            events.append(self.enc.text(choice.index, gen.echo_texts[choice.index]))
        if self.continuous:
            events = [self._counted(choice, e) for e in events]
        return b"".join(events)

    def text(self, choice: Choice, text: str, logprobs: bytes | None) -> bytes:
        event = self.enc.text(choice.index, text, logprobs)
        return self._counted(choice, event) if self.continuous else event

    def delta(self, choice: Choice, delta: OutputDelta | None, logprobs: bytes | None) -> bytes:
        body = chat_delta(*delta, self.reasoning_field) if delta else b"{}"
        event = self.enc.delta(choice.index, body, logprobs)
        return self._counted(choice, event) if self.continuous else event

    def finish(self, choice: Choice, end: ChoiceEnd) -> bytes:
        event = self._final(choice, end)
        return self._counted(choice, event) if self.continuous else event

    def _final(self, choice: Choice, end: ChoiceEnd) -> bytes:
        if choice.output is None:
            return self.enc.finish(
                choice.index,
                end.reason,
                end.stop_reason,
                end.text,
                end.nvext,
                logprobs=end.logprobs,
                prompt_logprobs=end.prompt_logprobs,
            )
        return self.enc.finish(
            choice.index,
            end.reason,
            end.stop_reason,
            nvext=end.nvext,
            delta=chat_delta(*end.delta, self.reasoning_field) if end.delta else None,
            logprobs=end.logprobs,
        )

    def closing(self) -> bytes:
        if self.include_usage:
            return self.enc.usage(self.gen.usage()) + DONE
        return DONE

    def failed(self, error: ApiError) -> bytes:
        return error_event(error.body()) + DONE

    async def body(self) -> list[bytes]:
        gen = self.gen
        model = gen.service.model_name
        choices: list[bytes] = []
        for c in gen.choices:  # logprobs first: encoding them yields between slices
            raw = await gen.unary_logprobs(c)
            lps = msgspec.Raw(raw) if raw is not None else None
            if gen.chat:
                content, reasoning, calls, reason = gen.outcome(c)
                message = ChatMessageOut(gen.role, content, tool_calls=calls)
                if self.reasoning_field == "reasoning":
                    message.reasoning = reasoning
                else:
                    message.reasoning_content = reasoning
                choices.append(msgspec.json.encode(ChatChoice(c.index, message, reason, lps, c.stop_reason)))
            else:
                choice = CompletionChoice(
                    c.index, gen.text_of(c), c.finish_reason, lps, stop_reason=c.stop_reason
                )
                prompt_lps = await gen.prompt_logprobs_json(c)
                if prompt_lps is not None:
                    choice.prompt_logprobs = msgspec.Raw(prompt_lps)
                choices.append(msgspec.json.encode(choice))
            if len(gen.choices) > 1:
                await anyio.lowlevel.checkpoint()
        body: ChatCompletionResponse | CompletionResponse
        if gen.chat:
            body = ChatCompletionResponse(self.response_id, gen.ctx.created, model, [], gen.usage())
            prompt_lps = await gen.prompt_logprobs_json(gen.choices[0])
            if prompt_lps is not None:
                body.prompt_logprobs = msgspec.Raw(prompt_lps)
        else:
            body = CompletionResponse(self.response_id, gen.ctx.created, model, [], gen.usage())
        first = gen.choices[0]
        extra = nvext_out.response_nvext(
            gen.nvext.extra_fields if gen.nvext else None, first.timing, first.route
        )
        if extra is not None:
            body.nvext = msgspec.Raw(extra)
        return _with_choices(msgspec.json.encode(body), choices)


_NO_CHOICES = b'"choices":[]'


def _with_choices(body: bytes, choices: list[bytes]) -> list[bytes]:
    """``body`` (a response encoded with no choices) with ``choices`` (each encoded) in its
    choices array, as parts. A quote inside a JSON string is escaped, so the first
    ``"choices":[]`` in ``body`` is the field itself."""
    head, tail = body.split(_NO_CHOICES, 1)
    parts = [head + b'"choices":[']
    for i, choice in enumerate(choices):
        if i:
            parts.append(b",")
        parts.append(choice)
    parts.append(b"]" + tail)
    return parts
