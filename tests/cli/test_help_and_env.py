"""``--help`` as an 80-column terminal shows it, and environment twins with one meaning each.

Walks the real Typer app: every command's help is rendered at ``COLUMNS=80`` and must show every
visible flag's names whole (no ``…`` stubs such as ``--router-kv-over…``) and no ``<bool>``
placeholder; every ``DYN_*`` twin that two declarations share must mean the same thing there.
"""

from __future__ import annotations

import re
from collections import defaultdict

import pytest
import typer.main
from typer.testing import CliRunner

from dyn.cli.app import app
from dyn.cli.options import env_name

runner = CliRunner()

SAME_MEANING = {
    "DYN_API_KEY": "the stack's key: servers require it, clients (bench, inspect-kv) send it",
    "DYN_BLOCK_SIZE": "the engines' KV block size (workers, indexer, bench's block model, replay)",
    "DYN_DTYPE": "the engine's dtype (vLLM's and SGLang's spellings)",
    "DYN_ENABLE_PREFIX_CACHING": "an engine setting the mocker simulates",
    "DYN_ENABLE_PRIORITY_SCHEDULING": "an engine setting the mocker simulates",
    "DYN_ENABLE_STREAMING_SESSION": "an engine setting the mocker simulates",
    "DYN_HTTP_HOST": "the frontend's HTTP address; dyn serve passes it to its frontend",
    "DYN_HTTP_PORT": "the frontend's HTTP port; dyn serve passes it to its frontend",
    "DYN_SYSTEM_PORT": "a process's HTTP status port (/metrics, /health): a router's or a worker's, as in Dynamo",
    "DYN_JSON": "print JSON instead of a table (inspect-kv, bench compare)",
    "DYN_KV_EVENTS_CONFIG": "the engine's KV-event publisher config (vLLM's or SGLang's)",
    "DYN_LORA_MODULES": "the LoRA adapters a worker serves (vLLM's; the mocker simulates them)",
    "DYN_MAX_LORAS": "how many LoRA adapters an engine holds at once (vLLM's; the mocker simulates it)",
    "DYN_MAX_MODEL_LEN": "the context length a worker serves (vLLM's; the mocker simulates it)",
    "DYN_MEDIA_IO_KWARGS": "how vLLM loads media: its workers load so, and the frontend counts so",
    "DYN_MM_PROCESSOR_KWARGS": "vLLM's processor settings: its workers process so, and the frontend counts so",
    "DYN_MODEL_NAME": "the served model's name (inspect-kv finds that model's indexer)",
    "DYN_MODEL_PATH": "the served model's directory (inspect-kv tokenizes with it)",
    "DYN_NUM_REQUESTS": "how many requests a benchmark runs (live or replayed)",
    "DYN_NUM_WORKERS": "simulated mocker workers (one process, or the offline replay)",
    "DYN_OUTPUT": "a benchmark's results file (live or replayed)",
    "DYN_RADIX_EVICTION_POLICY": "an engine setting the mocker simulates",
    "DYN_ROUTER_EVENT_THREADS": "threads decoding KV events (router, frontend, indexer)",
    "DYN_ROUTER_MODE": "the routing policy (live or in the offline replay)",
    "DYN_SCHEDULE_LOW_PRIORITY_VALUES_FIRST": "an engine setting the mocker simulates",
    "DYN_SCHEDULING_POLICY": "an engine setting the mocker simulates",
    "DYN_BENCH_SEED": "the seed of a benchmark's random choices (live or replayed)",
    "DYN_VOCAB_SIZE": "the token-id bound of synthesized prompts (live or replayed)",
}
"""Twins that several declarations (different help texts) share, and the one thing they mean."""


def commands(cmd=None, path=("dyn",)):
    """Every command of the app, groups included, with its path."""
    cmd = cmd if cmd is not None else typer.main.get_command(app)
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from commands(sub, (*path, name))


def options(cmd):
    return [p for p in cmd.params if p.param_type_name == "option" and not getattr(p, "hidden", False)]


def flattened(output: str) -> str:
    """The help text without panel borders, whitespace runs made one space."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", output).split())


HELP_CASES = [path for path, _ in commands()]


@pytest.mark.parametrize("path", HELP_CASES, ids=" ".join)
def test_help_at_80_columns_shows_every_flag_whole(path):
    cmd = dict(commands())[path]
    result = runner.invoke(app, [*path[1:], "--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": None})
    assert result.exit_code == 0, result.output
    assert "…" not in result.output and "<bool>" not in result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    for param in options(cmd):
        for name in (*param.opts, *param.secondary_opts):
            if name.startswith("-"):
                assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", result.output), (
                    f"{' '.join(path)}: {name} is not shown whole"
                )


def test_wide_help_puts_the_help_beside_the_names():
    result = runner.invoke(app, ["router", "--help"], env={"COLUMNS": "200"})
    line = next(line for line in result.output.splitlines() if "--router-kv-overlap-score-credit" in line)
    assert "Credit for device-local prefix overlap" in line


def test_every_env_name_has_one_meaning():
    meanings: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path, cmd in commands():
        for param in cmd.params:
            if param.param_type_name == "option" and isinstance(param.envvar, str):
                meanings[param.envvar][param.help or ""].append(" ".join(path))
    shared = {env for env, helps in meanings.items() if len(helps) > 1}
    clashes = {env: dict(meanings[env]) for env in shared - set(SAME_MEANING)}
    assert not clashes, f"env names with several meanings (scope them, or justify in SAME_MEANING): {clashes}"
    assert set(SAME_MEANING) <= shared, f"stale SAME_MEANING entries: {set(SAME_MEANING) - shared}"


def envvars(path: tuple[str, ...]) -> dict[str, str]:
    cmd = dict(commands())[path]
    return {next(o for o in p.opts if o.startswith("--")): p.envvar for p in cmd.params if p.envvar}


def test_twins_whose_meaning_differs_are_scoped_by_command():
    assert envvars(("dyn", "serve"))["--workers"] == "DYN_WORKERS"
    assert envvars(("dyn", "indexer"))["--workers"] == "DYN_INDEXER_WORKERS"
    assert (
        envvars(("dyn", "frontend"))["--http-port"]
        == envvars(("dyn", "serve"))["--http-port"]
        == "DYN_HTTP_PORT"
    )
    assert envvars(("dyn", "indexer"))["--http-port"] == "DYN_INDEXER_HTTP_PORT"
    assert (
        envvars(("dyn", "bench"))["--seed"]
        == envvars(("dyn", "bench", "replay"))["--seed"]
        == "DYN_BENCH_SEED"
    )
    assert envvars(("dyn", "bench"))["--url"] == "DYN_BENCH_URL"
    assert envvars(("dyn", "inspect-kv"))["--url"] == "DYN_INSPECT_KV_URL"
    assert envvars(("dyn", "bench"))["--duration"] == "DYN_BENCH_DURATION"
    assert envvars(("dyn", "inspect-kv"))["--duration"] == "DYN_INSPECT_KV_DURATION"
    assert env_name("--http-port", "indexer") == "DYN_INDEXER_HTTP_PORT"


def test_a_stack_environment_does_not_reach_the_indexer(tmp_path):
    """DYN_HTTP_PORT / DYN_WORKERS set for a stack are not the indexer's: a bad value there is
    not read, and the indexer's own twins are."""
    env = {"DYN_HTTP_PORT": "not-a-port", "DYN_WORKERS": "not-a-list", "DYN_DISCOVERY_DIR": str(tmp_path)}
    result = runner.invoke(app, ["indexer", "--workers", "zz"], env=env)
    text = flattened(result.output)
    assert result.exit_code == 2 and "--workers entry 'zz'" in text and "not-a-port" not in text
    result = runner.invoke(app, ["indexer"], env={**env, "DYN_INDEXER_WORKERS": "zz"})
    assert result.exit_code == 2 and "(set by DYN_INDEXER_WORKERS in the environment)" in flattened(
        result.output
    )


@pytest.mark.parametrize(
    ("argv", "env", "says"),
    [
        (["frontend"], {"DYN_ROUTER_MODE": "bogus"}, "unknown router mode 'bogus'"),
        (["frontend"], {"DYN_ROUTER_QUEUE_THRESHOLD": "abc"}, "--router-queue-threshold must be a number"),
        (["worker", "mocker"], {"DYN_PREEMPTION_MODE": "sideways"}, "--preemption-mode must be one of"),
        (["serve"], {"DYN_ENGINE": "nope"}, "must be one of mocker"),
        (["frontend"], {"DYN_LOG_LEVEL": "loud"}, "log level must be one of"),
    ],
)
def test_a_bad_value_from_the_environment_names_its_variable(argv, env, says, tmp_path):
    result = runner.invoke(app, argv, env={**env, "DYN_DISCOVERY_DIR": str(tmp_path)})
    text = flattened(result.output)
    (name,) = env
    assert result.exit_code == 2 and says in text and f"set by {name} in the environment" in text, text


def test_the_same_bad_value_on_the_command_line_names_no_variable(tmp_path):
    result = runner.invoke(app, ["frontend", "--router-mode", "bogus", "--discovery-dir", str(tmp_path)])
    assert result.exit_code == 2 and "unknown router mode 'bogus'" in result.output
    assert "in the environment" not in result.output


def test_clicks_own_type_errors_name_the_variable(tmp_path):
    result = runner.invoke(
        app, ["indexer"], env={"DYN_INDEXER_HTTP_PORT": "abc", "DYN_DISCOVERY_DIR": str(tmp_path)}
    )
    assert result.exit_code == 2 and "DYN_INDEXER_HTTP_PORT" in flattened(result.output)
