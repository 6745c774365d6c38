"""Real vLLM tool-parser plugins as dyn tool-call parsers, in the vLLM venv
(``scripts/provision_vllm_cpu.sh``; skipped without ``DYN_VLLM_VENV``): a plugin written in vLLM
0.32's idiom (``vllm_call_tags_plugin.py``), vLLM's own Hermes parser registered by a plugin and
read next to dyn's, and seed 004's example, which loads and registers but whose methods name
undefined variables: the text goes out as content and the log says why.
``vllm_plugin_cases.py`` runs there and reports; this module asserts on its report."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.core.parsers.test_vllm_plugin import SEED_004_EXAMPLE
from tests.vllm_cpu import VENV, python_and_model, vllm_env

NEEDS_VLLM = pytest.mark.skipif(
    not VENV, reason="set DYN_VLLM_VENV=$(scripts/provision_vllm_cpu.sh) to run vLLM's tool-parser classes"
)
pytestmark = [NEEDS_VLLM, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[3]
VLLM_HERMES = """\
from vllm.tool_parsers import ToolParserManager
from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser


@ToolParserManager.register_module(["vllm_hermes", "hermes"])
class VllmHermes(Hermes2ProToolParser):
    pass
"""
REFUSED = {
    "unnamed": (
        "from vllm.tool_parsers import ToolParser\n\n\n"
        "class Unnamed(ToolParser):\n"
        "    def extract_tool_calls(self, model_output, request):\n        return None\n"
    ),
    "neither": (
        "from vllm.tool_parsers import ToolParser, ToolParserManager\n\n\n"
        '@ToolParserManager.register_module("neither")\nclass Neither(ToolParser):\n    pass\n'
    ),
    "old_path": "from vllm.entrypoints.openai.tool_parsers import ToolParser, ToolParserManager\n",
}


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    plugins = tmp_path_factory.mktemp("vllm-plugins")
    shutil.copy(Path(__file__).with_name("vllm_call_tags_plugin.py"), plugins / "call_tags.py")
    (plugins / "vllm_hermes.py").write_text(VLLM_HERMES)
    (plugins / "example.py").write_text(SEED_004_EXAMPLE)
    for name, source in REFUSED.items():
        (plugins / f"{name}.py").write_text(source)
    python, _ = python_and_model()
    proc = subprocess.run(
        [str(python), "-m", "tests.core.parsers.vllm_plugin_cases", str(plugins)],
        cwd=ROOT,
        env=vllm_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_vllm_plugin_registers_its_names_and_says_what_it_needs(report):
    tags = report["call_tags"]
    assert tags["name"] == "call_tags" and tags["alias"] and tags["listed"]
    assert tags["needs_special_tokens"]  # its adjust_request turns skip_special_tokens off
    assert "is a vLLM plugin" in tags["render"] and "cannot write calls" in tags["render"]


def test_a_vllm_plugin_reads_calls_alike_however_the_text_is_split(report):
    outputs = report["call_tags"]["outputs"]
    assert all(case["agree"] for case in outputs.values()), {k: v["agree"] for k, v in outputs.items()}
    two = outputs["content_then_two_calls"]["whole"]
    assert two["content"] == "Let me check.\n"
    assert [(c["name"], json.loads(c["arguments"]), c["complete"], c["id"]) for c in two["calls"]] == [
        ("get_weather", {"city": "Zürich", "days": [1, 2]}, True, True),
        ("get_time", {}, True, True),
    ]


def test_arguments_vllm_sends_at_the_end_complete_a_call_without_its_end_marker(report):
    (call,) = report["call_tags"]["outputs"]["no_end_marker"]["whole"]["calls"]
    assert json.loads(call["arguments"]) == {"city": "Paris", "opts": {"a": {}}} and call["complete"]


def test_a_cut_off_call_stays_incomplete_and_plain_text_is_content(report):
    outputs = report["call_tags"]["outputs"]
    (call,) = outputs["cut_off"]["whole"]["calls"]
    assert call["name"] == "get_weather" and not call["complete"]
    assert outputs["plain"]["whole"] == {
        "content": "3 < 4 and <cal is not a call",
        "reasoning": "",
        "calls": [],
    }


def test_vllms_hermes_through_the_adapter_reads_as_dyns_hermes(report):
    hermes = report["hermes"]
    assert hermes["needs_special_tokens"]
    for key, case in hermes["outputs"].items():
        vllm, dyn = case["vllm"], case["dyn"]
        assert vllm["agree"], key
        assert vllm["whole"]["content"] == dyn["content"], key
        assert [(c["name"], json.loads(c["arguments"])) for c in vllm["whole"]["calls"]] == [
            (c["name"], json.loads(c["arguments"])) for c in dyn["calls"]
        ], key
        assert all(c["complete"] for c in vllm["whole"]["calls"]), key


def test_seed_004s_example_loads_and_a_call_to_it_gives_the_text_as_content(report):
    example = report["example"]
    assert example["name"] == "example" and not example["needs_special_tokens"]
    assert not example["takes_tools"]  # its __init__ takes the tokenizer only
    text = 'Hello <call>{"name": "f", "arguments": {}}</call>'
    assert example["whole"] == example["pieces"] == {"content": text, "reasoning": "", "calls": []}
    assert "vLLM tool-parser plugin example (ExampleToolParser" in report["log"]
    assert "NameError: name 'delta' is not defined" in report["log"]


def test_a_name_dyn_already_has_stays_dyns_and_the_log_says_so(report):
    assert report["hermes_is_dyns"]
    assert "registers VllmHermes as hermes, which dyn's own tool-call parsers take" in report["log"]


def test_plugins_that_cannot_be_adapted_are_refused_saying_why(report):
    refused = report["refused"]
    assert "defines the vLLM tool parser Unnamed but registers none" in refused["unnamed"]
    assert "register_module" in refused["unnamed"]
    assert (
        "Neither implements neither extract_tool_calls_streaming nor extract_tool_calls" in refused["neither"]
    )
    assert (
        "imports vllm.entrypoints.openai.tool_parsers, which the vLLM installed here does not have"
        in (refused["old_path"])
    )
    assert "vllm.tool_parsers" in refused["old_path"] and "@TOOL_PARSERS.register" in refused["old_path"]
