"""What a video-language model's files say about its clips: the placeholder a chat template writes
for a clip, its token id, and how many placeholder tokens one clip becomes in the prompt the engine
sees (``VideoTokens``).

Read for the Qwen2-VL family as vLLM 0.32 counts it (its video backends sample the frames, and
transformers' video processors resize and patch them). Qwen2-VL and Qwen2.5-VL (``model_type``
``qwen2_vl``, ``qwen2_5_vl``; vLLM's ``Qwen2VLVideoBackend``, ``Qwen2VLVideoProcessor``):

- Frames (``FrameSampling.frames``): ``n = total / source_fps * min(fps, 30)`` (``fps`` 2 by
  default; this and the frame bounds are vLLM's loader's, set by ``--media-io-kwargs``, not the
  video processor's config), raised to ``min_frames`` (4), then at most ``max_frames`` (768, and never more than the
  clip's frames rounded down to a multiple of ``temporal_patch_size``), then rounded down to a
  multiple of ``temporal_patch_size`` (2). A clip of fewer frames than one temporal patch has
  nothing to sample, and one whose rate is unknown (0) cannot be sampled: vLLM fails on both, and
  so does ``count``.
- Each frame is resized as the family's images are (``DynamicResolution``: ``smart_resize`` into
  the video processor's ``[min_pixels, max_pixels]``); with ``cap_pixels_per_frame`` (transformers'
  option, off unless the video processor's config sets it) ``max_pixels`` is first bounded by an
  even share of ``max_video_tokens`` tokens' worth of pixels (90% of them), floored at 1.05 x
  ``min_pixels``.
- Tokens: ``n / temporal_patch_size`` groups of the frame's merged patches. The template writes
  ``<|vision_start|><|video_pad|><|vision_end|>`` and ``<|video_pad|>`` is what repeats.

Qwen3-VL (``qwen3_vl``, ``qwen3_vl_moe``; ``Qwen3VLVideoBackend``, ``Qwen3VLVideoProcessor``) and
Qwen3.5 (``qwen3_5``, ``qwen3_5_moe``: vLLM serves it with Qwen3-VL's processor) write each pair of
frames with its time (``timed``):

- Frames (``FrameSampling.indices``): ``int(total / source_fps * min(fps, 30))`` (an unknown rate
  read as 24), within ``[min_frames, max_frames]`` and the clip's frames, at the indices
  ``linspace(0, total - 1, n)`` rounded. One frame is refused (the processor needs a temporal
  patch); an odd count repeats its last frame.
- The frames are resized together (transformers' 3-D ``smart_resize``: a side under
  ``patch_size * merge_size`` scales the frame up first, and the pixel bounds are on all frames,
  ``round(n / 2) * 2`` of them).
- Each pair is written ``<{t:.1f} seconds><|vision_start|>`` and the frame's merged patches as
  ``<|video_pad|>``, then ``<|vision_end|>``, where ``t`` is the pair's mean index over the source
  rate; each time is tokenized on its own, as vLLM does. transformers 5.10 and later (and vLLM
  with them) replace only the template's ``<|video_pad|>``, keeping its outer markers.

The video processor's settings (its pixel bounds; ``--mm-processor-kwargs`` laid over them) come
from ``processor_config.json``'s ``video_processor`` (how transformers 5 saves them), else ``video_preprocessor_config.json`` (the published Qwen3-VL
checkpoints), else the image processor's ``preprocessor_config.json`` (what the published Qwen2-VL
and Qwen2.5-VL checkpoints have, and transformers reads for their video processor too), else
transformers' defaults for the family. No other family's clips are read: ``video_tokens`` returns
None and a clip for a model of another family dyn reads images of is refused as not built.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dyn.core.model.image_layouts import MAX_ASPECT_RATIO, DynamicResolution
from dyn.core.model.info import ModelInfo, read_model_json, read_processor_files
from dyn.core.model.vision import overridden

TIMED_FAMILIES = frozenset({"qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"})
"""The families that write each pair of frames with its time."""
VIDEO_FAMILIES = frozenset({"qwen2_vl", "qwen2_5_vl"}) | TIMED_FAMILIES
"""The families whose clips are counted."""
QWEN_VIDEO_TOKENS = ("<|vision_start|>", "<|video_pad|>", "<|vision_end|>")
MAX_SAMPLING_FPS = 30
"""vLLM's Qwen2-VL and Qwen3-VL samplers never sample faster than this."""
MAX_SAMPLED_FRAMES = 768
"""Nor more frames than this, whatever ``max_frames`` says."""
UNKNOWN_FPS = 24.0
"""The source rate vLLM's Qwen3-VL sampler assumes for a clip whose rate is unknown."""
_DEFAULTS = {
    "min_pixels": 128 * 28 * 28,
    "max_pixels": 768 * 28 * 28,
    "min_frames": 4,
    "max_frames": 768,
    "temporal_patch_size": 2,
    "max_video_tokens": 128000,
}
"""transformers' ``Qwen2VLVideoProcessor`` defaults."""
_QWEN3_DEFAULTS = {
    **_DEFAULTS,
    "min_pixels": 128 * 32 * 32,
    "max_pixels": 768 * 32 * 32,
    "max_video_tokens": 768,
}
"""transformers' ``Qwen3VLVideoProcessor`` defaults (its pixel bounds are on a whole clip)."""
DEFAULT_FPS = 2.0
"""The rate vLLM's samplers sample at unless ``--media-io-kwargs`` says."""


class VideoLengthError(ValueError):
    """A clip the model cannot take as counted (too few frames, an unknown rate or size); the
    message says why."""


@dataclass(frozen=True, slots=True)
class FrameSampling:
    """Which frames of a clip the model sees (see the module docstring)."""

    fps: float
    min_frames: int
    max_frames: int
    temporal_patch_size: int

    def frames(self, total: int, source_fps: float) -> int:
        """Qwen2-VL's: how many frames are sampled from a clip of ``total`` frames at
        ``source_fps`` frames a second."""
        if not 0 < source_fps < math.inf:  # 0 (or NaN) is how OpenCV reports a rate it does not know
            raise VideoLengthError(
                "the video's frame rate is unknown (a variable or missing rate): send a clip with a constant rate"
            )
        step = self.temporal_patch_size
        most = math.floor(min(self.max_frames, MAX_SAMPLED_FRAMES, total) / step) * step
        n = total / source_fps * min(self.fps, MAX_SAMPLING_FPS)
        n = min(max(n, self.min_frames), most, total)
        n = math.floor(n / step) * step
        if n < step:
            raise VideoLengthError(
                f"the video has {total} frame(s): the model takes clips of at least {step} frames"
            )
        return n

    def indices(self, total: int, source_fps: float) -> list[int]:
        """Qwen3-VL's: the indices of the frames sampled from a clip of ``total`` frames at
        ``source_fps`` frames a second (numpy's ``linspace`` rounded, computed as numpy does)."""
        rate = known_rate(source_fps)
        n = int(total / rate * min(self.fps, MAX_SAMPLING_FPS))
        n = min(max(n, self.min_frames), self.max_frames, MAX_SAMPLED_FRAMES, total)
        if n < max(self.temporal_patch_size, 1):
            raise VideoLengthError(
                f"the video has {total} frame(s): the model takes clips of at least "
                f"{self.temporal_patch_size} frames"
            )
        if n == 1:
            return [0]
        step = (total - 1) / (n - 1)
        return [round(i * step) for i in range(n - 1)] + [total - 1]


def known_rate(source_fps: float) -> float:
    """Qwen3-VL's reading of a clip's rate: one OpenCV does not know (0, NaN, infinite) is 24."""
    return source_fps if 0 < source_fps < math.inf else UNKNOWN_FPS


@dataclass(frozen=True, slots=True)
class VideoTokens:
    """``token``: the placeholder token one clip's tokens repeat; ``token_id``: its id; ``text``:
    what a template that reads text writes for a clip; ``sampling`` and ``resolution``: its frames
    and their size (see the module docstring); ``max_video_tokens`` bounds the pixels of a frame
    when ``cap_pixels_per_frame``. ``timed`` (Qwen3-VL): each pair of frames is written with its
    time between ``start_id`` and ``end_id``."""

    token: str
    token_id: int
    text: str
    sampling: FrameSampling
    resolution: DynamicResolution
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = _DEFAULTS["max_video_tokens"]
    timed: bool = False
    start_id: int = 0
    end_id: int = 0

    @property
    def placeholder(self) -> str:
        return self.text or self.token

    def count(self, frames: int | None, fps: float | None, width: int | None, height: int | None) -> int:
        """``<|video_pad|>`` tokens of a clip of ``frames`` frames at ``fps``, ``width`` x
        ``height`` pixels (``VideoLengthError`` for one the model cannot take, or whose shape is
        unknown)."""
        groups, per_group = self._grid(frames, fps, width, height)
        return len(groups) * per_group

    def tokens_for(self, item: Any) -> int:
        """``count`` of a loaded clip (its ``frames``, ``fps``, ``width`` and ``height``)."""
        return self.count(item.frames, item.fps, item.width, item.height)

    def ids_for(self, item: Any, encode: Callable[[str], list[int]]) -> list[int] | None:
        """A timed clip's tokens (each pair's time tokenized by ``encode``, then its frame's
        tokens between the markers); None for a clip that is its ``<|video_pad|>`` repeated."""
        if not self.timed:
            return None
        groups, per_group = self._grid(item.frames, item.fps, item.width, item.height)
        out: list[int] = []
        for seconds in groups:
            out += encode(f"<{seconds:.1f} seconds>")
            out += [self.start_id, *[self.token_id] * per_group, self.end_id]
        return out

    def _grid(
        self, frames: int | None, fps: float | None, width: int | None, height: int | None
    ) -> tuple[list[float], int]:
        """``(each pair of frames' time in seconds, tokens a pair)``."""
        if frames is None or fps is None or width is None or height is None:
            raise VideoLengthError(
                "the video's frames, rate and size are unknown: the frontend reads them with OpenCV, "
                "which is not installed (pip install 'dyn[video]')"
            )
        step = self.sampling.temporal_patch_size
        if not self.timed:
            n = self.sampling.frames(frames, fps)
            return [0.0] * (n // step), self._frame_tokens(n, width, height)
        indices = self.sampling.indices(frames, fps)
        rate = known_rate(fps)
        padded = indices + indices[-1:] * (-len(indices) % step)
        times = [(padded[i] / rate + padded[i + step - 1] / rate) / 2 for i in range(0, len(padded), step)]
        return times, self._frame_tokens(len(indices), width, height)

    def _frame_tokens(self, n: int, width: int, height: int) -> int:
        """Merged patches of one frame of ``n`` sampled at ``width`` x ``height``."""
        patch, merge = self.resolution.patch_size, self.resolution.merge_size
        factor = patch * merge
        low, high = self.resolution.min_pixels, self.resolution.max_pixels
        if not self.timed:
            if self.cap_pixels_per_frame:
                share = (
                    int(self.max_video_tokens * factor * factor * 0.9)
                    * self.sampling.temporal_patch_size
                    // n
                )
                high = max(min(high, share), int(low * 1.05))
            try:
                return DynamicResolution(patch, merge, low, high).count(width, height)
            except ValueError as exc:  # ImageSizeError: the frame's aspect ratio
                raise VideoLengthError(str(exc).replace("image", "video frame", 1)) from None
        if self.cap_pixels_per_frame:
            high = max(min(self.max_video_tokens * factor * factor, high // n), int(low * 1.05)) * n
        h_bar, w_bar = _resize_clip(n, height, width, factor, self.sampling.temporal_patch_size, low, high)
        return (h_bar // patch) * (w_bar // patch) // (merge * merge)


def _resize_clip(
    frames: int, height: int, width: int, factor: int, temporal: int, low: int, high: int
) -> tuple[int, int]:
    """Qwen3-VL's frame size for ``frames`` frames of ``width`` x ``height`` (transformers' 3-D
    ``smart_resize``: the pixel bounds are on all the frames)."""
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise VideoLengthError(
            f"a {width}x{height} video frame: the model takes frames at most {MAX_ASPECT_RATIO} times "
            "longer than wide (or the other way)"
        )
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    t_bar = round(frames / temporal) * temporal
    if t_bar * h_bar * w_bar > high:
        beta = math.sqrt(frames * height * width / high)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < low:
        beta = math.sqrt(low / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def video_tokens(
    info: ModelInfo, overrides: Mapping[str, Any] | None = None, loading: Mapping[str, Any] | None = None
) -> VideoTokens | None:
    """The model's video placeholder, or None when it takes no clips (or none dyn can count).
    ``overrides``: settings that replace the video processor's (vLLM's ``--mm-processor-kwargs``:
    ``min_pixels``, ``max_pixels``, ``size``, ...); ``loading``: how vLLM's loader samples a clip
    (``--media-io-kwargs``' ``video``: ``fps``, ``min_frames``, ``max_frames``; 2, 4 and 768 by
    default: vLLM's samplers take them from there, not from the video processor's config)."""
    files = read_processor_files(info)
    config = files.config
    vision = config.get("vision_config")
    family = config.get("model_type")
    if family not in VIDEO_FAMILIES or not isinstance(vision, dict):
        return None
    timed = family in TIMED_FAMILIES
    defaults = _QWEN3_DEFAULTS if timed else _DEFAULTS
    token_id = _int(config.get("video_token_id"))
    start_id, end_id = _int(config.get("vision_start_token_id")), _int(config.get("vision_end_token_id"))
    patch = _int(vision.get("patch_size")) or (16 if timed else 14)
    merge = _int(vision.get("spatial_merge_size")) or 2
    settings = overridden(_video_processor(info, files.processor, files.preprocessor), overrides)
    loading = loading or {}
    size = settings.get("size")
    if not isinstance(size, dict):
        size = {}
    low = _int(settings.get("min_pixels")) or _int(size.get("shortest_edge")) or defaults["min_pixels"]
    high = _int(settings.get("max_pixels")) or _int(size.get("longest_edge")) or defaults["max_pixels"]
    step = (
        _int(settings.get("temporal_patch_size"))
        or _int(vision.get("temporal_patch_size"))
        or defaults["temporal_patch_size"]
    )
    fps = loading.get("fps")
    sampling = FrameSampling(
        float(fps) if isinstance(fps, int | float) and not isinstance(fps, bool) and fps > 0 else DEFAULT_FPS,
        _int(loading.get("min_frames")) or defaults["min_frames"],
        _int(loading.get("max_frames")) or defaults["max_frames"],
        step,
    )
    if token_id is None or not 0 < low <= high or (timed and (start_id is None or end_id is None)):
        return None
    start, pad, end = QWEN_VIDEO_TOKENS
    return VideoTokens(
        pad,
        token_id,
        start + pad + end,
        sampling,
        DynamicResolution(patch, merge, low, high),
        settings.get("cap_pixels_per_frame") is True,
        _int(settings.get("max_video_tokens")) or defaults["max_video_tokens"],
        timed,
        start_id or 0,
        end_id or 0,
    )


def _video_processor(
    info: ModelInfo, processor: dict[str, Any], preprocessor: dict[str, Any]
) -> dict[str, Any]:
    """The video processor's settings, where transformers looks for them (module docstring)."""
    inner = processor.get("video_processor")
    if isinstance(inner, dict):
        return inner
    for directory in dict.fromkeys((info.tokenizer_dir, info.path)):
        found = read_model_json(str(info.path), directory / "video_preprocessor_config.json", False)
        if found:
            return found
    return preprocessor


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
