"""What a vision-language model's files say about its images: the placeholder a chat template
writes for an image, its token id, and how many placeholder tokens one image becomes in the
prompt the engine sees (``ImageTokens``).

Which rule a family's images follow, and how each rule counts and writes an image, is in
``dyn.core.model.image_layouts``: the LLaVA count, the Qwen2-VL family's dynamic resolution,
LLaVA-NeXT's tiles, Idefics3's and SmolVLM's split tiles, Gemma 3's pan and scan (and its merged
newlines, ``dyn.core.model.newlines``), the rows of Mistral 3 and Pixtral-12B, Llama 4's canvas of
tiles. A rule's settings come from the model's config, its processor's and image processor's
files, and vLLM's ``--mm-processor-kwargs`` over them.

Only these families are read (their ``model_type``s are listed below). Every other family with a
vision tower writes its images by a rule not read here (Pixtral's own format, InternVL's tiles,
LLaVA-OneVision's pooled tiles, Mllama's cross attention, ...): ``image_tokens`` returns None for
it rather than guess a count, and a request with an image for it is refused, naming the family
(``vision_family``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dyn.core.errors import ConfigError
from dyn.core.model.image_layouts import (
    MAX_IMAGE_SIDE,
    MAX_PINPOINTS,
    MAX_SPLIT_TILES,
    MAX_TILES,
    AnyResolution,
    ClosestGrid,
    DynamicResolution,
    ImageLayout,
    ImageSizeError,
    PanAndScan,
    PatchRows,
    SplitTiles,
    TiledCanvas,
)
from dyn.core.model.info import ModelInfo, read_processor_files, token_content


@dataclass(frozen=True, slots=True)
class ImageTokens:
    """``token``: the placeholder token one image's tokens repeat; ``token_id``: its id;
    ``count``: how many times for one image (a fixed count), unless ``dynamic`` counts by the
    image's size (``count_for``); ``text``: what a template that reads text writes for an image
    (the token, or the family's wrapped form). With a ``SplitTiles``, ``PatchRows``,
    ``TiledCanvas`` or ``PanAndScan`` rule an image is written as text around its tokens
    (``text_for``), and ``count_for`` counts only its image tokens. ``merges_newlines``: the newlines the image is written with merge with the
    prompt's own (Gemma 3's; ``dyn.core.model.newlines``)."""

    token: str
    token_id: int
    count: int
    dynamic: ImageLayout | None = None
    text: str = ""
    merges_newlines: bool = False

    @property
    def placeholder(self) -> str:
        return self.text or self.token

    def count_for(self, width: int | None, height: int | None) -> int:
        """Placeholder tokens of a ``width`` x ``height`` image (``ImageSizeError`` for one the
        model refuses)."""
        if self.dynamic is None:
            return self.count
        if width is None or height is None:
            raise ImageSizeError("the image's size is unknown")
        return self.dynamic.count(width, height)

    def tokens_for(self, item: Any) -> int:
        """``count_for`` a loaded image (its ``width`` and ``height``)."""
        return self.count_for(item.width, item.height)

    def text_for(self, item: Any) -> str | None:
        """What a loaded image is written as in the prompt when the rule writes text around its
        tokens (every rule but ``DynamicResolution`` and ``AnyResolution``); None when the image
        is its placeholder token repeated."""
        if self.dynamic is None or isinstance(self.dynamic, DynamicResolution | AnyResolution):
            return None
        if item.width is None or item.height is None:
            raise ImageSizeError("the image's size is unknown")
        return self.dynamic.text(item.width, item.height)


def image_tokens(info: ModelInfo, overrides: Mapping[str, Any] | None = None) -> ImageTokens | None:
    """The model's image placeholder, or None when it takes no images (or none dyn can count).
    ``overrides``: settings that replace the image processor's (vLLM's ``--mm-processor-kwargs``:
    ``max_pixels``, ``do_image_splitting``, ...; ``overridden``)."""
    files = read_processor_files(info)
    config, processor = files.config, files.processor
    inner = processor.get("image_processor")
    image_processor = overridden(files.preprocessor or (inner if isinstance(inner, dict) else {}), overrides)
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return None
    family = config.get("model_type")
    if family in QWEN_VL_FAMILIES | GLM4V_FAMILIES and "spatial_merge_size" in vision:
        return _qwen_vl(config, vision, image_processor)
    if family == "gemma3":
        return _pan_and_scan(config, processor, overrides or {})
    if family == "mistral3" or (family == "llava" and vision.get("model_type") == "pixtral"):
        return _patch_rows(config, vision, processor, image_processor)
    if family == "llama4":
        return _tiled_canvas(config, vision, image_processor)
    if family == "internvl":
        return _closest_grid(config, vision, processor, image_processor)
    if family not in LLAVA_FAMILIES | SPLIT_FAMILIES:
        return None
    token_id = _int(config.get("image_token_index", config.get("image_token_id")))
    token = token_content(processor.get("image_token")) or "<image>"
    if token_id is None:
        return None
    if family in SPLIT_FAMILIES:
        split = _split_tiles(config, vision, processor, image_processor, token)
        return ImageTokens(token, token_id, 0, split) if split is not None else None
    if family == "llava_next":
        tiles = _any_resolution(config, vision, processor, image_processor)
        return ImageTokens(token, token_id, 0, tiles) if tiles is not None else None
    count = _count(vision, processor, image_processor, config)
    if count is None or count <= 0:
        return None
    return ImageTokens(token, token_id, count)


def overridden(settings: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """A processor's ``settings`` with ``overrides`` laid over them, as transformers takes a
    processor's keyword arguments over its saved config; a ``size`` given drops the saved
    ``min_pixels`` and ``max_pixels`` (which the readers here would otherwise prefer)."""
    merged = dict(settings)
    if overrides:
        if "size" in overrides:
            merged.pop("min_pixels", None)
            merged.pop("max_pixels", None)
        merged.update(overrides)
    return merged


def vision_family(info: ModelInfo) -> str | None:
    """The model's family (``model_type``) when it has a vision tower, counted or not; None for
    a model without one."""
    config = read_processor_files(info).config
    if not isinstance(config.get("vision_config"), dict):
        return None
    return str(config.get("model_type") or "unknown")


QWEN_VL_FAMILIES = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"})
"""The families of ``DynamicResolution`` (Qwen3.5's are served by vLLM with Qwen3-VL's processor)."""
GLM4V_FAMILIES = frozenset({"glm4v", "glm4v_moe"})
"""GLM-4.1V's and GLM-4.5V's: ``DynamicResolution`` over two frames (their video is not counted)."""
LLAVA_FAMILIES = frozenset({"llava", "llava_next"})
"""The families of the LLaVA count and of ``AnyResolution`` (``llava_next``)."""
SPLIT_FAMILIES = frozenset({"idefics3", "smolvlm"})
"""The families of ``SplitTiles``."""


def _patch_rows(
    config: dict[str, Any], vision: dict[str, Any], processor: dict[str, Any], image_processor: dict[str, Any]
) -> ImageTokens | None:
    """Pixtral's rule from the config (``image_token_index``, the tower's ``patch_size`` and
    ``image_size``, ``spatial_merge_size``), the processor's token names and, for Mistral 3, the
    image processor's longest edge; None for sizes that do not make sense."""
    token_id = _int(config.get("image_token_index"))
    patch, merge = _int(vision.get("patch_size")), _int(config.get("spatial_merge_size", 1))
    longest = _int(vision.get("image_size"))
    if config.get("model_type") == "mistral3":
        longest = _edge(image_processor.get("size"), longest)
    if token_id is None or not patch or not merge or not longest or min(patch, merge, longest) <= 0:
        return None
    rule = PatchRows(
        longest,
        patch * merge,
        token_content(processor.get("image_token")) or "[IMG]",
        token_content(processor.get("image_break_token")) or "[IMG_BREAK]",
        token_content(processor.get("image_end_token")) or "[IMG_END]",
    )
    return ImageTokens(rule.image, token_id, 0, rule)


MAX_CANVAS_TILES = 64
"""A Llama 4 model whose canvases may hold more tiles than this is not read (its images' text grows
with the tiles; Llama 4 Scout and Maverick hold 16)."""


def _tiled_canvas(
    config: dict[str, Any], vision: dict[str, Any], image_processor: dict[str, Any]
) -> ImageTokens | None:
    """Llama 4's rule from the config (``image_token_index``, the tower's ``image_size``,
    ``patch_size`` and ``pixel_shuffle_ratio``) and the image processor's ``max_patches`` and
    ``resize_to_max_canvas``; None for sizes that do not make sense."""
    token_id = _int(config.get("image_token_index"))
    tile, patch = _int(vision.get("image_size")), _int(vision.get("patch_size"))
    ratio = vision.get("pixel_shuffle_ratio", 0.5)
    max_tiles = _int(image_processor.get("max_patches", 16))
    if token_id is None or not tile or not patch or not max_tiles or min(tile, patch, max_tiles) <= 0:
        return None
    if not isinstance(ratio, int | float) or not 0 < ratio <= 1 or max_tiles > MAX_CANVAS_TILES:
        return None
    per_tile = (tile // patch) ** 2 // round(1 / ratio**2)
    if per_tile <= 0:
        return None
    rule = TiledCanvas(tile, max_tiles, per_tile, image_processor.get("resize_to_max_canvas") is True)
    return ImageTokens(rule.image, token_id, 0, rule)


def _closest_grid(
    config: dict[str, Any], vision: dict[str, Any], processor: dict[str, Any], image_processor: dict[str, Any]
) -> ImageTokens | None:
    """InternVL's rule from the config (``image_token_id``, ``image_seq_length``, else the tower's
    tile over its patches, pixel-shuffled by ``downsample_ratio``) and the image processor's tile
    ``size``, ``min_patches``, ``max_patches`` and ``crop_to_patches``; None for sizes that do not
    make sense or grids of over ``MAX_CANVAS_TILES`` tiles."""
    token_id = _int(config.get("image_token_id"))
    seq_len = _int(processor.get("image_seq_length")) or _int(config.get("image_seq_length"))
    size = image_processor.get("size")
    tile_height, tile_width = (
        (_int(size.get("height")), _int(size.get("width"))) if isinstance(size, dict) else (None, None)
    )
    low, high = _int(image_processor.get("min_patches", 1)), _int(image_processor.get("max_patches", 12))
    if token_id is None or not seq_len or not tile_height or not tile_width or low is None or high is None:
        return None
    if min(seq_len, tile_height, tile_width, low) <= 0 or not low <= high <= MAX_CANVAS_TILES:
        return None
    crop = image_processor.get("crop_to_patches") is True
    rule = ClosestGrid(tile_width, tile_height, low, high, seq_len, crop)
    return ImageTokens(rule.image, token_id, 0, rule)


GEMMA3_BOI = 255999
"""Gemma 3's ``<start_of_image>`` id, when its config does not say (``boi_token_index``)."""
PAN_AND_SCAN_SETTINGS = {
    "do_pan_and_scan": ("enabled", bool),
    "pan_and_scan_min_crop_size": ("min_crop", int),
    "pan_and_scan_max_num_crops": ("max_crops", int),
    "pan_and_scan_min_ratio_to_activate": ("min_ratio", float),
}
"""``--mm-processor-kwargs`` keys of Gemma 3's pan and scan: the ``PanAndScan`` field, its type."""


def _pan_and_scan(
    config: dict[str, Any], processor: dict[str, Any], overrides: Mapping[str, Any]
) -> ImageTokens | None:
    """Gemma 3's rule: the processor's ``image_seq_length`` (else the config's
    ``mm_tokens_per_image``, else 256) and pan and scan as ``overrides`` set it over the
    processor's defaults (``ConfigError`` for a setting of the wrong type or not positive)."""
    seq_len = _int(processor.get("image_seq_length")) or _int(config.get("mm_tokens_per_image")) or 256
    token_id = _int(config.get("boi_token_index"))
    if seq_len <= 0:
        return None
    settings = {
        name: _pan_and_scan_setting(key, overrides[key], kind)
        for key, (name, kind) in PAN_AND_SCAN_SETTINGS.items()
        if key in overrides
    }
    rule = PanAndScan(seq_len, **settings)
    return ImageTokens(rule.boi, GEMMA3_BOI if token_id is None else token_id, 0, rule, merges_newlines=True)


def _pan_and_scan_setting(key: str, value: Any, kind: type) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"--mm-processor-kwargs: {key} must be true or false, got {value!r}")
    allowed = (int, float) if kind is float else (int,)
    if isinstance(value, allowed) and not isinstance(value, bool) and value > 0:
        return kind(value)
    raise ConfigError(f"--mm-processor-kwargs: {key} must be a positive {kind.__name__}, got {value!r}")


def _split_tiles(
    config: dict[str, Any],
    vision: dict[str, Any],
    processor: dict[str, Any],
    image_processor: Any,
    token: str,
) -> SplitTiles | None:
    """The rule from the processor's ``image_seq_len`` (else the processors' formula: a tile's
    patches after the connector's pixel shuffle) and the image processor's sizes (else the
    families' defaults: tiles of the vision tower's side, four a side); None for sizes that do
    not make sense or allow more than ``MAX_SPLIT_TILES`` tiles a side."""
    image_processor = image_processor if isinstance(image_processor, dict) else {}
    side, patch, scale = (
        _int(vision.get("image_size")),
        _int(vision.get("patch_size")),
        _int(config.get("scale_factor")),
    )
    seq_len = _int(processor.get("image_seq_len"))
    if seq_len is None and side and patch and scale and patch > 0 and scale > 0:
        seq_len = (side // patch) ** 2 // scale**2
    tile = _edge(image_processor.get("max_image_size"), side)
    if seq_len is None or seq_len <= 0 or tile is None or tile <= 0:
        return None
    longest = _edge(image_processor.get("size"), 4 * tile)
    if longest is None or longest <= 0 or -(-min(longest, MAX_IMAGE_SIDE) // tile) > MAX_SPLIT_TILES:
        return None
    splitting = image_processor.get("do_image_splitting", True) is not False
    return SplitTiles(seq_len, longest, tile, splitting, image=token)


def _edge(size: Any, default: int | None) -> int | None:
    """``size["longest_edge"]``, else ``default`` when ``size`` states none."""
    if not isinstance(size, dict) or "longest_edge" not in size:
        return default
    return _int(size["longest_edge"])


def _any_resolution(
    config: dict[str, Any], vision: dict[str, Any], processor: dict[str, Any], image_processor: dict[str, Any]
) -> AnyResolution | None:
    grid = config.get("image_grid_pinpoints", image_processor.get("image_grid_pinpoints"))
    tile, patch = _int(vision.get("image_size")), _int(vision.get("patch_size"))
    if not isinstance(grid, list) or not grid or tile is None or patch is None or not 0 < patch <= tile:
        return None
    if len(grid) > MAX_PINPOINTS:
        return None
    pinpoints = []
    for point in grid:
        if not isinstance(point, list | tuple) or len(point) != 2:
            return None
        height, width = _int(point[0]), _int(point[1])
        if (
            height is None
            or width is None
            or not tile <= min(height, width) <= max(height, width) <= MAX_TILES * tile
        ):
            return None
        pinpoints.append((height, width))
    extra = _int(processor.get("num_additional_image_tokens"))
    if extra is None:  # a CLIP tower adds its CLS feature, a SigLIP tower none
        extra = 0 if "siglip" in str(vision.get("model_type", "")) else 1
    strategy = processor.get("vision_feature_select_strategy", config.get("vision_feature_select_strategy"))
    base = (tile // patch) ** 2 + extra - (1 if strategy == "default" else 0)
    return AnyResolution(tuple(pinpoints), tile, patch, base)


QWEN_VL_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")
_QWEN_PIXELS = (56 * 56, 28 * 28 * 1280)
"""Qwen2-VL's image processor's default ``min_pixels`` and ``max_pixels``."""
GLM4V_TOKENS = ("<|begin_of_image|>", "<|image|>", "<|end_of_image|>")
_GLM4V_PIXELS = (112 * 112, 28 * 28 * 15000)
"""GLM-4V's image processor's default ``size`` (``shortest_edge``, ``longest_edge``: pixels)."""


def _qwen_vl(
    config: dict[str, Any], vision: dict[str, Any], image_processor: dict[str, Any]
) -> ImageTokens | None:
    """The Qwen2-VL family's ``DynamicResolution``, or GLM-4V's (two frames to an image, small
    images scaled up first, its own tokens and pixel defaults)."""
    glm = config.get("model_type") in GLM4V_FAMILIES
    token_id = _int(config.get("image_token_id"))
    patch = _int(vision.get("patch_size")) or 14
    merge = _int(vision.get("spatial_merge_size")) or 2
    size = image_processor.get("size")
    if not isinstance(size, dict):
        size = {}
    default_low, default_high = _GLM4V_PIXELS if glm else _QWEN_PIXELS
    low = _int(image_processor.get("min_pixels")) or _int(size.get("shortest_edge")) or default_low
    high = _int(image_processor.get("max_pixels")) or _int(size.get("longest_edge")) or default_high
    if token_id is None or patch <= 0 or merge <= 0 or not 0 < low <= high:
        return None
    start, pad, end = GLM4V_TOKENS if glm else QWEN_VL_TOKENS
    rule = DynamicResolution(patch, merge, low, high, frames=2 if glm else 1, scale_up=glm)
    return ImageTokens(pad, token_id, 0, rule, start + pad + end)


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
