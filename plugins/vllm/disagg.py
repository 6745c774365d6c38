"""Disaggregated prefill and decode on vLLM: the KV connector a ``dyn worker vllm
--disaggregation-mode prefill|decode`` runs, and the ``kv_transfer_params`` of each phase.

Followed from vLLM 0.32 (``vllm/distributed/kv_transfer/kv_connector/v1/nixl/``, the NIXL
connector's scheduler side; ``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``, vLLM's
own P/D proxy) and Dynamo's vLLM worker (its prefill handler; NIXL by default):

- ``--kv-connector nixl``: vLLM's ``NixlConnector`` with ``kv_role`` ``kv_both`` on both roles, as
  vLLM's and Dynamo's P/D examples run it, ``kv_load_failure_policy`` ``recompute`` (a decode
  worker that cannot read the prefill worker's blocks, because that worker died or its lease
  lapsed, computes them itself: the request is not lost). The decode worker reads the blocks
  from the prefill worker's memory; the prefill worker keeps them until read or until the
  connector's lease ends. Each worker's NIXL side channel (the handshake listener vLLM binds on
  ``VLLM_NIXL_SIDE_CHANNEL_HOST:VLLM_NIXL_SIDE_CHANNEL_PORT``, 5600 by default) gets a free port
  on the worker's ``--host``, advertised as the worker's address, so several workers share a
  machine (a port the environment sets is kept). On vLLM's CPU platform NIXL runs too (host
  buffers, ``kv_buffer_device`` ``cpu``; the ``nixl`` package's CUDA build loads without a GPU),
  but the prefill engine keeps stepping while it holds blocks for a reader, and on a machine with
  few cores that loop starves the transfer until the lease ends (measured: 30 s per request on 2
  cores); so it is not the CPU default.
- ``--kv-connector storage`` (the default on the CPU platform): ``plugins.vllm.kv_connector``,
  vLLM's reference storage connector moving KV through files under ``--kv-storage-path``, which
  prefill and decode workers must share (one machine, or a shared filesystem). Default: the
  namespace's directory in the file discovery store (``kv-transfer`` under it), or for another
  discovery backend ``{tempdir}/dyn-kv-{namespace}``.
- A user's own ``--kv-transfer-config`` (vLLM's flag, passed through) replaces all of it.
- A prefill request (``KvTransfer.phase == "prefill"``) runs with ``{"do_remote_decode": true}``:
  vLLM computes the prompt, keeps its KV for the decode worker, and answers with the decode side's
  ``kv_transfer_params`` in the final ``RequestOutput``; dyn hands them on as JSON in
  ``Finish.kv_transfer.params``. A decode request passes them back as
  ``SamplingParams.extra_args["kv_transfer_params"]``, as vLLM's serving layer does with a
  request's ``kv_transfer_params``; vLLM reads the blocks it does not hold and generates every
  output token.
- A worker without a connector (aggregated) answers a prefill request with empty ``params``
  (``prompt_tokens`` 0: no KV kept) and serves a decode request whole, prefilling locally.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dyn.core.messages import GenerateRequest, KvTransfer
from dyn.core.transport.sockets import advertised_host, free_ports

STORAGE_KEY = "dyn_kv_storage_path"
"""The ``kv_transfer_params`` key that makes ``--kv-connector storage`` load a decode request's KV
(its value: the prefill worker's storage directory; ``plugins.vllm.kv_connector``)."""
CONNECTORS = ("nixl", "storage")
"""``--kv-connector`` values."""
SIDE_CHANNEL_HOST = "VLLM_NIXL_SIDE_CHANNEL_HOST"
SIDE_CHANNEL_PORT = "VLLM_NIXL_SIDE_CHANNEL_PORT"
KV_TRANSFER_FLAGS = ("--kv-transfer-config", "--kv_transfer_config")


def user_kv_transfer_config(args: Sequence[str]) -> bool:
    """Whether vLLM's own ``--kv-transfer-config`` is among the passed-through ``args`` (any of
    vLLM's spellings: ``=VALUE``, a separate value, ``--kv-transfer-config.FIELD``)."""
    return any(arg.startswith(KV_TRANSFER_FLAGS) for arg in args)


def default_connector(device_type: str) -> str:
    """The ``--kv-connector`` a worker on ``device_type`` (vLLM's ``current_platform.device_type``)
    runs when none is given: ``storage`` on the CPU, ``nixl`` elsewhere (see the module docstring)."""
    return "storage" if device_type == "cpu" else "nixl"


def default_storage_path(namespace: str, discovery_root: str | None, backend: str = "file") -> str:
    """``--kv-storage-path`` when none is given (see the module docstring)."""
    if backend == "file":
        from dyn.core.discovery.file_store import default_root

        return str(Path(discovery_root or default_root()) / namespace / "kv-transfer")
    return str(Path(tempfile.gettempdir()) / f"dyn-kv-{namespace}")


def kv_transfer_config(connector: str, device_type: str, storage_path: str) -> str:
    """vLLM's ``--kv-transfer-config`` for ``connector`` on ``device_type``."""
    config: dict[str, Any]
    if connector == "nixl":
        config = {
            "kv_connector": "NixlConnector",
            "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
        }
        if device_type == "cpu":
            config["kv_buffer_device"] = "cpu"
    elif connector == "storage":
        config = {
            "kv_connector": "DynStorageConnector",
            "kv_connector_module_path": "dyn.plugins.vllm.kv_connector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": storage_path},
        }
    else:
        raise ValueError(f"--kv-connector must be one of {', '.join(CONNECTORS)}, got {connector!r}")
    return json.dumps(config)


def side_channel_env(host: str, environ: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, str]:
    """The NIXL side-channel variables to set for a worker bound on ``host`` (those ``environ``
    does not set already)."""
    env: dict[str, str] = {}
    if SIDE_CHANNEL_PORT not in environ:
        env[SIDE_CHANNEL_PORT] = str(free_ports(host, 1)[0])
    if SIDE_CHANNEL_HOST not in environ:
        env[SIDE_CHANNEL_HOST] = advertised_host(host)
    return env


class BadKvTransfer(ValueError):
    """A decode request's ``KvTransfer.params`` are not a JSON object."""


def request_params(request: GenerateRequest, *, connector: bool) -> dict[str, Any] | None:
    """The ``kv_transfer_params`` vLLM runs ``request`` with (``None``: none), on a worker with a
    KV connector or without one (``connector``)."""
    transfer = request.kv_transfer
    if transfer is None or not connector:
        return None
    if transfer.phase == "prefill":
        return {"do_remote_decode": True}
    if not transfer.params:
        return None
    try:
        params = json.loads(transfer.params)
    except ValueError as exc:
        raise BadKvTransfer(f"kv_transfer.params is not JSON: {exc}") from None
    if not isinstance(params, dict):
        raise BadKvTransfer("kv_transfer.params must be a JSON object (vLLM's kv_transfer_params)")
    return params


def prefill_answer(request: GenerateRequest, output_params: dict[str, Any] | None) -> KvTransfer | None:
    """The ``Finish.kv_transfer`` of ``request`` once vLLM finished it with ``output_params``
    (its ``RequestOutput.kv_transfer_params``); ``None`` unless it was a prefill request. The
    host fills in ``source_instance_id``."""
    transfer = request.kv_transfer
    if transfer is None or transfer.phase != "prefill":
        return None
    if not output_params:
        return KvTransfer(phase="decode")
    return KvTransfer(phase="decode", prompt_tokens=len(request.token_ids), params=json.dumps(output_params))


MAX_STORED_PROMPTS = 64
"""Prompt directories the storage connector keeps; older ones are removed as new ones are written."""


def prune(path: str, keep: int) -> int:
    """Remove the oldest prompt directories under ``path`` beyond ``keep`` (another worker may be
    removing them too: what is gone already is skipped); returns how many this call removed."""
    try:
        with os.scandir(path) as it:
            entries = [e for e in it if e.is_dir(follow_symlinks=False)]
    except OSError:
        return 0
    if len(entries) <= keep:
        return 0

    def mtime(entry: os.DirEntry[str]) -> float:
        try:
            return entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            return 0.0

    entries.sort(key=mtime)
    old = entries[: len(entries) - keep]
    for entry in old:
        shutil.rmtree(entry.path, ignore_errors=True)
    return len(old)
