"""Preparing a request for the generation core: one validation, the chat template, the tokenizer,
and the route of every choice.

``OpenAIService`` serves one model over a router. ``prepare_chat`` (a request with messages: chat
completions, and the Responses and Messages APIs, whose adapters build a chat request) and
``prepare_completion`` (a text prompt) check the request, render and tokenize it, decide how its
output is read (reasoning and tool-call parsers, constraints, logprobs) and route it, raising
``ApiError`` for every failure that can be known before the first byte; the ``Generation`` they
return (``dyn.core.frontend.generation``) runs the choices and the API's ``Wire`` writes them.

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
from contextlib import aclosing
from dataclasses import dataclass

import anyio
import msgspec

from dyn.core.background import BackgroundTasks
from dyn.core.engine import FEATURE_MEDIA, FEATURE_POOLING_ONLY, FEATURE_TOOL_HINTS
from dyn.core.frontend import nvext as nvext_out
from dyn.core.frontend.agent_trace import AgentTrace
from dyn.core.frontend.beam_search import MAX_BEAM_STEP_REQUESTS, BeamChoice, BeamSearch
from dyn.core.frontend.choice import Choice, Migration
from dyn.core.frontend.detokenizer import IncrementalDetokenizer
from dyn.core.frontend.failures import routing_error
from dyn.core.frontend.generation import Generation, RequestContext, WireFactory
from dyn.core.frontend.limits import check_response_bytes
from dyn.core.frontend.logprobs import TokenTexts
from dyn.core.frontend.media import LoadedMedia, MediaSettings, load_media, media_parts
from dyn.core.frontend.metrics import FrontendMetrics
from dyn.core.frontend.migration import Reliability
from dyn.core.frontend.output import OutputPlan
from dyn.core.frontend.preprocessor import Preprocessor, Prompt, engine_request
from dyn.core.frontend.request_log import RequestLog
from dyn.core.frontend.session_identity import SessionAffinity, agent_ids
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.kv.hashing import MediaSpan, mm_key
from dyn.core.messages import GenerateRequest, MediaItem, OutputConstraint, StopConditions, ToolSpec
from dyn.core.model.info import ModelInfo
from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.registry import ParserModelError, ParserUnavailable, Registry, UnknownParserError
from dyn.core.parsers.tool import TOOL_PARSERS, Tool
from dyn.core.protocol.errors import ApiError, bad_request
from dyn.core.protocol.grammar import GrammarCompiler
from dyn.core.protocol.openai import (
    DEFAULT_MAX_LOGPROBS,
    AgentHints,
    ChatCompletionRequest,
    CompletionRequest,
    _GenerationRequest,
    check_chat,
    check_completion,
)
from dyn.core.protocol.priority import Convention, engine_priority, queue_priority, request_priority
from dyn.core.protocol.structured import request_constraint
from dyn.core.protocol.tools import forced_schema, tool_plan
from dyn.core.router.policy import Route, RouteOverrides, Router, RouteRequest, RouteSession, RoutingError

__all__ = ["Generation", "OpenAIService", "OutputSettings", "RequestContext"]


def media_spans(media: list[MediaItem]) -> list[MediaSpan]:
    """What a router needs of a prompt's media: where each item is and its key."""
    return [MediaSpan(m.offset, m.length, mm_key(m.mm_hash) or 0) for m in media]


log = logging.getLogger(__name__)

_engine_seq = itertools.count()


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
    reasoning_field_name: str = "reasoning_content"
    """The chat message's and delta's field for reasoning (``--reasoning-field-name``)."""
    force_include_usage: bool = False
    """Every stream carries usage, in each chunk and at its end, as if its ``stream_options`` asked
    for both (``--enable-force-include-usage``)."""


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
        agent_trace: AgentTrace | None = None,
        affinity: SessionAffinity | None = None,
        media: MediaSettings | None = None,
    ) -> None:
        """``priority_convention``: how a request's priority is read (``dyn.core.protocol.priority``);
        ``request_log``: logs each request as it is routed (``--enable-log-requests``);
        ``affinity``: what a session id a client sends does (``dyn.core.frontend.session_identity``);
        ``media``: how the images (audio, video) of messages are fetched and bounded."""
        self.media = media or MediaSettings()
        self.affinity = affinity or SessionAffinity()
        self.request_log = request_log
        self.agent_trace = agent_trace
        """Writes a line per finished request (``--agent-trace-file``), when set."""
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

    async def prepare_chat(
        self,
        req: ChatCompletionRequest,
        ctx: RequestContext,
        wire: WireFactory,
        endpoint: str,
        api: str = "Chat Completions",
    ) -> Generation:
        """A request with messages, ready to generate and be written by ``wire``; ``endpoint``
        labels it in the metrics, ``api`` names the API in errors."""
        check_chat(req, self.outputs.max_logprobs)
        self.check_model(req.model)
        self.check_generates(api)
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
        prompt = await self.preprocessor.chat_async(req, await self._media(req))
        output_plan = OutputPlan(
            reasoning=_parser(REASONING_PARSERS, reasoning_name, self.preprocessor.tokenizer),
            tool_parser=(
                _parser(TOOL_PARSERS, tool_name, self.preprocessor.tokenizer)
                if plan.choice == "auto"
                else None
            ),
            tools=plan.tools,
            forced=plan.choice if plan.choice in ("named", "required") else None,
            forced_name=plan.name,
            prompt_text=prompt.text,
            chat_template_kwargs=self.preprocessor.template_kwargs(req),
            constrained=outputs.constraint is not None,
            tokenizer=self.preprocessor.tokenizer,
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
        return Generation(self, ctx, req, choices, endpoint, echo, wire)

    async def _media(self, req: ChatCompletionRequest) -> list[LoadedMedia]:
        """The messages' images (audio, video), loaded and checked (``dyn.core.frontend.media``);
        a 400 before anything is fetched when the model or its workers take none."""
        parts = media_parts(req.messages)
        if not parts:
            return []
        kinds = sorted({p.modality for p in parts})
        taken = set(self.preprocessor.placeholders or ())
        if not set(kinds) <= taken:
            first = next(p for p in parts if p.modality not in taken)
            family = self.preprocessor.uncounted_media.get(first.modality)
            if family is not None:
                raise bad_request(
                    f"{first.param}: model {self.model_name!r} takes {first.modality}s, but dyn does "
                    f"not count their placeholder tokens for its family ({family}): not built; send text",
                    param=first.param,
                )
            raise bad_request(
                f"{first.param}: model {self.model_name!r} takes no {first.modality} input; send "
                f"text, or serve a model that takes {first.modality}s",
                param=first.param,
            )
        workers = self.router.pool.workers()
        if workers and not any(FEATURE_MEDIA in w.record.features for w in workers):
            raise bad_request(
                f"{parts[0].param}: the workers serving {self.model_name!r} take no images, audio "
                "or video (their engine does not list the media feature); send text",
                param=parts[0].param,
            )
        return await load_media(req.messages, self.media)

    async def prepare_completion(
        self, req: CompletionRequest, ctx: RequestContext, wire: WireFactory
    ) -> Generation:
        """A request with a text or token prompt (or a batch), ready to generate."""
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
        return Generation(self, ctx, req, choices, "completions", echo, wire)

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
    ) -> list[Choice]:
        if self.request_log is not None:
            self.request_log.received(ctx.request_id, prompts, req.n, ctx.session_id, ctx.parent_session_id)
        nvext = req.nvext
        instance_id, dp_rank, prefill_instance_id = nvext_out.routing_target(
            nvext, ctx.worker_instance_id, ctx.prefill_instance_id, ctx.dp_rank
        )
        hints = nvext.agent_hints if nvext is not None else None
        session = nvext.session_control if nvext is not None else None
        if session is not None and len(prompts) * req.generations > 1:
            raise bad_request(
                "nvext.session_control needs a single choice: n=1 and one prompt",
                param="nvext.session_control",
            )
        cache = nvext.cache_control if nvext is not None else None
        trajectory, parent = agent_ids(nvext, ctx.session_id, ctx.parent_session_id)
        affinity = self.affinity
        by_id = None
        if (
            session is None
            and ctx.session_id is not None
            and affinity.mode != "off"
            and len(prompts) * req.generations == 1
        ):
            by_id = RouteSession(ctx.session_id, timeout=affinity.ttl_s)
        route_template = RouteRequest(
            request_id="",
            token_ids=[],
            instance_id=instance_id,
            dp_rank=dp_rank,
            prefill_instance_id=prefill_instance_id,
            priority=queue_priority(hints.priority, self.priority_convention) if hints is not None else None,
            latency_sensitivity=hints.latency_sensitivity if hints is not None else None,
            expected_output_tokens=hints.osl if hints is not None else None,
            session=RouteSession(session.session_id, session.action, session.timeout) if session else by_id,
            affinity=affinity.mode if by_id is not None else None,  # type: ignore[arg-type]
            pin_ttl_s=float(cache.ttl_seconds()) if cache is not None else None,
            lora_name=self.lora_name,
            overrides=_credit_override(hints),
            trajectory=trajectory,
            parent=parent,
        )
        client_priority = request_priority(req, self.priority_convention)
        tokenizer = self.preprocessor.tokenizer
        plan = outputs.plan
        skip_special = req.skip_special_tokens and not (plan is not None and plan.needs_special_tokens)
        migrates = self.reliability.migration_limit > 0 and instance_id is None and session is None
        beam = req.use_beam_search
        if beam and outputs.constraint is not None:
            raise bad_request(
                "beam search cannot follow a structured output (response_format, structured_outputs "
                "or a forced tool call): each step is a new one-token request; drop one of the two",
                param="use_beam_search",
            )
        members = [(prompt, j) for prompt in prompts for j in range(req.generations)]
        routed = [(p, 0) for p in prompts] if beam else members  # a search routes its own steps
        route_requests = [
            msgspec.structs.replace(
                route_template,
                request_id=f"{ctx.request_id}-{next(_engine_seq):x}",
                token_ids=prompt.token_ids,
                media=media_spans(prompt.media),
            )
            for prompt, _ in routed
        ]
        try:  # the choices are admitted as one unit, so none waits behind its own siblings
            routes = await self.router.route_all(route_requests)
        except RoutingError as exc:
            raise routing_error(exc) from None
        if beam:
            routes = [route for route in routes for _ in range(req.n)]
            route_requests = [r for r in route_requests for _ in range(req.n)]
        choices: list[Choice] = []
        search: BeamSearch | None = None
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
                    logprobs=outputs.logprobs if req.generations == req.n else outputs.logprobs or 0,
                    prompt_logprobs=outputs.prompt_logprobs,
                    tools=outputs.tool_hints() if hinted else None,
                    lora_name=self.lora_name,
                )
                timing = nvext_out.ChoiceTiming(
                    ctx.received, ctx.received_wall, routed=time.perf_counter(), session_id=ctx.session_id
                )
                output = plan.new() if plan is not None else None
                if beam:
                    if j == 0:
                        search = self._beam_search(route, route_template, request, prompt, req, outputs)
                    assert search is not None
                    choices.append(
                        BeamChoice(
                            index, prompt, route, request, detok, timing, output, search=search, rank=j
                        )
                    )
                    continue
                migration = Migration(self, route_template, client_priority) if migrates else None
                choices.append(Choice(index, prompt, route, request, detok, timing, output, migration))
        except BaseException:  # whatever failed, no booking outlives the request
            for route in routes:
                route.finished()
            raise
        return choices

    def _beam_search(
        self,
        first: Route,
        template: RouteRequest,
        request: GenerateRequest,
        prompt: Prompt,
        req: _GenerationRequest,
        outputs: _Outputs,
    ) -> BeamSearch:
        """The search of one prompt's ``n`` beams (``dyn.core.frontend.beam_search``), to the
        prompt's ``max_tokens`` or the context's end."""
        info = self.preprocessor.info
        max_tokens = prompt.stop.max_tokens
        most = MAX_BEAM_STEP_REQUESTS // req.n
        if max_tokens is None or max_tokens > most:
            raise bad_request(
                f"beam search sends one request per beam per token: with n={req.n} it takes at most "
                f"max_tokens={most} (n * max_tokens <= {MAX_BEAM_STEP_REQUESTS}); send max_tokens",
                param="max_tokens",
            )
        return BeamSearch(
            self,
            first,
            template,
            request,
            width=req.n,
            max_tokens=max_tokens,
            length_penalty=req.length_penalty,
            eos_token_ids=info.eos_token_ids,
            top=outputs.logprobs or 0,
        )

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
        usage = gen.usage()
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
        if self.agent_trace is not None:
            self.agent_trace.record(gen, ok)


def check_parsers(outputs: OutputSettings, tokenizer: Tokenizer) -> None:
    """The parsers the frontend's flags name, checked against the served model (``tokenizer``'s):
    ``ParserModelError`` (a ``ValueError``) says what the model lacks. The tool-call parser only
    counts with ``--enable-auto-tool-choice``, the only way the frontend uses it."""
    if outputs.tool_call_parser and outputs.enable_auto_tool_choice:
        TOOL_PARSERS.get(outputs.tool_call_parser).check_tokenizer(tokenizer)
    if outputs.reasoning_parser:
        REASONING_PARSERS.get(outputs.reasoning_parser).check_tokenizer(tokenizer)


def _parser(registry: Registry, name: str | None, tokenizer: Tokenizer) -> type | None:
    """A parser class by the name the frontend was given or a worker advertised, usable with the
    served model (``tokenizer``'s): a 500 says what is missing when it is not."""
    if not name:
        return None
    try:
        cls = registry.get(name)
        cls.check_tokenizer(tokenizer)
    except UnknownParserError as exc:
        raise ApiError(
            500,
            f"a worker advertises a parser this frontend does not know ({exc}); start "
            "the frontend with its --tool-parser-plugin",
            code="unknown_parser",
        ) from None
    except (ParserModelError, ParserUnavailable) as exc:
        raise ApiError(
            500,
            f"the {registry.kind} {name!r} cannot read this model's output: {exc}",
            code="unusable_parser",
        ) from None
    return cls


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


def _credit_override(hints: AgentHints | None) -> RouteOverrides | None:
    """``agent_hints.kv_overlap_score_credit`` as the router's per-request override."""
    if hints is None or hints.kv_overlap_score_credit is None:
        return None
    return RouteOverrides(overlap_score_credit=hints.kv_overlap_score_credit)
