"""What ``VllmEngine`` registers and reports, read from objects shaped like vLLM 0.32's
``AsyncLLM.vllm_config``, ``get_kv_event_sources()`` and scheduler stats (no vLLM needed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dyn.core.engine import EngineStartError
from dyn.plugins.vllm.config import VllmConfig
from dyn.plugins.vllm.engine import VllmEngine


def events_config(endpoint="tcp://*:0", replay="tcp://*:0", enabled=True, topic="kv-events"):
    return SimpleNamespace(
        enable_kv_cache_events=enabled,
        publisher="zmq" if enabled else "null",
        endpoint=endpoint,
        replay_endpoint=replay,
        topic=topic,
    )


def fake_llm(*, sources=None, config_events=None, dp=1):
    vllm_config = SimpleNamespace(
        parallel_config=SimpleNamespace(data_parallel_size=dp),
        cache_config=SimpleNamespace(block_size=32, num_gpu_blocks=4096),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=2048, policy="priority"),
        model_config=SimpleNamespace(max_model_len=1024),
        kv_events_config=config_events,
    )
    llm = SimpleNamespace(vllm_config=vllm_config)
    if sources is not None:
        llm.get_kv_event_sources = lambda: sources
    return llm


def engine(host="127.0.0.1") -> VllmEngine:
    return VllmEngine(VllmConfig(), "/models/m", host=host)


def test_info_comes_from_the_started_engine_and_the_endpoints_vllm_bound():
    bound = events_config("tcp://127.0.0.1:41001", "tcp://127.0.0.1:41002")
    info = engine()._read_info(fake_llm(sources={0: bound}, config_events=events_config()))
    assert (info.block_size, info.total_kv_blocks, info.max_num_batched_tokens, info.context_length) == (
        32,
        4096,
        2048,
        1024,
    )
    assert info.kv_events_endpoint == "tcp://127.0.0.1:41001"
    assert info.kv_replay_endpoint == "tcp://127.0.0.1:41002"
    assert info.kv_events_topic == "kv-events" and info.priority_order == "lower_first"
    assert info.features == []


def test_a_vllm_without_event_sources_falls_back_to_the_configured_port_on_the_worker_host():
    info = engine("10.1.2.3")._read_info(fake_llm(config_events=events_config("tcp://*:5557", None)))
    assert info.kv_events_endpoint == "tcp://10.1.2.3:5557" and info.kv_replay_endpoint is None


def test_an_endpoint_vllm_never_reported_is_a_start_error():
    with pytest.raises(EngineStartError, match="explicit port"):
        engine()._read_info(fake_llm(config_events=events_config("tcp://*:0")))


def test_disabled_events_register_no_endpoint():
    info = engine()._read_info(fake_llm(sources={}, config_events=events_config(enabled=False)))
    assert info.kv_events_endpoint is None and info.kv_replay_endpoint is None


def test_more_than_one_data_parallel_rank_is_refused():
    with pytest.raises(EngineStartError, match="one data-parallel rank"):
        engine()._read_info(fake_llm(sources={}, dp=2))


def test_load_metrics_follow_the_scheduler_stats_and_read_idle_without_requests():
    e = engine()
    e.info = e._read_info(fake_llm(sources={0: events_config("tcp://127.0.0.1:1", None)}))
    e.load.record(
        SimpleNamespace(num_running_reqs=3, num_waiting_reqs=2, kv_cache_usage=0.25),
        SimpleNamespace(num_preempted_reqs=1),
    )
    e.load.record(None, SimpleNamespace(num_preempted_reqs=2))
    e._live.add("r1")
    (m,) = e.load_metrics()
    assert (m.num_running, m.num_waiting, m.active_kv_blocks, m.total_kv_blocks) == (3, 2, 1024, 4096)
    assert m.kv_usage == 0.25 and m.num_preempted == 3 and m.num_passes == 1
    e._live.clear()
    (idle,) = e.load_metrics()
    assert idle.num_running == idle.num_waiting == 0


def test_no_usable_device_is_a_start_error_that_says_so(monkeypatch):
    """``vllm.platforms.current_platform`` is ``UnspecifiedPlatform`` when vLLM finds no device."""
    import sys
    import types

    from dyn.plugins.vllm.engine import check_device

    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = SimpleNamespace(is_unspecified=lambda: True)
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    with pytest.raises(EngineStartError, match="no usable device"):
        check_device()
    platforms.current_platform = SimpleNamespace(is_unspecified=lambda: False)
    check_device()
