"""Images through the official ``openai`` and ``anthropic`` clients against a real ``dyn serve`` whose mocker
workers serve a vision-language model (``tests/vision_model.py``; no weights: the mocker reads
its JSON files) with the KV router.

A repeated image is a cache hit on the worker that holds it (``cached_tokens`` covers the image's
blocks); the same conversation with another image is not, from the image's first block on; both
as vLLM's prefix cache behaves with image identifiers in its block hashes, and the router's
prediction of it (``nvext.timing``'s KV hit) agrees.
"""

from __future__ import annotations

import base64
import io

import openai
import pytest
from PIL import Image

from tests.integration.conftest import serve_ready_url
from tests.vision_model import make_vision_model

pytestmark = pytest.mark.integration

BLOCK = 4


def data_url(colour: tuple[int, int, int]) -> str:
    out = io.BytesIO()
    Image.new("RGB", (16, 16), colour).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def test_a_repeated_image_is_a_cache_hit_where_it_is_cached(dyn_process, tmp_path):
    model = make_vision_model(tmp_path / "tiny-vlm")
    proc = dyn_process(
        "serve", "--http-port", "0", "--model-path", str(model), "--workers", "2",
        "--speedup-ratio", "100", "--block-size", str(BLOCK), "--router-mode", "kv",
    )  # fmt: skip
    client = openai.OpenAI(base_url=serve_ready_url(proc), api_key="x", max_retries=0, timeout=60)

    def ask(colour):
        messages = [
            {"role": "system", "content": "You describe pictures in a few words, nothing more."},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": data_url(colour)}},
                    {"type": "text", "text": "What colour is this square?"},
                ],
            },
        ]
        return client.chat.completions.create(
            model="tiny-vlm",
            messages=messages,
            max_tokens=2,
            extra_body={"nvext": {"extra_fields": ["worker_id", "timing"]}},
        )

    first = ask((255, 0, 0))
    prompt = first.usage.prompt_tokens
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = ask((255, 0, 0))
    worker = again.model_extra["nvext"]["worker_id"]["decode_worker_id"]
    assert worker == first.model_extra["nvext"]["worker_id"]["decode_worker_id"]
    assert again.usage.prompt_tokens_details.cached_tokens == (prompt - 1) // BLOCK * BLOCK
    other = ask((0, 0, 255))
    cached = other.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < again.usage.prompt_tokens_details.cached_tokens  # up to the image only


def test_anthropics_sdk_sends_a_picture_as_claude_code_does(dyn_process, tmp_path):
    """The official ``anthropic`` client's image block (base64 source), in a user turn and in a
    tool result, reaches the vision-language model's workers: the answer comes, and the same
    picture again is read from the cache (``cache_read_input_tokens``)."""
    import anthropic

    model = make_vision_model(tmp_path / "tiny-vlm")
    proc = dyn_process(
        "serve", "--http-port", "0", "--model-path", str(model), "--workers", "1",
        "--speedup-ratio", "100", "--block-size", str(BLOCK), "--dyn-tool-call-parser", "hermes",
    )  # fmt: skip
    base = serve_ready_url(proc).removesuffix("/v1")
    client = anthropic.Anthropic(base_url=base, api_key="x", max_retries=0, timeout=60)
    png = data_url((0, 200, 0)).split(",", 1)[1]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
    messages = [
        {"role": "user", "content": [image, {"type": "text", "text": "Take a screenshot."}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [image]}]},
    ]
    tools = [{"name": "shot", "description": "Takes a screenshot", "input_schema": {"type": "object"}}]
    first = client.messages.create(model="tiny-vlm", max_tokens=2, messages=messages, tools=tools)
    assert first.usage.input_tokens > 0 and first.content
    again = client.messages.create(model="tiny-vlm", max_tokens=2, messages=messages, tools=tools)
    assert again.usage.cache_read_input_tokens > 0
