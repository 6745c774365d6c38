"""One choice of a generation: one engine request, from its route to its last token.

A ``Choice`` sends its ``GenerateRequest`` to the worker its route chose, reads the worker's
batches (token chunks, then ``Finish``), keeps the timing, usage and logprobs, and runs the text
through its detokenizer. Text goes to an ``on_text`` callback as it comes (streaming) or is kept
(unary). When its worker fails mid-stream and the request may move (``Migration``), it continues
on another worker with the tokens generated so far.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, cast

import msgspec

from dyn.core.frontend import nvext as nvext_out
from dyn.core.frontend.detokenizer import IncrementalDetokenizer
from dyn.core.frontend.failures import routing_error
from dyn.core.frontend.migration import continued_request, worker_failed
from dyn.core.frontend.output import ChoiceOutput
from dyn.core.frontend.prefill import run_prefill
from dyn.core.frontend.preprocessor import Prompt
from dyn.core.messages import Finish, GenerateRequest, TokenChunk, TokenLogprobs
from dyn.core.protocol.errors import ApiError
from dyn.core.protocol.priority import engine_priority
from dyn.core.router.policy import Route, RouteRequest, RoutingError
from dyn.core.transport.request_plane import RemoteError, WorkerUnavailable

if TYPE_CHECKING:
    from dyn.core.frontend.service import OpenAIService

log = logging.getLogger(__name__)

OnText = Callable[["Choice", str, list[int], "list[TokenLogprobs] | None"], Awaitable[None]]


class Choice:
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
        migration: Migration | None = None,
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


class Migration:
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
            raise routing_error(exc) from None

    def count(self, kind: str) -> None:
        self.service.metrics.migrations.labels(self.service.model_name, kind).inc()

    def priority(self, route: Route) -> int | None:
        return engine_priority(
            self.client_priority, route.worker.record.priority_order, self.service.priority_convention
        )
