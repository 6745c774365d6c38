"""The ``--aic-*`` flags on the commands: ``dyn bench replay --offline --router-prefill-load-model
aic`` with the real AIConfigurator's prefill table (Qwen/Qwen3-32B on h200_sxm with vLLM) behind
the KV router, end to end, the mocker's --timing-model aic reading the same flags, and the
mistakes each command refuses before it starts."""

from __future__ import annotations

import orjson
import pytest
from typer.testing import CliRunner

from dyn.cli.app import app as dyn_app
from dyn.core.bench.report import read_result

pytest.importorskip("aiconfigurator_core")

AIC = ["--aic-backend", "vllm", "--aic-system", "h200_sxm", "--aic-model-path", "Qwen/Qwen3-32B"]


@pytest.fixture
def trace(tmp_path):
    rows = [
        {"timestamp": t, "input_length": 4096, "output_length": 4, "hash_ids": [i, i + 1, i + 2, i + 3]}
        for i, t in enumerate((0, 0, 0, 10, 20, 30))
    ]
    path = tmp_path / "trace.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
    return path


def test_a_trace_replays_with_the_aic_prefill_model(trace, tmp_path):
    out = tmp_path / "results.json"
    argv = ["bench", "replay", "--offline", str(trace), "--num-workers", "2", "-o", str(out)]
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "COLUMNS": "200"}
    result = CliRunner().invoke(dyn_app, [*argv, "--router-prefill-load-model", "aic", *AIC], env=env)
    assert result.exit_code == 0, result.output
    saved = read_result(out)
    assert saved.summary.succeeded == 6
    router = saved.config["router"]
    assert (router["prefill_load_model"], router["aic_system"], router["aic_model_path"]) == (
        "aic",
        "h200_sxm",
        "Qwen/Qwen3-32B",
    )
    assert list((tmp_path / "cache" / "dyn" / "aic").glob("*.json"))  # the table was cached


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--aic-system", "h201_sxm"], "--aic-system 'h201_sxm': AIConfigurator has performance data for"),
        (["--router-mode", "round-robin"], "needs --router-mode kv"),
    ],
)
def test_mistakes_exit_2_before_the_replay(trace, tmp_path, extra, says):
    argv = ["bench", "replay", "--offline", str(trace), "--router-prefill-load-model", "ais", *AIC, *extra]
    result = CliRunner().invoke(dyn_app, argv, env={"XDG_CACHE_HOME": str(tmp_path), "COLUMNS": "200"})
    assert result.exit_code == 2 and says in " ".join(result.output.split())


def test_the_frontend_refuses_the_aic_model_without_the_kv_router(tmp_path):
    argv = ["frontend", "--router-prefill-load-model", "aic", *AIC]
    result = CliRunner().invoke(dyn_app, argv, env={"XDG_CACHE_HOME": str(tmp_path), "COLUMNS": "200"})
    assert result.exit_code == 2
    assert "it needs --router-mode kv, not round-robin" in " ".join(result.output.split())


def test_the_replays_mocker_reads_the_routers_aic_flags(trace, tmp_path):
    """dyn bench replay declares each --aic-* flag once: the router's prefill load model and the
    mocker's timing model get the same setup."""
    out = tmp_path / "results.json"
    argv = ["bench", "replay", "--offline", str(trace), "-o", str(out), "--timing-model", "aic"]
    l40s = [*AIC[:2], "--aic-system", "l40s", *AIC[4:]]
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "COLUMNS": "200"}
    result = CliRunner().invoke(dyn_app, [*argv, "--router-prefill-load-model", "ais", *l40s], env=env)
    assert result.exit_code == 0, result.output
    config = read_result(out).config
    assert config["mocker"]["timing_model"] == "aic"
    for flag in ("aic_backend", "aic_system", "aic_model_path", "aic_tp_size"):
        assert config["mocker"][flag] == config["router"][flag], flag
    assert config["mocker"]["aic_system"] == "l40s"
    # two tables: the prefill table router and mocker share, and the mocker's decode table
    assert len(list((tmp_path / "cache" / "dyn" / "aic").glob("*.json"))) == 2


def test_the_replays_timing_model_needs_the_setup(trace, tmp_path):
    argv = ["bench", "replay", "--offline", str(trace), "--timing-model", "aic", *AIC[:4]]
    result = CliRunner().invoke(dyn_app, argv, env={"XDG_CACHE_HOME": str(tmp_path), "COLUMNS": "200"})
    assert result.exit_code == 2
    assert "--timing-model aic needs --aic-model-path (the served model)" in " ".join(result.output.split())
