"""Images, audio and video through the official ``openai`` and ``anthropic`` clients against a real
``dyn serve`` whose mocker workers serve a vision-language (LLaVA-style, or Idefics3-style: an image
written as tiles around its tokens; Qwen2-VL-style for video) or a Qwen2-Audio-style model
(``tests/media_models.py``; no weights: the mocker reads their JSON files) with the KV router.

A repeated image, clip or video is a cache hit on the worker that holds it (``cached_tokens`` covers the
item's blocks); the same conversation with another item is not, from the item's first block on; both
as vLLM's prefix cache behaves with image identifiers in its block hashes, and the router's
prediction of it (``nvext.timing``'s KV hit) agrees.
"""

from __future__ import annotations

import base64
import io
import wave
from functools import partial

import openai
import pytest
from PIL import Image

from tests.integration.conftest import serve_ready_url
from tests.media_clips import clip as video_clip
from tests.media_models import make_audio_model, make_idefics3_model, make_qwen_vl_model, make_vision_model

pytestmark = pytest.mark.integration

BLOCK = 4


def data_url(colour: tuple[int, int, int]) -> str:
    out = io.BytesIO()
    Image.new("RGB", (16, 16), colour).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def picture(which: int) -> dict:
    return {"type": "image_url", "image_url": {"url": data_url(((255, 0, 0), (0, 0, 255))[which])}}


def clip(which: int) -> dict:
    """A 1 s 16 kHz WAV (25 placeholder tokens), silent or a square wave."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((b"\0\0" if which == 0 else b"\0\x40\0\xc0") * (16000 // (which + 1)))
    data = base64.b64encode(out.getvalue()).decode()
    return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}


def video(which: int) -> dict:
    """A 2 s MP4 at 8 frames a second, 64x48 (4 frames sampled: 2 groups of 2 x 2 tokens), each
    frame one grey level or, for the other, another."""
    data = base64.b64encode(video_clip(16 + which, 8.0)).decode()
    return {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + data}}


@pytest.mark.parametrize(
    "make_model, part, question",
    [
        (make_vision_model, picture, "What colour is this square?"),
        (make_idefics3_model, picture, "What colour is this square?"),
        (make_audio_model, clip, "What is this sound?"),
        (make_qwen_vl_model, video, "What happens in this video?"),
        (partial(make_qwen_vl_model, family="qwen3_vl"), video, "What happens in this video?"),
    ],
    ids=["image", "idefics3-tiles", "audio", "video", "video-with-times"],
)
def test_a_repeated_item_is_a_cache_hit_where_it_is_cached(dyn_process, tmp_path, make_model, part, question):
    model = make_model(tmp_path / "tiny-mm")
    proc = dyn_process(
        "serve", "--http-port", "0", "--model-path", str(model), "--workers", "2",
        "--speedup-ratio", "100", "--block-size", str(BLOCK), "--router-mode", "kv",
    )  # fmt: skip
    client = openai.OpenAI(base_url=serve_ready_url(proc), api_key="x", max_retries=0, timeout=60)

    def ask(which):
        messages = [
            {"role": "system", "content": "You describe what you are given in a few words, nothing more."},
            {"role": "user", "content": [part(which), {"type": "text", "text": question}]},
        ]
        return client.chat.completions.create(
            model="tiny-mm",
            messages=messages,
            max_tokens=2,
            extra_body={"nvext": {"extra_fields": ["worker_id", "timing"]}},
        )

    first = ask(0)
    prompt = first.usage.prompt_tokens
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = ask(0)
    worker = again.model_extra["nvext"]["worker_id"]["decode_worker_id"]
    assert worker == first.model_extra["nvext"]["worker_id"]["decode_worker_id"]
    assert again.usage.prompt_tokens_details.cached_tokens == (prompt - 1) // BLOCK * BLOCK
    other = ask(1)
    cached = other.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < again.usage.prompt_tokens_details.cached_tokens  # up to the item only


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
