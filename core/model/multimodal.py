"""The media a model takes, by modality: each modality's placeholder rule (``ImageTokens`` from
``dyn.core.model.vision``, ``AudioTokens`` from ``dyn.core.model.audio``, ``VideoTokens`` from
``dyn.core.model.video``), read once from the model's files. The rules answer the same questions:
``token`` and ``token_id`` (the placeholder that repeats), ``placeholder`` (what a template that
reads text writes for one item) and ``tokens_for(item)`` (how many placeholder tokens a loaded item
becomes, or one of ``COUNT_ERRORS`` saying why the model cannot take it); ``placeholder_ids`` is
what an item becomes in the prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dyn.core.errors import ConfigError
from dyn.core.model.audio import AudioLengthError, AudioTokens, audio_tokens
from dyn.core.model.image_layouts import ImageSizeError
from dyn.core.model.info import ModelInfo
from dyn.core.model.video import VideoLengthError, VideoTokens, video_tokens
from dyn.core.model.vision import GLM4V_FAMILIES, QWEN_VL_FAMILIES, ImageTokens, image_tokens, vision_family

PlaceholderRule = ImageTokens | AudioTokens | VideoTokens
COUNT_ERRORS = (ImageSizeError, AudioLengthError, VideoLengthError)


@dataclass(frozen=True, slots=True)
class MediaProcessing:
    """How the engine processes media beyond what the model's files say, as vLLM takes it:
    ``processor_kwargs`` (``--mm-processor-kwargs``) replace the image and video processors'
    settings (``{"max_pixels": 1003520}``), and ``media_io_kwargs`` (``--media-io-kwargs``) say
    how each modality is loaded (``{"video": {"fps": 1}}``: the frames vLLM's loader samples).
    A worker must be started with the same (``dyn serve`` hands them to both)."""

    processor_kwargs: Mapping[str, Any] = field(default_factory=dict)
    media_io_kwargs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def parse(cls, processor_kwargs: str | None, media_io_kwargs: str | None) -> MediaProcessing:
        """From the flags' JSON text; ``ConfigError`` naming the flag for anything but a JSON
        object (of objects, by modality, for ``--media-io-kwargs``)."""
        processing = _json_object("--mm-processor-kwargs", processor_kwargs)
        loading = _json_object("--media-io-kwargs", media_io_kwargs)
        for modality, options in loading.items():
            if not isinstance(options, dict):
                raise ConfigError(
                    f"--media-io-kwargs: {modality!r} must map to an object of options "
                    f'(\'{{"video": {{"fps": 1}}}}\'), got {options!r}'
                )
        return cls(processing, loading)


def _json_object(flag: str, text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{flag}: not JSON ({exc}); give a JSON object") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{flag}: give a JSON object, got {text!r}")
    return value


def placeholder_rules(
    info: ModelInfo, processing: MediaProcessing | None = None
) -> dict[str, PlaceholderRule]:
    """``{modality: rule}`` for each modality the model takes, as ``processing`` processes them;
    empty for a text-only model."""
    processing = processing or MediaProcessing()
    overrides = processing.processor_kwargs
    rules: dict[str, PlaceholderRule] = {}
    if (image := image_tokens(info, overrides)) is not None:
        rules["image"] = image
    if (audio := audio_tokens(info)) is not None:
        rules["audio"] = audio
    if (video := video_tokens(info, overrides, processing.media_io_kwargs.get("video"))) is not None:
        rules["video"] = video
    return rules


def uncounted_modalities(info: ModelInfo, rules: dict[str, PlaceholderRule]) -> dict[str, str]:
    """``{modality: family}`` for what the model takes but ``rules`` (its ``placeholder_rules``)
    cannot count (not built), so a request with such media says so instead of calling the model
    text-only."""
    family = vision_family(info)
    uncounted = {"image": family} if family is not None and "image" not in rules else {}
    if family in QWEN_VL_FAMILIES | GLM4V_FAMILIES and "video" not in rules:  # one that takes video
        uncounted["video"] = family
    return uncounted


def placeholder_ids(
    rule: PlaceholderRule, item: Any, count: int, encode: Callable[[str], list[int]]
) -> list[int]:
    """The tokens a loaded ``item`` becomes in the prompt under its modality's ``rule``, given its
    ``count`` (``rule.tokens_for(item)``): the placeholder token repeated ``count`` times, or, for
    an image a rule writes as text around its tokens (Idefics3's tiles), that text tokenized by
    ``encode`` (without special tokens added), or, for a clip written with its frames' times
    (Qwen3-VL's), its ``ids_for``. Raises one of ``COUNT_ERRORS`` for an item the model cannot
    take."""
    if isinstance(rule, VideoTokens):
        ids = rule.ids_for(item, encode)
        return ids if ids is not None else [rule.token_id] * count
    text = rule.text_for(item) if isinstance(rule, ImageTokens) else None
    if text is not None:
        return encode(text)
    return [rule.token_id] * count
