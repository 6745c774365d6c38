"""The media a model takes, by modality: each modality's placeholder rule (``ImageTokens`` from
``dyn.core.model.vision``, ``AudioTokens`` from ``dyn.core.model.audio``, ``VideoTokens`` from
``dyn.core.model.video``), read once from the model's files. The rules answer the same questions:
``token`` and ``token_id`` (the placeholder that repeats), ``placeholder`` (what a template that
reads text writes for one item) and ``tokens_for(item)`` (how many placeholder tokens a loaded item
becomes, or one of ``COUNT_ERRORS`` saying why the model cannot take it); ``placeholder_ids`` is
what an item becomes in the prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dyn.core.model.audio import AudioLengthError, AudioTokens, audio_tokens
from dyn.core.model.info import ModelInfo
from dyn.core.model.video import VideoLengthError, VideoTokens, video_tokens
from dyn.core.model.vision import QWEN_VL_FAMILIES, ImageSizeError, ImageTokens, image_tokens, vision_family

PlaceholderRule = ImageTokens | AudioTokens | VideoTokens
COUNT_ERRORS = (ImageSizeError, AudioLengthError, VideoLengthError)


def placeholder_rules(info: ModelInfo) -> dict[str, PlaceholderRule]:
    """``{modality: rule}`` for each modality the model takes; empty for a text-only model."""
    rules: dict[str, PlaceholderRule] = {}
    if (image := image_tokens(info)) is not None:
        rules["image"] = image
    if (audio := audio_tokens(info)) is not None:
        rules["audio"] = audio
    if (video := video_tokens(info)) is not None:
        rules["video"] = video
    return rules


def uncounted_modalities(info: ModelInfo, rules: dict[str, PlaceholderRule]) -> dict[str, str]:
    """``{modality: family}`` for what the model takes but ``rules`` (its ``placeholder_rules``)
    cannot count (not built), so a request with such media says so instead of calling the model
    text-only."""
    family = vision_family(info)
    uncounted = {"image": family} if family is not None and "image" not in rules else {}
    if family in QWEN_VL_FAMILIES and "video" not in rules:  # a Qwen2-VL-family model without a video token
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
