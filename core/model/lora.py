"""LoRA adapters as ``--lora-modules`` declares them (vLLM's flag), for every engine.

A spec is ``name=path`` or a JSON object ``{"name": ..., "path": ..., "base_model_name": ...}``
(``base_model_name`` optional: the adapter's ``parent`` in ``/v1/models``), or a JSON list of such
objects; empty specs are skipped, as vLLM skips them (``vllm/entrypoints/launchers/cli_args.py``
``LoRAParserAction``, ``vllm/entrypoints/openai/models/protocol.py`` ``LoRAModulePath``).
Differences from vLLM, on purpose: the form is told by the first character (``{`` or ``[``: JSON;
else ``name=path``, split at the first ``=``), where vLLM guesses JSON from any comma; bad specs
are refused at start-up with a sentence naming the fix (vLLM fails some only on first use): at
most ``MAX_LORA_MODULES`` adapters, names ``NAME_PATTERN`` and unique, and (for a real engine) the
path an existing directory holding ``adapter_config.json``.

A worker advertises its adapters in discovery (``WorkerRecord.loras``); the frontend serves each
as a model of its own (``dyn.core.frontend.catalog``), and requests carry the adapter's name
(``GenerateRequest.lora_name``), which block hashes mix in (``dyn.core.kv.hashing``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

MAX_LORA_MODULES = 64
"""The most adapters one worker declares; far above what one GPU batches (vLLM's --max-loras)."""
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}"
"""An adapter name: what clients send as ``model``. Hugging Face style ``org/adapter`` names are
allowed; whitespace, ``=`` and ``,`` are not (they would make specs ambiguous)."""
ADAPTER_CONFIG = "adapter_config.json"
JSON_KEYS = ("name", "path", "base_model_name")
_NAME = re.compile(NAME_PATTERN)


class LoraSpecError(ValueError):
    """A ``--lora-modules`` spec that cannot be served; the message names the spec and the fix."""


class LoraModule(msgspec.Struct, frozen=True):
    """One adapter: the name clients ask for, its local directory (absolute), and the model
    ``/v1/models`` lists as its ``parent`` (``None``: the worker's served model)."""

    name: str
    path: str
    base_model_name: str | None = None

    def parent(self, served_model: str) -> str:
        """The ``parent`` of this adapter's ``/v1/models`` entry (vLLM's rule)."""
        return self.base_model_name or served_model


def parse_lora_modules(
    specs: Iterable[str], *, reserved_names: Iterable[str] = (), on_disk: bool = True
) -> list[LoraModule]:
    """The adapters of ``--lora-modules SPEC ...``, in order; raises ``LoraSpecError``.

    ``reserved_names`` are names an adapter may not take (the worker's served model names): a
    request's ``model`` must say unambiguously whether it wants the base model or an adapter.
    ``on_disk``: each path must be a local adapter directory (made absolute); the mocker, which
    simulates adapters, takes any path as given.
    """
    reserved = set(reserved_names)
    modules: list[LoraModule] = []
    seen: dict[str, str] = {}
    for spec in specs:
        for module in _parse_spec(spec, on_disk):
            if module.name in reserved:
                raise LoraSpecError(
                    f"--lora-modules {spec!r}: {module.name!r} is the served model's name; give "
                    "the adapter a name of its own"
                )
            if module.name in seen:
                raise LoraSpecError(
                    f"--lora-modules {spec!r}: the adapter name {module.name!r} is already given "
                    f"(by {seen[module.name]!r}); each adapter needs its own name"
                )
            seen[module.name] = spec
            modules.append(module)
            if len(modules) > MAX_LORA_MODULES:
                raise LoraSpecError(
                    f"--lora-modules: more than {MAX_LORA_MODULES} adapters; serve the rest from "
                    "another worker"
                )
    return modules


def _parse_spec(spec: str, on_disk: bool) -> list[LoraModule]:
    text = spec.strip()
    if not text:
        return []
    if text[0] in "{[":
        try:
            parsed = json.loads(text)
        except ValueError as exc:
            raise LoraSpecError(f"--lora-modules {spec!r} is not valid JSON: {exc}") from None
        items = parsed if isinstance(parsed, list) else [parsed]
        return [_from_json(spec, item, on_disk) for item in items]
    name, sep, path = text.partition("=")
    if not sep:
        raise LoraSpecError(
            f"--lora-modules {spec!r}: expected NAME=PATH or a JSON object such as "
            '{"name": "sql", "path": "/adapters/sql", "base_model_name": "llama"}'
        )
    return [_module(spec, name.strip(), path.strip(), None, on_disk)]


def _from_json(spec: str, item: Any, on_disk: bool) -> LoraModule:
    if not isinstance(item, dict):
        raise LoraSpecError(
            f'--lora-modules {spec!r}: each adapter must be a JSON object with "name" and "path"'
        )
    unknown = sorted(set(item) - set(JSON_KEYS))
    if unknown:
        raise LoraSpecError(
            f"--lora-modules {spec!r}: unknown key(s) {', '.join(map(repr, unknown))}; "
            f"an adapter takes {', '.join(map(repr, JSON_KEYS))}"
        )
    for key in ("name", "path"):
        if not isinstance(item.get(key), str):
            raise LoraSpecError(f"--lora-modules {spec!r}: {key!r} is required and must be a string")
    base = item.get("base_model_name")
    if base is not None and (not isinstance(base, str) or not base.strip()):
        raise LoraSpecError(f"--lora-modules {spec!r}: 'base_model_name' must be a non-empty string")
    return _module(spec, item["name"].strip(), item["path"].strip(), base.strip() if base else None, on_disk)


def _module(spec: str, name: str, path: str, base_model_name: str | None, on_disk: bool) -> LoraModule:
    if not _NAME.fullmatch(name):
        raise LoraSpecError(
            f"--lora-modules {spec!r}: the adapter name {name!r} is not allowed; use 1-128 letters, "
            "digits and . _ - / : @ +, starting with a letter or digit"
        )
    if not path:
        raise LoraSpecError(f"--lora-modules {spec!r}: the adapter {name!r} has no path")
    if not on_disk:
        return LoraModule(name, path, base_model_name)
    directory = Path(path).expanduser().resolve()
    if not directory.is_dir():
        raise LoraSpecError(
            f"--lora-modules {spec!r}: {str(directory)!r} is not a directory; give the local "
            f"directory holding the adapter's {ADAPTER_CONFIG} and weights"
        )
    if not (directory / ADAPTER_CONFIG).is_file():
        raise LoraSpecError(
            f"--lora-modules {spec!r}: {str(directory)!r} has no {ADAPTER_CONFIG}; is it a PEFT "
            "LoRA adapter directory?"
        )
    return LoraModule(name, str(directory), base_model_name)
