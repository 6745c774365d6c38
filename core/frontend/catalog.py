"""Every model a frontend serves, under each name a request may use.

A frontend starts with one model of its own (``--model-path``/``--model-name``: the *primary*),
served whether or not a worker serves it yet. Any other model that a live worker registers in
discovery is served too, from the first such worker on, as Dynamo's frontend discovers models: the
catalog loads that model's tokenizer and config from the directory the worker's record names
(``WorkerRecord.model_path``, which must be readable from this host; None is the embedded
dyn-tiny) and gives it a pipeline of its own: preprocessor, worker pool, router with its own KV
index, OpenAI service. A model whose directory cannot be loaded here is logged once, and requests
for it get a 404 that says why.

Names: a model answers to its own name and to its aliases: the primary's ``--served-model-name``
names after the first, and every worker record's ``aliases``. A name that already means another
model is ignored, with a warning. ``GET /v1/models`` lists the primary and each other model while
it has live workers.

LoRA adapters (a worker record's ``loras``) are served as models of their own, named by the
adapter, with their base model as ``parent``: the base model's tokenizer, a pool of the base
model's workers that hold the adapter, a router whose block hashes mix the adapter's name in (as
the workers' KV events do), and engine requests that carry the adapter's name.

Context: a model is served with the smallest context its live workers advertise
(``WorkerRecord.context_length``: a worker's ``--max-model-len``) when that is below the model's own
(``Preprocessor.cap_context``), so a request over it is a 400 here, before it is routed.

Bounds: at most ``MAX_MODELS`` models (adapters count); the workers of any model beyond it are
ignored, with a warning; a record's first ``MAX_NAMES`` aliases only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import anyio

from dyn.core.discovery.store import DiscoveryStore, WorkerAdded
from dyn.core.frontend.service import OpenAIService
from dyn.core.messages import WorkerRecord
from dyn.core.model.info import ModelError, ModelInfo, load_model_info
from dyn.core.model.names import MAX_NAMES
from dyn.core.protocol.errors import ApiError
from dyn.core.router.pool import Worker, WorkerPool

log = logging.getLogger(__name__)

MAX_MODELS = 64
"""Most models one frontend serves."""


@dataclass(slots=True)
class ServedModel:
    """One model's pipeline: its OpenAI service (preprocessor and router inside) and worker pool."""

    service: OpenAIService
    pool: WorkerPool
    parent: str | None = None
    """For a LoRA adapter, its base model's name."""
    root: str | None = None
    """For a LoRA adapter, its path on the workers (``/v1/models``'s ``root``)."""

    def __post_init__(self) -> None:
        self.pool.add_listener(self._workers_changed)

    def _workers_changed(self, worker: Worker, added: bool) -> None:
        """Serve the smallest context a live worker advertises (``Preprocessor.cap_context``)."""
        advertised = [w.record.context_length for w in self.pool.workers() if w.record.context_length]
        self.service.preprocessor.cap_context(min(advertised, default=None))

    @property
    def name(self) -> str:
        return self.service.model_name

    @property
    def info(self) -> ModelInfo:
        """The model as served (its context capped by its workers' ``--max-model-len``)."""
        return self.service.preprocessor.info

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the model's workers and run its router until cancelled."""
        async with anyio.create_task_group() as tg:
            await tg.start(self.pool.run)
            await tg.start(self.service.router.run)
            task_status.started()


ModelBuilder = Callable[[ModelInfo, str | None], ServedModel]
"""``build(info, lora_name)``: the pipeline of a model a worker registered, or of its LoRA
adapter ``lora_name`` (``build_app``'s, with the frontend's settings); raises ``ValueError`` with a
sentence when it cannot."""


class ModelCatalog:
    """The primary model and, with ``build``, every model the workers of ``store`` register."""

    def __init__(
        self,
        primary: ServedModel,
        *,
        aliases: tuple[str, ...] = (),
        store: DiscoveryStore | None = None,
        build: ModelBuilder | None = None,
        why_not: str | None = None,
    ) -> None:
        """``why_not``: why other models are not served although ``store`` is given (logged
        once per model met)."""
        self.primary = primary
        self._store = store
        self._build = build
        self._why_not = why_not
        self._models: dict[str, ServedModel] = {primary.name: primary}
        self._names: dict[str, ServedModel] = {primary.name: primary}
        self._failed: dict[str, str] = {}
        """Models that could not be served here, with the reason."""
        self._pending: set[str] = set()
        self._warned: set[tuple[str, str]] = set()
        for alias in aliases:
            self._alias(alias, primary)

    # ----------------------------------------------------------------- reading

    def resolve(self, name: str | None) -> OpenAIService:
        """The service of the model a request names (None: the primary); a 404 otherwise."""
        if name is None:
            return self.primary.service
        model = self._names.get(name)
        if model is not None:
            return model.service
        reason = self._failed.get(name)
        if reason is not None:
            raise ApiError(
                404,
                f"The model '{name}' is served by workers, but this frontend cannot serve it: {reason}",
                param="model",
                code="model_not_found",
            )
        raise ApiError(
            404,
            f"The model '{name}' does not exist; this server serves "
            f"{', '.join(repr(n) for n in self.names())} (see GET /v1/models)",
            param="model",
            code="model_not_found",
        )

    def models(self) -> list[ServedModel]:
        """Every model with a pipeline, the primary first."""
        return list(self._models.values())

    def listed(self) -> list[tuple[str, ServedModel]]:
        """``(name, model)`` for every name of the primary and of each other model that has live
        workers: what ``GET /v1/models`` shows."""
        return [
            (name, model)
            for name, model in self._names.items()
            if model is self.primary or len(model.pool) > 0
        ]

    def names(self) -> list[str]:
        return [name for name, _ in self.listed()]

    # ----------------------------------------------------------------- following discovery

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the primary's pipeline and, with a store, serve each model its workers register,
        until cancelled; ``task_status.started()`` once the primary and the models of the workers
        live now are served."""
        async with anyio.create_task_group() as tg:
            await tg.start(self.primary.run)
            if self._store is not None:
                for record in await self._store.list():
                    await self._met(tg, record)
                task_status.started()
                async with aclosing(self._store.watch()) as events:
                    async for event in events:
                        if isinstance(event, WorkerAdded):
                            tg.start_soon(self._met, tg, event.record)
            else:
                task_status.started()

    async def _met(self, tg: anyio.abc.TaskGroup, record: WorkerRecord) -> None:
        """A worker registered: learn its aliases, and serve its model if it is new."""
        name = record.model_name
        model = self._models.get(name)
        if model is None and name not in self._failed and name not in self._pending:
            model = await self._add(tg, record)
        if model is not None:
            for alias in record.aliases[:MAX_NAMES]:
                self._alias(alias, model)
            for lora, path in record.loras.items():
                if lora not in self._models and lora not in self._failed:
                    await self._add_lora(tg, model, lora, path)

    async def _add_lora(self, tg: anyio.abc.TaskGroup, base: ServedModel, name: str, path: str) -> None:
        """Serve LoRA adapter ``name`` of ``base`` on the workers that hold it."""
        reason = self._unservable(name)
        if reason is not None or self._build is None:
            self._refuse(name, reason or "")
            return
        try:
            adapter = self._build(base.service.preprocessor.model_info, name)
        except ValueError as exc:
            self._refuse(name, str(exc))
            return
        adapter.parent, adapter.root = base.name, path
        self._models[name] = adapter
        self._names[name] = adapter
        await tg.start(adapter.run)
        log.info("serving LoRA adapter %r of model %r", name, base.name)

    async def _add(self, tg: anyio.abc.TaskGroup, record: WorkerRecord) -> ServedModel | None:
        name = record.model_name
        reason = self._unservable(name)
        if reason is not None or self._build is None:
            self._refuse(name, reason or "")
            return None
        self._pending.add(name)
        try:
            info = await anyio.to_thread.run_sync(
                load_model_info, record.model_path, name, record.tokenizer_path
            )
            model = self._build(info, None)
        except (ModelError, ValueError) as exc:
            self._refuse(name, f"its model directory does not load here: {exc}")
            return None
        finally:
            self._pending.discard(name)
        self._models[name] = model
        self._names.setdefault(name, model)
        await tg.start(model.run)
        log.info(
            "serving model %r too (from worker %d, model directory %s)",
            name,
            record.instance_id,
            record.model_path or "dyn-tiny, embedded",
        )
        return model

    def _unservable(self, name: str) -> str | None:
        """Why a new model (or adapter) ``name`` cannot be served here, or None."""
        if self._build is None:
            return "this frontend serves its own model only"
        if self._why_not is not None:
            return self._why_not
        if name in self._names:
            return f"'{name}' is already a name of '{self._names[name].name}'"
        if len(self._models) >= MAX_MODELS:
            return f"this frontend serves its limit of {MAX_MODELS} models"
        return None

    def _refuse(self, name: str, reason: str) -> None:
        self._failed[name] = reason
        log.warning("not serving model %r, which a worker serves: %s", name, reason)

    def _alias(self, alias: str, model: ServedModel) -> None:
        current = self._names.get(alias)
        if current is model:
            return
        if current is not None or alias in self._pending:
            if (alias, model.name) in self._warned:
                return
            self._warned.add((alias, model.name))
            log.warning(
                "ignoring alias %r of model %r: it names model %r already",
                alias,
                model.name,
                current.name if current is not None else alias,
            )
            return
        self._names[alias] = model
        model.service.aliases.add(alias)
