"""SglangConfig validation, SGLang's parser over extra args, and the @sglang_flags decorator."""

import pytest
import typer
from typer.testing import CliRunner

from dyn.cli.config_flags import config_flags
from dyn.core.engine import EngineStartError
from dyn.plugins.sglang.config import SglangConfig, merge_extra_args, parse_server_args, to_server_args

sglang_flags = config_flags(
    "sglang_config", SglangConfig
)  # what dyn worker sglang takes its engine flags with


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (SglangConfig(tp_size=0), "--tp-size must be at least 1"),
        (SglangConfig(page_size=-4), "--page-size must be at least 1"),
        (SglangConfig(max_prefill_tokens=0), "--max-prefill-tokens must be at least 1"),
        (SglangConfig(chunked_prefill_size=0), "--chunked-prefill-size must be a positive"),
        (SglangConfig(mem_fraction_static=1.5), "--mem-fraction-static must be in (0, 1]"),
        (SglangConfig(dtype="fp7"), "--dtype must be one of"),
        (SglangConfig(radix_eviction_policy="lfu"), "--radix-eviction-policy must be lru or priority"),
        (SglangConfig(kv_events_config="{nope"), "--kv-events-config must be a JSON object"),
        (SglangConfig(kv_events_config="[1]"), "--kv-events-config must be a JSON object"),
        (
            SglangConfig(kv_events_config="{}", kv_events_endpoint="tcp://127.0.0.1:5557"),
            "--kv-events-endpoint only applies",
        ),
        (
            SglangConfig(kv_events_endpoint="127.0.0.1:5557"),
            "--kv-events-endpoint must look like tcp://HOST:PORT",
        ),
    ],
)
def test_bad_flags_get_a_sentence_naming_the_flag(config, message):
    with pytest.raises(ValueError) as bad:
        config.validate()
    assert message in str(bad.value)


def test_only_given_flags_become_engine_fields():
    assert SglangConfig().engine_fields() == {}
    config = SglangConfig(
        page_size=16,
        chunked_prefill_size=-1,
        enable_priority_scheduling=True,
        schedule_low_priority_values_first=True,
        radix_eviction_policy="priority",
        enable_streaming_session=True,
        kv_events_endpoint="tcp://127.0.0.1:9",
    )
    assert config.validate().engine_fields() == {
        "page_size": 16,
        "chunked_prefill_size": -1,
        "enable_priority_scheduling": True,
        "schedule_low_priority_values_first": True,
        "radix_eviction_policy": "priority",
        "enable_streaming_session": True,
    }


def test_extra_args_go_through_sglangs_parser_and_dyn_flags_lay_over_them(fake):
    server_args_cls = fake.module.ServerArgs
    config = merge_extra_args(
        SglangConfig(page_size=32), ["--quantization", "fp8", "--tensor-parallel-size", "2"]
    )
    namespace, given = parse_server_args(server_args_cls, config, "/models/m")
    assert given == {"quantization", "tp_size", "page_size"}
    server_args = to_server_args(server_args_cls, namespace, {"skip_tokenizer_init": True})
    assert (
        server_args.model_path,
        server_args.quantization,
        server_args.tp_size,
        server_args.page_size,
        server_args.skip_tokenizer_init,
        server_args.max_prefill_tokens,
    ) == ("/models/m", "fp8", 2, 32, True, 16384)


def test_dyns_tokenizer_is_sglangs_tokenizer_path(fake):
    namespace, given = parse_server_args(fake.module.ServerArgs, SglangConfig(), "/models/m", "/tok")
    assert namespace.tokenizer_path == "/tok" and "tokenizer_path" not in given
    namespace, _ = parse_server_args(fake.module.ServerArgs, SglangConfig(), "/models/m")
    assert namespace.tokenizer_path is None


@pytest.mark.parametrize(
    ("extra", "flags", "message"),
    [
        (
            ["--no-such-flag"],
            {},
            "SGLang refused the arguments passed through to it: unrecognized arguments: --no-such-flag",
        ),
        (["--radix-eviction-policy", "fifo"], {}, "invalid choice"),
        (["--page-size", "16"], {"page_size": 32}, "--page-size is given both as a dyn flag and among the"),
        (
            ["--enable-streaming-session"],
            {"enable_streaming_session": True},
            "--enable-streaming-session is given both",
        ),
        (["--model-path", "/other"], {}, "give the model with dyn's own --model-path"),
        (["--kv-events-config", "{}"], {}, "give it with dyn's own --kv-events-config flag"),
        (["--tokenizer-path", "/tok"], {}, "give it with dyn's own --tokenizer"),
    ],
)
def test_bad_extra_args_fail_the_start_with_a_sentence(fake, extra, flags, message):
    config = SglangConfig(extra_args=extra, **flags)
    with pytest.raises(EngineStartError) as bad:
        parse_server_args(fake.module.ServerArgs, config, "/models/m")
    assert message in str(bad.value)


def _app():
    app = typer.Typer()
    seen = {}

    @app.command()
    @sglang_flags
    def worker(model_path: str = "m", sglang_config: SglangConfig = None, host: str = "127.0.0.1") -> None:
        seen["config"], seen["host"] = sglang_config, host

    return app, seen


def test_the_decorator_hands_the_command_one_config_and_reads_env_twins():
    app, seen = _app()
    result = CliRunner().invoke(
        app,
        [
            "--tp-size",
            "2",
            "--page-size",
            "16",
            "--enable-priority-scheduling",
            "--radix-eviction-policy",
            "priority",
            "--kv-events-config",
            '{"publisher": "zmq"}',
            "--host",
            "127.0.0.2",
        ],
        env={"DYN_MAX_PREFILL_TOKENS": "8192"},
    )
    assert result.exit_code == 0, result.output
    assert seen["host"] == "127.0.0.2"
    assert seen["config"] == SglangConfig(
        tp_size=2,
        page_size=16,
        max_prefill_tokens=8192,
        enable_priority_scheduling=True,
        radix_eviction_policy="priority",
        kv_events_config='{"publisher": "zmq"}',
    )
    app, seen = _app()
    assert CliRunner().invoke(app, []).exit_code == 0
    assert seen["config"] == SglangConfig()


def test_the_decorator_turns_a_bad_value_into_exit_2_naming_the_flag():
    app, seen = _app()
    result = CliRunner().invoke(app, ["--mem-fraction-static", "2"])
    assert result.exit_code == 2 and "--mem-fraction-static must be in (0, 1]" in result.output
    assert "config" not in seen


def test_the_decorator_needs_the_parameter():
    with pytest.raises(TypeError, match="needs a sglang_config parameter"):
        sglang_flags(lambda model_path: None)
