"""dyn.core.frontend.chat_template: renders what transformers' apply_chat_template(tokenize=False)
renders for the messages vLLM hands it, and turns every template or message problem into
ChatTemplateError."""

from __future__ import annotations

import copy
import json
from datetime import datetime
from typing import Any

import pytest

from dyn.core.frontend.chat_template import ChatTemplate, ChatTemplateError, compile_template, conversation
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.model.info import TINY_MODEL_DIR

# A tool-calling template in the style of Llama 3.1 / Qwen: tools, documents, tool calls with
# object arguments, reasoning, a chat_template_kwargs switch, tojson with options, namespace,
# loop controls and transformers' {% generation %} tag.
RICH = """{{ bos_token }}{% set ns = namespace(n=0) %}
{% if tools %}# Tools
{% for t in tools %}{{ t | tojson }}
{% endfor %}{% endif %}
{% if documents %}{% for d in documents %}[{{ d.title }}] {{ d.text }}
{% endfor %}{% endif %}
{% for m in messages %}{% set ns.n = ns.n + 1 %}
<|{{ m.role }}|>{% if m.name is defined %}({{ m.name }}){% endif %}
{% if m.reasoning_content is defined %}<think>{{ m.reasoning_content }}</think>{% endif %}
{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}
{% for c in m.tool_calls | default([]) %}{% if loop.index > 2 %}{% break %}{% endif %}
<call>{{ c.function.name }} {{ c.function.arguments | tojson(indent=2, sort_keys=true) }}</call>
{% endfor %}
{% if m.tool_call_id is defined %} for {{ m.tool_call_id }}{% endif %}{{ eos_token }}
{% endfor %}
{% if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}
[{{ ns.n }} messages]"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city — «été»",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "hi"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3?"},
    ],
    [{"role": "user", "content": "数据 🎉 naïve\n\n  spaced  "}, {"role": "assistant", "content": "ok"}],
    [{"role": "user", "content": "{{ not evaluated }} {% if x %}<|eot_id|>"}],
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_dir(TINY_MODEL_DIR)


@pytest.fixture(scope="module")
def hf():
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(TINY_MODEL_DIR)


def _ours(tok: Tokenizer, messages: list[dict[str, Any]], source: str | None = None, **kw: Any) -> str:
    return compile_template(source or tok.chat_template).render(
        messages, special_tokens=tok.special_tokens_map, **kw
    )


def _theirs(
    hf,
    messages: list[dict[str, Any]],
    source: str | None = None,
    *,
    extra_kwargs: dict | None = None,
    **kw: Any,
) -> str:
    return hf.apply_chat_template(
        messages, tokenize=False, chat_template=source, **kw, **(extra_kwargs or {})
    )


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("source", [None, RICH], ids=["tiny", "rich"])
def test_matches_transformers(tok: Tokenizer, hf, source: str | None, add_generation_prompt: bool) -> None:
    for messages in CONVERSATIONS:
        assert _ours(tok, messages, source, add_generation_prompt=add_generation_prompt) == _theirs(
            hf, messages, source, add_generation_prompt=add_generation_prompt
        )


def test_bos_and_eos_arguments(tok: Tokenizer) -> None:
    text = compile_template(tok.chat_template).render(CONVERSATIONS[0], bos_token="<B>", eos_token="<E>")
    assert (
        text
        == "<B><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert (
        compile_template("[{{ bos_token }}|{{ pad_token }}]").render(
            CONVERSATIONS[0], bos_token="<B>", special_tokens={"bos_token": "x", "pad_token": "<P>"}
        )
        == "[<B>|<P>]"
    )


@pytest.mark.parametrize("source", [None, RICH], ids=["tiny", "rich"])
def test_continue_final_message(tok: Tokenizer, hf, source: str | None) -> None:
    cases = [
        [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}],
        [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi there "}],
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": "x"}],  # content seen earlier too
        [{"role": "user", "content": "the last message is not the assistant's"}],
    ]
    for messages in cases:
        ours = _ours(tok, messages, source, add_generation_prompt=False, continue_final_message=True)
        assert ours == _theirs(hf, messages, source, continue_final_message=True)
        assert ours.rstrip().endswith(messages[-1]["content"].rstrip())
    assert _ours(tok, cases[0])[-1] == "\n"  # without it the message is closed and a new one begins


def test_continue_final_message_with_generation_prompt_is_an_error(tok: Tokenizer) -> None:
    with pytest.raises(ChatTemplateError, match="add_generation_prompt"):
        _ours(tok, CONVERSATIONS[2], add_generation_prompt=True, continue_final_message=True)
    with pytest.raises(ChatTemplateError, match="add_generation_prompt"):
        _ours(
            tok,
            CONVERSATIONS[2],
            add_generation_prompt=False,
            extra_kwargs={"continue_final_message": True, "add_generation_prompt": True},
        )


def test_list_content_parts_are_joined_with_newlines(tok: Tokenizer, hf) -> None:
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "first"},
                "plain string part",
                {"type": "text", "text": ""},
                {"type": "text", "text": None},
                {"type": "input_text", "text": "second"},
            ],
        },
        {"role": "assistant", "content": None},
        {"role": "user", "content": [{"type": "refusal", "refusal": "r"}]},
    ]
    as_strings = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first\nplain string part\nsecond"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "r"},
    ]
    for source in (None, RICH):
        assert _ours(tok, messages, source) == _theirs(hf, as_strings, source, add_generation_prompt=True)


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"image_url": {"url": "http://x/y.png"}},
    ],
)
def test_non_text_parts_are_refused(tok: Tokenizer, part: dict[str, Any]) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}]
    with pytest.raises(ChatTemplateError, match="takes no (image|audio) input|is not supported"):
        _ours(tok, messages)


def test_tools_documents_and_tool_calls(tok: Tokenizer, hf) -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "use the tool",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "°C"}'},
                },
                {"id": "c2", "type": "function", "function": {"name": "noop", "arguments": ""}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "21 °C", "name": "get_weather"},
    ]
    # what vLLM hands transformers: arguments as objects, "" as {}, content None as ""
    for_hf = copy.deepcopy(messages)
    for_hf[1]["content"] = ""
    for_hf[1]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris", "unit": "°C"}
    for_hf[1]["tool_calls"][1]["function"]["arguments"] = {}
    documents = [{"title": "Doc", "text": "Paris is in France."}]
    before = copy.deepcopy(messages)
    ours = _ours(tok, messages, RICH, tools=TOOLS, documents=documents)
    assert ours == _theirs(hf, for_hf, RICH, tools=TOOLS, documents=documents, add_generation_prompt=True)
    assert messages == before
    assert '"unit": "°C"' in ours and "«été»" in ours and "<think>use the tool</think>" in ours


def test_bad_tool_call_arguments(tok: Tokenizer) -> None:
    messages = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}],
        }
    ]
    with pytest.raises(ChatTemplateError, match=r"tool_calls\[0\].function.arguments is not valid JSON"):
        _ours(tok, messages, RICH)


def test_chat_template_kwargs(tok: Tokenizer, hf) -> None:
    messages = CONVERSATIONS[0]
    for extra in (
        {"enable_thinking": False},
        {"enable_thinking": True},
        {"add_generation_prompt": False},
        {"eos_token": "<END>", "unused": [1, 2]},
    ):
        # vLLM: chat_template_kwargs are merged over the request's own arguments
        assert _ours(tok, messages, RICH, add_generation_prompt=True, extra_kwargs=extra) == _theirs(
            hf, messages, RICH, extra_kwargs={"add_generation_prompt": True, **extra}
        )
    with pytest.raises(ChatTemplateError, match="cannot set 'messages'"):
        _ours(tok, messages, RICH, extra_kwargs={"messages": []})


def test_tojson_is_transformers_variant(tok: Tokenizer, hf) -> None:
    source = (
        "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ x | tojson(separators=(',', ':'), sort_keys=true) }}"
        "|{{ x | tojson(ensure_ascii=true) }}"
    )
    x = {"b": "é <tag> & 'q'", "a": [1, None, True]}
    ours = _ours(tok, CONVERSATIONS[0], source, extra_kwargs={"x": x})
    assert ours == _theirs(hf, CONVERSATIONS[0], source, extra_kwargs={"x": x})
    assert ours.split("|")[0] == json.dumps(x, ensure_ascii=False)


def test_template_errors_become_chat_template_errors(tok: Tokenizer) -> None:
    raising = "{% if messages[0].role != 'system' %}{{ raise_exception('Conversation must start with system') }}{% endif %}"
    with pytest.raises(ChatTemplateError, match="^Conversation must start with system$"):
        compile_template(raising).render(CONVERSATIONS[0])
    with pytest.raises(ChatTemplateError, match="undefined"):
        compile_template("{{ nothing.here }}").render(CONVERSATIONS[0])
    with pytest.raises(ChatTemplateError, match="line 1"):
        compile_template("{% for m in messages %}no end")
    with pytest.raises(ChatTemplateError):
        compile_template("{{ ''.__class__.__mro__ }}").render(CONVERSATIONS[0])  # the sandbox holds
    with pytest.raises(ChatTemplateError, match="underscore"):
        compile_template("{% set ns = namespace(_x=1) %}").render(CONVERSATIONS[0])
    with pytest.raises(ChatTemplateError, match="empty conversation"):
        _ours(tok, [])
    with pytest.raises(ChatTemplateError, match=r"messages\[0\].role"):
        _ours(tok, [{"content": "no role"}])


def test_globals(tok: Tokenizer) -> None:
    source = "{{ strftime_now('%Y') }} {{ dict(a=1) | tojson }} {% for i in [1, 2, 3] %}{% if i == 2 %}{% continue %}{% endif %}{{ i }}{% endfor %}"
    assert _ours(tok, CONVERSATIONS[0], source) == f'{datetime.now().strftime("%Y")} {{"a": 1}} 13'


def test_compiled_once_per_source() -> None:
    source = "{{ messages | length }} unique-to-this-test"
    first = compile_template(source)
    hits = compile_template.cache_info().hits
    assert compile_template(source) is first
    assert compile_template.cache_info().hits == hits + 1
    assert compile_template.cache_info().maxsize == 32
    assert isinstance(first, ChatTemplate) and first.source == source
    assert first.render([{"role": "user", "content": "a"}] * 3) == "3 unique-to-this-test"


def test_claude_codes_billing_line_is_dropped_from_system_messages_only():
    """vLLM's rule (``_strip_claude_code_billing_header``): the line changes every request, so a
    gateway's chat request that keeps it would miss the prefix cache from its first tokens."""
    header = "x-anthropic-billing-header: cc_version=2.1.332.f00; cc_entrypoint=cli; cch=7a1b2;"
    messages = [
        {"role": "system", "content": f"{header}\nYou are Claude Code."},
        {
            "role": "system",
            "content": [{"type": "text", "text": header}, {"type": "text", "text": "Be brief."}],
        },
        {"role": "system", "content": header},
        {"role": "user", "content": f"{header}\nkept"},
    ]
    chat = conversation(messages)
    assert [m["content"] for m in chat] == ["You are Claude Code.", "Be brief.", "", f"{header}\nkept"]
    assert messages[1]["content"][0]["text"] == header  # the request is not changed


@pytest.mark.anyio
async def test_two_gateway_requests_differing_in_the_billing_line_give_the_same_prompt(make_frontend):
    from tests.core.frontend.fake_workers import reply

    async with make_frontend(workers=1, script=reply("ok")) as fe:
        for cch in ("7a1b2", "9c3d4"):
            system = f"x-anthropic-billing-header: cc_version=2.1.332.f00; cch={cch};\nYou are Claude Code."
            body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}]}
            r = await fe.client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
        first, second = fe.fleet.requests
    assert first.token_ids == second.token_ids


PARTS_ONLY = (
    "{% for m in messages %}{{ m.role }}:{% for c in m['content'] %}"
    "{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}|{% endfor %}"
)
"""A template that reads content only as a list of parts (SmolVLM's and Idefics3's do)."""


def test_the_content_format_is_the_templates_own_unless_set():
    """vLLM's ``--chat-template-content-format``: ``auto`` gives a template that loops over the
    content a list of parts for every message, text-only ones too; ``string`` and ``openai``
    force one format whatever the template reads."""
    template = compile_template(PARTS_ONLY)
    chat = [{"role": "system", "content": None}, {"role": "user", "content": "hi"}]
    assert template.render(chat, add_generation_prompt=False) == "system:|user:hi|"
    assert template.render(chat, add_generation_prompt=False, content_format="string") == "system:|user:|"
    plain = compile_template("{% for m in messages %}{{ m.content }};{% endfor %}")
    assert plain.render(chat[1:], add_generation_prompt=False) == "hi;"
    forced = plain.render(chat[1:], add_generation_prompt=False, content_format="openai")
    assert forced == "[{'type': 'text', 'text': 'hi'}];"
    assert conversation([{"role": "user", "content": [{"type": "text", "text": "a"}, "b"]}], parts=True) == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]


def test_continue_final_message_continues_the_last_text_part():
    template = compile_template(PARTS_ONLY)
    chat = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "It is"}]
    rendered = template.render(chat, add_generation_prompt=False, continue_final_message=True)
    assert rendered == "user:2+2?|assistant:It is"


@pytest.mark.anyio
async def test_the_frontend_takes_the_content_format_flag(make_frontend):
    from tests.core.frontend.fake_workers import reply, tokenizer

    plain = "{% for m in messages %}{{ m.content }};{% endfor %}"
    async with make_frontend(
        workers=1, script=reply("ok"), chat_template=plain, chat_template_content_format="openai"
    ) as fe:
        r = await fe.client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
        )
        assert r.status_code == 200, r.text
        prompt = tokenizer().decode(fe.fleet.requests[0].token_ids)
    assert "'type': 'text'" in prompt and "'text': 'hi'" in prompt


@pytest.mark.anyio
async def test_tool_choice_none_renders_no_tools_under_the_vllm_flag(make_frontend):
    """vLLM's ``--exclude-tools-when-tool-choice-none``: off, the tools are rendered whatever the
    choice (vLLM's default); on, ``tool_choice: "none"`` leaves them out of the prompt."""
    from tests.core.frontend.fake_workers import reply, tokenizer

    template = "{% if tools %}TOOLS {% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    prompts = {}
    for exclude in (False, True):
        async with make_frontend(
            workers=1,
            script=reply("ok"),
            chat_template=template,
            exclude_tools_when_tool_choice_none=exclude,
            tool_call_parser="hermes",
            enable_auto_tool_choice=True,
        ) as fe:
            for choice in ("none", "auto"):
                body = {
                    "messages": [{"role": "user", "content": "hi"}],
                    "tools": tools,
                    "tool_choice": choice,
                }
                r = await fe.client.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                prompts[exclude, choice] = tokenizer().decode(fe.fleet.requests[-1].token_ids)
    assert "TOOLS" in prompts[False, "none"] and "TOOLS" in prompts[True, "auto"]
    assert "TOOLS" not in prompts[True, "none"]
