"""dyn.core.frontend.limits through the Preprocessor: every per-request bound is a 400 that names
the field and the flag that raises it, checked before any rendering or tokenizing."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest

from dyn.core.frontend.limits import MIN_PROMPT_BYTES, RequestLimits, json_size
from dyn.core.frontend.preprocessor import Preprocessor
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.model.info import load_model_info
from dyn.core.protocol.errors import ApiError
from dyn.core.protocol.openai import ChatCompletionRequest, CompletionRequest

HI = [{"role": "user", "content": "hi"}]
AT_ONCE = 0.25
"""Seconds within which a refusal counts as immediate: it takes microseconds, but a loaded test
machine can pause a process; tokenizing what these tests send would take seconds."""


class CountingTokenizer(Tokenizer):
    """dyn-tiny's tokenizer, counting the texts it is asked to encode."""

    encoded = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        CountingTokenizer.encoded += 1
        return super().encode(text, add_special_tokens)


@pytest.fixture(scope="module")
def info():
    return load_model_info(None, None)


def _pre(info, **limits: Any) -> Preprocessor:
    tok = CountingTokenizer.from_dir(info.path)
    return Preprocessor(info, tok, limits=RequestLimits(**limits))


def chat(**body: Any) -> ChatCompletionRequest:
    return msgspec.convert({"messages": HI, "max_tokens": 4, **body}, ChatCompletionRequest)


def completion(**body: Any) -> CompletionRequest:
    return msgspec.convert({"prompt": "hi", "max_tokens": 4, **body}, CompletionRequest)


def refused(call, *args: Any) -> ApiError:
    before = CountingTokenizer.encoded
    with pytest.raises(ApiError) as caught:
        call(*args)
    assert caught.value.status == 400
    assert CountingTokenizer.encoded == before, "tokenized before refusing"
    return caught.value


def test_defaults_accept_an_ordinary_request(info) -> None:
    pre = _pre(info)
    prompt = pre.chat(chat(stop=["</answer>", "\nUser:"], n=4))
    assert prompt.token_ids and prompt.stop_strings == ["</answer>", "\nUser:"]
    assert prompt.stop_matcher is not None and prompt.stop_matcher.stops == ("</answer>", "\nUser:")
    assert pre.prompt_bytes == max(32 * info.context_length, MIN_PROMPT_BYTES)
    assert len(pre.completions(completion(prompt=["a", "b"], n=3))) == 2


def test_n_and_fan_out(info) -> None:
    pre = _pre(info, max_n=8, max_prompts=20)
    err = refused(pre.chat, chat(n=9))
    assert err.param == "n" and "--max-n" in err.message and "8" in err.message
    pre.chat(chat(n=8))
    # 1000 prompts x n=128, the probe's request: refused at once, before reading a prompt
    big = _pre(info)
    request = completion(prompt=["hello"] * 1000, n=128)
    start = time.perf_counter()
    err = refused(big.completions, request)
    assert time.perf_counter() - start < AT_ONCE
    assert err.param == "prompt" and "--max-prompts" in err.message and "128000" in err.message
    err = refused(pre.completions, completion(prompt=["a"] * 3, n=7))
    assert err.param == "prompt" and "3 prompts x n=7" in err.message
    assert len(pre.completions(completion(prompt=["a"] * 4, n=5))) == 4
    err = refused(_pre(info, max_prompts=4).chat, chat(n=5))  # one prompt: n is what fans out
    assert err.param == "n" and "--max-prompts" in err.message


def test_stop_string_count_and_length(info) -> None:
    pre = _pre(info, max_stop_strings=3, max_stop_string_chars=10)
    err = refused(pre.chat, chat(stop=["a", "b", "c", "d"]))
    assert err.param == "stop" and "--max-stop-strings" in err.message
    err = refused(pre.completions, completion(stop=["ok", "x" * 11]))
    assert err.param == "stop[1]" and "--max-stop-string-chars" in err.message and "11" in err.message
    err = refused(pre.chat, chat(stop="y" * 11))
    assert err.param == "stop"
    assert pre.chat(chat(stop=["a", "b", "x" * 10])).stop_strings == ["a", "b", "x" * 10]


def test_a_megabyte_stop_string_is_refused_at_once(info) -> None:
    pre, request = _pre(info), chat(stop=["s" * (1 << 20)])
    start = time.perf_counter()
    err = refused(pre.chat, request)
    assert time.perf_counter() - start < AT_ONCE and "--max-stop-string-chars" in err.message


@pytest.mark.parametrize("where", ["content", "parts", "tools", "documents", "kwargs", "tool_call"])
def test_prompt_bytes_count_every_text_the_template_reads(info, where: str) -> None:
    pre = _pre(info, max_prompt_bytes=1000)
    text = "é" * 300  # 600 bytes in UTF-8: twice that is over 1000 bytes, once is under
    bodies = {
        "content": {"messages": [{"role": "user", "content": text}, {"role": "user", "content": text}]},
        "parts": {"messages": [{"role": "user", "content": [{"type": "text", "text": text}] * 2}]},
        "tools": {"tools": [{"type": "function", "function": {"name": "f", "description": text}}] * 2},
        "documents": {"documents": [{"title": "t", "text": text}] * 2},
        "kwargs": {"chat_template_kwargs": {"a": text, "b": text}},
        "tool_call": {
            "messages": [
                *HI,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "1", "type": "function", "function": {"name": "f", "arguments": text}}
                    ]
                    * 2,
                },
            ]
        },
    }
    err = refused(pre.chat_work_bytes, chat(**bodies[where]))
    assert err.param == "messages" and "--max-prompt-bytes" in err.message and "1000 bytes" in err.message


def test_completion_prompt_bytes_and_token_counts(info) -> None:
    pre = _pre(info, max_prompt_bytes=100)
    err = refused(pre.completions, completion(prompt=["x" * 60, "y" * 60]))
    assert err.param == "prompt" and "--max-prompt-bytes" in err.message
    assert len(pre.completions(completion(prompt=["x" * 40, "y" * 40]))) == 2
    # token ids are bounded by count: the context length, before they are scanned
    ctx = info.context_length
    err = refused(pre.completions, completion(prompt=[1] * (ctx + 1)))
    assert err.param == "prompt" and err.code == "context_length_exceeded"
    err = refused(pre.completions, completion(prompt=[[1, 2], [1] * (ctx + 1)]))
    assert err.param == "prompt"
    err = refused(pre.chat, chat(nvext={"token_data": [1] * (ctx + 1)}))
    assert err.param == "nvext.token_data"


def test_ten_megabyte_prompt_is_refused_in_linear_time_without_tokenizing(info) -> None:
    pre = _pre(info)
    for text in ("a" * (10 << 20), "数" * (4 << 20)):
        for request in (chat(messages=[{"role": "user", "content": text}]), completion(prompt=text)):
            start = time.perf_counter()
            err = refused(
                pre.chat if isinstance(request, ChatCompletionRequest) else pre.completions, request
            )
            assert time.perf_counter() - start < AT_ONCE
            assert "--max-prompt-bytes" in err.message
    # many small parts: counted as they come, the walk stops at the limit
    parts = [{"type": "text", "text": "ab"}] * 2_000_000
    request = chat(messages=[{"role": "user", "content": parts}])
    start = time.perf_counter()
    refused(pre.chat, request)
    assert time.perf_counter() - start < 2 * AT_ONCE


def test_json_size_is_close_to_the_json_text() -> None:
    value = {
        "messages": [{"role": "user", "content": "naïve 数据 🎉"}, {"x": [1, 2.5, None, True]}],
        "t": "a",
    }
    text = msgspec.json.encode(value)
    assert len(text) * 0.8 <= json_size(value, 10_000) <= len(text) * 1.5
    assert json_size("x" * 100, 10) > 10


def test_request_chat_template_needs_trust(info) -> None:
    template = "{% for m in messages %}[{{ m.content }}]{% endfor %}"
    pre = _pre(info)
    for body in ({"chat_template": template}, {"chat_template_kwargs": {"chat_template": template}}):
        err = refused(pre.chat, chat(**body))
        assert err.param == "chat_template" and "--trust-request-chat-template" in err.message
    trusted = _pre(info, trust_request_chat_template=True)
    assert trusted.chat(chat(chat_template=template)).text == "[hi]"
    # vLLM: a template in chat_template_kwargs wins over the request's chat_template
    both = chat(chat_template="x", chat_template_kwargs={"chat_template": template})
    assert trusted.chat(both).text == "[hi]"
    # other kwargs still reach the template
    greeting = chat(chat_template="{{ greeting }}", chat_template_kwargs={"greeting": "yo"})
    assert trusted.chat(greeting).text == "yo"


def test_template_bomb_is_a_400_in_milliseconds(info) -> None:
    trusted, bomb = _pre(info, trust_request_chat_template=True), chat(chat_template="{{ 'a ' * 10000000 }}")
    start = time.perf_counter()
    err = refused(trusted.chat, bomb)  # compiled and rendered: the repeat is refused before it runs
    assert time.perf_counter() - start < AT_ONCE
    assert err.param == "chat_template" and "longer than" in err.message
    slow = _pre(info, trust_request_chat_template=True, max_render_seconds=0.2)
    loops = chat(
        chat_template="{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    )
    start = time.perf_counter()
    err = refused(slow.chat, loops)
    assert 0.2 <= time.perf_counter() - start < 1.5 and "took more than 0.2 s" in err.message


def test_default_chat_template_kwargs_apply_unless_the_request_sets_them(info) -> None:
    """vLLM's --default-chat-template-kwargs: every request renders with them; its own win."""
    template = "{{ greeting | default('none') }}/{{ mood | default('none') }}"
    pre = Preprocessor(
        info,
        CountingTokenizer.from_dir(info.path),
        chat_template=template,
        default_template_kwargs={"greeting": "hi", "mood": "calm"},
    )
    assert pre.chat(chat()).text == "hi/calm"
    assert pre.chat(chat(chat_template_kwargs={"greeting": "yo"})).text == "yo/calm"
    plain = Preprocessor(info, CountingTokenizer.from_dir(info.path), chat_template=template)
    assert plain.chat(chat()).text == "none/none"
