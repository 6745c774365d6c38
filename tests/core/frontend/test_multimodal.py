"""Images in chat, in-process: a vision-language model (``tests/media_models.py``: 4 placeholder
tokens per image) over fake workers that take media.

What the worker gets is what vLLM would: the rendered prompt with each image's one ``<image>``
token repeated as many times as the model reads an image, and each image as a ``MediaItem`` (its
bytes, their format, their SHA-256, where its placeholders are), in the order the messages hold
them. The route request carries the same spans, so a KV router hashes them into the blocks. A
text-only model, workers without the media feature and a broken image are 400s before any
worker is asked.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import random
import wave

import pytest
from PIL import Image

from dyn.core.engine import FEATURE_MEDIA
from dyn.core.frontend.limits import RequestLimits
from tests.media_clips import clip
from tests.media_models import (
    AUDIO_TOKEN_ID,
    AUDIO_TOKENS,
    GEMMA3_NEWLINES,
    GEMMA3_SEQ_LEN,
    GEMMA3_TOKENS,
    IDEFICS3_SEQ_LEN,
    IDEFICS3_TOKENS,
    IMAGE_TOKEN_ID,
    IMAGE_TOKENS,
    MISTRAL3_TOKENS,
    QWEN_TOKENS,
    make_audio_model,
    make_gemma3_model,
    make_idefics3_model,
    make_llava_next_model,
    make_mistral3_model,
    make_qwen_vl_model,
    make_vision_model,
)

pytestmark = pytest.mark.anyio


def png(colour: tuple[int, int, int], size: int = 8, height: int | None = None) -> bytes:
    """A PNG ``size`` pixels wide and ``height`` (else ``size``) high."""
    out = io.BytesIO()
    Image.new("RGB", (size, height or size), colour).save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def user(*parts: dict) -> dict:
    return {"role": "user", "content": list(parts)}


def image_part(data: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": data_url(data)}}


TEXT = {"type": "text", "text": "What is in these?"}
RED, BLUE = png((255, 0, 0)), png((0, 0, 255))


@pytest.fixture
def vision_model(tmp_path):
    return str(make_vision_model(tmp_path / "tiny-vlm"))


async def test_each_image_becomes_its_placeholders_and_a_media_item(make_frontend, vision_model):
    async with make_frontend(workers=1, model_path=vision_model, features={1: [FEATURE_MEDIA]}) as fe:
        body = {"messages": [user(image_part(RED), TEXT, image_part(BLUE))], "max_tokens": 3}
        r = await fe.client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        (request,) = fe.fleet[1].requests
        ids = request.token_ids
        runs = [
            i for i, t in enumerate(ids) if t == IMAGE_TOKEN_ID and (i == 0 or ids[i - 1] != IMAGE_TOKEN_ID)
        ]
        assert len(runs) == 2 and ids.count(IMAGE_TOKEN_ID) == 2 * IMAGE_TOKENS
        assert [(m.offset, m.length) for m in request.media] == [
            (runs[0], IMAGE_TOKENS),
            (runs[1], IMAGE_TOKENS),
        ]
        assert [m.data for m in request.media] == [RED, BLUE]
        assert [m.mm_hash for m in request.media] == [
            hashlib.sha256(RED).hexdigest(),
            hashlib.sha256(BLUE).hexdigest(),
        ]
        assert {m.mime for m in request.media} == {"image/png"} and {m.modality for m in request.media} == {
            "image"
        }
        assert r.json()["usage"]["prompt_tokens"] == len(ids)


async def test_a_template_that_reads_text_gets_the_placeholder_before_the_text(make_frontend, vision_model):
    """vLLM's "string" content format: each image's placeholder on its own line, then the text."""
    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    async with make_frontend(
        workers=1,
        model_path=vision_model,
        features={1: [FEATURE_MEDIA]},
        limits=RequestLimits(trust_request_chat_template=True),
    ) as fe:
        body = {"messages": [user(TEXT, image_part(RED))], "max_tokens": 3, "chat_template": template}
        r = await fe.client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        tokens = await fe.client.post("/detokenize", json={"tokens": fe.fleet[1].requests[0].token_ids})
        assert tokens.json()["prompt"] == "user: " + "<image>" * IMAGE_TOKENS + "\nWhat is in these?\n"


@pytest.mark.parametrize(
    "model,features,part,param,words",
    [
        (None, [FEATURE_MEDIA], image_part(RED), "messages[0].content[0].image_url", "takes no image input"),
        ("vision", [], image_part(RED), "messages[0].content[0].image_url", "take no images"),
        (
            "vision",
            [FEATURE_MEDIA],
            image_part(b"\x89PNG\r\n\x1a\nbroken"),
            "messages[0].content[0].image_url",
            "",
        ),
        (
            "vision",
            [FEATURE_MEDIA],
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            "messages[0].content[0].input_audio",
            "takes no audio input",
        ),
    ],
)
async def test_what_cannot_be_served_is_a_400_before_any_worker_is_asked(
    make_frontend, vision_model, model, features, part, param, words
):
    settings = {"model_path": vision_model} if model == "vision" else {}
    async with make_frontend(workers=1, features={1: features}, **settings) as fe:
        r = await fe.client.post(
            "/v1/chat/completions", json={"messages": [user(part, TEXT)], "max_tokens": 3}
        )
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and words in error["message"]
        assert fe.fleet[1].requests == []


async def test_a_data_url_counts_against_media_bounds_not_the_prompt_text_bound(make_frontend, vision_model):
    noise = Image.frombytes("RGB", (64, 64), random.Random(5).randbytes(64 * 64 * 3))
    out = io.BytesIO()
    noise.save(out, "PNG")
    big = out.getvalue()
    assert len(big) > 10_000  # well over the 512-byte text bound below
    async with make_frontend(
        workers=1,
        model_path=vision_model,
        features={1: [FEATURE_MEDIA]},
        limits=RequestLimits(max_prompt_bytes=512),
    ) as fe:
        r = await fe.client.post(
            "/v1/chat/completions", json={"messages": [user(image_part(big))], "max_tokens": 2}
        )
        assert r.status_code == 200, r.text


async def test_an_image_longer_than_the_context_is_refused_before_its_tokens_are_built(
    make_frontend, tmp_path
):
    """A model's files may state any count: a billion tokens an image is a 400 naming the part,
    answered at once (the list is never built), and the frontend serves on."""
    model = make_vision_model(tmp_path / "huge")
    processor = json.loads((model / "processor_config.json").read_text())
    (model / "processor_config.json").write_text(json.dumps({**processor, "image_seq_length": 10**9}))
    async with make_frontend(workers=1, model_path=str(model), features={1: [FEATURE_MEDIA]}) as fe:
        r = await fe.client.post(
            "/v1/chat/completions", json={"messages": [user(image_part(RED))], "max_tokens": 2}
        )
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "messages[0].content[0].image_url"
        assert "takes 1000000000 tokens, more than the model's context" in error["message"]
        r = await fe.client.post("/v1/chat/completions", json={"messages": [user(TEXT)], "max_tokens": 2})
        assert r.status_code == 200, r.text


async def test_images_through_the_messages_and_responses_apis(make_frontend, vision_model):
    """Anthropic's image blocks and the Responses API's input_image reach the worker as media."""
    encoded = base64.b64encode(RED).decode()
    async with make_frontend(workers=1, model_path=vision_model, features={1: [FEATURE_MEDIA]}) as fe:
        block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": encoded}}
        body = {
            "model": "tiny-vlm",
            "max_tokens": 3,
            "messages": [{"role": "user", "content": [block, {"type": "text", "text": "What is it?"}]}],
        }
        r = await fe.client.post("/v1/messages", json=body)
        assert r.status_code == 200, r.text
        part = {"type": "input_image", "image_url": data_url(RED)}
        body = {"model": "tiny-vlm", "max_output_tokens": 3, "input": [{"role": "user", "content": [part]}]}
        r = await fe.client.post("/v1/responses", json=body)
        assert r.status_code == 200, r.text
        assert [[m.data for m in req.media] for req in fe.fleet[1].requests] == [[RED], [RED]]


async def test_an_uploaded_image_is_read_by_its_file_id_in_the_messages_and_responses_apis(
    make_frontend, vision_model
):
    async with make_frontend(workers=1, model_path=vision_model, features={1: [FEATURE_MEDIA]}) as fe:
        upload = {"file": ("red.png", RED, "image/png")}
        openai_id = (await fe.client.post("/v1/files", files=upload, data={"purpose": "vision"})).json()["id"]
        anthropic = {"anthropic-version": "2023-06-01"}
        anthropic_id = (await fe.client.post("/v1/files", files=upload, headers=anthropic)).json()["id"]
        block = {"type": "image", "source": {"type": "file", "file_id": anthropic_id}}
        body = {"model": "tiny-vlm", "max_tokens": 3, "messages": [{"role": "user", "content": [block]}]}
        r = await fe.client.post("/v1/messages", json=body, headers=anthropic)
        assert r.status_code == 200, r.text
        part = {"type": "input_image", "file_id": openai_id}
        body = {"model": "tiny-vlm", "max_output_tokens": 3, "input": [{"role": "user", "content": [part]}]}
        r = await fe.client.post("/v1/responses", json=body)
        assert r.status_code == 200, r.text
        assert [[m.data for m in req.media] for req in fe.fleet[1].requests] == [[RED], [RED]]
        part["file_id"] = "file-gone"
        r = await fe.client.post("/v1/responses", json=body)
        assert r.status_code == 404 and r.json()["error"]["param"] == "input[0].content[0].file_id"


async def test_a_qwen2_vl_model_gets_as_many_placeholders_as_each_image_needs(make_frontend, tmp_path):
    """Qwen2-VL's dynamic resolution: a 224x224 image is 64 ``<|image_pad|>`` tokens between the
    template's vision markers, a 20x20 one 4 (scaled up to the minimum), and one 200 times longer
    than wide is a 400 naming it, as Qwen's processor refuses it."""
    model = str(make_qwen_vl_model(tmp_path / "qwen"))
    pad = QWEN_TOKENS["<|image_pad|>"]
    async with make_frontend(workers=1, model_path=model, features={1: [FEATURE_MEDIA]}) as fe:
        big, small = png((9, 9, 9), size=224), png((8, 8, 8), size=20)
        body = {"messages": [user(image_part(big), image_part(small), TEXT)], "max_tokens": 2}
        r = await fe.client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        (request,) = fe.fleet[1].requests
        assert [m.length for m in request.media] == [64, 4]
        for m in request.media:
            ids = request.token_ids
            assert ids[m.offset - 1] == QWEN_TOKENS["<|vision_start|>"]
            assert ids[m.offset : m.offset + m.length] == [pad] * m.length
            assert ids[m.offset + m.length] == QWEN_TOKENS["<|vision_end|>"]
        body = {"messages": [user(image_part(png((0, 0, 0), 4020, 20)))], "max_tokens": 2}
        r = await fe.client.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[0].image_url"
        assert "200 times" in r.json()["error"]["message"]


def video_part(data: bytes) -> dict:
    return {
        "type": "video_url",
        "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(data).decode()},
    }


async def test_a_qwen2_vl_model_gets_as_many_placeholders_as_each_clip_needs(
    make_frontend, tmp_path, monkeypatch
):
    """Qwen2-VL's clips (``dyn.core.model.video``): 30 frames at 10 a second are sampled to 6, 3
    groups of 2 x 2 merged patches at 64x48 (scaled up to the minimum): 12 ``<|video_pad|>``
    between the template's vision markers, beside an image's own count. A one-frame clip, and any
    clip when the frontend has no OpenCV to read it, are 400s naming the part and the reason."""
    from dyn.core.frontend import media

    model = str(make_qwen_vl_model(tmp_path / "qwen"))
    async with make_frontend(workers=1, model_path=model, features={1: [FEATURE_MEDIA]}) as fe:
        body = {"messages": [user(video_part(clip(30, 10.0)), image_part(png((8, 8, 8), size=20)), TEXT)]}
        r = await fe.client.post("/v1/chat/completions", json={**body, "max_tokens": 2})
        assert r.status_code == 200, r.text
        (request,) = fe.fleet[1].requests
        assert [(m.modality, m.length) for m in request.media] == [("video", 12), ("image", 4)]
        video = request.media[0]
        ids = request.token_ids
        assert ids[video.offset - 1] == QWEN_TOKENS["<|vision_start|>"]
        assert ids[video.offset : video.offset + video.length] == [QWEN_TOKENS["<|video_pad|>"]] * 12
        assert ids[video.offset + video.length] == QWEN_TOKENS["<|vision_end|>"]
        r = await fe.client.post("/v1/chat/completions", json={"messages": [user(video_part(clip(1)))]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[0].video_url"
        assert "has 1 frame(s)" in r.json()["error"]["message"]
        monkeypatch.setattr(media, "_opencv", lambda: None)
        r = await fe.client.post("/v1/chat/completions", json={"messages": [user(video_part(clip()))]})
        assert r.status_code == 400 and "pip install 'dyn[video]'" in r.json()["error"]["message"]


async def test_a_qwen3_vl_clip_is_written_pair_by_pair_with_each_pairs_time(make_frontend, tmp_path):
    """Qwen3-VL: the template's ``<|video_pad|>`` becomes, for each pair of sampled frames, its time
    (``<0.3 seconds>``, tokenized alone) and its frame's tokens between the vision markers, inside the
    template's own markers (transformers 5.10 and later, and vLLM with them); the item's span is all
    of it. 30 frames at 10 a second: 6 frames sampled at 64x48 (resized to 64x64: 4 x 4 patches of
    16, merged 2x2, 4 tokens), 3 pairs at 0.3, 1.4 and 2.6 seconds."""
    model = str(
        make_qwen_vl_model(
            tmp_path / "qwen3", min_pixels=64 * 64, max_pixels=32 * 32 * 256, family="qwen3_vl"
        )
    )
    async with make_frontend(workers=1, model_path=model, features={1: [FEATURE_MEDIA]}) as fe:
        r = await fe.client.post(
            "/v1/chat/completions",
            json={"messages": [user(video_part(clip(30, 10.0)), TEXT)], "max_tokens": 2},
        )
        assert r.status_code == 200, r.text
        (request,) = fe.fleet[1].requests
        (video,) = request.media
        span = request.token_ids[video.offset : video.offset + video.length]
        start, pad, end = (QWEN_TOKENS[t] for t in ("<|vision_start|>", "<|video_pad|>", "<|vision_end|>"))
        assert (
            request.token_ids[video.offset - 1] == start
            and request.token_ids[video.offset + video.length] == end
        )
        assert span.count(pad) == 12 and span.count(start) == span.count(end) == 3
        text = fe.app.service.preprocessor.tokenizer.decode(span, skip_special_tokens=False)
        assert text == "".join(
            f"<{t} seconds><|vision_start|>{'<|video_pad|>' * 4}<|vision_end|>" for t in ("0.3", "1.4", "2.6")
        )


async def test_a_llava_next_model_gets_as_many_placeholders_as_each_images_tiles_need(
    make_frontend, tmp_path
):
    """LLaVA-NeXT: at the tiny model's 28-pixel tiles (2x2 patches each) a 56x56 image fills the
    2x2-tile pinpoint (4 for the whole image + 4 x 4 patches + 4 newlines), a 112x28 one the
    1x3-tile pinpoint (4 + 2 x 6 + 2)."""
    model = str(make_llava_next_model(tmp_path / "next"))
    async with make_frontend(workers=1, model_path=model, features={1: [FEATURE_MEDIA]}) as fe:
        square, wide = png((9, 9, 9), size=56), png((8, 8, 8), 112, 28)
        body = {"messages": [user(image_part(square), image_part(wide), TEXT)], "max_tokens": 2}
        r = await fe.client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        (request,) = fe.fleet[1].requests
        assert [m.length for m in request.media] == [24, 18]
        for m in request.media:
            assert request.token_ids[m.offset : m.offset + m.length] == [IMAGE_TOKEN_ID] * m.length


async def test_an_idefics3_model_gets_each_image_written_as_its_tiles(make_frontend, tmp_path):
    """Idefics3 (and SmolVLM): an image is resized to a longest edge of 224 pixels, so a 224x112
    one is cut into 2 x 4 tiles of 56, each written ``<fake_token_around_image><row_R_col_C>`` and
    4 ``<image>`` tokens, then the whole image; a 30x40 one into 4 x 3. Each span is the whole
    written text, as vLLM places it."""
    model = str(make_idefics3_model(tmp_path / "idefics3"))
    fake, whole = IDEFICS3_TOKENS["<fake_token_around_image>"], IDEFICS3_TOKENS["<global-img>"]
    async with make_frontend(workers=1, model_path=model, features={1: [FEATURE_MEDIA]}) as fe:
        wide, tall = png((9, 9, 9), 224, 112), png((8, 8, 8), 30, 40)
        body = {"messages": [user(image_part(wide), image_part(tall), TEXT)], "max_tokens": 2}
        r = await fe.client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        (request,) = fe.fleet[1].requests
        spans = [request.token_ids[m.offset : m.offset + m.length] for m in request.media]
        first_tag = IDEFICS3_TOKENS["<row_1_col_1>"]
        for span, (rows, columns) in zip(spans, [(2, 4), (4, 3)], strict=True):
            tags = [t - first_tag for t in span if first_tag <= t < first_tag + 36]
            assert tags == [6 * r + c for r in range(rows) for c in range(columns)]
            assert span.count(IMAGE_TOKEN_ID) == (rows * columns + 1) * IDEFICS3_SEQ_LEN
            assert span[0] == fake and span[-IDEFICS3_SEQ_LEN - 3 :][:2] == [fake, whole] and span[-1] == fake
        assert r.json()["usage"]["prompt_tokens"] == len(request.token_ids)


async def test_an_image_for_a_family_dyn_cannot_count_says_so(make_frontend, tmp_path):
    """A model of the InternVL family takes images, but writes them by a rule dyn does not read
    (its tiles): the 400 says that, not that the model takes no images or that the template wrote
    no placeholder."""
    model = make_vision_model(tmp_path / "internvl")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": "internvl"}))
    async with make_frontend(workers=1, model_path=str(model), features={1: [FEATURE_MEDIA]}) as fe:
        body = {"messages": [user(image_part(png((1, 2, 3))), TEXT)], "max_tokens": 2}
        r = await fe.client.post("/v1/chat/completions", json=body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "messages[0].content[0].image_url"
        assert "(internvl): not built" in error["message"] and "takes images" in error["message"]
        assert fe.fleet[1].requests == []


async def test_a_mistral3_model_gets_each_image_written_in_rows(make_frontend, tmp_path):
    """Mistral 3 (Pixtral's rows): a 57x29 image is 2 rows of 3 merged patches, written
    ``[IMG][IMG][IMG][IMG_BREAK][IMG][IMG][IMG][IMG_END]``, its span the whole of it; a 300x200 one
    is scaled down to 224x149 and written in 6 rows of 8."""
    model = str(make_mistral3_model(tmp_path / "mistral3"))
    img, brk, end = MISTRAL3_TOKENS.values()
    async with make_frontend(workers=1, model_path=model, features={1: [FEATURE_MEDIA]}) as fe:
        small, photo = png((9, 9, 9), 57, 29), png((8, 8, 8), 300, 200)
        body = {"messages": [user(image_part(small), TEXT, image_part(photo))], "max_tokens": 2}
        r = await fe.client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        (request,) = fe.fleet[1].requests
        spans = [request.token_ids[m.offset : m.offset + m.length] for m in request.media]
        assert spans[0] == [img] * 3 + [brk] + [img] * 3 + [end]
        assert spans[1] == ([img] * 8 + [brk]) * 5 + [img] * 8 + [end]
        assert r.json()["usage"]["prompt_tokens"] == len(request.token_ids)


GEMMA3_LAYOUTS = {
    "image-then-text": [image_part(RED), TEXT],
    "side-by-side": [image_part(RED), image_part(BLUE), TEXT],
    "text-around": [TEXT, image_part(RED), {"type": "text", "text": "and?"}],
}


async def test_a_gemma3_prompt_is_its_processors_and_each_image_where_vllm_places_it(make_frontend, tmp_path):
    """Gemma 3: the prompt a worker gets is transformers' ``Gemma3Processor``'s for the rendered
    text, token for token (each image wrapped in ``\n\n``, merged with the template's newline
    before it, two side by side sharing their ``\n\n\n\n``), each span where vLLM places it, and
    its source what the template wrote there."""
    from transformers import AutoProcessor

    model = make_gemma3_model(tmp_path / "gemma3")
    processor = AutoProcessor.from_pretrained(model)
    boi, soft = GEMMA3_TOKENS["<start_of_image>"], GEMMA3_TOKENS["<image_soft_token>"]
    nl1, nl3, nl4 = (GEMMA3_NEWLINES["\n" * n] for n in (1, 3, 4))
    async with make_frontend(workers=1, model_path=str(model), features={1: [FEATURE_MEDIA]}) as fe:
        for name, parts in GEMMA3_LAYOUTS.items():
            messages = [user(*parts)]
            r = await fe.client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
            assert r.status_code == 200, (name, r.text)
            request = fe.fleet[1].requests[-1]
            text = processor.tokenizer.apply_chat_template(
                [user(*({"type": "image"} if p["type"] == "image_url" else p for p in parts))],
                tokenize=False,
                add_generation_prompt=True,
            )
            images = [Image.open(io.BytesIO(m.data)) for m in request.media]
            expected = processor(text=text, images=images, add_special_tokens=False)["input_ids"][0]
            assert request.token_ids == list(expected), name
            assert r.json()["usage"]["prompt_tokens"] == len(request.token_ids)
            for m in request.media:
                span = request.token_ids[m.offset : m.offset + m.length]
                assert (
                    span.count(soft) == GEMMA3_SEQ_LEN and span[1] == boi and m.length == GEMMA3_SEQ_LEN + 4
                )
            if name == "image-then-text":
                (only,) = request.media
                assert request.token_ids[only.offset] == nl3 and only.source == [nl1, boi]
            if name == "side-by-side":
                first, second = request.media
                assert second.offset == first.offset + first.length - 1
                assert request.token_ids[second.offset] == nl4 and second.source == [boi]


async def test_a_gemma3_image_followed_by_one_newline_is_a_400_as_vllm_fails_it(make_frontend, tmp_path):
    model = make_gemma3_model(tmp_path / "gemma3")
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = config["chat_template"].replace("part['text'] | trim", "part['text']")
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    async with make_frontend(workers=1, model_path=str(model), features={1: [FEATURE_MEDIA]}) as fe:
        body = {"messages": [user(image_part(RED), {"type": "text", "text": "\nWhat?"})], "max_tokens": 2}
        r = await fe.client.post("/v1/chat/completions", json=body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "messages[0].content[0].image_url"
        assert "no single newline right after an image" in error["message"]
        body["messages"][0]["content"][1]["text"] = "\n\nWhat?"  # two newlines merge as vLLM places them
        assert (await fe.client.post("/v1/chat/completions", json=body)).status_code == 200


def wav(frames: int, rate: int = 16000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\0\1" * frames)
    return out.getvalue()


def flac(frames: int, rate: int) -> bytes:
    import numpy as np
    import soundfile

    out = io.BytesIO()
    soundfile.write(out, np.zeros(frames, dtype="float32"), rate, format="FLAC")
    return out.getvalue()


def input_audio(data: bytes) -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}}


async def test_each_clip_becomes_as_many_placeholders_as_its_length_needs(make_frontend, tmp_path):
    """A Qwen2-Audio model: a 1 s WAV is 25 ``<|AUDIO|>`` tokens between the template's audio
    markers, a 0.5 s FLAC at 8 kHz (an ``audio_url``) 12; a clip too short for one token and an
    image (the model takes none) are 400s naming the part."""
    model = str(make_audio_model(tmp_path / "audio"))
    one_second, half = wav(16000), flac(4000, 8000)
    async with make_frontend(workers=1, model_path=model, features={1: [FEATURE_MEDIA]}) as fe:
        url = "data:audio/flac;base64," + base64.b64encode(half).decode()
        parts = [input_audio(one_second), TEXT, {"type": "audio_url", "audio_url": {"url": url}}]
        r = await fe.client.post("/v1/chat/completions", json={"messages": [user(*parts)], "max_tokens": 2})
        assert r.status_code == 200, r.text
        (request,) = fe.fleet[1].requests
        assert [(m.modality, m.mime, m.length, m.data) for m in request.media] == [
            ("audio", "audio/wav", 25, one_second),
            ("audio", "audio/flac", 12, half),
        ]
        ids = request.token_ids
        for m in request.media:
            assert ids[m.offset - 1] == AUDIO_TOKENS["<|audio_bos|>"]
            assert ids[m.offset : m.offset + m.length] == [AUDIO_TOKEN_ID] * m.length
            assert ids[m.offset + m.length] == AUDIO_TOKENS["<|audio_eos|>"]
        for part, param, words in [
            (input_audio(wav(100)), "messages[0].content[1].input_audio", "too short"),
            (image_part(RED), "messages[0].content[1].image_url", "takes no image input"),
        ]:
            r = await fe.client.post(
                "/v1/chat/completions", json={"messages": [user(TEXT, part)], "max_tokens": 2}
            )
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["param"] == param and words in error["message"], error
        assert len(fe.fleet[1].requests) == 1
