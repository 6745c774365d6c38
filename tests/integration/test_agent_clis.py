"""The coding agents people run, headless, against `dyn serve` with no extra flag: Codex (`codex
exec`, the Responses API), Claude Code (`claude -p`, Anthropic's Messages API) and OpenCode
(`opencode run`, chat completions) each run a scripted tool loop through the mocker's
``--replies``: the model asks for a shell command that prints ``dyn-probe-42`` (the shell computes
the 42), the CLI runs it and sends the output back, and the model's final answer, scripted to
match only that output, is what the CLI prints.

The CLIs come from npm through ``scripts/provision_agents.sh`` (cached in ~/.cache/dyn; the
first run installs them in under a minute). Where npm or the install is missing, each test says
so in its skip reason. Every CLI runs in a private HOME with its update checks, telemetry and
plugin downloads off (``tests/fixtures/agents/README.md``): it talks to the loopback server only.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.agent_clis import opencode_env, private_home, provisioned_agents, run_cli, seed_003_model
from tests.integration.conftest import serve_ready_url

pytestmark = pytest.mark.integration

PROBE = "echo dyn-probe-$((6*7))"
FINAL = "The probe printed dyn-probe-42, done."


def _call(name: str, arguments: dict) -> str:
    """A tool call as dyn-tiny writes it (Hermes), which the default stack parses."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _replies(tmp_path: Path, call: str) -> Path:
    """The script: the prompt asks for the probe, its output gets the final answer, anything
    else (a CLI's side request) a short reply instead of tokens up to its max_tokens."""
    lines = [
        {"match": "dyn-probe-42", "text": FINAL},
        {"match": "Run the probe", "text": call},
        {"match": "", "text": "ok"},
    ]
    path = tmp_path / "replies.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture(scope="module")
def agents() -> Path:
    return provisioned_agents()


@pytest.fixture
def serve(dyn_process, tmp_path):
    """``dyn serve`` as a newcomer starts it (one worker, plus ``flags``), answering from ``replies``."""

    def start(replies: Path, *flags: str) -> str:
        proc = dyn_process("serve", "--http-port", "0", "--workers", "1", "--replies", str(replies), *flags)
        return serve_ready_url(proc).removesuffix("/v1")

    return start


def test_codex_runs_a_tool_loop_through_the_responses_api(agents, serve, tmp_path):
    url = serve(_replies(tmp_path, _call("exec_command", {"cmd": PROBE})))
    env = private_home(tmp_path)
    codex_home = tmp_path / "codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        f"""model = "dyn-tiny"
model_provider = "dyn"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[features]
plugins = false
remote_plugin = false
apps = false

[model_providers.dyn]
name = "dyn"
base_url = "{url}/v1"
wire_api = "responses"
"""
    )
    env["CODEX_HOME"] = str(codex_home)
    out = run_cli(
        [
            str(agents / "bin" / "codex"),
            "exec",
            "--skip-git-repo-check",
            "--ephemeral",
            "--dangerously-bypass-approvals-and-sandbox",
            "Run the probe",
        ],
        env,
        tmp_path / "work",
    )
    assert FINAL in out


@pytest.mark.long
def test_claude_code_runs_a_tool_loop_through_the_messages_api(agents, serve, tmp_path):
    url = serve(_replies(tmp_path, _call("Bash", {"command": PROBE, "description": "Run the probe"})))
    env = {
        **private_home(tmp_path),
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": "unused",
        "ANTHROPIC_MODEL": "dyn-tiny",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "dyn-tiny",
        "ANTHROPIC_DEFAULT_SONNET_MODEL": "dyn-tiny",
        "ANTHROPIC_DEFAULT_OPUS_MODEL": "dyn-tiny",
        "CLAUDE_CODE_SUBAGENT_MODEL": "dyn-tiny",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_NON_ESSENTIAL_MODEL_CALLS": "1",
    }
    out = run_cli(
        [
            str(agents / "bin" / "claude"),
            "-p",
            "Run the probe",
            "--model",
            "dyn-tiny",
            "--allowedTools",
            "Bash",
        ],
        env,
        tmp_path / "work",
    )
    assert FINAL in out


@pytest.mark.parametrize(
    "flags",
    [(), ("--engine-type", "sglang", "--enable-streaming-session")],
    ids=["default", "sglang-flavour"],
)
@pytest.mark.long
def test_opencode_runs_a_tool_loop_through_chat_completions(agents, serve, tmp_path, flags):
    """The default stack with a bare model entry, and seed 003's walk-through on the mocker in
    SGLang's flavour (its streaming sessions on) with seed 003's model entry (tool calls,
    reasoning, ``interleaved.field: reasoning_content``)."""
    url = serve(_replies(tmp_path, _call("bash", {"command": PROBE, "description": "Run the probe"})), *flags)
    entry = seed_003_model("dyn-tiny") if flags else None
    env = opencode_env(tmp_path, url, "dyn-tiny", entry)
    out = run_cli([str(agents / "bin" / "opencode"), "run", "Run the probe"], env, tmp_path / "work")
    assert FINAL in out
