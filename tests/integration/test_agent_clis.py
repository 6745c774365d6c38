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
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import serve_ready_url

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROBE = "echo dyn-probe-$((6*7))"
FINAL = "The probe printed dyn-probe-42, done."
CLI_TIMEOUT_S = 180


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
    """The provisioned CLIs' prefix (its bin/ has codex, claude, opencode), or a skip saying why."""
    given = os.environ.get("DYN_AGENTS")
    if given:
        return Path(given)
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: the agent CLIs install from the npm registry")
    out = subprocess.run(
        [str(ROOT / "scripts" / "provision_agents.sh")], capture_output=True, text=True, timeout=1800
    )
    if out.returncode != 0:
        pytest.skip(f"scripts/provision_agents.sh could not install the agent CLIs: {out.stderr[-500:]}")
    return Path(out.stdout.strip())


@pytest.fixture
def serve(dyn_process, tmp_path):
    """``dyn serve`` as a newcomer starts it (one worker), answering from ``replies``."""

    def start(replies: Path) -> str:
        proc = dyn_process("serve", "--http-port", "0", "--workers", "1", "--replies", str(replies))
        return serve_ready_url(proc).removesuffix("/v1")

    return start


def _home(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    work = tmp_path / "work"
    for d in (home, work):
        d.mkdir(exist_ok=True)
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local/share"),
        "XDG_STATE_HOME": str(home / ".local/state"),
    }


def _run(cmd: list[str], env: dict[str, str], cwd: Path) -> str:
    out = subprocess.run(
        cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL
    )
    assert out.returncode == 0, (
        f"{cmd[0]} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    )
    return out.stdout


def test_codex_runs_a_tool_loop_through_the_responses_api(agents, serve, tmp_path):
    url = serve(_replies(tmp_path, _call("exec_command", {"cmd": PROBE})))
    env = _home(tmp_path)
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
    out = _run(
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


def test_claude_code_runs_a_tool_loop_through_the_messages_api(agents, serve, tmp_path):
    url = serve(_replies(tmp_path, _call("Bash", {"command": PROBE, "description": "Run the probe"})))
    env = {
        **_home(tmp_path),
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
    out = _run(
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


def test_opencode_runs_a_tool_loop_through_chat_completions(agents, serve, tmp_path):
    url = serve(_replies(tmp_path, _call("bash", {"command": PROBE, "description": "Run the probe"})))
    env = {
        **_home(tmp_path),
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_SHARE": "1",
    }
    config = Path(env["XDG_CONFIG_HOME"]) / "opencode"
    (config / "node_modules").mkdir(parents=True)
    # with this lock file OpenCode does not fetch its plugin package from npm in the background
    (config / "package-lock.json").write_text(
        json.dumps(
            {
                "name": "opencode-config",
                "lockfileVersion": 3,
                "requires": True,
                "packages": {"": {"dependencies": {"@opencode-ai/plugin": "1.18.33"}}},
            }
        )
    )
    (config / "opencode.json").write_text(
        json.dumps(
            {
                "$schema": "https://opencode.ai/config.json",
                "provider": {
                    "dyn": {
                        "npm": "@ai-sdk/openai-compatible",
                        "name": "dyn",
                        "options": {"baseURL": f"{url}/v1", "apiKey": "unused"},
                        "models": {"dyn-tiny": {"name": "dyn-tiny"}},
                    }
                },
                "model": "dyn/dyn-tiny",
                "small_model": "dyn/dyn-tiny",
                "autoupdate": False,
                "share": "disabled",
                "permission": {"bash": "allow", "edit": "allow"},
            }
        )
    )
    out = _run([str(agents / "bin" / "opencode"), "run", "Run the probe"], env, tmp_path / "work")
    assert FINAL in out
