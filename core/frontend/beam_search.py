"""Beam search (vLLM's ``use_beam_search``) run by the frontend over any engine, as vLLM's own API
server runs it (``vllm/entrypoints/generate/beam_search/online.py``): the engine only ever
generates one token with its top log-probabilities.

A search keeps ``width`` beams (the request's ``n``). Each step sends every live beam's prompt plus
its tokens so far to a worker as a one-token request asking for ``2 * width`` top logprobs (each
routed like any request, so a KV router sends a beam where its prefix is cached), and extends each
beam by each of those tokens: a beam plus an end-of-sequence token is complete (unless
``ignore_eos``), the best ``width`` of the others go on. After ``max_tokens`` steps, or when no
beam goes on, the complete and the live beams are ranked by ``cumulative logprob / length **
length_penalty`` (the length counts the prompt, as vLLM's does) and the best ``width`` are the
answer, best first. The sampled token of each step is not used, so the result depends only on the
engine's log-probabilities; the step requests carry the request's temperature and seed (the
mocker's logprobs depend on the seed: without one the steps use 0, so a search is repeatable).

``BeamChoice`` is one of the ``n`` choices: the first of them to run starts the search, the others
wait for it, and each then writes its beam's tokens through the usual detokenizer and output
stage (stop strings apply to the text; an end-of-sequence token is not part of it).
"""

from __future__ import annotations

import itertools
import time
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import msgspec

from dyn.core.frontend.choice import Choice, OnText
from dyn.core.frontend.failures import routing_error
from dyn.core.messages import Finish, GenerateRequest, TokenChunk, TokenLogprobs
from dyn.core.protocol.errors import ApiError
from dyn.core.router.policy import Route, RouteRequest, RoutingError

if TYPE_CHECKING:
    from dyn.core.frontend.service import OpenAIService

_steps = itertools.count()

MAX_BEAM_STEP_REQUESTS = 4096
"""Most one-token requests a search may send, ``n * max_tokens`` (each is a prefill of its
beam): a larger search is a 400 that says so, since one request must not flood the workers."""


@dataclass(slots=True)
class Beam:
    """A sequence of output tokens with the sum of their logprobs; ``ended``: its last token is an
    end-of-sequence token (which its text leaves out)."""

    tokens: list[int]
    cum_logprob: float = 0.0
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    ended: bool = False


class BeamSearch:
    """One prompt's search (see the module docstring). ``first``: the route of the prompt's first
    step, already chosen with the request's other choices; ``template``: how later steps are
    routed; ``request``: the engine request the steps are made from; ``top``: the top logprobs the
    client asked for per token (each step asks for at least that many)."""

    def __init__(
        self,
        service: OpenAIService,
        first: Route,
        template: RouteRequest,
        request: GenerateRequest,
        *,
        width: int,
        max_tokens: int,
        length_penalty: float,
        eos_token_ids: tuple[int, ...],
        top: int = 0,
    ) -> None:
        self.service = service
        self.first = first
        self.template = template
        self.width = width
        self.max_tokens = max_tokens
        self.length_penalty = length_penalty
        self.ignore_eos = request.stop.ignore_eos
        self.eos = frozenset(() if self.ignore_eos else eos_token_ids)
        sampling = request.sampling
        if sampling.seed is None:
            sampling = msgspec.structs.replace(sampling, seed=0)
        self.step_request = msgspec.structs.replace(
            request,
            sampling=sampling,
            stop=msgspec.structs.replace(request.stop, max_tokens=1, min_tokens=0, stop_token_ids=[]),
            logprobs=max(2 * width, top),
            prompt_logprobs=None,
            constraint=None,
            session_id=None,
        )
        self.prompt_tokens = len(request.token_ids)
        self.cached_tokens = 0
        self._lock = anyio.Lock()
        self._result: list[Beam] | None = None

    async def beams(self) -> list[Beam]:
        """The best beams, best first (the search runs once, for the first caller)."""
        async with self._lock:
            if self._result is None:
                try:
                    self._result = await self._search()
                finally:
                    self.first.finished()
        return self._result

    async def _search(self) -> list[Beam]:
        live = [Beam([])]
        done: list[Beam] = []
        route: Route | None = self.first
        for _ in range(self.max_tokens):
            steps = await self._steps(live, route)
            route = None  # only the prompt's own step uses the first route
            candidates: list[Beam] = []
            for beam, top in zip(live, steps, strict=True):
                for token, logprob in zip(top.top_ids, top.top_logprobs, strict=True):
                    chosen = _chosen(top, token, logprob)
                    grown = Beam([*beam.tokens, token], beam.cum_logprob + logprob, [*beam.logprobs, chosen])
                    if token in self.eos:
                        grown.ended = True
                        done.append(grown)
                    else:
                        candidates.append(grown)
            candidates.sort(key=lambda b: b.cum_logprob, reverse=True)
            live = candidates[: self.width]
            if not live:
                break
        ranked = sorted([*done, *live], key=self._score, reverse=True)
        return ranked[: self.width]

    async def _steps(self, beams: list[Beam], first: Route | None) -> list[TokenLogprobs]:
        """The next token's top logprobs after each beam, all at once (``first``: the route of
        the first beam's step, None: each is routed)."""
        steps: list[TokenLogprobs | None] = [None] * len(beams)

        async def step(i: int) -> None:
            steps[i] = await self._step(beams[i], first if i == 0 else None)

        async with anyio.create_task_group() as tg:
            for i in range(len(beams)):
                tg.start_soon(step, i)
        return [s for s in steps if s is not None]

    def _score(self, beam: Beam) -> float:
        length = self.prompt_tokens + len(beam.tokens) - (1 if beam.ended else 0)
        return beam.cum_logprob / (max(length, 1) ** self.length_penalty)

    async def _step(self, beam: Beam, route: Route | None) -> TokenLogprobs:
        """One token after ``beam`` with its top logprobs, on ``route`` or a new one."""
        request_id = f"{self.step_request.request_id}-b{next(_steps):x}"
        token_ids = [*self.step_request.token_ids, *beam.tokens]
        if route is None:
            try:
                route = await self.service.router.route(
                    msgspec.structs.replace(self.template, request_id=request_id, token_ids=token_ids)
                )
            except RoutingError as exc:
                raise routing_error(exc) from None
            own = True
        else:
            own = False
        request = msgspec.structs.replace(self.step_request, request_id=request_id, token_ids=token_ids)
        found: TokenLogprobs | None = None
        try:
            stream = route.worker.client.generate_batches(request)
            route.started()
            async with aclosing(stream):
                async for batch in stream:
                    for item in batch:
                        if isinstance(item, TokenChunk) and item.logprobs and found is None:
                            found = item.logprobs[0]
                            route.first_token()
                        elif isinstance(item, Finish):
                            _check_finish(item)
                            if not beam.tokens:
                                self.cached_tokens = min(item.usage.cached_tokens, self.prompt_tokens)
        finally:
            if own:
                route.finished()
        if found is None or not found.top_ids:
            raise ApiError(
                500,
                "beam search needs each step's top logprobs, and the worker returned none; does "
                "its engine return logprobs?",
                code="engine_error",
            )
        return found


def _chosen(top: TokenLogprobs, token: int, logprob: float) -> TokenLogprobs:
    """The logprobs entry of ``token`` picked from ``top`` (its rank: its place in the list)."""
    return TokenLogprobs(logprob, top.top_ids, top.top_logprobs, top.top_ids.index(token) + 1)


def _check_finish(finish: Finish) -> None:
    if finish.reason in ("error", "cancelled"):
        raise ApiError(
            500 if finish.reason == "error" else 503,
            f"the engine ended a beam search step: {finish.reason}",
            code=finish.reason,
        )


class BeamChoice(Choice):
    """Choice ``rank`` (0: the best) of a beam search: its text is its beam's (see the module
    docstring), written when the search ends."""

    __slots__ = ("search", "rank")

    def __init__(self, *args, search: BeamSearch, rank: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.search = search
        self.rank = rank

    async def _generate(self, request: GenerateRequest, on_text: OnText | None) -> str:
        beams = await self.search.beams()
        beam = beams[self.rank] if self.rank < len(beams) else Beam([])
        ids = beam.tokens[:-1] if beam.ended else beam.tokens
        lps = beam.logprobs[: len(ids)]
        timing = self.timing
        timing.first = timing.last = time.perf_counter()
        timing.tokens = self.last_chunk = len(beam.tokens)
        search = self.search
        self.usage = (search.prompt_tokens, len(beam.tokens), search.cached_tokens)
        self.finish_reason = "stop" if beam.ended else "length"
        if self.logprobs is not None:
            top = request.logprobs or 0
            lps = [TokenLogprobs(lp.logprob, lp.top_ids[:top], lp.top_logprobs[:top], lp.rank) for lp in lps]
            if on_text is None:
                self.token_ids.extend(ids)
                self.logprobs.extend(lps)
        else:
            lps = []
        text = self.detok.push(ids)
        if self.detok.stopped:
            self.stop_reason = self.detok.stop_reason
            self.finish_reason = "stop"
            return await self._text(on_text, text, True, ids, lps or None)
        if text or lps:
            await self._text(on_text, text, False, ids, lps or None)
        return await self._text(on_text, self.detok.finish(), True, [], None)
