"""``VllmConfig``: the flags dyn declares become vLLM's own command line."""

from __future__ import annotations

import json

import pytest

from dyn.plugins.vllm.config import VllmConfig, advertised_endpoint, default_kv_events_config


def test_only_the_flags_set_are_passed_with_kv_events_and_extras_last():
    config = VllmConfig(
        dtype="bfloat16",
        block_size=32,
        enable_prefix_caching=False,
        scheduling_policy="priority",
        enforce_eager=True,
        extra_args=["--swap-space", "4", "--trust-remote-code"],
    )
    argv = config.engine_argv("/models/m")
    assert argv[:2] == ["--model", "/models/m"]
    assert argv[argv.index("--dtype") + 1] == "bfloat16"
    assert argv[argv.index("--block-size") + 1] == "32"
    assert argv[argv.index("--scheduling-policy") + 1] == "priority"
    assert "--no-enable-prefix-caching" in argv and "--enforce-eager" in argv
    assert "--max-model-len" not in argv and "--seed" not in argv and "--mm-processor-kwargs" not in argv
    assert argv[-3:] == ["--swap-space", "4", "--trust-remote-code"]
    events = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert events == json.loads(default_kv_events_config())
    processing = VllmConfig(mm_processor_kwargs='{"max_pixels": 1}', media_io_kwargs='{"video": {"fps": 1}}')
    argv = processing.engine_argv("/models/m")  # the frontend counts with them; vLLM processes with them
    assert argv[argv.index("--mm-processor-kwargs") + 1] == '{"max_pixels": 1}'
    assert argv[argv.index("--media-io-kwargs") + 1] == '{"video": {"fps": 1}}'


def test_dyns_tokenizer_goes_to_vllm_after_the_model():
    argv = VllmConfig().engine_argv("/models/m", tokenizer="/tok")
    assert argv[:4] == ["--model", "/models/m", "--tokenizer", "/tok"]
    assert "--tokenizer" not in VllmConfig().engine_argv("/models/m")


def test_max_model_len_is_vllms_own_flag():
    """``--max-model-len`` reaches vLLM's parser as its own flag (``EngineArgs.max_model_len``);
    the worker then advertises vLLM's resolved ``model_config.max_model_len`` (test_engine_info),
    and vLLM refuses a value above the model's."""
    argv = VllmConfig(max_model_len=1024).engine_argv("/models/m")
    assert argv[argv.index("--max-model-len") + 1] == "1024"
    with pytest.raises(ValueError, match="--max-model-len must be at least 1"):
        VllmConfig(max_model_len=0).validate()


def test_default_kv_events_bind_free_ports_that_vllm_reports():
    events = json.loads(default_kv_events_config())
    assert events["enable_kv_cache_events"] is True and events["publisher"] == "zmq"
    assert events["endpoint"] == events["replay_endpoint"] == "tcp://*:0"


def test_under_plane_keys_vllm_binds_private_unix_sockets_for_the_worker_to_relay(tmp_path):
    from dyn.core.transport.sockets import use_plane_keys, write_plane_keys

    use_plane_keys(write_plane_keys(tmp_path / "keys"))
    try:
        events = json.loads(default_kv_events_config("0.0.0.0"))
    finally:
        use_plane_keys(None)
    assert events["endpoint"].startswith("ipc://") and events["replay_endpoint"].startswith("ipc://")
    assert events["endpoint"] != events["replay_endpoint"]


def test_a_given_kv_events_config_is_passed_as_is():
    given = '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557"}'
    argv = VllmConfig(kv_events_config=given).engine_argv("m")
    assert argv[argv.index("--kv-events-config") + 1] == given


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        (VllmConfig(block_size=0), "--block-size must be at least 1"),
        (VllmConfig(gpu_memory_utilization=1.5), "--gpu-memory-utilization"),
        (VllmConfig(scheduling_policy="lifo"), "fcfs or priority"),
        (VllmConfig(kv_events_config="{nope"), "must be a JSON object"),
        (VllmConfig(kv_events_config="[1]"), "must be a JSON object"),
    ],
)
def test_bad_values_name_the_flag(config, needle):
    with pytest.raises(ValueError, match=needle):
        config.validate()


@pytest.mark.parametrize(
    ("endpoint", "host", "advertised"),
    [
        ("tcp://127.0.0.1:4001", "127.0.0.1", "tcp://127.0.0.1:4001"),
        ("tcp://*:5557", "10.0.0.2", "tcp://10.0.0.2:5557"),
        ("tcp://*:5557", "::1", "tcp://[::1]:5557"),
        ("tcp://*:0", "127.0.0.1", None),
        (None, "127.0.0.1", None),
        ("ipc:///tmp/kv", "127.0.0.1", "ipc:///tmp/kv"),
    ],
)
def test_advertised_endpoint(endpoint, host, advertised):
    assert advertised_endpoint(endpoint, host) == advertised


def test_on_every_interface_vllm_binds_free_ports_there_and_peers_get_the_advertised_host():
    """vLLM refuses ``tcp://*:0`` without a concrete ``VLLM_HOST_IP`` (its
    ``ZmqEventPublisher._bind`` in ``vllm/distributed/kv_events.py``), so dyn picks the ports."""
    from dyn.core.transport.sockets import use_advertise_host

    argv = VllmConfig().engine_argv("m", "0.0.0.0")
    events = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert events["endpoint"].startswith("tcp://*:") and events["replay_endpoint"].startswith("tcp://*:")
    assert events["endpoint"] != events["replay_endpoint"] and not events["endpoint"].endswith(":0")
    use_advertise_host("10.0.0.7")
    try:
        port = events["endpoint"].rpartition(":")[2]
        assert advertised_endpoint(events["endpoint"], "0.0.0.0") == f"tcp://10.0.0.7:{port}"
        assert advertised_endpoint("tcp://10.0.0.3:4001", "10.0.0.3") == "tcp://10.0.0.7:4001"
    finally:
        use_advertise_host(None)
