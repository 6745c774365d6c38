"""What a vision-language model's files say about its images: the placeholder a chat template
writes for an image, its token id, and how many placeholder tokens one image becomes in the
prompt the engine sees (``ImageTokens``).

Read as the LLaVA family's processors compute it (transformers' ``LlavaProcessor``): an image
resized to the image processor's crop size (else its size) becomes ``(height // patch_size) *
(width // patch_size) + num_additional_image_tokens`` tokens, one fewer with the ``default``
feature-select strategy (the CLS feature is dropped); a processor config that states
``image_seq_length`` is taken at its word, and without a processor config the vision tower's
``image_size`` and ``patch_size`` give ``(image_size // patch_size) ** 2``.

The Qwen2-VL family (Qwen2-VL, Qwen2.5-VL, Qwen3-VL: a vision tower with ``spatial_merge_size``)
counts by each image's own size, as its image processor resizes it (transformers'
``smart_resize``): height and width rounded to multiples of ``patch_size * spatial_merge_size``,
scaled into ``[min_pixels, max_pixels]`` keeping the aspect ratio (at most 200:1), then one token
per ``spatial_merge_size ** 2`` patches; its template writes ``<|vision_start|><|image_pad|>
<|vision_end|>`` and ``<|image_pad|>`` is what repeats.

LLaVA-NeXT (``model_type`` ``llava_next``) counts by each image's size too, as vLLM's
``LlavaNextProcessingInfo`` and transformers' ``LlavaNextProcessor`` do (``AnyResolution``): the
whole image as one tile (the LLaVA count), plus the tiles of the ``image_grid_pinpoints``
resolution that keeps the most of the image (the least padding on a tie), with the rows and
columns of patches that would be padding removed, plus one newline token per remaining row.

Idefics3 and SmolVLM (``model_type`` ``idefics3``, ``smolvlm``) write an image as text around its
tokens, as vLLM's ``Idefics3ProcessingInfo.get_image_repl`` and transformers' processors do
(``SplitTiles``): the image is resized so its longest edge is the image processor's
``size.longest_edge`` (the other edge rounded up to even), then cut into tiles of
``max_image_size.longest_edge`` pixels, rows and columns rounded up. Each tile is written
``<fake_token_around_image><row_R_col_C>`` and ``image_seq_len`` ``<image>`` tokens, with a newline
after each row, then a newline and the whole image: ``<fake_token_around_image><global-img>``,
``image_seq_len`` ``<image>`` tokens, ``<fake_token_around_image>``. An image of one tile (or with
``do_image_splitting`` off) is that last part alone. The span an image takes in the prompt is the
whole text, tokenized, as vLLM places it.

Gemma 3 (``model_type`` ``gemma3``) writes each image its template wrote as ``<start_of_image>``
as ``\n\n<start_of_image>``, ``image_seq_length`` (else ``mm_tokens_per_image``, else 256)
``<image_soft_token>``s and ``<end_of_image>\n\n``, as transformers' ``Gemma3Processor`` and vLLM's
``Gemma3MultiModalProcessor`` do (``PanAndScan``); with pan and scan on, a long image is also cut
into crops, each written the same way after the whole image, in a sentence. The ``\n\n`` at either
end then merges with a newline token beside it (``merges_newlines``, ``dyn.core.model.newlines``).
Pan and scan's settings are the processor's defaults (off; crops of at least 256 pixels, at most
4; an image 1.2 times longer than wide) with ``--mm-processor-kwargs`` over them: the image
processor's saved ``do_pan_and_scan`` is not read, because transformers' processor and vLLM give
the defaults precedence over it.

Mistral 3 (``model_type`` ``mistral3``, Mistral Small 3.1 and 3.2) and LLaVA with a Pixtral vision
tower (Pixtral-12B in transformers' format) write an image in rows, as vLLM's
``Mistral3MultiModalProcessor`` and ``PixtralHFMultiModalProcessor`` do (``PatchRows``): an image
longer than the longest edge on a side (Mistral 3: the image processor's ``size.longest_edge``;
LLaVA: the vision tower's ``image_size``) is scaled down to it, both sides floored, then cut into
patches of the tower's ``patch_size`` times the config's ``spatial_merge_size`` (1 when absent),
rows and columns rounded up; each row is ``[IMG]`` per column and an ``[IMG_BREAK]``, the last
row's break an ``[IMG_END]``.

Llama 4 (``model_type`` ``llama4``) fits an image onto a canvas of tiles, as transformers'
``Llama4ImageProcessor`` and vLLM's ``Mllama4MultiModalProcessor`` do (``TiledCanvas``): of the
canvases of at most ``max_patches`` tiles of the tower's ``image_size`` (in the order
transformers lists them), the one that scales the image up least (most, with
``resize_to_max_canvas``), else down least, the smallest of equals, the scales compared in float32
as torch computes them. An image on more than one tile is written ``<|image_start|>``, each row's
tiles of ``<|patch|>`` tokens joined by ``<|tile_x_separator|>`` and ended by
``<|tile_y_separator|>``, then ``<|image|>`` and the whole image's ``<|patch|>`` tokens and
``<|image_end|>``; on one tile, only the last part. A tile is ``(image_size // patch_size) ** 2``
patches, pixel-shuffled by ``pixel_shuffle_ratio``.

Only these families are read (their ``model_type``s are listed below). Every other family with a
vision tower writes its images by a rule not read here (Pixtral's own format, InternVL's tiles,
LLaVA-OneVision's pooled tiles, Mllama's cross attention, ...): ``image_tokens`` returns None for
it rather than guess a count, and a request with an image for it is refused, naming the family
(``vision_family``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dyn.core.errors import ConfigError
from dyn.core.model.info import ModelInfo, read_processor_files, token_content

MAX_ASPECT_RATIO = 200
"""The Qwen2-VL family's image processors refuse a longer side over 200 times the shorter."""
MAX_PINPOINTS = 256
MAX_TILES = 64
"""A LLaVA-NeXT grid of more shapes, or a shape more tiles long, is not read (the model is not
counted): each image is matched against every shape, and its count grows with the tiles (llava-v1.6
has 5 shapes of at most 3 tiles a side; anyres_max_9 grids some 36 of at most 9)."""


MAX_SPLIT_TILES = 16
"""An Idefics3-style model whose images may be cut into more tiles a side than this is not read
(the model is not counted): an image's text grows with the tiles (Idefics3 and SmolVLM cut at most
4 or 5 a side)."""
MAX_IMAGE_SIDE = 4096
"""Idefics3's image processors shrink a longer side to this before tiling."""


class ImageSizeError(ValueError):
    """An image the model's processor would refuse (its aspect ratio); the message says why."""


@dataclass(frozen=True, slots=True)
class DynamicResolution:
    """The Qwen2-VL family's rule (see the module docstring)."""

    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int

    def count(self, width: int, height: int) -> int:
        if min(width, height) <= 0 or max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
            raise ImageSizeError(
                f"a {width}x{height} image: the model takes images at most {MAX_ASPECT_RATIO} times "
                "longer than wide (or the other way)"
            )
        factor = self.patch_size * self.merge_size
        h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
        if h_bar * w_bar > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h_bar = math.ceil(height * beta / factor) * factor
            w_bar = math.ceil(width * beta / factor) * factor
        return (h_bar // self.patch_size) * (w_bar // self.patch_size) // (self.merge_size**2)


@dataclass(frozen=True, slots=True)
class AnyResolution:
    """LLaVA-NeXT's rule (see the module docstring): ``pinpoints`` are the (height, width)
    resolutions an image may be tiled at, ``tile`` the vision tower's image side, ``patch`` its
    patch side, ``base`` the tokens of the whole image as one tile."""

    pinpoints: tuple[tuple[int, int], ...]
    tile: int
    patch: int
    base: int

    def count(self, width: int, height: int) -> int:
        if min(width, height) <= 0:
            raise ImageSizeError(f"a {width}x{height} image has no pixels")
        best_height, best_width = self._best_resolution(width, height)
        side = self.tile // self.patch
        rows, columns = side * (best_height // self.tile), side * (best_width // self.tile)
        if width / height > columns / rows:  # wider than the grid: rows of padding above and below
            scaled = int(round(height * (columns / width), 7))
            rows -= 2 * ((rows - scaled) // 2)
        else:
            scaled = int(round(width * (rows / height), 7))
            columns -= 2 * ((columns - scaled) // 2)
        return self.base + rows * columns + rows

    def _best_resolution(self, width: int, height: int) -> tuple[int, int]:
        """The pinpoint that shows the most of the image once fitted into it, then wastes the
        fewest pixels (the first of equals)."""
        best = self.pinpoints[0]
        most, least_waste = 0, math.inf
        for fit_height, fit_width in self.pinpoints:
            scale = min(fit_width / width, fit_height / height)
            shown = min(int(width * scale) * int(height * scale), width * height)
            waste = fit_width * fit_height - shown
            if shown > most or (shown == most and waste < least_waste):
                best, most, least_waste = (fit_height, fit_width), shown, waste
        return best


@dataclass(frozen=True, slots=True)
class SplitTiles:
    """Idefics3's and SmolVLM's rule (see the module docstring): ``seq_len`` image tokens a tile,
    ``longest_edge`` the side an image is resized to, ``tile`` a tile's side, ``splitting`` whether
    images are tiled at all; ``image``, ``fake`` and ``global_tag`` the tokens written."""

    seq_len: int
    longest_edge: int
    tile: int
    splitting: bool = True
    image: str = "<image>"
    fake: str = "<fake_token_around_image>"
    global_tag: str = "<global-img>"

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """The (rows, columns) of tiles a ``width`` x ``height`` image is cut into; (0, 0) when it
        is not cut."""
        if min(width, height) <= 0:
            raise ImageSizeError(f"a {width}x{height} image has no pixels")
        if not self.splitting:
            return 0, 0
        height, width = _fit_longest(height, width, self.longest_edge, even=True)
        if max(height, width) > MAX_IMAGE_SIDE:
            height, width = _fit_longest(height, width, MAX_IMAGE_SIDE, even=False)
        rows, columns = -(-height // self.tile), -(-width // self.tile)
        return (rows, columns) if rows > 1 or columns > 1 else (0, 0)

    def count(self, width: int, height: int) -> int:
        """The image tokens of a ``width`` x ``height`` image (the tiles' and the whole image's)."""
        rows, columns = self.grid(width, height)
        return (rows * columns + 1) * self.seq_len

    def text(self, width: int, height: int) -> str:
        """What a ``width`` x ``height`` image is written as in the prompt."""
        rows, columns = self.grid(width, height)
        tokens = self.image * self.seq_len
        whole = f"{self.fake}{self.global_tag}{tokens}{self.fake}"
        if rows == 0:
            return whole
        lines = (
            "".join(f"{self.fake}<row_{r}_col_{c}>{tokens}" for c in range(1, columns + 1)) + "\n"
            for r in range(1, rows + 1)
        )
        return "".join(lines) + "\n" + whole


@dataclass(frozen=True, slots=True)
class PatchRows:
    """Pixtral's rule (see the module docstring): images scaled to at most ``longest`` pixels a
    side, cut into ``patch``-pixel patches; ``image``, ``row_break`` and ``end`` the tokens
    written."""

    longest: int
    patch: int
    image: str = "[IMG]"
    row_break: str = "[IMG_BREAK]"
    end: str = "[IMG_END]"

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """The (rows, columns) of patches of a ``width`` x ``height`` image, as vLLM's
        ``get_patch_grid_size`` counts them."""
        if min(width, height) <= 0:
            raise ImageSizeError(f"a {width}x{height} image has no pixels")
        ratio = max(width / self.longest, height / self.longest)
        if ratio > 1:
            width, height = math.floor(width / ratio), math.floor(height / ratio)
        return (height - 1) // self.patch + 1, (width - 1) // self.patch + 1

    def count(self, width: int, height: int) -> int:
        """The ``[IMG]`` tokens of a ``width`` x ``height`` image."""
        rows, columns = self.grid(width, height)
        return rows * columns

    def text(self, width: int, height: int) -> str:
        """What a ``width`` x ``height`` image is written as in the prompt."""
        rows, columns = self.grid(width, height)
        row = self.image * columns
        return (row + self.row_break) * (rows - 1) + row + self.end


@dataclass(frozen=True, slots=True)
class TiledCanvas:
    """Llama 4's rule (see the module docstring): ``tile``-pixel tiles, canvases of at most
    ``max_tiles`` of them, ``per_tile`` patch tokens a tile; ``to_max_canvas``: upscale onto the
    largest canvas that fits; the tokens written."""

    tile: int
    max_tiles: int
    per_tile: int
    to_max_canvas: bool = False
    start: str = "<|image_start|>"
    end: str = "<|image_end|>"
    image: str = "<|image|>"
    patch: str = "<|patch|>"
    x_separator: str = "<|tile_x_separator|>"
    y_separator: str = "<|tile_y_separator|>"

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """The (rows, columns) of tiles of the canvas a ``width`` x ``height`` image is fitted
        onto (transformers' ``get_best_fit``)."""
        if min(width, height) <= 0:
            raise ImageSizeError(f"a {width}x{height} image has no pixels")
        canvases = _canvases(self.max_tiles)
        f32 = np.float32
        scales = [
            min(f32(rows * self.tile) / f32(height), f32(columns * self.tile) / f32(width))
            for rows, columns in canvases
        ]
        up = [scale for scale in scales if scale >= 1]
        if up:
            chosen = max(up) if self.to_max_canvas else min(up)
        else:
            chosen = max(scales)
        fitting = [canvas for canvas, scale in zip(canvases, scales, strict=True) if scale == chosen]
        return min(fitting, key=lambda canvas: canvas[0] * canvas[1])

    def count(self, width: int, height: int) -> int:
        """The ``<|patch|>`` tokens of a ``width`` x ``height`` image (its tiles' and the whole
        image's)."""
        rows, columns = self.grid(width, height)
        tiles = rows * columns
        return self.per_tile * (tiles + 1 if tiles > 1 else 1)

    def text(self, width: int, height: int) -> str:
        """What a ``width`` x ``height`` image is written as in the prompt."""
        rows, columns = self.grid(width, height)
        patches = self.patch * self.per_tile
        tiles = ""
        if rows * columns > 1:
            row = self.x_separator.join([patches] * columns) + self.y_separator
            tiles = row * rows
        return f"{self.start}{tiles}{self.image}{patches}{self.end}"


@functools.lru_cache(maxsize=8)
def _canvases(max_tiles: int) -> tuple[tuple[int, int], ...]:
    """Every (rows, columns) of at most ``max_tiles`` tiles, in the order transformers'
    ``find_supported_resolutions`` lists them: by aspect ratio, first met from the most tiles
    down, and by tile count within one ratio (the order breaks ties in ``TiledCanvas.grid``)."""
    by_ratio: dict[float, list[tuple[int, int]]] = {}
    for tiles in range(max_tiles, 0, -1):
        for rows in sorted(d for d in range(1, tiles + 1) if tiles % d == 0):
            by_ratio.setdefault(rows / (tiles // rows), []).append((rows, tiles // rows))
    return tuple(canvas for canvases in by_ratio.values() for canvas in canvases)


@dataclass(frozen=True, slots=True)
class PanAndScan:
    """Gemma 3's rule (see the module docstring): ``seq_len`` image tokens for the whole image and
    for each crop; pan and scan ``enabled`` or not, with its ``min_crop`` side, ``max_crops`` and
    ``min_ratio`` (how much longer than wide an image must be to be cropped); ``boi``, ``image`` and
    ``eoi`` the tokens written."""

    seq_len: int
    enabled: bool = False
    min_crop: int = 256
    max_crops: int = 4
    min_ratio: float = 1.2
    boi: str = "<start_of_image>"
    image: str = "<image_soft_token>"
    eoi: str = "<end_of_image>"

    def crops(self, width: int, height: int) -> int:
        """The crops a ``width`` x ``height`` image is cut into besides the whole image (0: none),
        as transformers' ``Gemma3ImageProcessor.pan_and_scan`` and vLLM count them."""
        if min(width, height) <= 0:
            raise ImageSizeError(f"a {width}x{height} image has no pixels")
        if not self.enabled:
            return 0
        long, short = max(width, height), min(width, height)
        if long / short < self.min_ratio:
            return 0
        across = min(math.floor(long / self.min_crop), math.floor(long / short + 0.5))
        across = min(self.max_crops, max(2, across))
        if min(math.ceil(long / across), short) < self.min_crop:
            return 0
        return across

    def count(self, width: int, height: int) -> int:
        """The image tokens of a ``width`` x ``height`` image (the whole image's and its crops')."""
        return (self.crops(width, height) + 1) * self.seq_len

    def text(self, width: int, height: int) -> str:
        """What a ``width`` x ``height`` image is written as in the prompt."""
        crops = self.crops(width, height)
        full = f"\n\n{self.boi}{self.image * self.seq_len}{self.eoi}\n\n"
        if crops == 0:
            return full
        return (
            f"Here is the original image {full} and here are some crops to help you see better "
            + " ".join([full] * crops)
        )


def _fit_longest(height: int, width: int, side: int, *, even: bool) -> tuple[int, int]:
    """(height, width) with the longer edge (the width on a tie) set to ``side`` and the other
    scaled and truncated, rounded up to even with ``even``, at least 1: transformers' Idefics3
    resize arithmetic, float for float."""
    aspect = width / height
    if width >= height:
        width, height = side, int(side / aspect)
        height += 1 if even and height % 2 else 0
    else:
        height, width = side, int(side * aspect)
        width += 1 if even and width % 2 else 0
    return max(height, 1), max(width, 1)


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
    dynamic: DynamicResolution | AnyResolution | SplitTiles | PatchRows | TiledCanvas | PanAndScan | None = (
        None
    )
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
    if family in QWEN_VL_FAMILIES and "spatial_merge_size" in vision:
        return _qwen_vl(config, vision, image_processor)
    if family == "gemma3":
        return _pan_and_scan(config, processor, overrides or {})
    if family == "mistral3" or (family == "llava" and vision.get("model_type") == "pixtral"):
        return _patch_rows(config, vision, processor, image_processor)
    if family == "llama4":
        return _tiled_canvas(config, vision, image_processor)
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


QWEN_VL_FAMILIES = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"})
"""The families of ``DynamicResolution``."""
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


def _qwen_vl(
    config: dict[str, Any], vision: dict[str, Any], image_processor: dict[str, Any]
) -> ImageTokens | None:
    token_id = _int(config.get("image_token_id"))
    patch = _int(vision.get("patch_size")) or 14
    merge = _int(vision.get("spatial_merge_size")) or 2
    size = image_processor.get("size")
    if not isinstance(size, dict):
        size = {}
    low = _int(image_processor.get("min_pixels")) or _int(size.get("shortest_edge")) or _QWEN_PIXELS[0]
    high = _int(image_processor.get("max_pixels")) or _int(size.get("longest_edge")) or _QWEN_PIXELS[1]
    if token_id is None or patch <= 0 or merge <= 0 or not 0 < low <= high:
        return None
    start, pad, end = QWEN_VL_TOKENS
    return ImageTokens(pad, token_id, 0, DynamicResolution(patch, merge, low, high), start + pad + end)


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
