"""--replies: the replies file, finding the conversation's last message in a rendered prompt, and
scripted answers streamed by the engine (a whole tool loop)."""

import json

import anyio
import pytest

from dyn.core.frontend.chat_template import compile_template
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.messages import GenerateRequest, OutputConstraint, SamplingParams, StopConditions
from dyn.core.model import load_model_info
from dyn.core.parsers.tool import TOOL_PARSERS
from dyn.plugins.mocker import replies as replies_module
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.conversation import MAX_SKIPPED, LastMessage
from dyn.plugins.mocker.engine import MockerEngine
from dyn.plugins.mocker.replies import Replies

MODEL = load_model_info(None, None)
TOKENIZER = Tokenizer.from_model(MODEL)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
# Hermes tool-call format as Qwen2.5-7B-Instruct writes it (its tokenizer_config.json chat template;
# NousResearch Hermes-2-Pro function-calling format): JSON between <tool_call> tags
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def write(tmp_path, *lines):
    path = tmp_path / "replies.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ------------------------------------------------------------------ the file


def test_first_matching_entry_wins(tmp_path):
    replies = Replies.load(
        write(
            tmp_path,
            json.dumps({"match": "weather", "text": "A"}),
            "",
            json.dumps({"match": "(?i)paris", "text": "B"}),
        )
    )
    assert replies.answer("weather in Paris") == "A"
    assert replies.answer("PARIS") == "B"
    assert replies.answer("nothing") is None


@pytest.mark.parametrize(
    "lines,message",
    [
        (['{"match": "a", "text": "x"}', "{not json"], "line 2: expected"),
        (['{"match": "(", "text": "x"}'], "line 1: bad regex"),
        (['{"match": "a"}'], "line 1: expected"),
        (['{"match": "a", "text": "x", "extra": 1}'], "line 1: expected"),
        (['["a", "x"]'], "line 1: expected"),
    ],
)
def test_bad_lines_are_named(tmp_path, lines, message):
    with pytest.raises(ValueError, match=message) as exc:
        Replies.load(write(tmp_path, *lines))
    assert str(exc.value).startswith(f"--replies {tmp_path / 'replies.jsonl'} line")
    assert "\n" not in str(exc.value)


def test_missing_or_oversized_files_and_too_many_entries_are_refused(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="no such file"):
        Replies.load(tmp_path / "absent.jsonl")
    with pytest.raises(ValueError, match="is a directory"):
        Replies.load(tmp_path)
    monkeypatch.setattr(replies_module, "MAX_REPLIES", 2)
    with pytest.raises(ValueError, match="line 3: more than 2 replies"):
        Replies.load(write(tmp_path, *[json.dumps({"match": "a", "text": "x"})] * 3))
    monkeypatch.setattr(replies_module, "MAX_FILE_BYTES", 10)
    with pytest.raises(ValueError, match="at most 10 are accepted"):
        Replies.load(write(tmp_path, json.dumps({"match": "a", "text": "x"})))


# ------------------------------------------------------------------ the last message


def render(template_source, messages, tokenizer=TOKENIZER, **kwargs):
    return compile_template(template_source).render(
        messages,
        add_generation_prompt=True,
        tools=TOOLS,
        bos_token=tokenizer.bos_token,
        eos_token=tokenizer.eos_token,
        **kwargs,
    )


LOOP = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What's the weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21C"},
]


def test_dyn_tiny_prompts_give_back_the_last_user_message_or_tool_result():
    last = LastMessage(TOKENIZER)
    for upto, expected in ((2, "What's the weather in Paris?"), (4, "sunny, 21C")):
        prompt = render(TOKENIZER.chat_template, LOOP[:upto])
        assert last.text(TOKENIZER.encode(prompt, add_special_tokens=False)) == expected
    follow_up = [
        *LOOP,
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "And tomorrow?\nThanks."},
    ]
    assert last.find(render(TOKENIZER.chat_template, follow_up)) == "And tomorrow?\nThanks."


# The Qwen2.5 / Hermes chat format (Qwen2.5-7B-Instruct's tokenizer_config.json renders the same text):
# <|im_start|>role\n...<|im_end|>\n; tool results as a user turn of <tool_response> blocks.
QWEN_STYLE = """\
{%- if messages[0].role != 'system' %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}
{%- for m in messages %}
    {%- if m.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- else %}
        {{- '<|im_start|>' + m.role + '\\n' + m.content }}
        {%- for c in m.tool_calls or [] %}
            {{- '\\n<tool_call>\\n{"name": "' + c.function.name + '", "arguments": ' }}
            {{- c.function.arguments | tojson }}{{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""


def qwen_tokenizer():
    return Tokenizer(TOKENIZER.backend, special_tokens_map={}, chat_templates={"default": QWEN_STYLE})


def test_qwen_style_prompts_give_back_the_last_message():
    tok = qwen_tokenizer()
    last = LastMessage(tok)
    assert last.generation_prompt == "<|im_start|>assistant\n"
    assert last.find(render(QWEN_STYLE, LOOP[1:2], tok)) == "What's the weather in Paris?"
    assert last.find(render(QWEN_STYLE, LOOP, tok)) == "sunny, 21C"
    two_results = [*LOOP, {"role": "tool", "tool_call_id": "c2", "content": "windy"}]
    assert "windy" in last.find(render(QWEN_STYLE, two_results, tok))
    assert "What's the weather" not in last.find(render(QWEN_STYLE, two_results, tok))


REMINDER = {"role": "system", "content": "<system-reminder>Plan mode is off. Keep going.</system-reminder>"}
DEVELOPER = {"role": "developer", "content": "Answer in English."}


@pytest.mark.parametrize("template", ["dyn-tiny", "qwen"])
def test_system_and_developer_messages_after_the_last_user_message_or_tool_result_are_skipped(template):
    """Agents (OpenCode, Claude Code, Codex) put a system message or a reminder after the user's
    message or the tool result: the scripted reply still answers that message."""
    tok = TOKENIZER if template == "dyn-tiny" else qwen_tokenizer()
    source = tok.chat_template
    last = LastMessage(tok)
    assert {f.role for f in last.frames} == {"user", "tool", "system", "developer"}
    assert last.find(render(source, [*LOOP[:2], REMINDER], tok)) == "What's the weather in Paris?"
    assert last.find(render(source, [*LOOP, REMINDER], tok)) == "sunny, 21C"
    assert last.find(render(source, [*LOOP, REMINDER, DEVELOPER, REMINDER], tok)) == "sunny, 21C"
    assert last.find(render(source, [*LOOP[:2], DEVELOPER], tok)) == "What's the weather in Paris?"


def test_the_skipping_is_bounded_and_a_conversation_of_system_messages_is_matched_whole():
    last = LastMessage(TOKENIZER)
    many = [*LOOP[:2], *[REMINDER] * MAX_SKIPPED]
    assert last.find(render(TOKENIZER.chat_template, many)) == "What's the weather in Paris?"
    too_many = [*LOOP[:2], *[REMINDER] * (MAX_SKIPPED + 1)]
    whole = render(TOKENIZER.chat_template, too_many)
    assert last.find(whole) == whole[: -len(last.generation_prompt)]
    only_system = render(TOKENIZER.chat_template, [{"role": "system", "content": "Be brief."}])
    assert last.find(only_system) == only_system[: -len(last.generation_prompt)]


def test_prompts_without_the_template_structure_are_matched_whole():
    last = LastMessage(TOKENIZER)
    assert last.find("Once upon a time") == "Once upon a time"
    no_template = Tokenizer(TOKENIZER.backend, chat_templates={})
    assert LastMessage(no_template).find("raw <|eot_id|> text") == "raw <|eot_id|> text"


# ------------------------------------------------------------------ the engine


async def run(engine, *requests):
    outputs = []
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(engine.run)
            for req in requests:
                out = [m async for m in engine.generate(req)]
                outputs.append(([t for m in out[:-1] for t in m.token_ids], out[-1]))
            tg.cancel_scope.cancel()
    return outputs


def chat_request(rid, messages, seed=0, **kwargs):
    prompt = TOKENIZER.encode(render(TOKENIZER.chat_template, messages), add_special_tokens=False)
    return GenerateRequest(rid, prompt, SamplingParams(seed=seed), StopConditions(max_tokens=200), **kwargs)


@pytest.mark.anyio
async def test_a_scripted_tool_loop(tmp_path):
    path = write(
        tmp_path,
        json.dumps({"match": r"^sunny", "text": "It is sunny in Paris."}),
        json.dumps({"match": "weather in (Paris|Rome)", "text": CALL}),
    )
    engine = MockerEngine(
        MockerConfig(block_size=16, num_gpu_blocks=256, speedup_ratio=1000, replies=str(path)), MODEL
    )
    (call, call_end), (answer, answer_end), (free, _) = await run(
        engine,
        chat_request("t1", LOOP[:2]),
        chat_request("t2", LOOP),
        chat_request("t3", [{"role": "user", "content": "unscripted"}], seed=5),
    )
    assert TOKENIZER.decode(call, skip_special_tokens=False) == CALL
    assert (call_end.reason, call_end.stop_token_id) == ("stop", MODEL.eos_token_ids[0])
    events = TOOL_PARSERS.get("hermes")().feed(TOKENIZER.decode(call))
    assert any(getattr(e, "name", None) == "get_weather" for e in events)
    assert TOKENIZER.decode(answer) == "It is sunny in Paris." and answer_end.reason == "stop"
    assert TOKENIZER.decode(free) not in ("It is sunny in Paris.", CALL)


@pytest.mark.anyio
async def test_a_scripted_tool_loop_with_system_reminders_after_each_turn(tmp_path):
    """The same loop as an agent sends it: a system reminder after the user message and after
    the tool result (whose words the regexes would otherwise find first)."""
    path = write(
        tmp_path,
        json.dumps({"match": "Plan mode", "text": "reminder matched"}),
        json.dumps({"match": r"^sunny", "text": "It is sunny in Paris."}),
        json.dumps({"match": "weather in (Paris|Rome)", "text": CALL}),
    )
    engine = MockerEngine(
        MockerConfig(block_size=16, num_gpu_blocks=256, speedup_ratio=1000, replies=str(path)), MODEL
    )
    (call, _), (answer, _) = await run(
        engine,
        chat_request("r1", [*LOOP[:2], REMINDER]),
        chat_request("r2", [*LOOP, REMINDER]),
    )
    assert TOKENIZER.decode(call, skip_special_tokens=False) == CALL
    assert TOKENIZER.decode(answer) == "It is sunny in Paris."


@pytest.mark.anyio
async def test_a_reply_under_a_constraint_is_used_only_when_it_satisfies_it(tmp_path):
    path = write(tmp_path, json.dumps({"match": "json please", "text": '{"ok": true}'}))
    engine = MockerEngine(
        MockerConfig(block_size=16, num_gpu_blocks=256, speedup_ratio=1000, replies=str(path)), MODEL
    )
    messages = [{"role": "user", "content": "json please"}]
    fits = OutputConstraint("json", json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}}))
    refuses = OutputConstraint(
        "json", json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    )
    (scripted, _), (sampled, end) = await run(
        engine, chat_request("a", messages, constraint=fits), chat_request("b", messages, constraint=refuses)
    )
    assert TOKENIZER.decode(scripted) == '{"ok": true}'
    assert isinstance(json.loads(TOKENIZER.decode(sampled))["n"], int) and end.reason == "stop"
