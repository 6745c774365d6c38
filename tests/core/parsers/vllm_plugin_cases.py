"""Run in the vLLM venv by ``test_vllm_plugin_real.py`` (``python -m tests.core.parsers.vllm_plugin_cases
DIR`` from the repository root; DIR holds the plugin files): loads real vLLM tool-parser plugins
through ``load_plugin`` and prints, as JSON, what dyn's adapter makes of outputs fed whole, a
character at a time and split in two at every index, next to dyn's own parser where one reads
the same format. pytest is not installed there: the test asserts on the JSON."""

from __future__ import annotations

import json
import logging
import sys
from io import StringIO
from pathlib import Path

from dyn.core.frontend.output import OutputPlan
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.model.info import load_model_info
from dyn.core.parsers.events import Reasoning, ToolCallArgs, ToolCallEnd, ToolCallStart
from dyn.core.parsers.registry import load_plugin
from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall
from tests.core.parsers.test_hermes import QWEN3_TEXT_THEN_CALL, QWEN25_TWO_CALLS

TOKENIZER = Tokenizer.from_model(load_model_info(None, None))
TOOLS = (Tool("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}}),)
CALL_TAGS_OUTPUTS = {
    "content_then_two_calls": (
        'Let me check.\n<call>{"name": "get_weather", "arguments": {"city": "Zürich", "days": [1, 2]}}'
        '</call>\n<call>{"name": "get_time", "arguments": {}}</call>'
    ),
    "no_end_marker": '<call>{"name": "get_weather", "arguments": {"city": "Paris", "opts": {"a": {}}}}',
    "cut_off": '<call>{"name": "get_weather", "arguments": {"city": "Par',
    "plain": "3 < 4 and <cal is not a call",
}


def joined(events) -> dict:
    """Events joined: content, reasoning and calls (name, arguments, complete; ids left out)."""
    out: dict = {"content": "", "reasoning": "", "calls": []}
    for event in events:
        if isinstance(event, str):
            out["content"] += event
        elif isinstance(event, Reasoning):
            out["reasoning"] += event.text
        elif isinstance(event, ToolCallStart):
            out["calls"].append(
                {"name": event.name, "arguments": "", "complete": False, "id": bool(event.id)}
            )
        elif isinstance(event, ToolCallArgs):
            out["calls"][-1]["arguments"] += event.text
        elif isinstance(event, ToolCallEnd):
            out["calls"][-1]["complete"] = True
    return out


def parse(cls, pieces: list[str]) -> dict:
    parser = OutputPlan(tool_parser=cls, tools=TOOLS, tokenizer=TOKENIZER).new()._tools
    events = []
    for piece in pieces:
        events += parser.feed(piece)
    return joined(events + parser.finish())


def splits(cls, text: str) -> dict:
    """The result of ``text`` fed whole, and whether every other way of feeding it agrees."""
    whole = parse(cls, [text])
    ways = [list(text)] + [[text[:i], text[i:]] for i in range(len(text) + 1)]
    return {"whole": whole, "agree": all(parse(cls, pieces) == whole for pieces in ways)}


def main(plugins: Path) -> dict:
    logs = StringIO()
    logging.basicConfig(stream=logs, level=logging.WARNING)
    report: dict = {}
    for name in ("call_tags", "vllm_hermes", "example"):
        load_plugin(plugins / f"{name}.py")
    load_plugin(plugins / "call_tags.py")  # a second load is a no-op

    tags = TOOL_PARSERS.get("call_tags")
    try:
        tags.render([ToolCall("f", "{}")])
        render = ""
    except NotImplementedError as exc:
        render = str(exc)
    report["call_tags"] = {
        "name": tags.name,
        "alias": TOOL_PARSERS.get("call-tags-too") is tags,
        "listed": "call_tags" in TOOL_PARSERS.names(),
        "needs_special_tokens": tags.needs_special_tokens,
        "render": render,
        "outputs": {key: splits(tags, text) for key, text in CALL_TAGS_OUTPUTS.items()},
    }

    vllm_hermes, dyn_hermes = TOOL_PARSERS.get("vllm_hermes"), TOOL_PARSERS.get("hermes")
    report["hermes"] = {
        "needs_special_tokens": vllm_hermes.needs_special_tokens,
        "outputs": {
            key: {"vllm": splits(vllm_hermes, text), "dyn": parse(dyn_hermes, [text])}
            for key, text in {"two_calls": QWEN25_TWO_CALLS, "text_then_call": QWEN3_TEXT_THEN_CALL}.items()
        },
    }

    example = TOOL_PARSERS.get("example")
    text = 'Hello <call>{"name": "f", "arguments": {}}</call>'
    report["example"] = {
        "name": example.name,
        "needs_special_tokens": example.needs_special_tokens,
        "takes_tools": example.takes_tools,
        "whole": parse(example, [text]),
        "pieces": parse(example, list(text)),
    }
    report["hermes_is_dyns"] = dyn_hermes.__module__ == "dyn.core.parsers.tool.hermes"

    report["refused"] = {}
    for name in ("unnamed", "neither", "old_path"):
        try:
            load_plugin(plugins / f"{name}.py")
            report["refused"][name] = ""
        except ValueError as exc:
            report["refused"][name] = str(exc)
    report["log"] = logs.getvalue()
    return report


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
