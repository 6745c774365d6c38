"""KV router configuration: defaults, validation messages, the deprecated weight, --load-aware."""

from __future__ import annotations

import logging
import math
import re

import pytest

from dyn.core.errors import ConfigError
from dyn.core.router.config import (
    KvRouterConfig,
    build_config,
    deprecated_overlap_weight_from_env,
    overlap_refresh_from_env,
    parse_queue_threshold,
)


def test_defaults_follow_the_seed():
    c = KvRouterConfig().validate()
    assert (c.overlap_score_credit, c.prefill_load_scale, c.temperature) == (1.0, 1.0, 0.0)
    assert c.use_kv_events and c.track_active_blocks and c.assume_kv_reuse and c.track_prefill_tokens
    assert not c.track_output_blocks
    assert c.queue_threshold == 16.0 and c.queue_policy == "fcfs"
    assert c.ttl_secs == 120.0 and c.event_threads == 1 and c.predicted_ttl_secs is None
    assert c.overlap_refresh_after_secs == 10.0 and c.stale_request_secs == 300.0
    assert c.uses_indexer


def test_zero_credit_means_no_indexer():
    assert not KvRouterConfig(overlap_score_credit=0.0).validate().uses_indexer


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"overlap_score_credit": 1.5}, "--router-kv-overlap-score-credit"),
        ({"overlap_score_credit": -0.1}, "--router-kv-overlap-score-credit"),
        ({"overlap_score_credit": math.nan}, "--router-kv-overlap-score-credit"),
        ({"prefill_load_scale": -1.0}, "--router-prefill-load-scale"),
        ({"temperature": -0.5}, "--router-temperature"),
        ({"ttl_secs": 0.0}, "--router-ttl-secs"),
        ({"event_threads": 0}, "--router-event-threads"),
        ({"queue_threshold": 0.0}, "--router-queue-threshold"),
        ({"queue_threshold": -2.0}, "--router-queue-threshold"),
        ({"queue_policy": "sjf"}, "fcfs, lcfs, wspt"),
        ({"prefill_load_model": "magic"}, "--router-prefill-load-model"),
        ({"track_output_blocks": True, "track_active_blocks": False}, "--router-track-output-blocks"),
        ({"predicted_ttl_secs": 0.0}, "--router-predicted-ttl-secs"),
        ({"predicted_ttl_secs": 5.0, "use_kv_events": False}, "--no-router-kv-events"),
        ({"predicted_ttl_secs": 5.0, "overlap_score_credit": 0.0}, "--router-kv-overlap-score-credit"),
        ({"active_decode_blocks_threshold": 0.0}, "--active-decode-blocks-threshold"),
        ({"active_prefill_tokens_threshold": -5}, "--active-prefill-tokens-threshold"),
        ({"active_prefill_tokens_threshold_frac": 0.0}, "--active-prefill-tokens-threshold-frac"),
        ({"overlap_refresh_after_secs": -1.0}, "DYN_ROUTER_OVERLAP_REFRESH_AFTER_SECS"),
        ({"unstarted_booking_secs": 0.0}, "--router-unstarted-booking-secs"),
        ({"unstarted_booking_secs": math.inf}, "--router-unstarted-booking-secs"),
        ({"max_queued_requests": 0}, "--router-queue-limit"),
        ({"max_queued_requests": 2.5}, "--router-queue-limit"),
        ({"host_cache_hit_weight": 1.5}, "--router-host-cache-hit-weight must be between 0.0 and 1.0"),
        ({"host_cache_hit_weight": math.nan}, "--router-host-cache-hit-weight"),
        ({"disk_cache_hit_weight": -0.25}, "--router-disk-cache-hit-weight must be between 0.0 and 1.0"),
        ({"shared_cache_multiplier": 2.0}, "--shared-cache-multiplier must be between 0.0 and 1.0"),
        ({"shared_cache_type": "lmcache"}, "--shared-cache-type must be one of none, hicache"),
    ],
)
def test_validation_names_the_flag(fields, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        KvRouterConfig(**fields).validate()


def test_cache_tier_defaults_are_dynamos_and_the_shared_multiplier_needs_a_shared_cache():
    c = KvRouterConfig().validate()
    assert (c.host_cache_hit_weight, c.disk_cache_hit_weight) == (0.75, 0.25)
    assert (c.shared_cache_type, c.shared_cache_multiplier) == ("none", 0.5)
    assert c.effective_shared_cache_multiplier == 0.0
    edge = KvRouterConfig(host_cache_hit_weight=0.0, disk_cache_hit_weight=1.0, shared_cache_multiplier=0.0)
    assert edge.validate() is edge


def test_hicache_is_refused_at_start_in_one_line_that_says_why():
    with pytest.raises(ConfigError) as err:
        KvRouterConfig(shared_cache_type="hicache").validate()
    text = str(err.value)
    assert "\n" not in text and "HiCache" in text and "--shared-cache-type none" in text


def _router_flags_app():
    import typer

    from dyn.cli.router_flags import router_flags

    app, seen = typer.Typer(), {}

    @app.command()
    @router_flags
    def run(router_config: KvRouterConfig = None) -> None:
        seen["config"] = router_config

    return app, seen


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ([], {}, (0.75, 0.25, "none", 0.5)),
        (
            ["--router-host-cache-hit-weight", "0.5", "--router-disk-cache-hit-weight", "0.1"],
            {},
            (0.5, 0.1, "none", 0.5),
        ),
        (
            [],
            {
                "DYN_ROUTER_HOST_CACHE_HIT_WEIGHT": "0.2",
                "DYN_ROUTER_DISK_CACHE_HIT_WEIGHT": "0",
                "DYN_SHARED_CACHE_MULTIPLIER": "1",
                "DYN_SHARED_CACHE_TYPE": "none",
            },
            (0.2, 0.0, "none", 1.0),
        ),
    ],
)
def test_cache_tier_flags_and_their_environment_twins_reach_the_config(args, env, expected):
    from typer.testing import CliRunner

    app, seen = _router_flags_app()
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    c = seen["config"]
    assert (
        c.host_cache_hit_weight,
        c.disk_cache_hit_weight,
        c.shared_cache_type,
        c.shared_cache_multiplier,
    ) == (expected)


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--router-host-cache-hit-weight", "1.5"], {}, "--router-host-cache-hit-weight"),
        ([], {"DYN_ROUTER_DISK_CACHE_HIT_WEIGHT": "-1"}, "DYN_ROUTER_DISK_CACHE_HIT_WEIGHT"),
        (["--shared-cache-multiplier", "3"], {}, "--shared-cache-multiplier"),
        (["--shared-cache-type", "hicache"], {}, "HiCache's L3 storage"),
        ([], {"DYN_SHARED_CACHE_TYPE": "hicache"}, "HiCache's L3 storage"),
    ],
)
def test_cache_tier_flags_out_of_range_or_hicache_exit_2(args, env, says):
    from typer.testing import CliRunner

    app, seen = _router_flags_app()
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200", **env})
    assert result.exit_code == 2 and says in " ".join(result.output.split()) and "config" not in seen


AIC = {"aic_backend": "vllm", "aic_system": "h200_sxm", "aic_model_path": "Qwen/Qwen3-32B"}


@pytest.mark.parametrize("name", ["aic", "ais"])
def test_the_aic_prefill_model_and_its_ais_alias_need_the_aic_flags(name):
    with pytest.raises(ConfigError) as err:
        KvRouterConfig(prefill_load_model=name).validate()
    assert str(err.value) == (
        f"--router-prefill-load-model {name} needs --aic-backend (the engine: vllm, sglang or "
        "trtllm), --aic-system (the GPU system, such as h200_sxm), --aic-model-path (the served model)"
    )
    with pytest.raises(ConfigError, match=r"needs --aic-model-path \(the served model\)$"):
        KvRouterConfig(prefill_load_model=name, aic_backend="vllm", aic_system="h200_sxm").validate()
    config = KvRouterConfig(prefill_load_model=name, **AIC).validate()
    assert config.uses_aic and (config.aic_tp_size, config.aic_moe_tp_size) == (1, None)
    assert not KvRouterConfig().uses_aic


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"track_prefill_tokens": False}, "--no-router-track-prefill-tokens turns off: drop one of them"),
        ({"aic_tp_size": 0}, "--aic-tp-size must be a whole number of at least 1, got 0"),
        ({"aic_moe_ep_size": 0}, "--aic-moe-ep-size must be a whole number of at least 1"),
        ({"aic_attention_dp_size": 1.5}, "--aic-attention-dp-size must be a whole number"),
    ],
)
def test_aic_settings_that_cannot_work_are_named(fields, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        KvRouterConfig(prefill_load_model="aic", **{**AIC, **fields}).validate()


def test_build_config_checks_the_aic_setup_against_aiconfigurator(monkeypatch, tmp_path):
    pytest.importorskip("aiconfigurator_core")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match="--aic-system 'h201_sxm': AIConfigurator has performance data for"):
        build_config(prefill_load_model="aic", **{**AIC, "aic_system": "h201_sxm"})
    assert build_config(prefill_load_model="ais", **AIC).uses_aic


def test_the_aic_flags_reach_the_config_and_mistakes_exit_2(monkeypatch, tmp_path):
    pytest.importorskip("aiconfigurator_core")
    from typer.testing import CliRunner

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    app, seen = _router_flags_app()
    flags = ["--router-prefill-load-model", "aic", "--aic-backend", "sglang", "--aic-system", "h200_sxm"]
    moe = ["--aic-model-path", "Qwen/Qwen3-30B-A3B", "--aic-tp-size", "2"]
    result = CliRunner().invoke(app, [*flags, *moe, "--aic-moe-tp-size", "1", "--aic-moe-ep-size", "2"])
    assert result.exit_code == 0, result.output
    c = seen.pop("config")
    assert (c.aic_backend, c.aic_system, c.aic_model_path) == ("sglang", "h200_sxm", "Qwen/Qwen3-30B-A3B")
    assert (c.aic_tp_size, c.aic_moe_tp_size, c.aic_moe_ep_size, c.aic_attention_dp_size) == (2, 1, 2, None)
    result = CliRunner().invoke(app, [*flags, *moe, "--aic-moe-ep-size", "2"], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "config" not in seen
    assert "--aic-moe-tp-size 2 x --aic-moe-ep-size 2" in " ".join(result.output.split())
    result = CliRunner().invoke(app, flags, env={"COLUMNS": "200", "DYN_AIC_MODEL_PATH": "Qwen/Qwen3-32B"})
    assert result.exit_code == 0, result.output
    assert seen["config"].aic_model_path == "Qwen/Qwen3-32B"


def test_valid_combinations_pass():
    KvRouterConfig(predicted_ttl_secs=5.0).validate()
    KvRouterConfig(queue_threshold=None, queue_policy="wspt", temperature=0.5).validate()
    KvRouterConfig(use_kv_events=False, ttl_secs=30.0, overlap_score_credit=0.5).validate()
    KvRouterConfig(
        track_output_blocks=True,
        active_prefill_tokens_threshold=1000,
        active_prefill_tokens_threshold_frac=1.5,
        active_decode_blocks_threshold=0.9,
        overlap_refresh_after_secs=None,
    ).validate()


def test_nonzero_deprecated_weight_becomes_the_load_scale(caplog):
    with caplog.at_level(logging.WARNING, logger="dyn.router"):
        c = build_config(deprecated_overlap_weight=2.0, prefill_load_scale=0.5, overlap_score_credit=0.7)
    assert c.prefill_load_scale == 2.0 and c.overlap_score_credit == 0.7
    [record] = [r for r in caplog.records if r.name == "dyn.router"]
    assert "deprecated" in record.getMessage()
    assert "--router-prefill-load-scale 2" in record.getMessage()


def test_zero_deprecated_weight_turns_off_scale_and_credit(caplog):
    with caplog.at_level(logging.WARNING, logger="dyn.router"):
        c = build_config(
            deprecated_overlap_weight=0.0,
            deprecated_weight_source="DYN_OVERLAP_SCORE_WEIGHT",
            prefill_load_scale=3.0,
            overlap_score_credit=1.0,
        )
    assert c.prefill_load_scale == 0.0 and c.overlap_score_credit == 0.0 and not c.uses_indexer
    assert "DYN_OVERLAP_SCORE_WEIGHT is deprecated" in caplog.text


def test_negative_deprecated_weight_is_an_error():
    with pytest.raises(ConfigError, match="--kv-overlap-score-weight"):
        build_config(deprecated_overlap_weight=-1.0, deprecated_weight_source="--kv-overlap-score-weight")


def test_no_deprecated_weight_no_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="dyn.router"):
        c = build_config(prefill_load_scale=1.5)
    assert c.prefill_load_scale == 1.5 and not caplog.records


def test_load_aware_preset_keeps_the_load_scale():
    c = build_config(
        load_aware=True,
        prefill_load_scale=2.5,
        overlap_score_credit=0.8,
        track_prefill_tokens=False,
        track_active_blocks=False,
        use_remote_indexer=True,
    )
    assert c.overlap_score_credit == 0.0 and not c.uses_indexer
    assert not c.use_kv_events and not c.assume_kv_reuse and not c.use_remote_indexer
    assert c.track_active_blocks and c.track_prefill_tokens
    assert c.prefill_load_scale == 2.5


def test_load_aware_after_deprecated_weight():
    c = build_config(deprecated_overlap_weight=3.0, load_aware=True)
    assert c.prefill_load_scale == 3.0 and c.overlap_score_credit == 0.0


def test_load_aware_with_predicted_ttl_is_refused():
    with pytest.raises(ConfigError, match="--load-aware"):
        build_config(load_aware=True, predicted_ttl_secs=5.0)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, 10.0), ("", 10.0), ("2.5", 2.5), ("0", None), ("-3", None), ("inf", None), ("nan", None)],
)
def test_overlap_refresh_env(raw, expected):
    assert overlap_refresh_from_env(raw) == expected


def test_overlap_refresh_env_unparsable_falls_back_with_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="dyn.router"):
        assert overlap_refresh_from_env("soon") == 10.0
    assert "DYN_ROUTER_OVERLAP_REFRESH_AFTER_SECS" in caplog.text


def test_deprecated_weight_env():
    assert deprecated_overlap_weight_from_env({}) is None
    assert deprecated_overlap_weight_from_env({"DYN_OVERLAP_SCORE_WEIGHT": "0"}) == (
        0.0,
        "DYN_OVERLAP_SCORE_WEIGHT",
    )
    both = {"DYN_OVERLAP_SCORE_WEIGHT": "1", "DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT": "2"}
    assert deprecated_overlap_weight_from_env(both) == (2.0, "DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT")
    with pytest.raises(ConfigError, match="DYN_ROUTER_PREFILL_LOAD_SCALE"):
        deprecated_overlap_weight_from_env({"DYN_OVERLAP_SCORE_WEIGHT": "heavy"})


def test_parse_queue_threshold():
    assert parse_queue_threshold("None") is None
    assert parse_queue_threshold("0.1") == 0.1
    with pytest.raises(ConfigError, match="--router-queue-threshold"):
        parse_queue_threshold("lots")


def test_unstarted_expiry_and_queue_limit_defaults_and_their_flags():
    from dyn.cli.router_flags import _FLAGS, _config

    c = KvRouterConfig().validate()
    assert c.unstarted_booking_secs == 5.0 and c.max_queued_requests == 1024
    values = {name: option.default for name, (_, option) in _FLAGS.items()}
    assert (_config(values).unstarted_booking_secs, _config(values).max_queued_requests) == (5.0, 1024)
    off = _config({**values, "router_unstarted_booking_secs": 0.0, "router_queue_limit": 0})
    assert off.unstarted_booking_secs is None and off.max_queued_requests is None
    assert "Dynamo has no such" in _FLAGS["router_unstarted_booking_secs"][1].help


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"x": 1}', "unknown field `x`"),
        ("[1]", "Expected `object`"),
        ('{"policy": "always"}', "policy must be one of isl_bounding, prefill_load, isl_or_load"),
        ('{"eff_isl_threshold": -1}', ">= 0"),
        ('{"decode_busy_threshold": 0}', "> 0"),
        ("{" * 10_000, "malformed"),
    ],
)
def test_a_bad_conditional_disagg_config_says_what_to_fix(text, says):
    from dyn.core.router.config import parse_conditional_disagg

    with pytest.raises(ConfigError, match=re.escape(says)):
        parse_conditional_disagg(text)


def test_a_conditional_disagg_config_keeps_dynamos_defaults():
    from dyn.core.router.config import parse_conditional_disagg

    config = parse_conditional_disagg('{"eff_isl_threshold": 512}')
    assert (config.policy, config.eff_isl_threshold, config.eff_isl_ratio_threshold) == (
        "isl_bounding",
        512,
        0.7,
    )
    assert parse_conditional_disagg("  ") is None
