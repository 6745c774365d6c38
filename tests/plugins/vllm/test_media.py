"""``plugins.vllm.media`` and ``VllmEngine``'s image path against stand-ins shaped like vLLM 0.32's
``ModelConfig``, multimodal processor and ``AsyncLLM.renderer.render_cmpl_async`` (the real thing:
tests/plugins/vllm/test_real_vllm_multimodal.py)."""

from __future__ import annotations

import hashlib
import io
from types import SimpleNamespace

import pytest

from dyn.core.engine import FEATURE_CLASSIFY, FEATURE_EMBED, FEATURE_MEDIA, FEATURE_POOLING_ONLY, EngineError
from dyn.core.messages import GenerateRequest, MediaItem
from dyn.plugins.vllm import media
from dyn.plugins.vllm.config import VllmConfig
from dyn.plugins.vllm.engine import VllmApi, VllmEngine
from tests.plugins.vllm.test_engine_requests import FakeLLM, delta

IMAGE = 4096
PROMPT = [1, 2, IMAGE, IMAGE, IMAGE, 3, IMAGE, IMAGE, IMAGE, 4]
"""Two images of 3 placeholder tokens each, at 2 and 6."""


def item(offset=2, length=3, data=b"png-bytes", modality="image", mm_hash=None) -> MediaItem:
    return MediaItem(modality, data, "image/png", mm_hash or hashlib.sha256(data).hexdigest(), offset, length)


def request(*media_items: MediaItem, tokens=PROMPT) -> GenerateRequest:
    return GenerateRequest("r1", list(tokens), media=list(media_items))


def png(color=(255, 0, 0)) -> bytes:
    image = pytest.importorskip("PIL.Image")
    buf = io.BytesIO()
    image.new("RGB", (8, 6), color).save(buf, "PNG")
    return buf.getvalue()


def placeholder(offset: int, length: int) -> SimpleNamespace:
    """Stands for vllm.multimodal.inputs.PlaceholderRange."""
    return SimpleNamespace(offset=offset, length=length)


def rendered(tokens=PROMPT, ranges=((2, 3), (6, 3))) -> dict:
    """vLLM's rendered ``MultiModalInput`` as ``render_cmpl_async`` returns it."""
    return {
        "type": "multimodal",
        "prompt_token_ids": list(tokens),
        "mm_placeholders": {"image": [placeholder(*r) for r in ranges]},
    }


# ------------------------------------------------------------------ the model


def model_config(*, multimodal=True, enc_dec=False, image_limit=999, hf=None):
    limits = SimpleNamespace(get_limit_per_prompt=lambda modality: image_limit)
    return SimpleNamespace(
        is_multimodal_model=multimodal,
        is_encoder_decoder=enc_dec,
        multimodal_config=limits if multimodal else None,
        hf_config=hf or SimpleNamespace(image_token_index=IMAGE),
        runner_type="generate",
    )


def processor(*modalities):
    return SimpleNamespace(info=SimpleNamespace(get_supported_mm_limits=lambda: dict.fromkeys(modalities)))


@pytest.mark.parametrize(
    ("config", "mm_processor", "takes_images"),
    [
        (model_config(), processor("image"), True),
        (model_config(), None, True),  # no renderer to ask: the model config decides
        (model_config(multimodal=False), None, False),
        (model_config(), processor("audio"), False),  # an audio-only model
        (
            model_config(image_limit=0),
            processor("image"),
            False,
        ),  # --limit-mm-per-prompt / --language-model-only
        (model_config(enc_dec=True), processor("image"), False),
    ],
    ids=["vision", "no-renderer", "text", "audio-only", "images-off", "encoder-decoder"],
)
def test_a_model_takes_images_when_vllm_says_it_is_multimodal_with_an_image_processor(
    config, mm_processor, takes_images
):
    assert media.image_input(config, mm_processor) is takes_images


def test_the_image_token_comes_from_the_hugging_face_config():
    assert media.image_token(SimpleNamespace(image_token_index=32000)) == 32000  # LLaVA
    assert media.image_token(SimpleNamespace(image_token_id=151655)) == 151655  # Qwen2-VL, Idefics3
    assert media.image_token(SimpleNamespace()) is None


@pytest.mark.anyio
async def test_the_engine_lists_media_for_a_vision_model_and_only_then():
    def tasks(*names):
        async def get_supported_tasks():
            return names

        return get_supported_tasks

    llm = SimpleNamespace(
        vllm_config=SimpleNamespace(model_config=model_config()),
        renderer=SimpleNamespace(mm_processor=processor("image")),
        get_supported_tasks=tasks("embed"),
    )
    vision = VllmEngine(VllmConfig(), "/m")
    await vision._read_features(llm)
    assert vision.info.features == [FEATURE_MEDIA] and vision._image_token == IMAGE
    text = VllmEngine(VllmConfig(), "/m")
    await text._read_features(
        SimpleNamespace(vllm_config=SimpleNamespace(model_config=model_config(multimodal=False)))
    )
    assert text.info.features == [] and not text._images
    pooling = VllmEngine(VllmConfig(), "/m")
    pooling._pooling = True
    await pooling._read_features(llm)
    assert pooling.info.features == [FEATURE_EMBED, FEATURE_POOLING_ONLY]
    llm.get_supported_tasks = tasks("classify", "embed")
    await pooling._read_features(llm)
    assert pooling.info.features == [FEATURE_EMBED, FEATURE_POOLING_ONLY, FEATURE_CLASSIFY]


# ------------------------------------------------------------------ the request


def test_each_span_collapses_to_the_one_placeholder_vllm_expands():
    items = [item(2, 3), item(6, 3)]
    assert media.collapse(PROMPT, items, IMAGE) == [1, 2, IMAGE, 3, IMAGE, 4]
    assert media.collapse(PROMPT, items, None) == [1, 2, IMAGE, 3, IMAGE, 4]  # the span's first token
    assert media.collapse([7, 8, 9, 5], [item(1, 2)], 99) == [7, 99, 5]


def test_the_prompt_carries_the_images_and_their_mm_hash_as_uuids():
    items = [item(2, 3, b"a"), item(6, 3, b"b")]
    fields = media.prompt_fields(request(*items), ["image-a", "image-b"], IMAGE)
    assert fields == {
        "prompt_token_ids": [1, 2, IMAGE, 3, IMAGE, 4],
        "multi_modal_data": {"image": ["image-a", "image-b"]},
        "multi_modal_uuids": {"image": [hashlib.sha256(b"a").hexdigest(), hashlib.sha256(b"b").hexdigest()]},
    }


@pytest.mark.parametrize(
    ("items", "needle"),
    [
        ([item(modality="audio")], "vLLM takes audio as decoded samples"),
        ([item(modality="video")], "vLLM takes video as decoded frames"),
        ([item(mm_hash="ABC")], "mm_hash must be 64 lowercase hex"),
        ([item(8, 3)], "inside the 10-token prompt"),
        ([item(2, 0)], "must be non-empty"),
        ([item(6, 3), item(2, 3)], "after the previous item's"),
        ([item(2, 3), item(4, 3)], "after the previous item's"),  # overlapping
    ],
    ids=["audio", "video", "hash", "past-the-end", "empty", "out-of-order", "overlap"],
)
def test_media_the_worker_cannot_pass_is_refused_with_a_reason(items, needle):
    with pytest.raises(media.MediaError, match=needle):
        media.check_media(request(*items))


def test_well_formed_spans_pass():
    media.check_media(request(item(2, 3), item(6, 3)))
    media.check_media(request(item(0, 10, b"whole")))


def test_images_decode_with_pillow_and_a_broken_one_is_named():
    red, blue = png((255, 0, 0)), png((0, 0, 255))
    images = media.decode_images([item(data=red), item(data=blue)])
    assert [im.size for im in images] == [(8, 6), (8, 6)]
    assert images[1].getpixel((0, 0))[:3] == (0, 0, 255)
    with pytest.raises(media.MediaError, match=r"media item 1 \(image/png\): not an image Pillow can decode"):
        media.decode_images([item(data=red), item(data=red[:40])])


def test_vllms_expansion_must_give_back_the_requests_prompt_and_spans():
    both = request(item(2, 3), item(6, 3))
    media.check_expansion(both, rendered())
    with pytest.raises(
        media.MediaError, match="request has 3 placeholder tokens at position 6, vLLM's processor"
    ):
        media.check_expansion(both, rendered(ranges=((2, 3), (6, 4))))
    with pytest.raises(media.MediaError, match="vLLM placed 1 images in the prompt, the request has 2"):
        media.check_expansion(both, rendered(ranges=((2, 3),)))
    with pytest.raises(media.MediaError, match="differs from the request's .10. from position 9"):
        media.check_expansion(both, rendered(tokens=[*PROMPT[:-1], 5]))
    with pytest.raises(media.MediaError, match="vLLM's prompt .11 tokens. differs"):
        media.check_expansion(both, rendered(tokens=[*PROMPT, 5]))


# ------------------------------------------------------------------ the engine


class Renderer:
    """Stands for AsyncLLM.renderer: records each prompt, answers ``result`` or raises ``error``."""

    def __init__(self, result=None, error: Exception | None = None) -> None:
        self.result, self.error, self.prompts = result, error, []

    async def render_cmpl_async(self, prompts):
        self.prompts += prompts
        if self.error is not None:
            raise self.error
        return [self.result]


def engine(llm: FakeLLM, *, images=True) -> VllmEngine:
    e = VllmEngine(VllmConfig(), "/models/m")
    e._llm = llm
    e._api = VllmApi(
        sampling_params=lambda **kw: kw,
        tokens_prompt=lambda **kw: kw,
        delta="DELTA",
        client_errors=(),
        structured_outputs=lambda **kw: kw,
    )
    e._images, e._image_token = images, IMAGE
    return e


async def collect(e: VllmEngine, req: GenerateRequest) -> list:
    return [out async for out in e.generate(req)]


def llm_with(renderer: Renderer) -> FakeLLM:
    llm = FakeLLM([delta([5], "length")])
    llm.release.set()
    llm.renderer = renderer  # type: ignore[attr-defined]
    return llm


@pytest.mark.anyio
async def test_an_image_request_reaches_vllm_as_the_input_its_renderer_made():
    red = png()
    renderer = Renderer(rendered(tokens=[1, 2, IMAGE, IMAGE, IMAGE, 3], ranges=((2, 3),)))
    llm = llm_with(renderer)
    outs = await collect(engine(llm), request(item(2, 3, red), tokens=[1, 2, IMAGE, IMAGE, IMAGE, 3]))
    assert outs[-1].usage.prompt_tokens == 6
    (prompt,) = renderer.prompts
    assert prompt["prompt_token_ids"] == [1, 2, IMAGE, 3]
    assert prompt["multi_modal_uuids"] == {"image": [hashlib.sha256(red).hexdigest()]}
    assert [im.size for im in prompt["multi_modal_data"]["image"]] == [(8, 6)]
    assert llm.calls[0]["prompt"] is renderer.result  # rendered once, not processed again by generate


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("images", "renderer", "req", "needle"),
    [
        (False, Renderer(), request(item(2, 3)), "takes no images"),
        (True, Renderer(), request(item(2, 3, modality="audio")), "passes images only"),
        (True, Renderer(), request(item(2, 3, b"not a png")), "not an image Pillow can decode"),
        (
            True,
            Renderer(error=RuntimeError("Expected there to be 1 prompt updates")),
            None,
            "could not process",
        ),
        (True, Renderer(error=ValueError("At most 0 image(s) may be provided")), None, "At most 0 image"),
        (True, Renderer(rendered(ranges=((2, 5),))), None, "vLLM's processor for this model makes 5"),
    ],
    ids=["text-model", "audio", "broken-image", "no-placeholder", "over-limit", "miscounted"],
)
async def test_media_vllm_cannot_take_is_a_bad_request_before_generation(images, renderer, req, needle):
    llm = llm_with(renderer)
    e = engine(llm, images=images)
    req = req or request(item(2, 3, png()), tokens=PROMPT)
    with pytest.raises(EngineError, match=needle) as err:
        await collect(e, req)
    assert err.value.code == "bad_request" and not llm.calls and not e._live


@pytest.mark.anyio
async def test_a_text_request_skips_the_renderer():
    renderer = Renderer()
    llm = llm_with(renderer)
    await collect(engine(llm), GenerateRequest("t", [1, 2, 3]))
    assert llm.calls[0]["prompt"] == {"prompt_token_ids": [1, 2, 3]} and not renderer.prompts
