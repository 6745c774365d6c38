"""Serving one OpenAI request: preprocess, route every choice, generate, detokenize, respond.

Two phases, so that every failure that can be known before the first byte gets its own HTTP
status: ``OpenAIService.prepare_*`` validates, preprocesses and routes (raising ``ApiError``), then
the returned ``Generation`` either ``stream``s SSE events through an ``emit`` callback or
``collect``s a whole response. Both run inside the caller's cancel scope: when the client goes
away the HTTP layer cancels it, every engine request is closed, and closing sends the worker a
``CancelRequest``.

A choice is one engine request. ``n`` > 1 and batched completion prompts fan out to several
engine requests, each routed on its own (they share a prefix, which a KV-aware router exploits).

nvext acts here: the routing target (``dyn.core.frontend.nvext.routing_target``), the priority
(converted once, ``dyn.core.protocol.priority``), sessions and cache pinning (passed to the
router, ``dyn.core.router.agent``), ``extra_fields`` and ``annotations`` on the response, and
``agent_hints.speculative_prefill``: after a chat turn ends, the next turn's prefix (messages plus
the reply) is prefilled in the background through the router with ``max_tokens=1``.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import cast

import anyio
import anyio.lowlevel
import msgspec

from dyn.core.background import BackgroundTasks
from dyn.core.engine import FEATURE_POOLING_ONLY, FEATURE_TOOL_HINTS
from dyn.core.frontend import nvext as nvext_out
from dyn.core.frontend.detokenizer import IncrementalDetokenizer
from dyn.core.frontend.limits import check_response_bytes
from dyn.core.frontend.logprobs import ChatLogprobs, CompletionLogprobs, TokenTexts, prompt_logprobs_json
from dyn.core.frontend.metrics import FrontendMetrics
from dyn.core.frontend.migration import Reliability, continued_request, worker_failed
from dyn.core.frontend.output import ChoiceOutput, OutputDelta, OutputPlan, ToolCallDelta
from dyn.core.frontend.prefill import run_prefill
from dyn.core.frontend.preprocessor import Preprocessor, Prompt, engine_request
from dyn.core.frontend.request_log import RequestLog
from dyn.core.frontend.responses import DONE, StreamEncoder, chat_delta, error_event, usage_info
from dyn.core.messages import (
    Finish,
    GenerateRequest,
    OutputConstraint,
    StopConditions,
    TokenChunk,
    TokenLogprobs,
    ToolSpec,
)
from dyn.core.model.info import ModelInfo
from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.registry import Registry, UnknownParserError
from dyn.core.parsers.tool import TOOL_PARSERS, Tool
from dyn.core.protocol.errors import ApiError, bad_request, unavailable
from dyn.core.protocol.grammar import GrammarCompiler, one_line, refused_param
from dyn.core.protocol.openai import (
    DEFAULT_MAX_LOGPROBS,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessageOut,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    _GenerationRequest,
    check_chat,
    check_completion,
)
from dyn.core.protocol.priority import Convention, engine_priority, queue_priority, request_priority
from dyn.core.protocol.structured import constraint_param, request_constraint
from dyn.core.protocol.tools import forced_schema, tool_plan
from dyn.core.router.agent import SessionOpenError
from dyn.core.router.policy import (
    AllWorkersBusyError,
    NotDisaggregatedError,
    NoWorkersError,
    Route,
    Router,
    RouteRequest,
    RoutingError,
    TargetRequiredError,
    WorkerNotFoundError,
)
from dyn.core.transport.request_plane import RemoteError, WorkerUnavailable

log = logging.getLogger(__name__)

Emit = Callable[[bytes], Awaitable[None]]
OnText = Callable[["_Choice", str, list[int], "list[TokenLogprobs] | None"], Awaitable[None]]
_engine_seq = itertools.count()


@dataclass(slots=True)
class RequestContext:
    """Per-request facts the HTTP layer knows: ids, arrival, routing headers."""

    request_id: str
    received: float = field(default_factory=time.perf_counter)
    received_wall: float = field(default_factory=time.time)
    worker_instance_id: int | None = None
    """``x-worker-instance-id``"""
    prefill_instance_id: int | None = None
    """``x-prefill-instance-id``"""
    dp_rank: int | None = None
    """``x-dp-rank``"""

    @property
    def created(self) -> int:
        return int(self.received_wall)


class _Choice:
    """One engine request: its route, detokenizer, output stage and outcome. ``keep_text`` keeps
    the streamed text too (a speculative prefill needs the reply). With logprobs asked for,
    a unary choice keeps every token and its ``TokenLogprobs``; a streamed one hands them to
    ``on_text`` with the text they produced, and the last ones (``tail``) to the final event.

    With a ``migration`` (see ``dyn.core.frontend.migration``) the choice keeps its output token
    ids (``generated``) and, when its worker fails, continues on the route ``migration.reroute``
    gives it; ``base`` is how many output tokens came before the current engine request."""

    __slots__ = (
        "index",
        "prompt",
        "route",
        "request",
        "detok",
        "timing",
        "finish_reason",
        "stop_reason",
        "usage",
        "parts",
        "keep_text",
        "last_chunk",
        "output",
        "token_ids",
        "logprobs",
        "tail",
        "prompt_logprobs",
        "migration",
        "generated",
        "base",
        "awaiting_first",
        "finishing",
    )

    def __init__(
        self,
        index: int,
        prompt: Prompt,
        route: Route,
        request: GenerateRequest,
        detok: IncrementalDetokenizer,
        timing: nvext_out.ChoiceTiming,
        output: ChoiceOutput | None = None,
        migration: _Migration | None = None,
    ) -> None:
        self.index = index
        self.prompt = prompt
        self.route = route
        self.request = request
        self.detok = detok
        self.timing = timing
        self.output = output
        self.finish_reason = "stop"
        self.stop_reason: int | str | None = None
        self.usage = (len(prompt.token_ids), 0, 0)
        self.parts: list[str] = []
        self.keep_text = False
        self.last_chunk = 0
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprobs] | None = [] if request.logprobs is not None else None
        self.tail: tuple[list[int], list[TokenLogprobs]] | None = None
        self.prompt_logprobs: list[TokenLogprobs | None] | None = None
        self.migration = migration
        self.generated: list[int] | None = [] if migration is not None else None
        self.base = 0
        self.awaiting_first = True
        self.finishing = False
        """The batch being handled ends with the engine's ``Finish``: the final event follows at
        once, so what ``on_text`` produces now can wait for it (one write instead of two)."""

    @property
    def tokens(self) -> int:
        return self.timing.tokens

    async def run(self, on_text: OnText | None) -> str:
        """Generate to the end; stream text through ``on_text`` or keep it in ``parts``.

        Returns the text still held back at the end (the caller puts it in the final event).
        """
        request = self.request
        try:
            while True:
                try:
                    return await self._generate(request, on_text)
                except (WorkerUnavailable, RemoteError) as exc:
                    moved = await self._migrate(request, exc)
                    if moved is None:  # the budget was spent before the failure: done
                        return await self._text(on_text, self.detok.finish(), True, [], None)
                    request = moved
        finally:
            self.route.finished()

    async def _generate(self, request: GenerateRequest, on_text: OnText | None) -> str:
        if self.route.prefill is not None:  # disaggregated: the prompt's KV comes from a prefill worker
            request = await run_prefill(self.route, request)
            if request.kv_transfer is not None:
                self.timing.prefilled = time.perf_counter()
        stream = self.route.worker.client.generate_batches(request)
        self.route.started()
        async with aclosing(stream):
            async for batch in stream:
                # a batch: this request's TokenChunks since the last wakeup, maybe then its Finish
                last = batch[-1]
                finish = last if isinstance(last, Finish) else None
                self.finishing = finish is not None
                chunks = cast("list[TokenChunk]", batch[:-1] if finish is not None else batch)
                if chunks:
                    now = time.perf_counter()
                    timing = self.timing
                    if self.awaiting_first:
                        self.awaiting_first = False
                        if timing.first is None:
                            timing.first = now
                        self.route.first_token()
                    timing.last = now
                    if len(chunks) == 1:
                        ids = chunks[0].token_ids
                    else:
                        ids = [t for chunk in chunks for t in chunk.token_ids]
                    timing.tokens += len(ids)
                    self.last_chunk = len(ids)
                    self.route.progress(timing.tokens - self.base)
                    if self.generated is not None:
                        self._track(self.generated, ids)
                    lps = self._logprobs(ids, chunks, on_text is None)
                    text = self.detok.push(ids)
                    if self.detok.stopped:
                        self.stop_reason = self.detok.stop_reason
                        return await self._text(on_text, text, True, ids, lps)
                    if text or lps:
                        await self._text(on_text, text, False, ids, lps)
                if finish is not None:
                    self._finished(finish)
        return await self._text(on_text, self.detok.finish(), True, [], None)

    def _track(self, generated: list[int], ids: list[int]) -> None:
        """Keep the output for a migration, until the sequence grows past the bound on that."""
        generated.extend(ids)
        bound = self.migration.max_seq_len if self.migration is not None else None
        if bound is not None and len(self.prompt.token_ids) + len(generated) > bound:
            self.generated = None
            self.migration = None

    async def _migrate(self, request: GenerateRequest, exc: Exception) -> GenerateRequest | None:
        """Continue on another worker after ``exc``, or raise it when this choice cannot move."""
        migration = self.migration
        generated = self.generated
        if (
            migration is None
            or generated is None
            or migration.left <= 0
            or not worker_failed(exc)
            or request.session_id is not None
            or (generated and request.constraint is not None)
        ):
            raise exc
        migration.left -= 1
        failed = self.route.worker.instance_id
        self.route.finished()
        self.base = len(generated)
        continued = continued_request(
            self.request, generated, f"{self.request.request_id}-m{migration.limit - migration.left}"
        )
        if continued.stop.max_tokens == 0:
            self.finish_reason = "length"
            return None
        self.route = await migration.reroute(continued)
        self.awaiting_first = True
        migration.count("ongoing_request" if generated else "new_request")
        log.warning(
            "request %s: worker %d failed (%s); continuing on worker %d after %d token(s), "
            "%d migration(s) left",
            self.request.request_id,
            failed,
            exc,
            self.route.worker.instance_id,
            len(generated),
            migration.left,
        )
        return msgspec.structs.replace(continued, priority=migration.priority(self.route))

    def _logprobs(self, ids: list[int], chunks: list[TokenChunk], keep: bool) -> list[TokenLogprobs] | None:
        if self.logprobs is None:
            return None
        lps = chunks[0].logprobs if len(chunks) == 1 else [lp for c in chunks for lp in c.logprobs]
        if len(lps) != len(ids):
            raise ApiError(
                500,
                f"the worker sent {len(lps)} logprobs for {len(ids)} tokens; does its engine "
                "return logprobs?",
                code="engine_error",
            )
        if keep:
            self.token_ids.extend(ids)
            self.logprobs.extend(lps)
        return lps

    async def _text(
        self, on_text: OnText | None, text: str, final: bool, ids: list[int], lps: list[TokenLogprobs] | None
    ) -> str:
        if on_text is None or self.keep_text:
            self.parts.append(text)
        if on_text is None:
            return ""
        if final:
            if lps:
                self.tail = (ids, lps)
            return text
        await on_text(self, text, ids, lps)
        return ""

    def _finished(self, finish: Finish) -> None:
        if finish.reason in ("error", "cancelled"):
            raise ApiError(
                500 if finish.reason == "error" else 503,
                f"the engine ended the request: {finish.reason}",
                code=finish.reason,
            )
        self.finish_reason = finish.reason
        self.timing.engine = finish.timing
        if finish.stop_token_id is not None and finish.stop_token_id in self.prompt.stop.stop_token_ids:
            self.stop_reason = finish.stop_token_id
        u = finish.usage
        base = self.base  # after a migration the engine saw the earlier output as prompt
        prompt_tokens = u.prompt_tokens - base
        self.usage = (prompt_tokens, u.completion_tokens + base, min(u.cached_tokens, prompt_tokens))
        lps = finish.prompt_logprobs
        self.prompt_logprobs = lps[:prompt_tokens] if base and lps is not None else lps


class Generation:
    """A prepared request: routed choices, ready to stream or collect."""

    def __init__(
        self,
        service: OpenAIService,
        ctx: RequestContext,
        req: _GenerationRequest,
        choices: list[_Choice],
        endpoint: str,
        echo_texts: list[str] | None,
    ) -> None:
        self.service = service
        self.ctx = ctx
        self.req = req
        self.choices = choices
        self.endpoint = endpoint
        self.chat = endpoint == "chat_completions"
        self.echo_texts = echo_texts
        self.nvext = req.nvext
        prefix = "chatcmpl-" if self.chat else "cmpl-"
        self.response_id = prefix + ctx.request_id
        self._logprob_formatters: dict[int, ChatLogprobs | CompletionLogprobs] = {}
        hints = req.nvext.agent_hints if req.nvext is not None else None
        if hints is not None and hints.speculative_prefill and self.chat and len(choices) == 1:
            choices[0].keep_text = True
        self.role = _response_role(req, service.outputs.response_role)
        """The role of the answer's message (chat only)."""

    def release(self) -> None:
        """End every choice's route (a no-op for those that ended): whatever happened to the
        request, no booking outlives it in the router's load model."""
        for choice in self.choices:
            choice.route.finished()

    # ----------------------------------------------------------------- streaming

    async def stream(self, emit: Emit) -> bytes:
        """Send the SSE body through ``emit`` up to its end, which is returned for the caller to
        send as the response's last part: the last choice's final event, the usage, ``data:
        [DONE]`` (one write where there would be three).

        Events that carry no tokens wait for the next write instead of taking one of their own:
        the role event goes out with the first text, and text from the batch that ends the
        choice goes out with its final event. A client sees the same events, and its first
        token no later; with the response's head joining the first write
        (``dyn.core.asgi.HeadWithBody``), a response at speedup 100 is one write where it was four.
        """
        enc = StreamEncoder(self.response_id, self.ctx.created, self.service.model_name, self.chat)
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

        async def on_text(
            choice: _Choice, text: str, ids: list[int], lps: list[TokenLogprobs] | None
        ) -> None:
            logprobs = self._logprobs_json(choice, ids, lps) if lps else None
            flush = not choice.finishing
            output = choice.output
            if output is None:
                await send(enc.text(choice.index, text, logprobs), flush)
                return
            delta = output.push(text)
            if delta is not None and not delta.reasoning and not delta.tool_calls:
                await send(enc.text(choice.index, delta.content, logprobs), flush)
            elif delta is not None or logprobs is not None:
                await send(enc.delta(choice.index, chat_delta(*delta) if delta else b"{}", logprobs), flush)

        fields = self.nvext.extra_fields if self.nvext is not None else None
        wanted = set(self.nvext.annotations or ()) if self.nvext is not None else set()

        async def run(choice: _Choice) -> bytes:
            """Stream ``choice`` and return its final event."""
            first = enc.role(choice.index, self.role) if self.chat else b""
            if self.echo_texts is not None:
                first += enc.text(choice.index, self.echo_texts[choice.index])
            if first:
                await send(first, flush=False)
            rest = await choice.run(on_text)
            extra = nvext_out.response_nvext(fields, choice.timing, choice.route)
            logprobs = self._logprobs_json(choice, *choice.tail) if choice.tail else None
            prompt_lps = None if self.chat else await self._prompt_logprobs_json(choice)
            output = choice.output
            if output is None:
                last = enc.finish(
                    choice.index,
                    choice.finish_reason,
                    choice.stop_reason,
                    rest,
                    extra,
                    logprobs=logprobs,
                    prompt_logprobs=prompt_lps,
                )
            else:
                delta = _joined(output.push(rest), output.finish())
                last = enc.finish(
                    choice.index,
                    output.finish_reason(choice.finish_reason),
                    choice.stop_reason,
                    nvext=extra,
                    delta=chat_delta(*delta) if delta else None,
                    logprobs=logprobs,
                )
            if "llm_metrics" in wanted:
                prompt_tokens, completion, cached = choice.usage
                last += nvext_out.annotation(
                    "llm_metrics",
                    nvext_out.llm_metrics(
                        choice.route, prompt_tokens, completion or choice.tokens, choice.last_chunk, cached
                    ),
                )
            return last

        async def run_and_send(choice: _Choice) -> None:
            await send(await run(choice))

        ok = False
        tail = b""
        try:
            if wanted:
                await send(self._annotations(wanted))
            if len(self.choices) == 1:
                tail = await run(self.choices[0])
            else:
                await self._run_all(run_and_send)
            opts = self.req.stream_options
            if opts is not None and opts.include_usage:
                tail += enc.usage(self._usage())
            ok = True
        except (ApiError, RemoteError, WorkerUnavailable) as exc:
            tail = error_event(_as_api_error(exc, self.req).body())
        finally:
            self.service.observe(self, ok, stream=True)
        if ok:
            self._after()
        return take() + tail + DONE

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
        ):
            choice = self.choices[0]
            self.service.speculative_prefill(req, "".join(choice.parts), self.ctx.request_id)

    async def _run_all(self, run: Callable[[_Choice], Awaitable[object]]) -> None:
        """Run every choice concurrently; the first failure cancels the others and is raised."""
        if len(self.choices) == 1:
            await run(self.choices[0])
            return
        errors: list[Exception] = []

        async def guarded(choice: _Choice) -> None:
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
        """Run every choice to the end and return the response body (JSON) in parts, for
        ``dyn.core.asgi.respond_parts``: the choices one by one, so that a body of tens of
        megabytes (``n`` x logprobs) is never encoded or copied in one piece."""
        ok = False
        try:
            await self._run_all(lambda choice: choice.run(None))
            ok = True
        except (RemoteError, WorkerUnavailable) as exc:
            raise _as_api_error(exc, self.req) from None
        finally:
            self.service.observe(self, ok, stream=False)
        self._after()
        model = self.service.model_name
        body: ChatCompletionResponse | CompletionResponse
        choices: list[bytes] = []
        for c in self.choices:  # logprobs first: encoding them yields between slices
            lps = await self._unary_logprobs(c)
            if self.chat:
                choices.append(msgspec.json.encode(self._chat_choice(c, lps)))
            else:
                choice = CompletionChoice(
                    c.index, self._text(c), c.finish_reason, lps, stop_reason=c.stop_reason
                )
                prompt_lps = await self._prompt_logprobs_json(c)
                if prompt_lps is not None:
                    choice.prompt_logprobs = msgspec.Raw(prompt_lps)
                choices.append(msgspec.json.encode(choice))
            if len(self.choices) > 1:
                await anyio.lowlevel.checkpoint()
        if self.chat:
            body = ChatCompletionResponse(self.response_id, self.ctx.created, model, [], self._usage())
            prompt_lps = await self._prompt_logprobs_json(self.choices[0])
            if prompt_lps is not None:
                body.prompt_logprobs = msgspec.Raw(prompt_lps)
        else:
            body = CompletionResponse(self.response_id, self.ctx.created, model, [], self._usage())
        first = self.choices[0]
        extra = nvext_out.response_nvext(
            self.nvext.extra_fields if self.nvext else None, first.timing, first.route
        )
        if extra is not None:
            body.nvext = msgspec.Raw(extra)
        return _with_choices(msgspec.json.encode(body), choices)

    def _text(self, choice: _Choice) -> str:
        text = "".join(choice.parts)
        if self.echo_texts is not None:
            text = self.echo_texts[choice.index] + text
        return text

    def _chat_choice(self, choice: _Choice, logprobs: msgspec.Raw | None) -> ChatChoice:
        output = choice.output
        if output is None:
            message = ChatMessageOut(self.role, self._text(choice))
            return ChatChoice(choice.index, message, choice.finish_reason, logprobs, choice.stop_reason)
        output.push("".join(choice.parts))
        output.finish()
        content, reasoning, calls = output.message()
        if self.echo_texts is not None:
            content = self.echo_texts[choice.index] + (content or "")
        message = ChatMessageOut(self.role, content, reasoning, calls)
        return ChatChoice(
            choice.index, message, output.finish_reason(choice.finish_reason), logprobs, choice.stop_reason
        )

    # ----------------------------------------------------------------- logprobs

    def _formatter(self, choice: _Choice) -> ChatLogprobs | CompletionLogprobs:
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

    def _logprobs_json(self, choice: _Choice, ids: list[int], lps: list[TokenLogprobs]) -> bytes:
        formatter = self._formatter(choice)
        if isinstance(formatter, ChatLogprobs):
            return formatter.encode(formatter.entries(ids, lps))
        return formatter.encode(ids, lps)

    async def _unary_logprobs(self, choice: _Choice) -> msgspec.Raw | None:
        if choice.logprobs is None:
            return None
        formatter = self._formatter(choice)
        return msgspec.Raw(await formatter.encode_whole(choice.token_ids, choice.logprobs))

    async def _prompt_logprobs_json(self, choice: _Choice) -> bytes | None:
        if choice.prompt_logprobs is None or choice.request.prompt_logprobs is None:
            return None
        return await prompt_logprobs_json(
            self.service.token_texts,
            choice.request.token_ids,
            choice.prompt_logprobs,
            choice.request.prompt_logprobs,
        )

    def _usage(self):
        """Prompt tokens count once per distinct prompt (n choices share theirs)."""
        n = self.req.n
        prompt = sum(c.usage[0] for c in self.choices if c.index % n == 0)
        completion = sum(c.usage[1] or c.tokens for c in self.choices)
        return usage_info(
            prompt, completion, self.cached_tokens(), details=self.service.outputs.prompt_tokens_details
        )

    def cached_tokens(self) -> int:
        """Prompt tokens served from the cache, over the choices of the first prompt."""
        n = self.req.n
        return sum(c.usage[2] for c in self.choices if c.index % n == 0)

    # ----------------------------------------------------------------- metrics

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


@dataclass(frozen=True, slots=True)
class OutputSettings:
    """The frontend's output flags (vLLM's spellings). A parser left unset here is taken from
    what the live workers advertise (``--dyn-tool-call-parser``, ``--dyn-reasoning-parser``);
    a worker's tool-call parser also enables ``tool_choice: auto``, as Dynamo's does."""

    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    enable_auto_tool_choice: bool = False
    max_logprobs: int = DEFAULT_MAX_LOGPROBS
    response_role: str = "assistant"
    """The role of a chat answer when the request adds a generation prompt (vLLM's
    ``--response-role``)."""
    return_tokens_as_token_ids: bool = False
    """Logprob tokens are ``token_id:N`` strings (vLLM's ``--return-tokens-as-token-ids``)."""
    prompt_tokens_details: bool = True
    """Usage carries ``prompt_tokens_details.cached_tokens`` (``--enable-prompt-tokens-details``)."""


@dataclass(slots=True)
class _Outputs:
    """What a request asks of every choice's output, beyond sampling."""

    plan: OutputPlan | None = None
    constraint: OutputConstraint | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    hinted_tools: tuple[Tool, ...] = ()
    """The tools to tell workers with ``FEATURE_TOOL_HINTS`` about (``tool_choice`` auto only)."""
    _hints: list[ToolSpec] | None = None

    def tool_hints(self) -> list[ToolSpec]:
        """``hinted_tools`` as the request plane carries them, encoded once per request."""
        if self._hints is None:
            self._hints = [
                ToolSpec(t.name, msgspec.json.encode(t.parameters).decode()) for t in self.hinted_tools
            ]
        return self._hints


class _Migration:
    """One choice's migration budget, and how it finds its next worker: routed like the first
    (same hints), the engine priority converted for the new worker's convention."""

    __slots__ = ("service", "template", "client_priority", "limit", "left", "max_seq_len")

    def __init__(self, service: OpenAIService, template: RouteRequest, client_priority: int | None) -> None:
        self.service = service
        self.template = template
        self.client_priority = client_priority
        self.limit = self.left = service.reliability.migration_limit
        self.max_seq_len = service.reliability.migration_max_seq_len

    async def reroute(self, request: GenerateRequest) -> Route:
        try:
            return await self.service.router.route(
                msgspec.structs.replace(
                    self.template, request_id=request.request_id, token_ids=request.token_ids
                )
            )
        except RoutingError as exc:
            raise _routing_error(exc) from None

    def count(self, kind: str) -> None:
        self.service.metrics.migrations.labels(self.service.model_name, kind).inc()

    def priority(self, route: Route) -> int | None:
        return engine_priority(
            self.client_priority, route.worker.record.priority_order, self.service.priority_convention
        )


class OpenAIService:
    """The OpenAI endpoints of one served model over a router."""

    def __init__(
        self,
        model_name: str,
        preprocessor: Preprocessor,
        router: Router,
        metrics: FrontendMetrics,
        background: BackgroundTasks | None = None,
        outputs: OutputSettings | None = None,
        reliability: Reliability | None = None,
        priority_convention: Convention = "dyn",
        request_log: RequestLog | None = None,
    ) -> None:
        """``priority_convention``: how a request's priority is read (``dyn.core.protocol.priority``);
        ``request_log``: logs each request as it is routed (``--enable-log-requests``)."""
        self.request_log = request_log
        self.model_name = model_name
        self.aliases: set[str] = set()
        """Other names requests may use for the model (``dyn.core.frontend.catalog``)."""
        self.lora_name: str | None = None
        """The LoRA adapter every request of this model runs with: ``model_name`` names an
        adapter of the base model the preprocessor tokenizes for (``dyn.core.frontend.catalog``)."""
        self.priority_convention: Convention = priority_convention
        self.preprocessor = preprocessor
        self.router = router
        self.metrics = metrics
        self.model_metrics = metrics.for_model(model_name)
        self.background = background
        """Runs speculative prefills; without it they are skipped."""
        self.outputs = outputs or OutputSettings()
        self.reliability = reliability or Reliability()
        self.token_texts = TokenTexts(preprocessor.tokenizer)

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name and model not in self.aliases:
            raise ApiError(
                404,
                f"The model '{model}' does not exist; this server serves "
                f"'{self.model_name}' (see GET /v1/models)",
                param="model",
                code="model_not_found",
            )

    def check_generates(self, api: str) -> None:
        """404 when live workers serve the model and every one is a pooling worker (it embeds
        and does not generate), as vLLM has no ``api`` for a pooling model."""
        workers = self.router.pool.workers()
        if workers and all(FEATURE_POOLING_ONLY in w.record.features for w in workers):
            raise ApiError(
                404,
                f"The model '{self.model_name}' does not support the {api} API: its workers run "
                "--runner pooling (embeddings only, POST /v1/embeddings); start workers without it "
                "to generate",
                param="model",
                code="generation_not_supported",
            )

    def parser_names(self) -> tuple[str | None, str | None, bool]:
        """(tool-call parser, reasoning parser, whether ``tool_choice: auto`` is on) for the
        next request: the frontend's flags, else the first live worker that advertises one."""
        settings = self.outputs
        tool, reasoning = settings.tool_call_parser, settings.reasoning_parser
        auto = settings.enable_auto_tool_choice and tool is not None
        if tool is None or reasoning is None:
            for worker in self.router.pool.workers():
                record = worker.record
                if tool is None and record.tool_call_parser:
                    tool, auto = record.tool_call_parser, True
                if reasoning is None and record.reasoning_parser:
                    reasoning = record.reasoning_parser
                if tool is not None and reasoning is not None:
                    break
        return tool, reasoning, auto

    async def prepare_chat(self, req: ChatCompletionRequest, ctx: RequestContext) -> Generation:
        check_chat(req, self.outputs.max_logprobs)
        self.check_model(req.model)
        self.check_generates("Chat Completions")
        plan = tool_plan(req.tools, req.tool_choice, req.parallel_tool_calls)
        tool_name, reasoning_name, auto = self.parser_names()
        if plan.choice == "auto" and not auto:
            raise bad_request(
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be '
                "set on the frontend (or workers started with --dyn-tool-call-parser); or send "
                'tool_choice "none"',
                param="tool_choice",
            )
        outputs = _Outputs(
            constraint=await _constraint(req, forced_schema(plan), self.preprocessor.info),
            logprobs=(req.top_logprobs or 0) if req.logprobs else None,
            prompt_logprobs=req.prompt_logprobs,
        )
        prompt = await self.preprocessor.chat_async(req)
        output_plan = OutputPlan(
            reasoning=_parser(REASONING_PARSERS, reasoning_name),
            tool_parser=_parser(TOOL_PARSERS, tool_name) if plan.choice == "auto" else None,
            tools=plan.tools,
            forced=plan.choice if plan.choice in ("named", "required") else None,
            forced_name=plan.name,
            prompt_text=prompt.text,
            chat_template_kwargs=req.chat_template_kwargs,
            constrained=outputs.constraint is not None,
        )
        if output_plan.reasoning or output_plan.tool_parser or output_plan.forced:
            outputs.plan = output_plan
        if plan.choice == "auto":
            outputs.hinted_tools = plan.tools
        echo = None
        if req.echo:
            last = req.messages[-1]
            content = last.get("content") if last.get("role") == "assistant" else None
            text = content if isinstance(content, str) else ""
            echo = [text] * req.n
        self._check_response_bytes(req, [prompt], outputs, echo)
        choices = await self._route([prompt], req, ctx, outputs)
        return Generation(self, ctx, req, choices, "chat_completions", echo)

    async def prepare_completion(self, req: CompletionRequest, ctx: RequestContext) -> Generation:
        check_completion(req, self.outputs.max_logprobs)
        self.check_model(req.model)
        self.check_generates("Completions")
        outputs = _Outputs(
            constraint=await _constraint(req, None, self.preprocessor.info),
            logprobs=req.logprobs,
            prompt_logprobs=req.prompt_logprobs,
        )
        prompts = await self.preprocessor.completions_async(req)
        echo = None
        if req.echo:
            tok = self.preprocessor.tokenizer
            echo = [
                p.text if p.text is not None else tok.decode(p.token_ids, False)
                for p in prompts
                for _ in range(req.n)
            ]
        self._check_response_bytes(req, prompts, outputs, echo)
        choices = await self._route(prompts, req, ctx, outputs)
        return Generation(self, ctx, req, choices, "completions", echo)

    def _check_response_bytes(
        self, req: _GenerationRequest, prompts: list[Prompt], outputs: _Outputs, echo: list[str] | None
    ) -> None:
        """Refuse a non-streaming request whose response could exceed ``--max-response-bytes``."""
        if req.stream:
            return
        check_response_bytes(
            [p.stop.max_tokens or 0 for p in prompts],
            [len(p.token_ids) for p in prompts],
            req.n,
            outputs.logprobs,
            outputs.prompt_logprobs,
            self.preprocessor.limits.max_response_bytes,
            echo_bytes=sum(len(text) for text in echo) if echo is not None else 0,
        )

    async def _route(
        self, prompts: list[Prompt], req: _GenerationRequest, ctx: RequestContext, outputs: _Outputs
    ) -> list[_Choice]:
        if self.request_log is not None:
            self.request_log.received(ctx.request_id, prompts, req.n)
        nvext = req.nvext
        instance_id, dp_rank, prefill_instance_id = nvext_out.routing_target(
            nvext, ctx.worker_instance_id, ctx.prefill_instance_id, ctx.dp_rank
        )
        hints = nvext.agent_hints if nvext is not None else None
        session = nvext.session_control if nvext is not None else None
        if session is not None and len(prompts) * req.n > 1:
            raise bad_request(
                "nvext.session_control needs a single choice: n=1 and one prompt",
                param="nvext.session_control",
            )
        cache = nvext.cache_control if nvext is not None else None
        route_template = RouteRequest(
            request_id="",
            token_ids=[],
            instance_id=instance_id,
            dp_rank=dp_rank,
            prefill_instance_id=prefill_instance_id,
            priority=queue_priority(hints.priority, self.priority_convention) if hints is not None else None,
            latency_sensitivity=hints.latency_sensitivity if hints is not None else None,
            expected_output_tokens=hints.osl if hints is not None else None,
            session=session,
            pin_ttl_s=float(cache.ttl_seconds()) if cache is not None else None,
            lora_name=self.lora_name,
        )
        client_priority = request_priority(req, self.priority_convention)
        tokenizer = self.preprocessor.tokenizer
        plan = outputs.plan
        skip_special = req.skip_special_tokens and not (plan is not None and plan.needs_special_tokens)
        migrates = self.reliability.migration_limit > 0 and instance_id is None and session is None
        members = [(prompt, j) for prompt in prompts for j in range(req.n)]
        route_requests = [
            msgspec.structs.replace(
                route_template,
                request_id=f"{ctx.request_id}-{next(_engine_seq):x}",
                token_ids=prompt.token_ids,
            )
            for prompt, _ in members
        ]
        try:  # the choices are admitted as one unit, so none waits behind its own siblings
            routes = await self.router.route_all(route_requests)
        except RoutingError as exc:
            raise _routing_error(exc) from None
        choices: list[_Choice] = []
        try:
            for index, ((prompt, j), route, route_request) in enumerate(
                zip(members, routes, route_requests, strict=True)
            ):
                engine_id = route_request.request_id
                detok = IncrementalDetokenizer(
                    tokenizer,
                    prompt.token_ids,
                    skip_special_tokens=skip_special,
                    spaces_between_special_tokens=req.spaces_between_special_tokens,
                    stop=prompt.stop_matcher or (),
                    include_stop_str_in_output=req.include_stop_str_in_output,
                )
                record = route.worker.record
                priority = engine_priority(client_priority, record.priority_order, self.priority_convention)
                hinted = outputs.hinted_tools and FEATURE_TOOL_HINTS in record.features
                request = engine_request(
                    engine_id,
                    prompt,
                    j,
                    priority,
                    route.session_id,
                    constraint=outputs.constraint,
                    logprobs=outputs.logprobs,
                    prompt_logprobs=outputs.prompt_logprobs,
                    tools=outputs.tool_hints() if hinted else None,
                    lora_name=self.lora_name,
                )
                timing = nvext_out.ChoiceTiming(ctx.received, ctx.received_wall, routed=time.perf_counter())
                migration = _Migration(self, route_template, client_priority) if migrates else None
                choices.append(
                    _Choice(
                        index,
                        prompt,
                        route,
                        request,
                        detok,
                        timing,
                        plan.new() if plan is not None else None,
                        migration,
                    )
                )
        except BaseException:  # whatever failed, no booking outlives the request
            for route in routes:
                route.finished()
            raise
        return choices

    # ----------------------------------------------------------------- speculative prefill

    def speculative_prefill(self, req: ChatCompletionRequest, reply: str, request_id: str) -> None:
        """Queue the prefill of the turn after ``req`` answered with ``reply`` (background)."""
        if self.background is not None:
            self.background.spawn(
                f"speculative prefill after {request_id}", self._speculative_prefill, req, reply, request_id
            )

    async def _speculative_prefill(self, req: ChatCompletionRequest, reply: str, request_id: str) -> None:
        # rendering and tokenizing a long conversation must not stall the streams being served
        token_ids = await self.preprocessor.next_turn_prefix_async(req, reply)
        if token_ids is None:
            return
        engine_id = f"{request_id}-spec-{next(_engine_seq):x}"
        route = await self.router.route(
            RouteRequest(request_id=engine_id, token_ids=token_ids, lora_name=self.lora_name)
        )
        try:
            request = GenerateRequest(
                engine_id,
                token_ids,
                stop=StopConditions(max_tokens=1, ignore_eos=True),
                lora_name=self.lora_name,
            )
            stream = route.worker.client.generate_batches(request)
            route.started()
            async with aclosing(stream):
                async for _ in stream:
                    route.first_token()
        finally:
            route.finished()
        log.debug(
            "speculative prefill of %d tokens after %s on worker %d",
            len(token_ids),
            request_id,
            route.worker.instance_id,
        )

    def observe(self, gen: Generation, ok: bool, stream: bool) -> None:
        m = self.model_metrics
        ttft, itl, duration = gen.timings()
        usage = gen._usage()
        m.requests(gen.endpoint, "stream" if stream else "unary", "success" if ok else "error").inc()
        m.duration.observe(duration)
        m.isl.observe(usage.prompt_tokens)
        m.osl.observe(usage.completion_tokens)
        m.cached.observe(gen.cached_tokens())
        m.output_tokens.inc(usage.completion_tokens)
        if ttft is not None:
            m.ttft.observe(ttft)
        if itl is not None:
            m.itl.observe(itl)


def _response_role(req: _GenerationRequest, response_role: str) -> str:
    """vLLM's ``get_chat_request_role``: with ``add_generation_prompt`` false the answer
    continues the conversation as its last message's author, else it is ``response_role``."""
    if isinstance(req, ChatCompletionRequest) and not req.add_generation_prompt:
        role = req.messages[-1].get("role")
        if isinstance(role, str):
            return role
    return response_role


def _parser(registry: Registry, name: str | None) -> type | None:
    """A parser class by the name the frontend was given or a worker advertised."""
    if not name:
        return None
    try:
        return registry.get(name)
    except UnknownParserError as exc:
        raise ApiError(
            500,
            f"a worker advertises a parser this frontend does not know ({exc}); start "
            "the frontend with its --tool-parser-plugin",
            code="unknown_parser",
        ) from None


async def _constraint(
    req: _GenerationRequest, forced_tool_schema: dict | None, model: ModelInfo
) -> OutputConstraint | None:
    """The request's structured-output constraint, checked off the event loop as a worker compiles
    it (``dyn.core.protocol.grammar``: the model's tokenizer, the workers' limits; milliseconds for
    a large schema, the model's grammar compiler built on the first constrained request)."""
    if (
        forced_tool_schema is None
        and req.response_format is None
        and req.guided_json is None
        and req.guided_regex is None
        and req.guided_choice is None
        and req.guided_grammar is None
        and req.structured_outputs is None
    ):
        return None
    return await anyio.to_thread.run_sync(_checked_constraint, req, forced_tool_schema, model)


def _checked_constraint(
    req: _GenerationRequest, forced_tool_schema: dict | None, model: ModelInfo
) -> OutputConstraint | None:
    return request_constraint(req, forced_tool_schema, GrammarCompiler.for_model(model))


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


def _joined(*deltas: OutputDelta | None) -> OutputDelta | None:
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


def _routing_error(exc: RoutingError) -> ApiError:
    if isinstance(exc, (NoWorkersError, AllWorkersBusyError)):
        return unavailable(str(exc))
    if isinstance(exc, WorkerNotFoundError):
        return ApiError(404, str(exc), param="nvext.backend_instance_id", code="worker_not_found")
    if isinstance(exc, TargetRequiredError):
        return bad_request(str(exc), param="nvext.backend_instance_id")
    if isinstance(exc, NotDisaggregatedError):
        return bad_request(str(exc), param="nvext.prefill_worker_id")
    if isinstance(exc, SessionOpenError):
        return unavailable(str(exc))
    return ApiError(500, str(exc))


def _as_api_error(exc: Exception, req: _GenerationRequest | None = None) -> ApiError:
    """The client's error for a failure reported during generation. A worker's ``bad_request`` is a
    400 in one line; a refusal of the request's constraint names its field (``param``)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, WorkerUnavailable):
        return unavailable(f"the worker serving this request went away: {exc}")
    assert isinstance(exc, RemoteError)
    if exc.code == "bad_request":
        message = one_line(exc.reply.message)
        param = refused_param(message, constraint_param(req)) if req is not None else None
        return bad_request(message, param=param, code="bad_request")
    return ApiError(500, f"engine error: {exc.reply.message}", code=exc.code)
