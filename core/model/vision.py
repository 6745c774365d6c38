"""What a vision-language model's files say about its images: the placeholder a chat template
writes for an image, its token id, and how many placeholder tokens one image becomes in the
prompt the engine sees (``ImageTokens``).

Read as the LLaVA family's processors compute it (transformers' ``LlavaProcessor``): an image
resized to the image processor's crop size (else its size) becomes ``(height // patch_size) *
(width // patch_size) + num_additional_image_tokens`` tokens, one fewer with the ``default``
feature-select strategy (the CLS feature is dropped); a processor config that states
``image_seq_length`` is taken at its word, and without a processor config the vision tower's
``image_size`` and ``patch_size`` give ``(image_size // patch_size) ** 2``. Models whose count
depends on each image's own size (Qwen2-VL's dynamic resolution, LLaVA-NeXT's tiles) are not
read here: ``image_tokens`` returns None for a model it cannot read, and such a model is served
as text only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dyn.core.model.info import ModelInfo, read_model_json, token_content


@dataclass(frozen=True, slots=True)
class ImageTokens:
    """``token``: what a chat template writes for one image; ``token_id``: its id; ``count``: how
    many times the engine's prompt repeats it for one image."""

    token: str
    token_id: int
    count: int


def image_tokens(info: ModelInfo) -> ImageTokens | None:
    """The model's image placeholder, or None when it takes no images (or none dyn can count)."""
    where = str(info.path)
    config = read_model_json(where, info.path / "config.json", required=False) or {}
    processor: dict[str, Any] = {}
    image_processor: dict[str, Any] = {}
    for directory in dict.fromkeys((info.tokenizer_dir, info.path)):
        processor = processor or read_model_json(where, directory / "processor_config.json", False) or {}
        image_processor = (
            image_processor or read_model_json(where, directory / "preprocessor_config.json", False) or {}
        )
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return None
    token_id = _int(config.get("image_token_index", config.get("image_token_id")))
    token = token_content(processor.get("image_token")) or "<image>"
    if token_id is None:
        return None
    count = _count(vision, processor, image_processor, config)
    if count is None or count <= 0:
        return None
    return ImageTokens(token, token_id, count)


def _count(
    vision: dict[str, Any], processor: dict[str, Any], image_processor: dict[str, Any], config: dict[str, Any]
) -> int | None:
    stated = _int(processor.get("image_seq_length"))
    if stated is not None:
        return stated
    patch = _int(processor.get("patch_size", vision.get("patch_size")))
    if patch is None or patch <= 0:
        return None
    height, width = _image_size(image_processor, vision)
    if height is None or width is None:
        return None
    if not processor:
        return (height // patch) * (width // patch)
    extra = _int(processor.get("num_additional_image_tokens")) or 0
    strategy = processor.get("vision_feature_select_strategy", config.get("vision_feature_select_strategy"))
    return (height // patch) * (width // patch) + extra - (1 if strategy == "default" else 0)


def _image_size(image_processor: dict[str, Any], vision: dict[str, Any]) -> tuple[int | None, int | None]:
    """The processed image's (height, width): the crop size when the processor crops, else its
    resize target, else the vision tower's ``image_size``."""
    for key in ("crop_size", "size"):
        if key == "crop_size" and image_processor.get("do_center_crop") is False:
            continue
        value = image_processor.get(key)
        if isinstance(value, dict):
            height = _int(value.get("height", value.get("shortest_edge")))
            width = _int(value.get("width", value.get("shortest_edge")))
            if height and width:
                return height, width
        elif (side := _int(value)) is not None:
            return side, side
    side = _int(vision.get("image_size"))
    return side, side


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
