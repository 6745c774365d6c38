"""The generation core every API shares: routed choices, run to the end, written by the API's ``Wire``.

``OpenAIService`` prepares a request (one validation, the chat template, the tokenizer, the
route of every choice) into a ``Generation``. The generation runs its choices and hands what they
produce to the ``Wire`` of the API the client spoke (one per folder of ``dyn.core.frontend.apis``):
per choice, plain text or an ``OutputDelta`` (content, reasoning, tool-call pieces) with its
logprobs, then a ``ChoiceEnd`` (finish reason, the last tokens, response ``nvext``); after every
choice, the closing events with the usage. A unary request runs every choice and asks the wire for
the ``body``. An API adds nothing here: it writes its wire.

Both ``stream`` and ``collect`` run inside the caller's cancel scope: when the client goes away
the HTTP layer cancels it, every engine request is closed, and closing sends the worker a
``CancelRequest``.
"""

from __future__ import annotations

import abc
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import anyio

from dyn.core.frontend import nvext as nvext_out
from dyn.core.frontend.choice import Choice
from dyn.core.frontend.failures import as_api_error
from dyn.core.frontend.logprobs import ChatLogprobs, CompletionLogprobs, prompt_logprobs_json
from dyn.core.frontend.output import OutputDelta, ToolCallDelta
from dyn.core.messages import TokenLogprobs
from dyn.core.protocol.errors import ApiError
from dyn.core.protocol.openai import (
    ChatCompletionRequest,
    PromptTokensDetails,
    ToolCallOut,
    UsageInfo,
    _GenerationRequest,
)
from dyn.core.transport.request_plane import RemoteError, WorkerUnavailable

if TYPE_CHECKING:
    from dyn.core.frontend.service import OpenAIService

Emit = Callable[[bytes], Awaitable[None]]


@dataclass(slots=True)
class RequestContext:
    """Per-request facts the HTTP layer knows: ids, arrival, routing headers, session identity."""

    request_id: str
    received: float = field(default_factory=time.perf_counter)
    received_wall: float = field(default_factory=time.time)
    worker_instance_id: int | None = None
    """``x-worker-instance-id``"""
    prefill_instance_id: int | None = None
    """``x-prefill-instance-id``"""
    dp_rank: int | None = None
    """``x-dp-rank``"""
    session_id: str | None = None
    """The agent session the request belongs to (``dyn.core.frontend.session_identity``)."""
    parent_session_id: str | None = None
    """The session that spawned it (``x-dynamo-parent-session-id``)."""

    @property
    def created(self) -> int:
        return int(self.received_wall)


class ChoiceEnd(NamedTuple):
    """What a choice's last streamed event carries. Without an output stage the rest of its
    text is ``text``; with one, what the parsers still held is ``delta``."""

    text: str
    delta: OutputDelta | None
    reason: str
    """The finish reason: ``stop``, ``length``, or ``tool_calls`` when the output made calls."""
    stop_reason: int | str | None
    """The stop string or token that ended the choice (vLLM's ``stop_reason``)."""
    logprobs: bytes | None
    prompt_logprobs: bytes | None
    nvext: bytes | None


class Outcome(NamedTuple):
    """A whole choice, read by its output stage: the unary response's message."""

    content: str | None
    reasoning: str | None
    tool_calls: list[ToolCallOut]
    reason: str


class Wire(abc.ABC):
    """How one API writes a generation (see the module docstring). Streaming, in order:
    ``opening``; per choice ``start``, ``text``/``delta`` as output comes, ``finish``; then
    ``closing``, or ``failed`` when the generation failed after the stream started. Each returns
    the bytes to send (``b""``: nothing). Unary: ``body``, as parts."""

    def __init__(self, gen: Generation) -> None:
        self.gen = gen
        self.streams_prompt_logprobs = False
        """``ChoiceEnd.prompt_logprobs`` is computed for the stream (text completions)."""

    def opening(self) -> bytes:
        return b""

    def start(self, choice: Choice) -> bytes:
        return b""

    @abc.abstractmethod
    def text(self, choice: Choice, text: str, logprobs: bytes | None) -> bytes:
        """Plain content."""

    @abc.abstractmethod
    def delta(self, choice: Choice, delta: OutputDelta | None, logprobs: bytes | None) -> bytes:
        """Output with reasoning or tool-call pieces (or none, with logprobs only)."""

    @abc.abstractmethod
    def finish(self, choice: Choice, end: ChoiceEnd) -> bytes: ...

    @abc.abstractmethod
    def closing(self) -> bytes:
        """The events after every choice ended (usage, the end of the stream)."""

    @abc.abstractmethod
    def failed(self, error: ApiError) -> bytes:
        """The events that end a stream which failed after it started."""

    @abc.abstractmethod
    async def body(self) -> list[bytes]:
        """The unary response body, in parts (``dyn.core.asgi.respond_parts``)."""


WireFactory = Callable[["Generation"], Wire]


class Generation:
    """A prepared request: routed choices, ready to stream or collect through its ``wire``."""

    def __init__(
        self,
        service: OpenAIService,
        ctx: RequestContext,
        req: _GenerationRequest,
        choices: list[Choice],
        endpoint: str,
        echo_texts: list[str] | None,
        wire: WireFactory,
    ) -> None:
        """``endpoint``: the label of the request in the frontend's metrics; ``wire`` makes the
        API's writer of this generation."""
        self.service = service
        self.ctx = ctx
        self.req = req
        self.choices = choices
        self.endpoint = endpoint
        self.chat = isinstance(req, ChatCompletionRequest)
        """The prompt came from messages (else from a text completion's prompt)."""
        self.echo_texts = echo_texts
        self.unanswered_tokens = 0
        """The completion tokens of the choices ``best_of`` generated and left out."""
        self.nvext = req.nvext
        self._logprob_formatters: dict[int, ChatLogprobs | CompletionLogprobs] = {}
        hints = req.nvext.agent_hints if req.nvext is not None else None
        if hints is not None and hints.speculative_prefill and self.chat and len(choices) == 1:
            choices[0].keep_text = True
        self.role = _response_role(req, service.outputs.response_role)
        """The role of the answer's message (chat only)."""
        self.wire = wire(self)

    def release(self) -> None:
        """End every choice's route (a no-op for those that ended): whatever happened to the
        request, no booking outlives it in the router's load model."""
        for choice in self.choices:
            choice.route.finished()

    # ----------------------------------------------------------------- streaming

    async def stream(self, emit: Emit, open_at_once: bool = False) -> bytes:
        """Send the SSE body through ``emit`` up to its end, which is returned for the caller to
        send as the response's last part: the last choice's final event and the wire's closing
        events (one write where there would be several).

        Events that carry no tokens wait for the next write instead of taking one of their own:
        the opening and a choice's first events go out with the first text, and text from the
        batch that ends the choice goes out with its final event. A client sees the same events,
        and its first token no later; with the response's head joining the first write
        (``dyn.core.asgi.HeadWithBody``), a response at speedup 100 is one write where it was four.
        ``open_at_once``: the opening goes out before the first text (a background response's
        readers learn its id at once).
        """
        wire = self.wire
        lock = anyio.Lock() if len(self.choices) > 1 else None
        held: list[bytes] = []

        def take() -> bytes:
            data = b"".join(held)
            held.clear()
            return data

        async def send(data: bytes, flush: bool = True) -> None:
            held.append(data)
            if not flush:
                return
            if lock is None:
                await emit(take())
            else:
                async with lock:  # taken under the lock: every choice's events stay in order
                    if held:
                        await emit(take())

        async def on_text(choice: Choice, text: str, ids: list[int], lps: list[TokenLogprobs] | None) -> None:
            logprobs = self.logprobs_json(choice, ids, lps) if lps else None
            flush = not choice.finishing
            output = choice.output
            if output is None:
                await send(wire.text(choice, text, logprobs), flush)
                return
            delta = output.push(text)
            if delta is not None and not delta.reasoning and not delta.tool_calls:
                await send(wire.text(choice, delta.content, logprobs), flush)
            elif delta is not None or logprobs is not None:
                await send(wire.delta(choice, delta, logprobs), flush)

        fields = self.nvext.extra_fields if self.nvext is not None else None
        wanted = set(self.nvext.annotations or ()) if self.nvext is not None else set()

        async def run(choice: Choice) -> bytes:
            """Stream ``choice`` and return its final event."""
            first = wire.start(choice)
            if first:
                await send(first, flush=False)
            rest = await choice.run(on_text)
            extra = nvext_out.response_nvext(fields, choice.timing, choice.route)
            logprobs = self.logprobs_json(choice, *choice.tail) if choice.tail else None
            prompt_lps = await self.prompt_logprobs_json(choice) if wire.streams_prompt_logprobs else None
            output = choice.output
            if output is None:
                end = ChoiceEnd(
                    rest, None, choice.finish_reason, choice.stop_reason, logprobs, prompt_lps, extra
                )
            else:
                delta = joined(output.push(rest), output.finish())
                reason = output.finish_reason(choice.finish_reason)
                end = ChoiceEnd("", delta, reason, choice.stop_reason, logprobs, None, extra)
            last = wire.finish(choice, end)
            if "llm_metrics" in wanted:
                prompt_tokens, completion, cached = choice.usage
                last += nvext_out.annotation(
                    "llm_metrics",
                    nvext_out.llm_metrics(
                        choice.route, prompt_tokens, completion or choice.tokens, choice.last_chunk, cached
                    ),
                )
            return last

        async def run_and_send(choice: Choice) -> None:
            await send(await run(choice))

        ok = False
        tail = b""
        try:
            opening = wire.opening()
            if opening:
                await send(opening, flush=open_at_once)
            if wanted:
                await send(self._annotations(wanted))
            if len(self.choices) == 1:
                tail = await run(self.choices[0])
            else:
                await self._run_all(run_and_send)
            tail += wire.closing()
            ok = True
        except (ApiError, RemoteError, WorkerUnavailable) as exc:
            tail = wire.failed(as_api_error(exc, self.req))
        finally:
            self.service.observe(self, ok, stream=True)
        if ok:
            self._after()
        return take() + tail

    def _annotations(self, wanted: set[str]) -> bytes:
        """The events the request asked for that are known before generation."""
        out = b""
        prompt = self.choices[0].prompt
        if "formatted_prompt" in wanted and prompt.text is not None:
            out += nvext_out.annotation("formatted_prompt", prompt.text)
        if "token_ids" in wanted and not prompt.pretokenized:
            out += nvext_out.annotation("token_ids", prompt.token_ids)
        if "request_id" in wanted:
            out += nvext_out.annotation("request_id", self.ctx.request_id)
        return out

    def _after(self) -> None:
        """Work that follows a successful response: the speculative prefill of the next turn."""
        hints = self.nvext.agent_hints if self.nvext is not None else None
        req = self.req
        if (
            hints is not None
            and hints.speculative_prefill
            and isinstance(req, ChatCompletionRequest)
            and len(self.choices) == 1
            and self.choices[0].finish_reason != "error"
            and not self.choices[0].prompt.media  # the next turn's prefix would need its images
        ):
            choice = self.choices[0]
            self.service.speculative_prefill(req, "".join(choice.parts), self.ctx.request_id)

    async def _run_all(self, run: Callable[[Choice], Awaitable[object]]) -> None:
        """Run every choice concurrently; the first failure cancels the others and is raised."""
        if len(self.choices) == 1:
            await run(self.choices[0])
            return
        errors: list[Exception] = []

        async def guarded(choice: Choice) -> None:
            try:
                await run(choice)
            except Exception as exc:  # raised below, not as an ExceptionGroup
                errors.append(exc)
                tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            for choice in self.choices:
                tg.start_soon(guarded, choice)
        if errors:
            raise errors[0]

    # ----------------------------------------------------------------- unary

    async def collect(self) -> list[bytes]:
        """Run every choice to the end and return the wire's response body in parts, for
        ``dyn.core.asgi.respond_parts`` (a body of tens of megabytes, ``n`` x logprobs, is never
        encoded or copied in one piece)."""
        ok = False
        try:
            await self._run_all(lambda choice: choice.run(None))
            ok = True
        except (RemoteError, WorkerUnavailable) as exc:
            raise as_api_error(exc, self.req) from None
        finally:
            self.service.observe(self, ok, stream=False)
        self._keep_best()
        self._after()
        return await self.wire.body()

    def _keep_best(self) -> None:
        """``best_of`` more than ``n``: of each prompt's ``best_of`` choices, the ``n`` with the
        highest cumulative logprob (vLLM's ranking when it took ``best_of``; ties in the order
        generated), renumbered; the tokens of the others still count in the usage, as OpenAI
        bills them. Their logprobs were asked for the ranking: shown only if the client asked."""
        n, best_of = self.req.n, self.req.generations
        if best_of == n:
            return
        kept: list[Choice] = []
        for start in range(0, len(self.choices), best_of):
            group = self.choices[start : start + best_of]
            ranked = sorted(
                group, key=lambda c: math.fsum(lp.logprob for lp in c.logprobs or ()), reverse=True
            )
            for rank, choice in enumerate(ranked[:n]):
                choice.index = start // best_of * n + rank
                kept.append(choice)
        self.unanswered_tokens = sum(c.usage[1] or c.tokens for c in self.choices if c not in kept)
        self.choices = kept
        asked = getattr(self.req, "logprobs", None)  # chat: a bool; text completions: a count or None
        if asked is None or asked is False:
            for choice in kept:
                choice.logprobs = None

    def text_of(self, choice: Choice) -> str:
        """A unary choice's text, after its echoed prompt when the request asked for an echo."""
        text = "".join(choice.parts)
        if self.echo_texts is not None:
            text = self.echo_texts[choice.index] + text
        return text

    def outcome(self, choice: Choice) -> Outcome:
        """A unary choice's message: its text through the output stage (reasoning and tool calls
        parsed out when the request has one)."""
        output = choice.output
        if output is None:
            return Outcome(self.text_of(choice), None, [], choice.finish_reason)
        output.push("".join(choice.parts))
        output.finish()
        content, reasoning, calls = output.message()
        if self.echo_texts is not None:
            content = self.echo_texts[choice.index] + (content or "")
        return Outcome(content, reasoning, calls, output.finish_reason(choice.finish_reason))

    # ----------------------------------------------------------------- logprobs

    def _formatter(self, choice: Choice) -> ChatLogprobs | CompletionLogprobs:
        formatters = self._logprob_formatters
        formatter = formatters.get(choice.index)
        if formatter is None:
            texts, top = self.service.token_texts, choice.request.logprobs or 0
            as_ids = self.service.outputs.return_tokens_as_token_ids
            if self.chat:
                formatter = ChatLogprobs(texts, top, as_ids=as_ids)
            else:
                echo = self.echo_texts[choice.index] if self.echo_texts is not None else ""
                formatter = CompletionLogprobs(texts, top, offset=len(echo), as_ids=as_ids)
            formatters[choice.index] = formatter
        return formatter

    def logprobs_json(self, choice: Choice, ids: list[int], lps: list[TokenLogprobs]) -> bytes:
        """Streamed tokens' logprobs as the chat or completions API writes them (JSON)."""
        formatter = self._formatter(choice)
        if isinstance(formatter, ChatLogprobs):
            return formatter.encode(formatter.entries(ids, lps))
        return formatter.encode(ids, lps)

    async def unary_logprobs(self, choice: Choice) -> bytes | None:
        """A unary choice's logprobs (JSON), or None when none were asked for."""
        if choice.logprobs is None:
            return None
        return await self._formatter(choice).encode_whole(choice.token_ids, choice.logprobs)

    async def prompt_logprobs_json(self, choice: Choice) -> bytes | None:
        if choice.prompt_logprobs is None or choice.request.prompt_logprobs is None:
            return None
        return await prompt_logprobs_json(
            self.service.token_texts,
            choice.request.token_ids,
            choice.prompt_logprobs,
            choice.request.prompt_logprobs,
        )

    # ----------------------------------------------------------------- usage and metrics

    def usage(self) -> UsageInfo:
        """Prompt tokens count once per distinct prompt (n choices share theirs)."""
        n = self.req.n
        prompt = sum(c.usage[0] for c in self.choices if c.index % n == 0)
        completion = sum(c.usage[1] or c.tokens for c in self.choices) + self.unanswered_tokens
        return usage_info(
            prompt, completion, self.cached_tokens(), details=self.service.outputs.prompt_tokens_details
        )

    def cached_tokens(self) -> int:
        """Prompt tokens served from the cache, over the choices of the first prompt."""
        n = self.req.n
        return sum(c.usage[2] for c in self.choices if c.index % n == 0)

    def timings(self) -> tuple[float | None, float | None, float]:
        """(ttft, mean inter-token latency, duration) in seconds."""
        now = time.perf_counter()
        firsts = [c.timing.first for c in self.choices if c.timing.first is not None]
        if not firsts:
            return None, None, now - self.ctx.received
        first = min(firsts)
        last = max(c.timing.last for c in self.choices)
        tokens = sum(c.tokens for c in self.choices)
        itl = (last - first) / (tokens - 1) if tokens > 1 else None
        return first - self.ctx.received, itl, now - self.ctx.received


def usage_info(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int, *, details: bool = True
) -> UsageInfo:
    """A request's usage; ``details``: with ``prompt_tokens_details.cached_tokens`` (else that
    field is null, as in vLLM without ``--enable-prompt-tokens-details``)."""
    return UsageInfo(
        prompt_tokens,
        completion_tokens,
        prompt_tokens + completion_tokens,
        PromptTokensDetails(cached_tokens) if details else None,
    )


def joined(*deltas: OutputDelta | None) -> OutputDelta | None:
    """One delta carrying several in order (tool-call pieces of one call merged)."""
    got = [d for d in deltas if d is not None]
    if len(got) <= 1:
        return got[0] if got else None
    calls: list[ToolCallDelta] = []
    for delta in got:
        for call in delta.tool_calls:
            if calls and calls[-1].index == call.index:
                calls[-1] = calls[-1]._replace(arguments=calls[-1].arguments + call.arguments)
            else:
                calls.append(call)
    return OutputDelta("".join(d.content for d in got), "".join(d.reasoning for d in got), calls)


def _response_role(req: _GenerationRequest, response_role: str) -> str:
    """vLLM's ``get_chat_request_role``: with ``add_generation_prompt`` false the answer
    continues the conversation as its last message's author, else it is ``response_role``."""
    if isinstance(req, ChatCompletionRequest) and not req.add_generation_prompt:
        role = req.messages[-1].get("role")
        if isinstance(role, str):
            return role
    return response_role
