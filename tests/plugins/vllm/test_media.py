"""``plugins.vllm.media`` and ``VllmEngine``'s image and audio path against stand-ins shaped like
vLLM 0.32's ``ModelConfig``, multimodal processor and ``AsyncLLM.renderer.render_cmpl_async`` (the
real thing: tests/plugins/vllm/test_real_vllm_multimodal.py, test_real_vllm_audio.py)."""

from __future__ import annotations

import hashlib
import io
from types import SimpleNamespace

import msgspec
import pytest

from dyn.core.engine import FEATURE_CLASSIFY, FEATURE_EMBED, FEATURE_MEDIA, FEATURE_POOLING_ONLY, EngineError
from dyn.core.messages import GenerateRequest, MediaItem
from dyn.plugins.vllm import media
from dyn.plugins.vllm.config import VllmConfig
from dyn.plugins.vllm.engine import VllmApi, VllmEngine
from tests.plugins.vllm.test_engine_requests import FakeLLM, delta

IMAGE = 4096
AUDIO = 4097
PROMPT = [1, 2, IMAGE, IMAGE, IMAGE, 3, IMAGE, IMAGE, IMAGE, 4]
"""Two images of 3 placeholder tokens each, at 2 and 6."""
MIXED = [1, AUDIO, AUDIO, 2, IMAGE, IMAGE, IMAGE, 3, AUDIO, 4]
"""An audio clip of 2 placeholder tokens at 1, an image of 3 at 4, a clip of 1 at 8."""
MIMES = {"image": "image/png", "audio": "audio/wav", "video": "video/mp4"}


def item(offset=2, length=3, data=b"png-bytes", modality="image", mm_hash=None) -> MediaItem:
    mime = MIMES[modality]
    return MediaItem(modality, data, mime, mm_hash or hashlib.sha256(data).hexdigest(), offset, length)


def mixed_items(first=b"clip-1", image=b"png", second=b"clip-2") -> list[MediaItem]:
    """``MIXED``'s items, in prompt order."""
    return [item(1, 2, first, "audio"), item(4, 3, image), item(8, 1, second, "audio")]


def request(*media_items: MediaItem, tokens=PROMPT) -> GenerateRequest:
    return GenerateRequest("r1", list(tokens), media=list(media_items))


def png(color=(255, 0, 0)) -> bytes:
    image = pytest.importorskip("PIL.Image")
    buf = io.BytesIO()
    image.new("RGB", (8, 6), color).save(buf, "PNG")
    return buf.getvalue()


def wav(samples=1600, rate=16000, channels=1, seed=0, fmt="WAV", subtype="PCM_16") -> bytes:
    """A clip of ``samples`` frames of noise, a WAV file of 16-bit PCM unless ``fmt`` and
    ``subtype`` (soundfile's names) say otherwise."""
    np = pytest.importorskip("numpy")
    soundfile = pytest.importorskip("soundfile")
    noise = np.random.default_rng(seed).uniform(-0.5, 0.5, (samples, channels)).astype(np.float32)
    buf = io.BytesIO()
    soundfile.write(buf, noise, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def placeholder(offset: int, length: int) -> SimpleNamespace:
    """Stands for vllm.multimodal.inputs.PlaceholderRange."""
    return SimpleNamespace(offset=offset, length=length)


def rendered(tokens=PROMPT, ranges=((2, 3), (6, 3)), audio=None) -> dict:
    """vLLM's rendered ``MultiModalInput`` as ``render_cmpl_async`` returns it: ``ranges`` the
    images', ``audio`` the clips' (none when ``None``)."""
    placeholders = {"image": [placeholder(*r) for r in ranges]} if ranges else {}
    if audio is not None:
        placeholders["audio"] = [placeholder(*r) for r in audio]
    return {"type": "multimodal", "prompt_token_ids": list(tokens), "mm_placeholders": placeholders}


# ------------------------------------------------------------------ the model


def model_config(*, multimodal=True, enc_dec=False, image_limit=999, audio_limit=999, hf=None):
    limit = {"image": image_limit, "audio": audio_limit}
    limits = SimpleNamespace(get_limit_per_prompt=lambda modality: limit.get(modality, 999))
    return SimpleNamespace(
        is_multimodal_model=multimodal,
        is_encoder_decoder=enc_dec,
        multimodal_config=limits if multimodal else None,
        hf_config=hf or SimpleNamespace(image_token_index=IMAGE, audio_token_index=AUDIO),
        runner_type="generate",
    )


def processor(*modalities, rate=16000.0, method="torchaudio"):
    """Stands for the renderer's multimodal processor: its info's supported modalities and data
    parser (with its audio resampler)."""
    resampler = SimpleNamespace(target_sr=rate, method=method)
    info = SimpleNamespace(
        get_supported_mm_limits=lambda: dict.fromkeys(modalities),
        data_parser=SimpleNamespace(audio_resampler=resampler),
    )
    return SimpleNamespace(info=info)


@pytest.mark.parametrize(
    ("config", "mm_processor", "takes"),
    [
        (model_config(), processor("image"), ["image"]),
        (model_config(), None, ["image", "audio", "video"]),  # no renderer to ask: the model config decides
        (model_config(multimodal=False), None, []),
        (model_config(), processor("audio"), ["audio"]),  # Qwen2-Audio
        (model_config(), processor("audio", "image", "video"), ["image", "audio", "video"]),  # an omni model
        (
            model_config(image_limit=0),
            processor("image"),
            [],
        ),  # --limit-mm-per-prompt / --language-model-only
        (model_config(audio_limit=0), processor("image", "audio"), ["image"]),
        (model_config(enc_dec=True), processor("image"), []),
        (model_config(enc_dec=True), processor("audio"), []),  # Whisper
    ],
    ids=[
        "vision",
        "no-renderer",
        "text",
        "audio-only",
        "omni",
        "images-off",
        "audio-off",
        "encoder-decoder",
        "whisper",
    ],
)
def test_a_model_takes_what_its_processor_handles_when_vllm_says_it_is_multimodal(
    config, mm_processor, takes
):
    assert media.modalities(config, mm_processor) == takes


def test_the_placeholder_tokens_come_from_the_hugging_face_config():
    assert media.placeholder_token(SimpleNamespace(image_token_index=32000), "image") == 32000  # LLaVA
    assert media.placeholder_token(SimpleNamespace(image_token_id=151655), "image") == 151655  # Qwen2-VL
    assert (
        media.placeholder_token(SimpleNamespace(audio_token_index=151646), "audio") == 151646
    )  # Qwen2-Audio
    assert media.placeholder_token(SimpleNamespace(audio_token_id=151646), "audio") == 151646
    assert media.placeholder_token(SimpleNamespace(image_token_index=32000), "audio") is None
    assert media.placeholder_token(SimpleNamespace(), "image") is None


def test_the_audio_resampler_is_read_from_the_processors_data_parser():
    assert media.audio_resampling(processor("audio")) == (16000.0, "torchaudio")
    assert media.audio_resampling(None) == (None, None)


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
    assert vision.info.features == [FEATURE_MEDIA] and vision._media == {"image": IMAGE}
    hearing = VllmEngine(VllmConfig(), "/m")
    await hearing._read_features(
        SimpleNamespace(
            vllm_config=SimpleNamespace(model_config=model_config()),
            renderer=SimpleNamespace(mm_processor=processor("audio", rate=24000.0)),
        )
    )
    assert hearing.info.features == [FEATURE_MEDIA] and hearing._media == {"audio": AUDIO}
    assert hearing._audio_resampling == (24000.0, "torchaudio")
    text = VllmEngine(VllmConfig(), "/m")
    await text._read_features(
        SimpleNamespace(vllm_config=SimpleNamespace(model_config=model_config(multimodal=False)))
    )
    assert text.info.features == [] and not text._media
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
    assert media.collapse(PROMPT, items, {"image": IMAGE}) == [1, 2, IMAGE, 3, IMAGE, 4]
    # no token known: the span's first token
    assert media.collapse(PROMPT, items, {"image": None}) == [1, 2, IMAGE, 3, IMAGE, 4]
    assert media.collapse(PROMPT, items, {}) == [1, 2, IMAGE, 3, IMAGE, 4]
    assert media.collapse([7, 8, 9, 5], [item(1, 2)], {"image": 99}) == [7, 99, 5]


def test_each_span_collapses_to_its_own_modalitys_placeholder():
    placeholders = {"image": IMAGE, "audio": AUDIO}
    assert media.collapse(MIXED, mixed_items(), placeholders) == [1, AUDIO, 2, IMAGE, 3, AUDIO, 4]
    assert media.collapse([7, 8, 9, 6, 5], [item(1, 2, modality="audio"), item(3, 1)], {"audio": 42}) == [
        7,
        42,
        6,
        5,
    ]


def test_a_span_with_a_source_collapses_to_it_and_a_shared_token_to_neither():
    """Gemma 3's images (``MediaItem.source``): the template's newline merged into the first
    span's start comes back, and the newline-pair token two neighbours share goes with both."""
    nl3, nl4, boi = 101, 102, 50
    tokens = [7, nl3, boi, 9, 9, nl4, boi, 9, 9, 8]
    first = msgspec.structs.replace(item(1, 5), source=[100, boi])
    second = msgspec.structs.replace(item(5, 5), source=[boi])
    assert media.collapse(tokens, [first, second], {"image": 99}) == [7, 100, boi, boi]
    tail = msgspec.structs.replace(item(1, 4), source=[100, boi])
    assert media.collapse(tokens[:-1], [tail, item(5, 4)], {"image": 99}) == [7, 100, boi, 99]


def test_the_prompt_carries_the_images_and_their_mm_hash_as_uuids():
    items = [item(2, 3, b"a"), item(6, 3, b"b")]
    fields = media.prompt_fields(request(*items), {"image": ["image-a", "image-b"]}, {"image": IMAGE})
    assert fields == {
        "prompt_token_ids": [1, 2, IMAGE, 3, IMAGE, 4],
        "multi_modal_data": {"image": ["image-a", "image-b"]},
        "multi_modal_uuids": {"image": [hashlib.sha256(b"a").hexdigest(), hashlib.sha256(b"b").hexdigest()]},
    }


def test_the_prompt_carries_each_modalitys_items_and_uuids_in_prompt_order():
    decoded = {"audio": ["clip-1", "clip-2"], "image": ["png"]}
    fields = media.prompt_fields(
        request(*mixed_items(), tokens=MIXED), decoded, {"image": IMAGE, "audio": AUDIO}
    )
    sha = [hashlib.sha256(data).hexdigest() for data in (b"clip-1", b"png", b"clip-2")]
    assert fields == {
        "prompt_token_ids": [1, AUDIO, 2, IMAGE, 3, AUDIO, 4],
        "multi_modal_data": decoded,
        "multi_modal_uuids": {"audio": [sha[0], sha[2]], "image": [sha[1]]},
    }


@pytest.mark.parametrize(
    ("items", "needle"),
    [
        ([item(mm_hash="ABC")], "mm_hash must be 64 lowercase hex"),
        ([item(8, 3)], "inside the 10-token prompt"),
        ([item(2, 0)], "must be non-empty"),
        ([item(6, 3), item(2, 3)], "after the previous item's"),
        ([item(2, 3), item(3, 3)], "after the previous item's"),  # two tokens shared
        ([msgspec.structs.replace(item(2, 3), source=[1] * 17)], "source is 17 tokens, at most 16"),
    ],
    ids=["hash", "past-the-end", "empty", "out-of-order", "overlap", "source"],
)
def test_media_the_worker_cannot_pass_is_refused_with_a_reason(items, needle):
    with pytest.raises(media.MediaError, match=needle):
        media.check_media(request(*items))


def test_well_formed_spans_pass():
    media.check_media(request(item(2, 3), item(6, 3)))
    media.check_media(request(item(2, 3), item(4, 3)))  # Gemma 3's neighbours share a newline
    media.check_media(request(item(0, 10, b"whole")))
    media.check_media(request(item(2, 3, modality="audio")))
    media.check_media(request(item(2, 3, modality="video")))
    media.check_media(request(*mixed_items(), tokens=MIXED))


def test_a_modality_the_model_does_not_take_is_named():
    media.check_taken(request(*mixed_items(), tokens=MIXED), ["image", "audio"], "/m")
    with pytest.raises(media.MediaError, match=r"model \(/m\) takes no audio: send requests with audio"):
        media.check_taken(request(*mixed_items(), tokens=MIXED), ["image"], "/m")
    with pytest.raises(
        media.MediaError, match="takes no images: send requests with media to a worker serving"
    ):
        media.check_taken(request(item()), ["audio"], "/m")


def test_images_decode_with_pillow_and_a_broken_one_is_named():
    red, blue = png((255, 0, 0)), png((0, 0, 255))
    images = media.decode([item(data=red), item(data=blue)])["image"]
    assert [im.size for im in images] == [(8, 6), (8, 6)]
    assert images[1].getpixel((0, 0))[:3] == (0, 0, 255)
    with pytest.raises(media.MediaError, match=r"media item 1 \(image/png\): not an image Pillow can decode"):
        media.decode([item(data=red), item(data=red[:40])])


def test_audio_decodes_to_float_samples_at_its_own_rate_in_vllms_layout():
    np = pytest.importorskip("numpy")
    mono, stereo = wav(1600, 16000), wav(800, 8000, channels=2)
    decoded = media.decode(
        [item(data=mono, modality="audio"), item(data=png()), item(data=stereo, modality="audio")]
    )
    assert list(decoded) == ["audio", "image"]  # by modality, each in prompt order
    (samples, rate), (both, rate2) = decoded["audio"]
    assert (samples.shape, samples.dtype, rate) == ((1600,), np.float32, 16000)  # one channel: 1-D
    assert (both.shape, rate2) == ((2, 800), 8000)  # (channels, samples), as vLLM resamples and mixes
    assert both.flags.c_contiguous and 0 < np.abs(samples).max() <= 0.5


@pytest.mark.parametrize(
    ("fmt", "subtype"), [("WAV", "PCM_16"), ("FLAC", "PCM_16"), ("OGG", "VORBIS"), ("MP3", "MPEG_LAYER_III")]
)
def test_the_formats_clients_send_decode(fmt, subtype):
    ((samples, rate),) = media.decode(
        [item(data=wav(16000, 24000, fmt=fmt, subtype=subtype), modality="audio")]
    )["audio"]
    assert (samples.shape, rate) == ((16000,), 24000)


def test_a_clip_soundfile_cannot_read_is_named():
    good = wav()
    with pytest.raises(media.MediaError, match=r"media item 1 \(audio/wav\): not audio soundfile can decode"):
        media.decode([item(data=good, modality="audio"), item(data=b"RIFF not a wav", modality="audio")])
    with pytest.raises(media.MediaError, match=r"media item 0 \(audio/wav\): not audio soundfile"):
        media.decode([item(data=good[:30], modality="audio")])  # a header cut short
    with pytest.raises(media.MediaError, match=r"media item 0 \(audio/wav\): the clip holds no samples"):
        media.decode([item(data=wav(0), modality="audio")])


def test_a_clip_vllm_cannot_resample_is_named_with_the_rate_to_send():
    items = [item(1, 2, b"a", "audio"), item(4, 3, b"i"), item(8, 1, b"b", "audio")]
    req = request(*items, tokens=MIXED)
    decoded = {"audio": [("samples", 16000), ("samples", 8000)], "image": ["png"]}
    error = media.resample_error(req, decoded, (16000.0, "torchaudio"))
    assert str(error) == (
        "media item 2 is 8000 Hz audio; the model takes 16000 Hz, and vLLM's audio resampler "
        "(torchaudio) is not installed in this worker's environment: send audio sampled at 16000 Hz"
    )
    # every clip at the model's rate: the ImportError is not the resampler's
    assert media.resample_error(req, {"audio": [("s", 16000), ("s", 16000)]}, (16000.0, "torchaudio")) is None
    unknown = media.resample_error(req, decoded, (None, None))
    assert (
        "media item 0 is 16000 Hz audio, media item 2 is 8000 Hz audio; the model takes its sampling"
        in str(unknown)
    )


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


def test_vllms_expansion_is_checked_modality_by_modality():
    mixed = request(*mixed_items(), tokens=MIXED)
    media.check_expansion(mixed, rendered(MIXED, ((4, 3),), audio=((8, 1), (1, 2))))  # any order
    with pytest.raises(
        media.MediaError, match="audio clip 1: the request has 1 placeholder tokens at position 8, vLLM's"
    ):
        media.check_expansion(mixed, rendered(MIXED, ((4, 3),), audio=((1, 2), (8, 2))))
    with pytest.raises(media.MediaError, match="vLLM placed 1 audio clips in the prompt, the request has 2"):
        media.check_expansion(mixed, rendered(MIXED, ((4, 3),), audio=((1, 2),)))
    with pytest.raises(media.MediaError, match="vLLM placed 0 images in the prompt, the request has 1"):
        media.check_expansion(mixed, rendered(MIXED, (), audio=((1, 2), (8, 1))))
    with pytest.raises(media.MediaError, match="vLLM placed 0 audio clips in the prompt, the request has 2"):
        media.check_expansion(mixed, rendered(MIXED, ((4, 3),)))
    # an image where the request has an audio clip: the clips are checked first (the first item's)
    with pytest.raises(
        media.MediaError, match="audio clip 0: the request has 2 placeholder tokens at position 1"
    ):
        media.check_expansion(mixed, rendered(MIXED, ((1, 2), (4, 3)), audio=((8, 1),)))


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


def engine(llm: FakeLLM, *, takes=("image",), resampling=(16000.0, "torchaudio")) -> VllmEngine:
    e = VllmEngine(VllmConfig(), "/models/m")
    e._llm = llm
    e._api = VllmApi(
        sampling_params=lambda **kw: kw,
        tokens_prompt=lambda **kw: kw,
        delta="DELTA",
        client_errors=(),
        structured_outputs=lambda **kw: kw,
    )
    e._media = {m: {"image": IMAGE, "audio": AUDIO}[m] for m in takes}
    e._audio_resampling = resampling
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
async def test_a_request_with_audio_and_an_image_reaches_vllm_with_both_in_prompt_order():
    first, image, second = wav(1600, seed=1), png(), wav(3200, 8000, channels=2, seed=2)
    renderer = Renderer(rendered(MIXED, ((4, 3),), audio=((1, 2), (8, 1))))
    llm = llm_with(renderer)
    outs = await collect(
        engine(llm, takes=("image", "audio")), request(*mixed_items(first, image, second), tokens=MIXED)
    )
    assert outs[-1].usage.prompt_tokens == len(MIXED)
    (prompt,) = renderer.prompts
    assert prompt["prompt_token_ids"] == [1, AUDIO, 2, IMAGE, 3, AUDIO, 4]
    sha = [hashlib.sha256(data).hexdigest() for data in (first, image, second)]
    assert prompt["multi_modal_uuids"] == {"audio": [sha[0], sha[2]], "image": [sha[1]]}
    clips = prompt["multi_modal_data"]["audio"]
    assert [(samples.shape, rate) for samples, rate in clips] == [((1600,), 16000), ((2, 3200), 8000)]
    assert [im.size for im in prompt["multi_modal_data"]["image"]] == [(8, 6)]
    assert llm.calls[0]["prompt"] is renderer.result


def clip_request(data=None) -> GenerateRequest:
    """One audio clip (16 kHz WAV unless ``data``) of 3 placeholder tokens at 2."""
    return request(
        item(2, 3, wav() if data is None else data, "audio"), tokens=[1, 2, AUDIO, AUDIO, AUDIO, 3]
    )


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("takes", "renderer", "req", "needle"),
    [
        ((), Renderer(), request(item(2, 3)), "takes no images"),
        (("image",), Renderer(), request(item(2, 3, modality="audio")), "takes no audio"),
        (("audio",), Renderer(), request(item(2, 3)), "takes no images"),
        (
            ("image", "audio"),
            Renderer(),
            request(item(2, 3, modality="video")),
            "takes no video: send requests with videos to a worker serving a video-language model",
        ),
        (("image",), Renderer(), request(item(2, 3, b"not a png")), "not an image Pillow can decode"),
        (("audio",), Renderer(), clip_request(b"not a wav"), "not audio soundfile can decode"),
        (
            ("image",),
            Renderer(error=RuntimeError("Expected there to be 1 prompt updates")),
            None,
            "could not process",
        ),
        (
            ("image",),
            Renderer(error=ValueError("At most 0 image(s) may be provided")),
            None,
            "At most 0 image",
        ),
        (("image",), Renderer(rendered(ranges=((2, 5),))), None, "vLLM's processor for this model makes 5"),
        (
            ("audio",),
            Renderer(error=ValueError("The audio (len=161) is too short to be represented inside the model")),
            clip_request(),
            "could not process the request's media: The audio .len=161. is too short",
        ),
        (
            ("audio",),
            Renderer(error=ModuleNotFoundError("No module named 'torchaudio'")),
            clip_request(wav(800, 8000)),
            "media item 0 is 8000 Hz audio; the model takes 16000 Hz, and vLLM's audio resampler .torchaudio.",
        ),
        (
            ("audio",),
            Renderer(error=ImportError("No module named 'librosa'")),
            clip_request(),
            "could not process the request's media: ImportError: No module named 'librosa'",
        ),
        (
            ("audio",),
            Renderer(rendered([1, 2, *[AUDIO] * 4, 3], (), audio=((2, 4),))),
            clip_request(),
            "audio clip 0: the request has 3 placeholder tokens at position 2, vLLM's processor for this model makes 4",
        ),
    ],
    ids=[
        "text-model",
        "audio-to-vision-model",
        "image-to-audio-model",
        "video",
        "broken-image",
        "broken-clip",
        "no-placeholder",
        "over-limit",
        "miscounted",
        "clip-too-short",
        "no-resampler",
        "other-import-error",
        "miscounted-clip",
    ],
)
async def test_media_vllm_cannot_take_is_a_bad_request_before_generation(takes, renderer, req, needle):
    llm = llm_with(renderer)
    e = engine(llm, takes=takes)
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
