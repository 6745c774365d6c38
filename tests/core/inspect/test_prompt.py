"""The request's tokens are the ones a frontend makes: raw text as /v1/completions tokenizes it,
messages rendered with the chat template and generation prompt as /v1/chat/completions does."""

from __future__ import annotations

import json

import pytest

from dyn.core.errors import ConfigError
from dyn.core.frontend.preprocessor import Preprocessor
from dyn.core.inspect.prompt import prompt_tokens
from dyn.core.model.info import load_model_info
from dyn.core.protocol.openai import ChatCompletionRequest

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"}]


@pytest.fixture(scope="module")
def preprocessor() -> Preprocessor:
    return Preprocessor(load_model_info())


def test_a_prompt_is_tokenized_raw(preprocessor):
    tokens = prompt_tokens(None, prompt="hello world")
    assert tokens.model_name == "dyn-tiny"
    assert tokens.token_ids == preprocessor.tokenizer.encode("hello world", add_special_tokens=True)


@pytest.mark.parametrize(
    "body", [MESSAGES, {"messages": MESSAGES}, {"model": "x", "messages": MESSAGES, "max_tokens": 5}]
)
def test_messages_are_rendered_with_the_generation_prompt(tmp_path, preprocessor, body):
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(body))
    expected = preprocessor.chat(ChatCompletionRequest(messages=MESSAGES)).token_ids
    tokens = prompt_tokens(None, messages_file=str(path)).token_ids
    assert tokens == expected
    tok = preprocessor.tokenizer
    raw = tok.encode(
        preprocessor.chat_template.render(
            MESSAGES, add_generation_prompt=False, bos_token=tok.bos_token, eos_token=tok.eos_token
        ),
        add_special_tokens=False,
    )
    assert len(tokens) > len(raw) and tokens[: len(raw)] == raw  # the generation prompt follows


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read --messages"),
        ("{not json", "is not valid JSON"),
        ('{"model": "x"}', 'an object with a "messages" list'),
        ("42", "a JSON list of chat messages"),
        ("[]", "holds no messages"),
        ('[{"content": "hi"}]', 'message 0 must be an object with a string "role"'),
        ('[{"role": "user", "content": 5}]', "could not be rendered with the chat template"),
        ('{"messages": [{"role": "user", "content": "x"}], "n": "two"}', "--messages"),
    ],
)
def test_a_bad_messages_file_is_one_sentence(tmp_path, content, message):
    path = tmp_path / "chat.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        prompt_tokens(None, messages_file=str(path))


def test_a_bad_model_path_or_two_sources_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="tokenizer.json"):
        prompt_tokens(str(tmp_path), prompt="x")
    with pytest.raises(ConfigError, match="not both"):
        prompt_tokens(None, prompt="x", messages_file="y")
    with pytest.raises(ConfigError, match="empty"):
        prompt_tokens(None, prompt="")
