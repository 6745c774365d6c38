"""Scripted stand-ins for engine workers, for in-process frontend tests (no process, no socket).

A ``FakeFleet`` registers one discovery record per ``FakeWorker`` and opens a ``FakeClient`` in
place of the request-plane ``WorkerClient`` (``WorkerPool.client_factory``). The fake client keeps
the real client's contract (``dyn.core.transport.request_plane``): ``generate_batches`` yields
lists of ``TokenChunk``s, the last list ending with the ``Finish``; an ``ErrorReply`` raises
``RemoteError``; a failure raises ``WorkerUnavailable``; leaving the iterator before the
``Finish`` cancels the request (the worker records its id in ``cancelled``, where the real client
sends a ``CancelRequest``). Control calls (sessions, pins) are answered with ``ErrorReply``
``unsupported``, as a worker without those features answers.

What a worker answers is its ``script``: ``script(request)`` is an async iterator of reply
batches. ``reply(text)`` answers with the tokens of ``text`` one per chunk and a ``Finish`` whose
reason is ``length`` when ``max_tokens`` cut it, else ``stop`` (as an engine that reached EOS);
``endless(pace_s)`` streams a token per ``pace_s`` until cancelled; ``failing(code)`` answers
with an ``ErrorReply``; ``held(event, script)`` waits for ``event`` before answering.

A worker whose ``features`` list ``embed`` answers ``EmbedRequest``s (``FakeClient.embed``) with
``fake_vector(ids)`` per input (``fake_probs(ids)`` for the ``classify`` task; for a token task,
those of each prefix of the ids end to end), and records them in ``embeds``; ``embed_error``,
when set, is the ``ErrorReply`` it answers them with instead.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from typing import Any, Self

import anyio
import msgspec

from dyn.core.discovery.store import DiscoveryStore
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.messages import (
    CLASSIFY_TASKS,
    TOKEN_TASKS,
    EmbedReply,
    EmbedRequest,
    ErrorReply,
    Finish,
    GenerateRequest,
    TokenChunk,
    Usage,
    WorkerEndpoints,
    WorkerRecord,
)
from dyn.core.model.info import load_model_info
from dyn.core.model.pooler import RANKING_TOKEN_IDS
from dyn.core.transport.request_plane import RemoteError, WorkerUnavailable

Batch = list[TokenChunk | Finish]
Script = Callable[[GenerateRequest], AsyncIterator[Batch]]

DEFAULT_TEXT = "The fake worker says hello to you."
RECORD_TTL_S = 3600.0
"""Records outlive any test, so nothing expires while one runs."""


@functools.cache
def tokenizer() -> Tokenizer:
    """dyn-tiny's tokenizer (the model the frontend serves by default)."""
    return Tokenizer.from_dir(load_model_info(None, None).path)


def token_ids(text: str) -> list[int]:
    return tokenizer().encode(text, add_special_tokens=False)


def first_tokens_text(text: str, tokens: int) -> str:
    """What the first ``tokens`` tokens of ``text`` decode to."""
    return tokenizer().decode(token_ids(text)[:tokens])


def reply(text: str = DEFAULT_TEXT, *, per_chunk: int = 1) -> Script:
    """Answer with ``text``'s tokens (``per_chunk`` in each ``TokenChunk``), at most the request's
    ``max_tokens`` of them; the ``Finish`` reason is ``length`` when that cut the text, else
    ``stop``."""
    ids = token_ids(text)

    async def script(request: GenerateRequest) -> AsyncIterator[Batch]:
        limit = request.stop.max_tokens
        out = ids if limit is None else ids[:limit]
        for i in range(0, len(out), per_chunk):
            yield [TokenChunk(request.request_id, out[i : i + per_chunk])]
        reason = "length" if len(out) < len(ids) else "stop"
        yield [finish(request, reason, len(out))]

    return script


def endless(pace_s: float = 0.005) -> Script:
    """Stream one token every ``pace_s`` seconds (the pacing is the behaviour: a long generation)
    until the consumer leaves."""
    ids = token_ids(DEFAULT_TEXT)

    async def script(request: GenerateRequest) -> AsyncIterator[Batch]:
        i = 0
        while True:
            yield [TokenChunk(request.request_id, [ids[i % len(ids)]])]
            i += 1
            await anyio.sleep(pace_s)

    return script


def failing(code: str = "engine_error", message: str = "the fake engine failed") -> Script:
    """Answer every request with an ``ErrorReply``."""

    async def script(request: GenerateRequest) -> AsyncIterator[Batch]:
        raise RemoteError(ErrorReply(request.request_id, code, message))
        yield []  # an async generator all the same

    return script


def held(event: anyio.Event, then: Script | None = None) -> Script:
    """Answer as ``then`` (default ``reply()``) once ``event`` is set: requests pile up in flight."""
    inner = then or reply()

    async def script(request: GenerateRequest) -> AsyncIterator[Batch]:
        await event.wait()
        async for batch in inner(request):
            yield batch

    return script


def finish(request: GenerateRequest, reason: str, completion_tokens: int) -> Finish:
    return Finish(
        request.request_id,
        reason,  # type: ignore[arg-type]
        Usage(len(request.token_ids), completion_tokens),
    )


def fake_vector(ids: list[int]) -> list[float]:
    """A fake worker's embedding of ``ids``: 4 floats that name the input (its length, first and
    last id) and a constant, not normalized; what it is matters less than that it tells inputs apart."""
    return [float(len(ids)), float(ids[0]), float(ids[-1]), 0.5]


def fake_probs(ids: list[int]) -> list[float]:
    """A fake classifier's answer for ``ids``: 3 probabilities (its length, first and last id,
    normalized), so the likeliest class is known from the ids."""
    raw = [float(len(ids)), float(ids[0]), float(ids[-1])]
    total = sum(raw) or 1.0
    return [v / total for v in raw]


def row_ends(ids: list[int]) -> list[int]:
    """Where a token task's rows of ``ids`` end: after each token, or for a listwise ranker's
    prompt (it holds the marker ids) after each document marker and then the query marker."""
    document, query = RANKING_TOKEN_IDS
    if query not in ids:
        return list(range(1, len(ids) + 1))
    return [i + 1 for i, t in enumerate(ids) if t == document] + [
        i + 1 for i, t in enumerate(ids) if t == query
    ]


class FakeWorker:
    """One worker instance: what it was asked (``requests``), which requests its consumer left
    before their end (``cancelled``), and what it answers (``script``, replaceable any time)."""

    def __init__(self, instance_id: int, script: Script | None = None) -> None:
        self.instance_id = instance_id
        self.script: Script = script or reply()
        self.requests: list[GenerateRequest] = []
        self.cancelled: list[str] = []
        self.in_flight = 0
        self.endpoint = f"fake://worker-{instance_id}"
        self.features: list[str] = []
        self.embeds: list[EmbedRequest] = []
        self.embed_error: ErrorReply | None = None

    def record(self, namespace: str, model_name: str) -> WorkerRecord:
        return WorkerRecord(
            instance_id=self.instance_id,
            namespace=namespace,
            model_name=model_name,
            engine="fake",
            endpoints=WorkerEndpoints(request=self.endpoint),
            block_size=16,
            total_kv_blocks=1024,
            max_num_batched_tokens=8192,
            features=list(self.features),
        )


class FakeClient:
    """``WorkerClient``'s interface over a ``FakeWorker`` (see the module docstring)."""

    def __init__(
        self,
        worker: FakeWorker,
        endpoint: str,
        *,
        first_token_timeout_s: float = 0.0,
        inter_token_timeout_s: float = 0.0,
        on_health: Any = None,
    ) -> None:
        self.worker = worker
        self.endpoint = endpoint
        self.on_health = on_health
        self.healthy = True
        self._closed = False
        self._failure: BaseException | None = None
        self.messages_received = 0

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._closed = True

    @property
    def in_flight(self) -> int:
        return self.worker.in_flight

    def fail_all(self, error: BaseException) -> None:
        if self.worker.in_flight:
            self._failure = error

    async def call(self, message: Any, timeout_s: float = 10.0) -> Any:
        raise RemoteError(
            ErrorReply(message.request_id, "unsupported", "the fake worker serves no control calls")
        )

    async def embed(self, request: EmbedRequest, timeout_s: float) -> EmbedReply:
        if self._closed:
            raise WorkerUnavailable(f"client for {self.endpoint} is closed")
        worker = self.worker
        worker.embeds.append(request)
        if worker.embed_error is not None:
            raise RemoteError(worker.embed_error)
        pool = fake_probs if request.task in CLASSIFY_TASKS else fake_vector
        if request.task in TOKEN_TASKS:  # a row per token (a listwise ranker's marker), over the ids up to it
            vectors = [[v for end in row_ends(ids) for v in pool(ids[:end])] for ids in request.prompts]
        else:
            vectors = [pool(ids) for ids in request.prompts]
        return EmbedReply(request.request_id, vectors, sum(len(p) for p in request.prompts))

    async def generate_batches(self, request: GenerateRequest) -> AsyncIterator[Batch]:
        if self._closed:
            raise WorkerUnavailable(f"client for {self.endpoint} is closed")
        worker = self.worker
        worker.requests.append(request)
        worker.in_flight += 1
        finished = False
        try:
            async for batch in worker.script(request):
                if self._failure is not None:
                    raise self._failure
                self.messages_received += 1
                finished = isinstance(batch[-1], Finish)
                yield batch
                if finished:
                    return
            raise AssertionError("a fake script ended without a Finish")
        except RemoteError:
            finished = True  # the worker ended the request itself
            raise
        finally:
            worker.in_flight -= 1
            if not finished:
                worker.cancelled.append(request.request_id)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | Finish]:
        async for batch in self.generate_batches(request):
            for item in batch:
                yield item


class FakeFleet:
    """Fake workers by instance id; ``client`` is the pool's ``client_factory``."""

    def __init__(self, count: int, script: Script | None = None, first_id: int = 1) -> None:
        self.workers = {i: FakeWorker(i, script) for i in range(first_id, first_id + count)}

    def __getitem__(self, instance_id: int) -> FakeWorker:
        return self.workers[instance_id]

    def __iter__(self):
        return iter(self.workers.values())

    def script_all(self, script: Script) -> None:
        for worker in self:
            worker.script = script

    @property
    def requests(self) -> list[GenerateRequest]:
        return [r for w in self for r in w.requests]

    @property
    def cancelled(self) -> list[str]:
        return [rid for w in self for rid in w.cancelled]

    def client(self, endpoint: str, **options: Any) -> FakeClient:
        worker = next(w for w in self if w.endpoint == endpoint)
        return FakeClient(worker, endpoint, **options)

    async def register(
        self, store: DiscoveryStore, model_name: str, records: dict[int, dict[str, Any]] | None = None
    ) -> None:
        """Register every worker as serving ``model_name``, but with the record fields ``records``
        gives for its instance id (another ``model_name``, ``model_path``, ``aliases``)."""
        for worker in self:
            record = worker.record(store.namespace, model_name)
            changes = (records or {}).get(worker.instance_id)
            if changes:
                record = msgspec.structs.replace(record, **changes)
            await store.put(record, RECORD_TTL_S)
