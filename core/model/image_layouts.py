"""How each vision-language family's processor writes one image into the prompt: how many
placeholder tokens it becomes and, for the families that write it as text around its tokens, that
text. Each rule is read from the model's files by ``dyn.core.model.vision.image_tokens``.

Read as the LLaVA family's processors compute it (transformers' ``LlavaProcessor``): an image
resized to the image processor's crop size (else its size) becomes ``(height // patch_size) *
(width // patch_size) + num_additional_image_tokens`` tokens, one fewer with the ``default``
feature-select strategy (the CLS feature is dropped); a processor config that states
``image_seq_length`` is taken at its word, and without a processor config the vision tower's
``image_size`` and ``patch_size`` give ``(image_size // patch_size) ** 2``.

InternVL in transformers' format (``model_type`` ``internvl``: InternVL3, InternVL3.5 ``-hf``)
cuts an image into tiles, as transformers' ``GotOcr2ImageProcessor`` and vLLM's
``InternS1MultiModalProcessor`` do (``ClosestGrid``): of the grids of ``min_patches`` to
``max_patches`` tiles, the one whose aspect ratio is closest to the image's (on a tie, the one
with more tiles while the image covers over half of it), plus a thumbnail tile when the grid has
more than one (with ``crop_to_patches``; else one tile); it is written ``<img>``, the tiles'
``<IMG_CONTEXT>`` tokens (``image_seq_length`` a tile) and ``</img>``.

GLM-4V (``glm4v``, ``glm4v_moe``: GLM-4.1V and GLM-4.5V) counts the same way with two differences
(transformers' ``Glm4vImageProcessor``): an image with a side under the merged patch is scaled up
until it has none (before the aspect ratio is checked), and the pixel bounds hold two frames of the
image; its template writes ``<|begin_of_image|><|image|><|end_of_image|>``.

The Qwen2-VL family (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5: a vision tower with ``spatial_merge_size``)
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
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

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
    """The Qwen2-VL family's rule (see the module docstring); GLM-4V's with ``frames`` 2 (its
    pixel bounds hold two frames of an image) and ``scale_up`` (a side under the merged patch
    scales the image up first, before the aspect ratio is checked)."""

    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    frames: int = 1
    scale_up: bool = False

    def count(self, width: int, height: int) -> int:
        factor = self.patch_size * self.merge_size
        if self.scale_up and 0 < min(width, height) < factor:
            scale = max(factor / height, factor / width)
            height, width = int(height * scale), int(width * scale)
        if min(width, height) <= 0 or max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
            raise ImageSizeError(
                f"a {width}x{height} image: the model takes images at most {MAX_ASPECT_RATIO} times "
                "longer than wide (or the other way)"
            )
        h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
        frames = self.frames
        if frames * h_bar * w_bar > self.max_pixels:
            beta = math.sqrt(frames * height * width / self.max_pixels)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif frames * h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (frames * height * width))
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
class ClosestGrid:
    """InternVL's rule (see the module docstring): ``tile_width`` x ``tile_height`` tiles, grids of
    ``min_tiles`` to ``max_tiles`` of them (``crop``: images are cut at all), ``seq_len`` tokens a
    tile; ``start``, ``image`` and ``end`` the tokens written."""

    tile_width: int
    tile_height: int
    min_tiles: int
    max_tiles: int
    seq_len: int
    crop: bool = True
    start: str = "<img>"
    image: str = "<IMG_CONTEXT>"
    end: str = "</img>"

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """The (columns, rows) of the grid a ``width`` x ``height`` image is cut into
        (transformers' ``get_optimal_tiled_canvas``): the aspect ratio closest to the image's; of
        equals, the later in ``_grids``' order while the image's area is over half the grid's."""
        if min(width, height) <= 0:
            raise ImageSizeError(f"a {width}x{height} image has no pixels")
        aspect, area = width / height, width * height
        best, best_diff = (1, 1), math.inf
        for columns, rows in _grids(self.min_tiles, self.max_tiles):
            diff = abs(aspect - columns / rows)
            if diff < best_diff:
                best, best_diff = (columns, rows), diff
            elif diff == best_diff and area > 0.5 * self.tile_height * self.tile_width * columns * rows:
                best = (columns, rows)
        return best

    def tiles(self, width: int, height: int) -> int:
        """The tiles a ``width`` x ``height`` image becomes: its grid's and a thumbnail, or one."""
        if min(width, height) <= 0:
            raise ImageSizeError(f"a {width}x{height} image has no pixels")
        if not self.crop or self.max_tiles <= 1:
            return 1
        columns, rows = self.grid(width, height)
        return 1 + columns * rows if columns * rows > 1 else 1

    def count(self, width: int, height: int) -> int:
        """The ``<IMG_CONTEXT>`` tokens of a ``width`` x ``height`` image."""
        return self.tiles(width, height) * self.seq_len

    def text(self, width: int, height: int) -> str:
        """What a ``width`` x ``height`` image is written as in the prompt."""
        return self.start + self.image * self.count(width, height) + self.end


@functools.lru_cache(maxsize=8)
def _grids(min_tiles: int, max_tiles: int) -> tuple[tuple[int, int], ...]:
    """Every (columns, rows) of ``min_tiles`` to ``max_tiles`` tiles, in transformers'
    ``get_all_supported_aspect_ratios`` order: by columns then rows, stably sorted by tile count."""
    grids = [
        (columns, rows)
        for columns in range(1, max_tiles + 1)
        for rows in range(1, max_tiles + 1)
        if min_tiles <= columns * rows <= max_tiles
    ]
    return tuple(sorted(grids, key=lambda grid: grid[0] * grid[1]))


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


ImageLayout = (
    DynamicResolution | AnyResolution | SplitTiles | PatchRows | TiledCanvas | ClosestGrid | PanAndScan
)
"""The rules a family's images are counted (and written) by."""
