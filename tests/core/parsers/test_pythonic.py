"""The pythonic parser on outputs of Llama 3.2 / 3.3 and Llama 4 models (format: meta-llama/llama-models
models/llama3_3/prompt_format.md "Zero shot function calling"; vLLM's pythonic_tool_parser.py and
llama4_pythonic_tool_parser.py)."""

from __future__ import annotations

import json

from dyn.core.parsers.events import ToolCallArgs
from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.pythonic import ArgumentScanner

Pythonic = TOOL_PARSERS.get("pythonic")

# Llama 3.3 70B Instruct answering "What is the weather in SF and Seattle?" (prompt_format.md;
# its <|eot_id|> is the stop token and never reaches the parser)
LLAMA33_TWO_CALLS = (
    "[get_weather(city='San Francisco', metric='celsius'), get_weather(city='Seattle', metric='celsius')]"
)
# Llama 3.3 with the tools in the user message (prompt_format.md)
LLAMA33_USER_TOOLS = "[get_user_info(user_id=7890, special='black')]"
# Llama 4 wraps the list in <|python_start|> ... <|python_end|> (vLLM's
# tests/tool_parsers/test_llama4_pythonic_tool_parser.py, PYTHON_TAG_FUNCTION_OUTPUT)
LLAMA4_WRAPPED = "<|python_start|>[get_weather(city='LA', metric='C')]<|python_end|>"
# Llama 4 with text around the call (SGLang's test_function_call_parser.py, pythonic detector)
LLAMA4_TEXT_AROUND = (
    "User wants to get the weather in Mars. <|python_start|>[get_weather(location='Mars', "
    "unit='celsius')]<|python_end|> In this way we will get the weather in Mars."
)


def test_parallel_calls_stream_one_argument_at_a_time(check_splits):
    got = check_splits(Pythonic, LLAMA33_TWO_CALLS)
    assert got.content == ""
    assert got.named_args == [
        ("get_weather", {"city": "San Francisco", "metric": "celsius"}),
        ("get_weather", {"city": "Seattle", "metric": "celsius"}),
    ]
    assert got.calls[0].arguments == '{"city": "San Francisco", "metric": "celsius"}'
    assert all(c.complete for c in got.calls)
    parser = Pythonic()
    events = parser.feed("[get_weather(city='San Francisco', metric='cel")
    pieces = [e.text for e in events if isinstance(e, ToolCallArgs)]
    assert pieces == ['{"city": "San Francisco"']


def test_integer_argument_and_llama4_wrapper(check_splits):
    got = check_splits(Pythonic, LLAMA33_USER_TOOLS)
    assert got.named_args == [("get_user_info", {"user_id": 7890, "special": "black"})]
    got = check_splits(Pythonic, LLAMA4_WRAPPED)
    assert got.named_args == [("get_weather", {"city": "LA", "metric": "C"})] and got.content == ""


def test_literal_values(check_splits):
    text = (
        '[f(a=[1, -2.5, None], b={\'k\': (True, False)}, c="""tri\'ple "q" ), ]""", d=\'\', e="a\\"b,)"),'
        " g()]"
    )
    got = check_splits(Pythonic, text)
    assert got.named_args == [
        (
            "f",
            {
                "a": [1, -2.5, None],
                "b": {"k": [True, False]},
                "c": 'tri\'ple "q" ), ]',
                "d": "",
                "e": 'a"b,)',
            },
        ),
        ("g", {}),
    ]


def test_arguments_that_are_no_literals_are_left_out(check_splits):
    # never evaluated: names, calls, operators and positional arguments are dropped
    got = check_splits(Pythonic, "[f(a=__import__('os').system('x'), b=1 + 2, c=x, 5, d=1, **kw)]")
    assert got.named_args == [("f", {"d": 1})]


def test_content_before_and_after(check_splits):
    got = check_splits(Pythonic, LLAMA4_TEXT_AROUND)
    assert got.content == (
        "User wants to get the weather in Mars. In this way we will get the weather in Mars."
    )
    assert got.named_args == [("get_weather", {"location": "Mars", "unit": "celsius"})]
    # without the wrapper, a list opens where it opens like a call
    got = check_splits(Pythonic, "Let me check [see docs](x). [get_weather(city='Paris')] Done.")
    assert got.content == "Let me check [see docs](x). Done."
    assert got.named_args == [("get_weather", {"city": "Paris"})]


def test_plain_text_is_content(check_splits):
    text = "Results [1] and [2] are in a list [a, b] or [x](y); print(x) is code."
    got = check_splits(Pythonic, text)
    assert got.calls == [] and got.content == text


def test_unreadable_body_is_content(check_splits):
    for text in ("<|python_start|>not python<|python_end|>", "<|python_start|>[1, 2]<|python_end|>"):
        got = check_splits(Pythonic, text)
        assert got.calls == [] and got.content == text


def test_cut_off_call(parse):
    got = parse(Pythonic, ["[get_weather(city='San Francisco', metric='cel"])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_weather", '{"city": "San Francisco"', False)
    ]
    got = parse(Pythonic, ["[get_weather(city='SF'), get_time(tz='PST'"])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_weather", '{"city": "SF"}', True),
        ("get_time", "", False),
    ]
    for text in ("[get_wea", "<|python_start|>[get_weather"):
        got = parse(Pythonic, [text])
        assert got.calls == [] and got.content == text


def test_argument_scanner_waits_for_quotes():
    scanner = ArgumentScanner(0)
    assert scanner.next_stop("a=''", final=False) == -1  # '' or the start of '''
    assert scanner.next_stop("a=''')", final=False) == -1  # inside a triple-quoted string
    assert scanner.next_stop("a=''')''', b", final=False) == 9


def test_render_reads_back(check_splits):
    args = {"city": "Paris", "days": 3, "exact": True, "tags": ["a", None], "where": {"lat": 1.5}}
    calls = [ToolCall("get_weather", json.dumps(args)), ToolCall("noop", "{}")]
    text = Pythonic.render(calls)
    assert text == (
        "[get_weather(city='Paris', days=3, exact=True, tags=['a', None], where={'lat': 1.5}), noop()]"
    )
    got = check_splits(Pythonic, text)
    assert got.named_args == [("get_weather", args), ("noop", {})] and got.content == ""
