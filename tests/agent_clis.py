"""The coding-agent CLIs as the tests run them: installed from npm by ``scripts/provision_agents.sh``
(or ``DYN_AGENTS``), each in a private HOME with its update checks, telemetry and plugin downloads
off (``tests/fixtures/agents/README.md``), so it talks to the loopback server only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLI_TIMEOUT_S = 180
OPENCODE_PLUGIN = "1.18.33"
"""The ``@opencode-ai/plugin`` version the provisioned OpenCode would otherwise fetch."""


def provisioned_agents() -> Path:
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


def private_home(tmp_path: Path) -> dict[str, str]:
    """An environment whose HOME and XDG folders are under ``tmp_path`` (``work/`` is the CLI's cwd)."""
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


def run_cli(cmd: list[str], env: dict[str, str], cwd: Path) -> str:
    """Run a CLI headless; its stdout, or a failure with both its streams' tails."""
    out = subprocess.run(
        cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL
    )
    assert out.returncode == 0, (
        f"{cmd[0]} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    )
    return out.stdout


def seed_003_model(model: str, output_limit: int = 8192) -> dict[str, Any]:
    """An OpenCode model entry shaped as seed 003's ``.opencode/opencode.jsonc`` declares its model:
    tool calls, reasoning, ``interleaved.field: reasoning_content``, a 131072-token context."""
    return {
        "id": model,
        "name": model,
        "tool_call": True,
        "reasoning": True,
        "temperature": True,
        "attachment": False,
        "release_date": "2025-06-01",
        "limit": {"context": 131072, "output": output_limit},
        "cost": {"input": 0, "output": 0},
        "interleaved": {"field": "reasoning_content"},
    }


def opencode_env(tmp_path: Path, url: str, model: str, entry: dict[str, Any] | None = None) -> dict[str, str]:
    """A private HOME whose OpenCode config has one provider, ``dyn`` (``@ai-sdk/openai-compatible``
    at ``url``/v1), serving ``model`` (its entry: ``entry``, default just a name) as the model and
    the small model, with bash and edits allowed; returns the environment to run ``opencode`` in."""
    env = {
        **private_home(tmp_path),
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
                "packages": {"": {"dependencies": {"@opencode-ai/plugin": OPENCODE_PLUGIN}}},
            }
        )
    )
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "dyn",
        "options": {"baseURL": f"{url}/v1", "apiKey": "unused"},
        "models": {model: entry or {"name": model}},
    }
    (config / "opencode.json").write_text(
        json.dumps(
            {
                "$schema": "https://opencode.ai/config.json",
                "provider": {"dyn": provider},
                "model": f"dyn/{model}",
                "small_model": f"dyn/{model}",
                "autoupdate": False,
                "share": "disabled",
                "permission": {"bash": "allow", "edit": "allow"},
            }
        )
    )
    return env
