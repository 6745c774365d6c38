"""``/tokenize`` against a real ``dyn serve``: tokenizing a chat's messages gives exactly the prompt
tokens a chat completion with the same messages reports as ``usage.prompt_tokens`` (vLLM's
``/tokenize`` contract, ``entrypoints/openai/serving_tokenization.py``; model: dyn's embedded
``dyn-tiny`` behind mocker workers)."""

from __future__ import annotations

import httpx
import openai
import pytest

pytestmark = pytest.mark.integration

MESSAGES = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "What colour is the sky on a clear day?"},
]


def test_tokenize_of_messages_matches_the_chat_prompt_tokens(stack):
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="x", max_retries=0, timeout=60)
    chat = client.chat.completions.create(model="dyn-tiny", messages=MESSAGES, max_tokens=3)
    r = httpx.post(stack.url + "/tokenize", json={"model": "dyn-tiny", "messages": MESSAGES}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["tokens"]) == chat.usage.prompt_tokens
    back = httpx.post(stack.url + "/detokenize", json={"tokens": body["tokens"]}, timeout=30)
    assert back.status_code == 200 and "What colour is the sky" in back.json()["prompt"]
