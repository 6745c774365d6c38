"""What the mocker answers a request with: the agent test double's choice of token source.

In order, for a request:

0. ``logit_bias`` or ``allowed_token_ids`` (``SamplingParams``): sampled under them
   (``sources.BiasedSource``), never scripted, since a script would not obey them; with a
   constraint too, a ``bad_request`` (the mocker's grammars do not combine with them);
1. ``--replies``: the first entry matching the conversation's last user message or tool result is
   streamed as written (``replies``, ``conversation``); under a constraint only when the scripted
   text satisfies it;
2. a constraint (``GenerateRequest.constraint``): sampled under its grammar (``grammar``);
3. ``--tool-call-rate P`` with the request's tools (sent only with ``tool_choice`` auto, to workers
   that advertise ``FEATURE_TOOL_HINTS``) and no constraint: with probability P, drawn from the
   request's seed, one call to one of the tools, its arguments sampled under the tool's parameters
   schema (bounded, as constraints are), written as the worker's ``--dyn-tool-call-parser`` writes
   calls (``ToolParser.render``), then EOS;
4. otherwise no source: uniform random tokens (the scheduler's default path).

A request with none of these costs nothing here. A constraint or a tool schema the grammar engine
refuses is an ``EngineError`` with code ``bad_request`` and a one-line ``grammar.refusal`` message
(the frontend names the request's field from it). Compiling (and building the grammar engine, once
per process) runs in a worker thread, outside the event loop.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING

import anyio

from dyn.core.engine import EngineError
from dyn.core.messages import GenerateRequest, OutputConstraint, ToolSpec
from dyn.core.model import ModelInfo
from dyn.plugins.mocker.replies import Replies
from dyn.plugins.mocker.sources import BiasedSource, ScriptedSource, TokenSource

if TYPE_CHECKING:  # grammar loads numpy and llguidance: only when a request needs it
    from dyn.plugins.mocker.grammar import Grammar, GrammarEngine

log = logging.getLogger(__name__)

MAX_ARGUMENT_TOKENS = 1024
"""A tool call's arguments that do not end within this many tokens give up the call."""
_TOOL_SALT = 0x746F6F6C5F63616C


class Answers:
    """Chooses each request's token source (see the module docstring); one per engine."""

    def __init__(
        self,
        model: ModelInfo,
        *,
        replies: Replies | None = None,
        tool_call_rate: float = 0.0,
        tool_call_parser: str | None = None,
    ) -> None:
        self.model = model
        self.replies = replies
        self.tool_call_rate = tool_call_rate
        self.scripted = replies is not None or tool_call_rate > 0
        """Requests without a constraint may get a source too."""
        self._eos = model.eos_token_ids[0] if model.eos_token_ids else None
        self._parser = None
        self._tokenizer = None
        self._last_message = None
        if tool_call_rate > 0:
            from dyn.core.parsers.tool import TOOL_PARSERS

            if not tool_call_parser:
                raise ValueError(
                    "--tool-call-rate needs the worker's tool-call format: add "
                    "--dyn-tool-call-parser NAME (e.g. hermes), or set the rate to 0"
                )
            self._parser = TOOL_PARSERS.get(tool_call_parser)
            _check_renders(self._parser)
        if self.scripted:
            from dyn.core.frontend.tokenizer import Tokenizer

            self._tokenizer = Tokenizer.from_model(model)
            if replies is not None:
                from dyn.plugins.mocker.conversation import LastMessage

                self._last_message = LastMessage(self._tokenizer)
        self._engine: GrammarEngine | None = None

    def wants(self, request: GenerateRequest) -> bool:
        """Whether ``request`` may get a source (cheap; the default path skips ``source_for``)."""
        sampling = request.sampling
        return (
            request.constraint is not None
            or self.scripted
            or sampling.logit_bias is not None
            or sampling.allowed_token_ids is not None
        )

    async def source_for(self, request: GenerateRequest, seed: int) -> TokenSource | None:
        sampling = request.sampling
        if sampling.logit_bias is not None or sampling.allowed_token_ids is not None:
            # sampled under them, never a scripted reply or tool call (which would not obey them)
            if request.constraint is not None:
                raise EngineError(
                    "the mocker does not combine logit_bias or allowed_token_ids with a structured "
                    "output; drop one of them",
                    code="bad_request",
                )
            return BiasedSource(
                sampling.logit_bias, sampling.allowed_token_ids, sampling.temperature, self.model.vocab_size
            )
        grammar = None
        if request.constraint is not None:
            grammar = await self._compile(request.constraint)
        if self.replies is not None:
            text = self.replies.answer(self._last_message.text(request.token_ids))  # type: ignore[union-attr]
            if text is not None:
                tokens = self._tokenizer.encode(text, add_special_tokens=False)  # type: ignore[union-attr]
                if grammar is None or await anyio.to_thread.run_sync(grammar.accepts, tokens):
                    return ScriptedSource(tokens, self._eos, self.model.vocab_size)
                log.debug(
                    "request %s: the scripted reply does not satisfy its constraint; sampling instead",
                    request.request_id,
                )
        if grammar is not None:
            return grammar.source()
        if self.tool_call_rate > 0 and request.tools:
            return await self._tool_call(request, seed)
        return None

    async def _grammars(self) -> GrammarEngine:
        if self._engine is None:
            from dyn.plugins.mocker.grammar import GrammarEngine

            self._engine = await anyio.to_thread.run_sync(GrammarEngine.for_model, self.model)
        return self._engine

    async def _compile(self, what: OutputConstraint | ToolSpec) -> Grammar:
        """The grammar of a request's structured output, or of a tool call's arguments."""
        from dyn.plugins.mocker.grammar import ConstraintError

        engine = await self._grammars()
        tool = what if isinstance(what, ToolSpec) else None
        grammar = engine.cached(what if tool is None else ("tool", tool.parameters))
        if grammar is not None:
            return grammar
        try:
            if isinstance(what, ToolSpec):
                return await anyio.to_thread.run_sync(engine.compile_schema, what.parameters)
            return await anyio.to_thread.run_sync(engine.compile, what)
        except ConstraintError as exc:
            from dyn.core.protocol.grammar import refusal

            message = refusal(str(exc), None if tool is None else tool.name)
            raise EngineError(message, code="bad_request") from None

    async def _tool_call(self, request: GenerateRequest, seed: int) -> TokenSource | None:
        rng = random.Random(seed ^ _TOOL_SALT)
        if rng.random() >= self.tool_call_rate:
            return None
        tool = request.tools[int(rng.random() * len(request.tools))]
        grammar = await self._compile(tool)
        # up to a few hundred grammar steps: off the event loop, as compiles are
        arguments = await anyio.to_thread.run_sync(grammar.complete, rng.random, MAX_ARGUMENT_TOKENS)
        if arguments is None:
            log.debug(
                "request %s: arguments for %s did not end; answering without a call",
                request.request_id,
                tool.name,
            )
            return None
        from dyn.core.parsers.tool import ToolCall

        text = self._parser.render([ToolCall(tool.name, arguments)])  # type: ignore[union-attr]
        tokens = self._tokenizer.encode(text, add_special_tokens=False)  # type: ignore[union-attr]
        return ScriptedSource(tokens, self._eos, self.model.vocab_size, thinks=True)


def _check_renders(parser) -> None:
    from dyn.core.parsers.tool import ToolCall

    try:
        parser.render([ToolCall("probe", "{}")])
    except NotImplementedError:
        raise ValueError(
            f"the {parser.name} tool-call parser cannot write calls, so --tool-call-rate "
            "cannot use it; pick another --dyn-tool-call-parser or set the rate to 0"
        ) from None
