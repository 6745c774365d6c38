"""--tool-call-rate: requests that offer tools get, with probability P drawn from their seed, one
call to one of them with schema-valid arguments, written in the worker's tool-call format so the
frontend's parser of that name reads it back. The formats are the parsers' own (``render``; each
parser module cites the model family and document that shows its format)."""

import json

import anyio
import pytest

from dyn.core.config import DiscoveryConfig
from dyn.core.engine import FEATURE_TOOL_HINTS, EngineError
from dyn.core.errors import ConfigError
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.messages import GenerateRequest, OutputConstraint, SamplingParams, StopConditions, ToolSpec
from dyn.core.model import load_model_info
from dyn.core.parsers.events import ToolCallArgs, ToolCallStart
from dyn.core.parsers.tool import TOOL_PARSERS, Tool
from dyn.core.worker.settings import WorkerSettings
from dyn.plugins.mocker import build_hosts
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.engine import MockerEngine

MODEL = load_model_info(None, None)
TOKENIZER = Tokenizer.from_model(MODEL)
PROMPT = TOKENIZER.encode("<|start_header_id|>user<|end_header_id|>\n\nPlan my trip.<|eot_id|>", False)
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "minLength": 1}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
BOOK = {
    "type": "object",
    "properties": {
        "nights": {"type": "integer", "minimum": 1, "maximum": 14},
        "guests": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    },
    "required": ["nights", "guests"],
}
TOOLS = [ToolSpec("get_weather", json.dumps(WEATHER)), ToolSpec("book_hotel", json.dumps(BOOK))]
SCHEMAS = {"get_weather": WEATHER, "book_hotel": BOOK}


def engine(rate, parser="hermes", **overrides):
    config = MockerConfig(
        block_size=16, num_gpu_blocks=512, speedup_ratio=1000, tool_call_rate=rate, **overrides
    )
    return MockerEngine(config, MODEL, tool_call_parser=parser)


def request(rid, seed, tools=TOOLS, **kwargs):
    return GenerateRequest(
        rid, PROMPT, SamplingParams(seed=seed), StopConditions(max_tokens=300), tools=tools, **kwargs
    )


async def run(eng, *requests):
    outputs = []
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(eng.run)
            for req in requests:
                out = [m async for m in eng.generate(req)]
                outputs.append(([t for m in out[:-1] for t in m.token_ids], out[-1]))
            tg.cancel_scope.cancel()
    return outputs


def parse_calls(parser_name, text):
    """(name, arguments) of every call the frontend's parser reads in ``text``."""
    parser = TOOL_PARSERS.get(parser_name)([Tool(t.name, json.loads(t.parameters)) for t in TOOLS])
    calls = []
    for event in parser.feed(text) + parser.finish():
        if isinstance(event, ToolCallStart):
            calls.append([event.name, ""])
        elif isinstance(event, ToolCallArgs):
            calls[-1][1] += event.text
    return [(name, json.loads(args)) for name, args in calls]


@pytest.mark.anyio
async def test_rate_one_always_calls_a_tool_with_valid_arguments(check_schema):
    outputs = await run(engine(1.0), *[request(f"r{s}", s) for s in range(8)])
    names = set()
    for tokens, finish in outputs:
        calls = parse_calls("hermes", TOKENIZER.decode(tokens, skip_special_tokens=False))
        assert len(calls) == 1, TOKENIZER.decode(tokens)
        name, args = calls[0]
        check_schema(args, SCHEMAS[name])
        names.add(name)
        assert (finish.reason, finish.stop_token_id) == ("stop", MODEL.eos_token_ids[0])
    assert names == {"get_weather", "book_hotel"}


@pytest.mark.anyio
async def test_the_decision_and_the_call_are_drawn_from_the_seed():
    eng = engine(0.5)
    first = await run(eng, *[request(f"a{s}", s) for s in range(24)])
    second = await run(eng, *[request(f"b{s}", s) for s in range(24)])
    assert [t for t, _ in first] == [t for t, _ in second]
    called = sum(bool(parse_calls("hermes", TOKENIZER.decode(t))) for t, _ in first)
    assert 4 <= called <= 20  # about half


@pytest.mark.anyio
async def test_no_call_without_tools_under_a_constraint_or_at_rate_zero():
    constraint = OutputConstraint("choice", choices=("yes", "no"))
    outputs = await run(engine(1.0), request("none", 1, tools=[]), request("c", 1, constraint=constraint))
    assert not parse_calls("hermes", TOKENIZER.decode(outputs[0][0]))
    assert TOKENIZER.decode(outputs[1][0]) in ("yes", "no")
    [(tokens, _)] = await run(engine(0.0), request("zero", 1))
    assert not parse_calls("hermes", TOKENIZER.decode(tokens))


@pytest.mark.anyio
async def test_replies_win_over_the_rate(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"match": "Plan my trip", "text": "Where to?"}) + "\n")
    [(tokens, _)] = await run(engine(1.0, replies=str(path)), request("r", 1))
    assert TOKENIZER.decode(tokens) == "Where to?"


@pytest.mark.anyio
async def test_a_tool_schema_the_engine_refuses_is_a_bad_request():
    bad = [ToolSpec("broken", json.dumps({"type": "object", "properties": {"x": {"type": "strin"}}}))]
    with pytest.raises(EngineError) as exc:
        async for _ in engine(1.0).generate(request("x", 1, tools=bad)):
            pass
    assert exc.value.code == "bad_request" and "broken" in str(exc.value)


def test_tool_hints_are_advertised_only_with_a_rate():
    assert FEATURE_TOOL_HINTS in engine(0.3).info.features
    assert FEATURE_TOOL_HINTS not in engine(0.0).info.features


def test_a_rate_needs_a_parser_that_can_write_calls(tmp_path):
    with pytest.raises(ValueError, match="--dyn-tool-call-parser"):
        engine(0.5, parser=None)
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        engine(0.5, parser="no_such_format")
    settings = WorkerSettings(discovery=DiscoveryConfig(dir=str(tmp_path)), tool_call_parser=None)
    with pytest.raises(ConfigError, match="--dyn-tool-call-parser"):
        build_hosts(
            MockerConfig(tool_call_rate=0.5), settings, model_path=None, model_name=None, num_workers=1
        )
    with pytest.raises(ValueError, match="between 0 and 1"):
        MockerConfig(tool_call_rate=1.5).validate()


def _formats():
    seen, names = set(), []
    for name in TOOL_PARSERS.names():
        cls = TOOL_PARSERS.get(name)
        if cls not in seen:
            seen.add(cls)
            names.append(name)
    return names


@pytest.mark.anyio
@pytest.mark.parametrize("parser", _formats())
async def test_calls_read_back_in_every_format(parser, check_schema):
    cls = TOOL_PARSERS.get(parser)
    try:
        cls.render([])
    except NotImplementedError:
        pytest.skip(f"the {parser} parser cannot write calls")
    outputs = await run(engine(1.0, parser=parser), *[request(f"r{s}", s) for s in range(6)])
    for tokens, _ in outputs:
        [(name, args)] = parse_calls(parser, TOKENIZER.decode(tokens, skip_special_tokens=False))
        check_schema(args, SCHEMAS[name])
