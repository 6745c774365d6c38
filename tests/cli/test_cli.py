import pytest
import typer.main
from typer.testing import CliRunner

import dyn.core
from dyn.cli.app import app
from dyn.cli.options import env_name

runner = CliRunner()
SUBCOMMANDS = ["frontend", "router", "worker", "indexer", "bench", "inspect-kv"]


def all_commands(cmd, path=("dyn",)):
    """Walk the command tree (Typer vendors its own click, so duck-type the classes)."""
    yield path, cmd
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            yield from all_commands(sub, (*path, name))


def test_help_lists_every_subcommand():
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0
    for name in SUBCOMMANDS:
        assert name in result.output


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"dyn {dyn.core.__version__}"


def test_every_flag_has_its_documented_environment_twin():
    checked = 0
    for path, cmd in all_commands(typer.main.get_command(app)):
        for param in cmd.params:
            # one-shot actions, as --help: Typer's completion options have no twin on purpose
            if param.param_type_name != "option" or param.name in (
                "help",
                "version",
                "install_completion",
                "show_completion",
            ):
                continue
            long_name = next(o for o in param.opts if o.startswith("--"))
            scoped = {env_name(long_name, scope) for scope in path[1:]}  # DYN_INDEXER_HTTP_PORT
            assert param.envvar in {env_name(long_name), *scoped}, f"{' '.join(path)} {long_name}"
            assert param.show_envvar, f"{' '.join(path)} {long_name} hides its env var"
            checked += 1
    assert checked >= 15


def test_env_twin_is_read_and_bad_values_get_a_clear_error():
    result = runner.invoke(app, ["worker", "mocker"], env={"DYN_PREEMPTION_MODE": "sideways"})
    assert result.exit_code == 2 and "--preemption-mode must be one of lifo, fifo" in result.output
    result = runner.invoke(app, ["worker", "mocker", "--block-size", "0"])
    assert result.exit_code == 2 and "--block-size must be a positive integer" in result.output
    result = runner.invoke(app, ["worker", "mocker", "--num-workers", "0"])
    assert result.exit_code == 2 and "num-workers" in result.output


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--discovery-backend", "etcd", "--etcd-endpoints", "http://127.0.0.1:1"], "cannot reach etcd"),
        (["--namespace", "a/b"], "namespace"),
    ],
)
def test_discovery_mistakes_are_clear_errors(argv, message, tmp_path):
    result = runner.invoke(app, ["worker", "mocker", "--discovery-dir", str(tmp_path), *argv])
    assert result.exit_code == 2 and result.output.startswith("error:") and message in result.output


def test_bad_log_level_is_rejected():
    result = runner.invoke(app, ["--log-level", "loud", "worker", "--help"])
    assert result.exit_code == 2 and "log level must be one of" in result.output


def test_log_format_json_emits_one_object_per_line(capsys):
    import logging

    import orjson

    from dyn.core.logs import configure_logging

    configure_logging("info", "json")
    logging.getLogger("dyn.test").info("hello %s", "there", extra={"instance_id": 7})
    line = capsys.readouterr().err.strip().splitlines()[-1]
    obj = orjson.loads(line)
    assert obj["message"] == "hello there" and obj["level"] == "info" and obj["instance_id"] == 7
    configure_logging("warning", "rich")


def test_a_vllm_api_server_flag_dyn_frontend_does_not_take_is_refused_with_why():
    """A vLLM user's flag is met with its reason, not only "no such option"; one dyn does not
    take is refused, every one it does take still parses, and none of the refused ones is also
    a dyn frontend flag (the table stays true as flags are added)."""
    from dyn.core.frontend.vllm_flags import FRONTEND_REFUSED, REFUSED

    result = runner.invoke(app, ["frontend", "--middleware", "my.Middleware"])
    assert result.exit_code == 2
    assert "vLLM's --middleware is not taken by dyn frontend: " in result.output
    frontend = typer.main.get_command(app).commands["frontend"]
    declared = {name for param in frontend.params for name in param.opts + param.secondary_opts}
    assert not declared & (set(REFUSED) | set(FRONTEND_REFUSED))


def test_engine_only_flags_and_other_tokenizer_modes_are_refused_by_the_frontend_with_why():
    """``--trust-remote-code`` is for vLLM's engine (dyn serve passes it there): the frontend runs
    no model code; ``--tokenizer-mode`` other than auto or hf names what is not built."""
    result = runner.invoke(app, ["frontend", "--trust-remote-code"])
    assert result.exit_code == 2
    assert "vLLM's --trust-remote-code is not taken by dyn frontend: the frontend runs no model code" in (
        result.output
    )
    result = runner.invoke(app, ["frontend", "--tokenizer-mode", "mistral"])
    assert result.exit_code == 2 and "--tokenizer-mode 'mistral' is not served" in result.output
