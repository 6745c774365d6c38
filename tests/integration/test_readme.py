"""The README's main-job snippets work as written (against a stack on a free port)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
DEFAULT_URL = "http://127.0.0.1:8000"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_readme_curl_and_openai_snippets(stack):
    curl = next(b for b in blocks("bash") if b.startswith("curl"))
    args = shlex.split(curl.replace("\\\n", " ").replace(DEFAULT_URL, stack.url))
    out = subprocess.run(args, capture_output=True, text=True, timeout=30, check=True).stdout
    assert '"object":"chat.completion"' in out and '"completion_tokens":' in out

    python = next(b for b in blocks("python") if "OpenAI(" in b).replace(DEFAULT_URL, stack.url)
    run = subprocess.run([sys.executable, "-c", python], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip()


def test_readme_main_command_is_dyn_serve():
    install = blocks("bash")[0].strip()
    assert install == "pip install -e . && dyn serve"


def test_readme_agents_snippet(stack):
    python = next(b for b in blocks("python") if "tool_calls" in b).replace(DEFAULT_URL, stack.url)
    python += (
        "\nimport json\nassert call.function.name == 'get_weather'\n"
        "assert isinstance(json.loads(call.function.arguments)['city'], str)\n"
        "assert final.choices[0].finish_reason in ('stop', 'length', 'tool_calls')\n"
    )
    run = subprocess.run([sys.executable, "-c", python], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
