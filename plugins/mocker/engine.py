"""``MockerEngine``: drives the simulated scheduler in real time behind the ``Engine`` protocol.

One engine is one simulated worker rank. Its loop runs a scheduler pass, sleeps until the pass's
simulated end (``duration / speedup``; passes are scheduled back to back against a deadline so
Python overhead does not add up), then delivers the pass's tokens to the request streams and hands
the pass's KV events to the event sink. When the process cannot keep up with the simulated
clock, passes run as fast as the CPU allows.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import anyio
import xxhash

from dyn.core.engine import EngineError, EngineInfo, KvEventSink
from dyn.core.messages import EngineTiming, Finish, GenerateRequest, LoadMetrics, TokenChunk, Usage
from dyn.core.model import ModelInfo
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.scheduler import Scheduler, SimModel, SimRequest


def request_seed(request: GenerateRequest) -> int:
    """The sampling seed if given, else one derived from the request id (stable across runs)."""
    if request.sampling.seed is not None:
        return request.sampling.seed
    return xxhash.xxh64_intdigest(request.request_id.encode())


class _Stream:
    """Output of one request waiting to be read by its ``generate`` iterator."""

    __slots__ = ("sim", "tokens", "finish", "ready", "received", "scheduled", "first_token")

    def __init__(self, sim: SimRequest, received: float) -> None:
        self.sim = sim
        self.tokens: list[int] = []
        self.finish: Finish | None = None
        self.ready = anyio.Event()
        self.received = received
        self.scheduled: float | None = None
        self.first_token: float | None = None


class MockerEngine:
    """A simulated vLLM-style engine for one worker rank."""

    def __init__(
        self, config: MockerConfig, model: ModelInfo, event_sink: KvEventSink | None = None,
        dp_rank: int = 0,
    ) -> None:
        self.config = config.validate()
        self.model = model
        self.dp_rank = dp_rank
        self._sink = event_sink
        self._scheduler = Scheduler(config, SimModel(
            vocab_size=model.vocab_size, eos_token_ids=frozenset(model.eos_token_ids),
            context_length=model.context_length))
        self._streams: dict[str, _Stream] = {}
        self._wake = anyio.Event()
        self.passes = 0
        self.info = EngineInfo(
            block_size=config.block_size, total_kv_blocks=config.num_gpu_blocks,
            max_num_batched_tokens=config.max_num_batched_tokens, context_length=model.context_length,
        )

    # ------------------------------------------------------------------ engine loop

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Run passes while there is work; idle without spinning. Runs until cancelled."""
        scheduler = self._scheduler
        task_status.started()
        deadline = time.monotonic()
        while True:
            if not scheduler.has_work:
                while not scheduler.has_work:
                    await self._wake.wait()
                    self._wake = anyio.Event()
                deadline = time.monotonic()
            start = time.monotonic()
            result = scheduler.step()
            self.passes += 1
            for rid in result.started:
                stream = self._streams.get(rid)
                if stream is not None and stream.scheduled is None:
                    stream.scheduled = start
            deadline = max(deadline, start) + result.duration_ms / 1000.0
            delay = deadline - time.monotonic()
            # always yield once so new requests and cancels get in between passes
            await anyio.sleep(delay if delay > 0 else 0)
            self._deliver(result)

    def _deliver(self, result) -> None:
        now = time.monotonic()
        streams = self._streams
        touched = set()
        for rid, token in result.tokens:
            stream = streams.get(rid)
            if stream is not None and stream.finish is None:  # finish set: aborted during the pass
                if stream.first_token is None:
                    stream.first_token = now
                stream.tokens.append(token)
                touched.add(rid)
        for fin in result.finished:
            stream = streams.get(fin.request_id)
            if stream is None or stream.finish is not None:
                continue
            stream.finish = Finish(
                request_id=fin.request_id, reason=fin.reason,
                usage=Usage(fin.prompt_tokens, fin.completion_tokens, fin.cached_tokens),
                timing=_timing(stream, now), stop_token_id=fin.stop_token_id,
            )
            touched.add(fin.request_id)
        for rid in touched:
            streams[rid].ready.set()
        if result.events and self._sink is not None:
            self._sink(result.events, self.dp_rank)

    # ------------------------------------------------------------------ Engine protocol

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | Finish]:
        rid = request.request_id
        if rid in self._streams:
            raise EngineError(f"request id {rid!r} is already running", code="duplicate_request")
        sim = SimRequest(rid, request.token_ids, stop=request.stop, seed=request_seed(request),
                         priority=request.priority, lora_name=request.lora_name)
        try:
            self._scheduler.add(sim)
        except ValueError as exc:
            raise EngineError(str(exc), code="bad_request") from None
        stream = self._streams[rid] = _Stream(sim, time.monotonic())
        self._wake.set()
        try:
            while True:
                await stream.ready.wait()
                stream.ready = anyio.Event()
                if stream.tokens:
                    tokens, stream.tokens = stream.tokens, []
                    yield TokenChunk(rid, tokens)
                if stream.finish is not None:
                    yield stream.finish
                    return
        finally:
            if stream.finish is None:
                self._scheduler.abort(rid)
            del self._streams[rid]

    async def abort(self, request_id: str) -> bool:
        stream = self._streams.get(request_id)
        if stream is None or stream.finish is not None:
            return False
        if not self._scheduler.abort(request_id):
            return False
        sim = stream.sim
        stream.finish = Finish(
            request_id=request_id, reason="cancelled",
            usage=Usage(sim.prompt_len, sim.num_output, sim.cached_tokens),
            timing=_timing(stream, time.monotonic()))
        stream.ready.set()
        return True

    def load_metrics(self) -> list[LoadMetrics]:
        load = self._scheduler.load()
        return [LoadMetrics(
            instance_id=0, dp_rank=self.dp_rank, ts=time.time(), num_running=load.num_running,
            num_waiting=load.num_waiting, active_kv_blocks=load.active_blocks,
            total_kv_blocks=load.total_blocks, kv_usage=load.kv_usage, num_preempted=load.num_preemptions,
            num_passes=self.passes,
        )]


def _timing(stream: _Stream, now: float) -> EngineTiming:
    scheduled = stream.scheduled if stream.scheduled is not None else now
    first = stream.first_token if stream.first_token is not None else now
    return EngineTiming(
        queue_ms=round((scheduled - stream.received) * 1000, 3),
        prefill_ms=round((first - scheduled) * 1000, 3),
        decode_ms=round((now - first) * 1000, 3),
    )
