"""vLLM tool-parser plugins behind dyn's parser contract (``dyn.core.parsers.tool._vllm_plugin``),
without vLLM: the adapter drives stand-ins that answer as vLLM parsers do (objects shaped like
``DeltaMessage``), over dyn-tiny's tokenizer; and a vLLM plugin where vLLM is not installed is
refused with an error naming dyn's own plugin API. ``test_vllm_plugin_real.py`` runs real vLLM
plugins (and seed 004's example) in the vLLM venv."""

from __future__ import annotations

import importlib.util
import json
import logging
from types import SimpleNamespace

import pytest

from dyn.core.frontend.output import OutputPlan
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.model.info import load_model_info
from dyn.core.parsers.registry import load_plugin
from dyn.core.parsers.tool import Tool, ToolCall, ToolParser
from dyn.core.parsers.tool import _vllm_plugin as adapter

TOKENIZER = Tokenizer.from_model(load_model_info(None, None))
TOOLS = (Tool("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}}),)
START, END, SEP = "<call>", "</call>", "|"


def _overlap(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` begin ``tag``."""
    return next((n for n in range(min(len(tag) - 1, len(text)), 0, -1) if text.endswith(tag[:n])), 0)


def _call(index, name=None, arguments=None, id=None):
    return SimpleNamespace(index=index, id=id, function=SimpleNamespace(name=name, arguments=arguments))


class PipeCalls:
    """A stand-in for a vLLM parser of ``<call>NAME|ARGS</call>``, written as vLLM's are: each
    delta re-reads ``current_text`` and sends what was not sent; a call's last ``}`` waits for
    ``</call>`` (``get_remaining_unstreamed_args`` has it when the marker never comes)."""

    def __init__(self, tokenizer, tools=None):
        assert tokenizer == "vllm-tokenizer" and tools == ["tools"]
        self.sent = 0
        self.prev_tool_call_arr: list[dict] = []
        self.streamed_args_for_tool: list[str] = []

    def extract_tool_calls_streaming(self, previous, current, delta, prev_ids, cur_ids, delta_ids, request):
        assert current == previous + delta and len(cur_ids) == len(prev_ids) + len(delta_ids)
        assert request.tools == ["tools"]
        if "BOOM" in current:
            raise RuntimeError("the plugin broke")
        at = current.find(START)
        sendable = at if at >= 0 else len(current) - _overlap(current, START)
        content = current[self.sent : sendable] if sendable > self.sent else None
        self.sent = max(self.sent, sendable)
        calls = []
        index = 0
        while at >= 0:
            body_at = at + len(START)
            end = current.find(END, body_at)
            body = current[body_at:] if end < 0 else current[body_at:end]
            if end < 0:
                body = body[: len(body) - _overlap(body, END)]
            if SEP not in body:
                break
            name, args = body.split(SEP, 1)
            if index == len(self.prev_tool_call_arr):
                self.prev_tool_call_arr.append({"name": name})
                self.streamed_args_for_tool.append("")
                calls.append(_call(index, name=name, id=f"call-{index}"))
            try:
                self.prev_tool_call_arr[index]["arguments"] = json.loads(args)
            except ValueError:
                pass
            sendable_args = args if end >= 0 else args.rstrip("}")
            sent = self.streamed_args_for_tool[index]
            if len(sendable_args) > len(sent):
                calls.append(_call(index, arguments=sendable_args[len(sent) :]))
                self.streamed_args_for_tool[index] = sendable_args
            if end < 0:
                break
            at = current.find(START, end + len(END))
            index += 1
        if content or calls:
            return SimpleNamespace(content=content, reasoning=None, tool_calls=calls)
        return None

    def get_remaining_unstreamed_args(self):
        args = self.prev_tool_call_arr[-1].get("arguments")
        expected = json.dumps(args) if args is not None else ""
        sent = self.streamed_args_for_tool[-1]
        return expected[len(sent) :] if expected.startswith(sent) else ""

    def extract_tool_calls(self, model_output, request):
        at = model_output.find(START)
        if at < 0:
            return SimpleNamespace(tools_called=False, tool_calls=[], content=model_output)
        calls = []
        for body in model_output[at:].split(START)[1:]:
            name, args = body.removesuffix(END).split(SEP, 1)
            calls.append(SimpleNamespace(id=None, function=SimpleNamespace(name=name, arguments=args)))
        return SimpleNamespace(tools_called=True, tool_calls=calls, content=model_output[:at] or None)


@pytest.fixture(autouse=True)
def _no_vllm(monkeypatch):
    """The adapter's two reaches into vLLM, answered without it."""
    monkeypatch.setattr(adapter, "_probe_request", lambda tools: SimpleNamespace(tools=["tools"]))
    monkeypatch.setattr(adapter, "_vllm_tokenizer", lambda tokenizer: "vllm-tokenizer")


def _adapter(plugin=PipeCalls, **attrs):
    """An adapter class for ``plugin``, as ``register_vllm_parsers`` makes them (unregistered)."""
    attrs = {"plugin": plugin, "plugin_file": "plugin.py", "name": "pipe_calls", **attrs}
    return type(f"Vllm{plugin.__name__}", (adapter.VllmToolParser,), attrs)


def _make(cls=None):
    cls = cls or _adapter()
    return lambda: cls(TOOLS, tokenizer=TOKENIZER)


def test_calls_and_content_read_alike_however_the_text_is_split(check_splits):
    got = check_splits(_make(), 'Let me check. <call>get_weather|{"city": "Paris"}</call><call>f|{}</call>')
    assert got.content == "Let me check. "
    assert got.named_args == [("get_weather", {"city": "Paris"}), ("f", {})]
    assert [c.id for c in got.calls] == ["call-0", "call-1"] and all(c.complete for c in got.calls)


def test_unicode_and_markers_inside_arguments(check_splits):
    got = check_splits(_make(), 'é <call>get_weather|{"city": "Zürich 🌧 </ca"}</call>')
    assert got.content == "é " and got.named_args == [("get_weather", {"city": "Zürich 🌧 </ca"})]


def test_a_marker_that_never_begins_a_call_is_content(check_splits):
    assert check_splits(_make(), "3 <ca").content == "3 <ca"
    # held back by the parser, which never found a call in it: returned at the end, as dyn's parsers do
    assert check_splits(_make(), "a <call>no separator").content == "a <call>no separator"


def test_arguments_the_parser_holds_back_are_sent_at_the_end(check_splits):
    got = check_splits(_make(), '<call>get_weather|{"city": "Paris", "n": {"a": 1}}')
    assert got.named_args == [("get_weather", {"city": "Paris", "n": {"a": 1}})] and got.calls[0].complete


def test_a_call_cut_off_stays_incomplete(check_splits):
    got = check_splits(_make(), '<call>get_weather|{"city": "Par')
    assert got.calls[0].name == "get_weather" and not got.calls[0].complete


def test_the_parser_sees_token_sized_deltas_with_their_ids():
    seen = []

    class Recorder(PipeCalls):
        def extract_tool_calls_streaming(
            self, previous, current, delta, prev_ids, cur_ids, delta_ids, request
        ):
            seen.append((delta, list(delta_ids)))
            return super().extract_tool_calls_streaming(
                previous, current, delta, prev_ids, cur_ids, delta_ids, request
            )

    text = "Hé, <call>f|{}</call>"
    parser = _make(_adapter(Recorder))()
    parser.feed(text)
    assert "".join(d for d, _ in seen) == text and len(seen) > 5
    assert [i for _, ids in seen for i in ids] == TOKENIZER.encode(text, add_special_tokens=False)
    assert all(ids for _, ids in seen)  # é's two byte tokens travel together


def test_a_plugin_without_streaming_reads_the_whole_text_at_the_end(check_splits):
    got = check_splits(_make(_adapter(streams=False)), 'ok <call>get_weather|{"city": "Oslo"}</call>')
    assert got.content == "ok " and got.named_args == [("get_weather", {"city": "Oslo"})]


def test_a_plugin_that_raises_hands_the_text_over_as_content_and_logs_it(caplog, check_splits):
    cls = _adapter()
    with caplog.at_level(logging.ERROR, logger=adapter.__name__):
        got = check_splits(_make(cls), "Hi <ca BOOM and the rest")
    assert got.content == "Hi <ca BOOM and the rest" and got.calls == []
    failures = [r for r in caplog.records if "pipe_calls" in r.getMessage()]
    assert "RuntimeError: the plugin broke" in failures[0].getMessage() and failures[0].exc_info
    assert all(r.exc_info is None for r in failures[1:])  # the traceback once per parser


def test_after_a_call_started_a_failure_leaves_it_open_and_the_unary_answer_is_the_text():
    plan = OutputPlan(tool_parser=_adapter(), tools=TOOLS, tokenizer=TOKENIZER)
    text = '<call>get_weather|{"city": "BOOM"}</call> tail'
    unary = plan.new()
    unary.push(text)
    unary.finish()
    assert unary.message()[0] == text and unary.message()[2] == []
    streamed = plan.new()
    deltas = [streamed.push(piece) for piece in text]
    deltas.append(streamed.finish())
    calls = [c for d in deltas if d for c in d.tool_calls]
    assert calls[0].name == "get_weather" and "".join(c.arguments for c in calls) == '{"city": "BOO'
    assert "".join(d.content for d in deltas if d) == 'M"}</call> tail'  # from the failing piece on


@pytest.mark.parametrize(
    "messages",
    [
        [SimpleNamespace(content=None, tool_calls=[_call(0, arguments="{}")])],  # arguments before a name
        [
            SimpleNamespace(content=None, tool_calls=[_call(1, name="f")]),
            SimpleNamespace(content=None, tool_calls=[_call(0, name="g")]),  # back to an earlier call
        ],
    ],
)
def test_deltas_dyn_cannot_express_stop_the_parser(messages):
    class Scripted:
        def __init__(self, tokenizer, tools=None):
            self.replies = iter(messages)

        def extract_tool_calls_streaming(self, *args):
            return next(self.replies, None)

    parser = _adapter(Scripted)(TOOLS, tokenizer=TOKENIZER)
    events = parser.feed("ab") + parser.feed("cd") + parser.finish()
    assert "".join(e for e in events if isinstance(e, str)).endswith("cd")


def test_a_plugin_that_cannot_be_built_passes_the_text_through(caplog):
    class Broken(PipeCalls):
        def __init__(self, tokenizer, tools=None):
            raise ValueError("no <call> token in the vocabulary")

    with caplog.at_level(logging.ERROR, logger=adapter.__name__):
        parser = _adapter(Broken)(TOOLS, tokenizer=TOKENIZER)
        assert parser.feed("<call>f|{}</call>") + parser.finish() == ["<call>f|{}</call>"]
    assert "building it: ValueError: no <call> token" in caplog.text


def test_a_plugin_taking_only_the_tokenizer_is_built_without_tools():
    class TokenizerOnly(PipeCalls):
        def __init__(self, tokenizer):
            super().__init__(tokenizer, ["tools"])

    assert not adapter._takes_tools(TokenizerOnly) and adapter._takes_tools(PipeCalls)
    parser = _adapter(TokenizerOnly, takes_tools=False)(TOOLS, tokenizer=TOKENIZER)
    assert parser.feed("<call>f|{}</call>")[0] == adapter.ToolCallStart("f", "call-0")


def test_the_mocker_cannot_write_a_plugins_format():
    with pytest.raises(NotImplementedError, match="is a vLLM plugin"):
        _adapter().render([ToolCall("f", "{}")])


def test_the_output_plan_hands_the_served_tokenizer_to_a_parser_that_takes_it():
    class Takes(ToolParser):
        takes_tokenizer = True

        def __init__(self, tools=(), tokenizer=None):
            super().__init__(tools)
            self.tokenizer = tokenizer

        def feed(self, text):
            return [text]

    output = OutputPlan(tool_parser=Takes, tools=TOOLS, tokenizer=TOKENIZER).new()
    assert output._tools.tokenizer is TOKENIZER


# --- without vLLM ------------------------------------------------------------------------------

SEED_004_EXAMPLE = """\
# import the required packages
from collections.abc import Sequence
from typing import Union

from vllm.entrypoints.generate.base.protocol import DeltaMessage, ExtractedToolCallInformation
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.tokenizers import TokenizerLike as AnyTokenizer
from vllm.tool_parsers import ToolParser, ToolParserManager

# define a tool parser and register it to vllm
# the name list in register_module can be used
# in --tool-call-parser. you can define as many
# tool parsers as you want here.
@ToolParserManager.register_module(["example"])
class ExampleToolParser(ToolParser):
    def __init__(self, tokenizer: AnyTokenizer):
        super().__init__(tokenizer)

    # adjust request. e.g.: set skip special tokens
    # to False for tool call output.
    def adjust_request(
            self, request: ChatCompletionRequest) -> ChatCompletionRequest:
        return request

    # implement the tool call parse for stream call
    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: ChatCompletionRequest,
    ) -> Union[DeltaMessage, None]:
        return delta

    # implement the tool parse for non-stream call
    def extract_tool_calls(
        self,
        model_output: str,
        request: ChatCompletionRequest,
    ) -> ExtractedToolCallInformation:
        return ExtractedToolCallInformation(tools_called=False,
                                            tool_calls=[],
                                            content=text)
"""
"""Seed 004's plugin example (vLLM's docs, "How to write a tool parser plugin") with its
indentation restored and its "# import the required packages" done for vLLM 0.32 (which names
the tokenizer type ``TokenizerLike``); otherwise as printed, ``delta`` and ``text`` undefined."""


def test_without_vllm_the_seed_example_is_refused_naming_dyns_plugin_api(tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed in this environment")
    plugin = tmp_path / "example_tool_parser.py"
    plugin.write_text(SEED_004_EXAMPLE)
    with pytest.raises(ValueError) as refused:
        load_plugin(plugin)
    message = str(refused.value)
    assert "is written for vLLM" in message and "not installed in the frontend's environment" in message
    assert "dyn.core.parsers.tool.ToolParser subclass" in message and "@TOOL_PARSERS.register" in message
