"""Parser registries: names as vLLM and Dynamo spell them, every module found by itself, a user's
plugin file registering its own parser, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.registry import UnknownParserError, load_plugin
from dyn.core.parsers.tool import TOOL_PARSERS

PLUGIN = Path(__file__).with_name("line_calls_plugin.py")
ISSUE_TOOL_PARSERS = (
    "hermes",
    "qwen3_coder",
    "llama3_json",
    "mistral",
    "pythonic",
    "granite",
    "internlm",
    "jamba",
    "deepseek_v3",
    "deepseek_v31",
    "glm45",
    "glm47",
    "kimi_k2",
    "gpt-oss",
)
ISSUE_REASONING_PARSERS = (
    "deepseek_r1",
    "qwen3",
    "glm45",
    "gpt_oss",
    "granite",
    "kimi",
    "minimax",
    "nemotron",
)


def test_every_promised_name_is_registered_and_spellings_agree():
    for name in ISSUE_TOOL_PARSERS:
        assert TOOL_PARSERS.get(name).name
    for name in ISSUE_REASONING_PARSERS:
        assert REASONING_PARSERS.get(name).name
    assert TOOL_PARSERS.get("gpt-oss") is TOOL_PARSERS.get("gpt_oss") is TOOL_PARSERS.get("openai")
    assert TOOL_PARSERS.get("Hermes") is TOOL_PARSERS.get("qwen25")


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(UnknownParserError) as info:
        TOOL_PARSERS.get("nope")
    assert "unknown tool-call parser 'nope'" in str(info.value) and "hermes" in str(info.value)


def test_a_plugin_file_registers_its_parser(parse):
    load_plugin(PLUGIN)
    load_plugin(PLUGIN)  # a second load is a no-op
    got = parse(TOOL_PARSERS.get("line_calls"), ['Sure.\nCALL f {"a": ', "1}"])
    assert got.content == "Sure.\n" and got.named_args == [("f", {"a": 1})]


def test_plugin_errors_say_what_went_wrong(tmp_path):
    with pytest.raises(ValueError, match="is not a file"):
        load_plugin(tmp_path / "absent.py")
    broken = tmp_path / "broken.py"
    broken.write_text("import nowhere_to_be_found\n")
    with pytest.raises(ValueError, match="failed to import: ModuleNotFoundError"):
        load_plugin(broken)
