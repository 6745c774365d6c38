"""``dyn worker vllm`` gives vLLM a socket directory of its own (``VLLM_RPC_BASE_PATH``) and takes
it back when the engine stops, whether it started or not; a directory the user chose is left."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from dyn.core.engine import EngineStartError
from dyn.plugins.vllm.config import VllmConfig
from dyn.plugins.vllm.engine import VllmEngine


def failing_engine(seen: list[str | None]) -> VllmEngine:
    engine = VllmEngine(VllmConfig(), "/m")

    def start() -> None:  # vLLM would read the variable here, then fail to load the model
        seen.append(os.environ.get("VLLM_RPC_BASE_PATH"))
        raise EngineStartError("no model here")

    engine._start = start  # type: ignore[method-assign]
    return engine


def test_the_private_directory_is_removed_and_unset_when_the_engine_stops(monkeypatch):
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    seen: list[str | None] = []
    for _ in range(2):  # a second start in the same process gets a new directory
        with pytest.raises(EngineStartError):
            anyio.run(failing_engine(seen).run)
        assert "VLLM_RPC_BASE_PATH" not in os.environ
    assert len(set(seen)) == 2
    for path in seen:
        assert path is not None and Path(path).name.startswith("dyn-vllm-rpc-") and not Path(path).exists()


def test_a_directory_the_user_chose_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(tmp_path))
    seen: list[str | None] = []
    with pytest.raises(EngineStartError):
        anyio.run(failing_engine(seen).run)
    assert seen == [str(tmp_path)] and os.environ["VLLM_RPC_BASE_PATH"] == str(tmp_path) and tmp_path.exists()
