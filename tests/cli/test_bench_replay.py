"""``dyn bench replay --offline``: the command function, through a Typer app of its own, and the
``@mocker_flags`` it shares with ``dyn worker mocker``."""

from __future__ import annotations

import orjson
import pytest
import typer
import typer.main
from typer.testing import CliRunner

from dyn.cli.app import app as dyn_app
from dyn.core.bench.report import read_result

runner = CliRunner()


@pytest.fixture
def trace(tmp_path):
    rows = [
        {"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2]},
        {"timestamp": 2000, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2]},
        {"timestamp": 100, "session_id": "a", "input_length": 600, "output_length": 3, "hash_ids": [5, 6]},
        {"session_id": "a", "delay": 500, "input_length": 1200, "output_length": 3, "hash_ids": [5, 6, 7]},
    ]
    path = tmp_path / "trace.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
    return path


def test_replay_writes_an_offline_result(trace, tmp_path):
    out = tmp_path / "results.json"
    result = runner.invoke(
        dyn_app,
        [
            "bench",
            "replay",
            "--offline",
            str(trace),
            "--num-workers",
            "2",
            "--block-size",
            "32",
            "--router-temperature",
            "0.5",
            "-o",
            str(out),
        ],
        env={"COLUMNS": "120"},
    )
    assert result.exit_code == 0, result.output
    assert "requests (ok / failed)" in result.output and "simulated" in result.output
    saved = read_result(out)
    assert saved.kind == "offline" and saved.summary.succeeded == 4
    assert saved.workload["requests"] == 4 and saved.workload["sessions"] == 1
    assert saved.workload["block_size"] == 512
    assert saved.config["mocker"]["block_size"] == 32 and saved.config["router"]["temperature"] == 0.5
    assert saved.config["router_mode"] == "kv" and saved.config["simulation"]["passes"] > 0
    assert sorted(r.conversation for r in saved.requests) == ["r0", "r1", "sa", "sa"]
    r1 = next(r for r in saved.requests if r.conversation == "r1")
    assert r1.cached_tokens > 0  # r1 repeats r0's prompt: the KV router sends it to r0's worker


def test_num_requests_mode_and_environment_twins(trace, tmp_path):
    out = tmp_path / "results.json"
    result = runner.invoke(
        dyn_app,
        ["bench", "replay", "--offline", str(trace), "--num-requests", "2", "-o", str(out)],
        env={"DYN_ROUTER_MODE": "round-robin", "DYN_NUM_WORKERS": "2"},
    )
    assert result.exit_code == 0, result.output
    saved = read_result(out)
    assert saved.summary.requests == 2 and saved.config["router_mode"] == "round-robin"
    assert saved.config["router"] is None
    assert {r.worker for r in saved.requests} == {"0", "1"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--router-mode", "direct"],
            "--router-mode kv, round-robin, random, power-of-two, least-loaded, device-aware-weighted",
        ),
        (["--block-size", "0"], "--block-size must be a positive integer"),
        (["--enable-streaming-session"], "add --engine-type sglang"),
        (["--use-remote-indexer"], "--use-remote-indexer"),
        (["--router-queue-threshold", "-1"], "--router-queue-threshold"),
    ],
)
def test_mistakes_exit_2_with_a_sentence(trace, argv, message):
    result = runner.invoke(
        dyn_app, ["bench", "replay", "--offline", str(trace), *argv], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_the_trace_is_required_and_checked(tmp_path):
    result = runner.invoke(dyn_app, ["bench", "replay"])
    assert result.exit_code == 2 and "--offline" in result.output
    missing = tmp_path / "nope.jsonl"
    result = runner.invoke(dyn_app, ["bench", "replay", "--offline", str(missing)])
    assert result.exit_code == 2 and result.output.startswith("error: cannot read trace")


def options(command) -> dict[str, tuple]:
    return {
        p.name: (tuple(p.opts), tuple(p.secondary_opts), p.default, p.envvar, p.help)
        for p in command.params
        if p.param_type_name == "option"
    }


AIC_SETUP = [
    "aic_backend",
    "aic_system",
    "aic_model_path",
    "aic_backend_version",
    "aic_tp_size",
    "aic_moe_tp_size",
    "aic_moe_ep_size",
    "aic_attention_dp_size",
]
"""The mocker's --timing-model aic setup: in dyn bench replay, the router's flags (declared once)."""


def test_mocker_flags_are_the_same_in_both_commands():
    worker = typer.main.get_command(dyn_app).commands["worker"].commands["mocker"]
    bench = typer.main.get_command(dyn_app).commands["bench"].commands["replay"]
    ours, theirs = options(worker), options(bench)
    engine = [
        "block_size",
        "num_gpu_blocks_override",
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_model_len",
        "enable_prefix_caching",
        "enable_chunked_prefill",
        "preemption_mode",
        "speedup_ratio",
        "decode_speedup_ratio",
        "timing_model",
        *AIC_SETUP,
        "engine_type",
        "device",
        "scheduling_policy",
        "enable_priority_scheduling",
        "schedule_low_priority_values_first",
        "radix_eviction_policy",
        "enable_streaming_session",
        "reasoning",
        "replies",
        "tool_call_rate",
        "runner",
        "lora_modules",
        "max_loras",
        "lora_load_time_ms",
        "kv_transfer_bandwidth",
        "kv_bytes_per_token",
        "kv_cache_dtype",
        "num_host_kv_blocks",
        "host_kv_transfer_ms_per_block",
    ]
    for name in engine:
        assert ours[name] == theirs[name], name
    # dyn worker mocker keeps its order: model flags, engine flags, then worker flags
    assert list(ours) == [
        "model_path",
        "tokenizer",
        "model_name",
        "served_model_name",
        *engine,
        "num_workers",
        "dyn_tool_call_parser",
        "dyn_reasoning_parser",
        "namespace",
        "discovery_backend",
        "discovery_dir",
        "etcd_endpoints",
        "host",
        "advertise_host",
        "disaggregation_mode",
        "drain_timeout",
        "system_port",
        "plane_keys",
        "config",  # every command's --config (dyn.cli.config_file), last
    ]


def test_an_unwritable_output_is_refused_before_the_replay(trace, tmp_path):
    result = runner.invoke(
        dyn_app, ["bench", "replay", "--offline", str(trace), "-o", str(tmp_path / "no" / "r.json")]
    )
    assert result.exit_code == 2 and "cannot write into" in result.output
