"""``dyn serve``'s CLI layer: option specs read from the click commands, argv assembly for the
children, and flag errors before anything starts (``run_stack`` replaced)."""

from __future__ import annotations

import sys

import pytest
import typer
from typer.testing import CliRunner

from dyn.cli import serve as serve_cli
from dyn.cli.options import flag
from dyn.core.serve import ServeConfig

# ---------------------------------------------------------------------------------------------
# the CLI layer: option specs from click commands, argv assembly (run_stack replaced)


def _fake_app() -> typer.Typer:
    """A root app shaped like dyn's: a frontend and a worker group, with serve registered."""
    app = typer.Typer()

    @app.command("frontend")
    def frontend(
        http_port: int = flag(8000, "--http-port", help="Port."),
        http_host: str = flag("127.0.0.1", "--http-host", help="Host."),
        router_mode: str = flag("round-robin", "--router-mode", help="Mode."),
        speedup_ratio: float = flag(1.0, "--speedup-ratio", help="Shared by both, for the test."),
        namespace: str = flag("default", "--namespace", help="Namespace."),
        model_name: str = flag(None, "--model-name", help="Name."),
        served_model_name: list[str] = flag([], "--served-model-name", help="Names."),
    ) -> None:
        """Fake frontend."""

    workers = typer.Typer()

    @workers.command("mocker")
    def mocker(
        speedup_ratio: float = flag(1.0, "--speedup-ratio", help="Speed."),
        enable_prefix_caching: bool = flag(
            True, "--enable-prefix-caching/--no-enable-prefix-caching", help="PC."
        ),
        num_workers: int = flag(1, "--num-workers", help="Hosted."),
        namespace: str = flag("default", "--namespace", help="Namespace."),
        model_name: str = flag(None, "--model-name", help="Name."),
        served_model_name: list[str] = flag([], "--served-model-name", help="Names."),
    ) -> None:
        """Fake mocker."""

    @workers.command("other")
    def other() -> None:
        """Another engine."""

    @workers.command("real", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def real(namespace: str = flag("default", "--namespace", help="Namespace.")) -> None:
        """An engine that passes undeclared flags to itself, like dyn worker vllm."""

    app.add_typer(workers, name="worker")
    app.command("serve", context_settings=serve_cli.CONTEXT_SETTINGS)(serve_cli.serve)
    return app


@pytest.fixture
def captured_config(monkeypatch):
    configs: list[ServeConfig] = []

    def fake_run_stack(config, **_kwargs):
        configs.append(config)
        return 0

    monkeypatch.setattr("dyn.core.serve.run_stack", fake_run_stack)
    return configs


def test_option_specs_read_click_commands():
    import typer.main

    from dyn.cli.app import app

    mocker = typer.main.get_command(app).commands["worker"].commands["mocker"]
    specs = serve_cli.option_specs(mocker)
    assert specs["--block-size"] == 1 and specs["--speedup-ratio"] == 1
    assert specs["--enable-prefix-caching"] == 0 and specs["--no-enable-prefix-caching"] == 0


def test_cli_routes_flags_and_builds_children(captured_config, monkeypatch):
    monkeypatch.delenv("DYN_ROUTER_MODE", raising=False)
    monkeypatch.delenv("DYN_NUM_WORKERS", raising=False)
    result = CliRunner().invoke(
        _fake_app(),
        [
            "serve",
            "--workers",
            "3",
            "--http-port",
            "0",
            "--namespace",
            "ns",
            "--router-mode",
            "kv",
            "--speedup-ratio=5",
            "--no-enable-prefix-caching",
            "--num-workers",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    (config,) = captured_config
    base = [sys.executable, "-m", "dyn.cli"]
    assert list(config.frontend.argv) == [
        *base,
        "frontend",
        "--http-host",
        "127.0.0.1",
        "--http-port",
        "0",
        "--namespace",
        "ns",
        "--router-mode",
        "kv",
        "--speedup-ratio=5",
    ]
    assert [w.name for w in config.workers] == ["worker-0", "worker-1", "worker-2"]
    assert list(config.workers[0].argv) == [
        *base,
        "worker",
        "mocker",
        "--namespace",
        "ns",
        "--speedup-ratio=5",
        "--no-enable-prefix-caching",
        "--num-workers",
        "2",
    ]
    assert config.instances_per_worker == 2 and config.expected_instances == 6
    assert config.summary == "model dyn-tiny, 6 mocker workers in 3 processes, router kv"


def test_cli_summary_reads_env_twins_and_defaults(captured_config, monkeypatch):
    monkeypatch.setenv("DYN_ROUTER_MODE", "random")
    monkeypatch.delenv("DYN_NUM_WORKERS", raising=False)
    result = CliRunner().invoke(_fake_app(), ["serve", "--workers", "1", "--model-name", "m"])
    assert result.exit_code == 0, result.output
    (config,) = captured_config
    assert config.summary == "model m, 1 mocker worker, router random" and config.instances_per_worker == 1
    assert ["--model-name", "m"] == list(config.workers[0].argv[-2:])


def test_served_model_names_go_to_the_frontend_and_the_workers(captured_config):
    from dyn.cli.options import expand_multi_value

    args = expand_multi_value(["serve", "--workers", "1", "--served-model-name", "a", "b"])
    result = CliRunner().invoke(_fake_app(), args)
    assert result.exit_code == 0, result.output
    (config,) = captured_config
    names = ["--served-model-name", "a", "--served-model-name", "b"]
    assert list(config.frontend.argv[-4:]) == names and list(config.workers[0].argv[-4:]) == names
    assert config.summary.startswith("model a, ")


def test_cli_rejects_unknown_flags_and_engines_before_starting_anything(captured_config):
    app = _fake_app()
    result = CliRunner().invoke(app, ["serve", "--warp-drive", "9"])
    assert result.exit_code == 2 and "--warp-drive" in result.output
    assert "dyn frontend" in result.output and "dyn worker mocker" in result.output
    result = CliRunner().invoke(app, ["serve", "--engine", "nope"])
    assert result.exit_code == 2 and "mocker, other" in result.output
    result = CliRunner().invoke(app, ["serve", "--engine", "other", "--speedup-ratio", "2"])
    assert result.exit_code == 0  # defined by the frontend only, for this engine
    assert captured_config[-1].workers[0].argv[-2:] == ["worker", "other"]
    assert not any("--speedup-ratio" in " ".join(w.argv) for w in captured_config[-1].workers)


def test_real_app_rejects_an_unknown_flag():
    from dyn.cli.app import app

    result = CliRunner().invoke(app, ["serve", "--warp-drive", "9"])
    assert result.exit_code == 2 and "--warp-drive" in result.output and "dyn worker mocker" in result.output


def test_real_engines_take_undeclared_flags_own_gpus_and_a_longer_start(captured_config, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    result = CliRunner().invoke(
        _fake_app(),
        [
            "serve",
            "--engine",
            "real",
            "--workers",
            "2",
            "--gpus-per-worker",
            "2",
            "--router-mode",
            "kv",
            "--quantization",
            "fp8",
            "--trust-remote-code",
        ],
    )
    assert result.exit_code == 0, result.output
    (config,) = captured_config
    assert list(config.workers[1].argv[-3:]) == ["--quantization", "fp8", "--trust-remote-code"]
    assert [dict(w.env) for w in config.workers] == [
        {"CUDA_VISIBLE_DEVICES": "4,5"},
        {"CUDA_VISIBLE_DEVICES": "6,7"},
    ]
    assert config.frontend.env == {} and config.startup_timeout_s == 900.0


def test_too_few_visible_gpus_is_refused_before_starting(captured_config, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    result = CliRunner().invoke(
        _fake_app(), ["serve", "--engine", "real", "--workers", "2", "--gpus-per-worker", "1"]
    )
    assert result.exit_code == 2 and "needs 2 GPUs" in result.output and not captured_config
