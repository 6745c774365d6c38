"""What a video-language model's files say about its clips: the placeholder a chat template writes
for a clip, its token id, and how many placeholder tokens one clip becomes in the prompt the engine
sees (``VideoTokens``).

Read for Qwen2-VL and Qwen2.5-VL (``model_type`` ``qwen2_vl``, ``qwen2_5_vl``), as vLLM 0.32 counts
them (its ``Qwen2VLVideoBackend`` samples the frames, transformers' ``Qwen2VLVideoProcessor``
resizes and patches them):

- Frames (``FrameSampling``): ``n = total / source_fps * min(fps, 30)`` (``fps`` 2 by default),
  raised to ``min_frames`` (4), then at most ``max_frames`` (768, and never more than the clip's
  frames rounded down to a multiple of ``temporal_patch_size``), then rounded down to a multiple of
  ``temporal_patch_size`` (2). A clip of fewer frames than one temporal patch has nothing to
  sample, and one whose rate is unknown (0) cannot be sampled: vLLM fails on both, and so does
  ``count``.
- Each frame is resized as the family's images are (``DynamicResolution``: ``smart_resize`` into
  the video processor's ``[min_pixels, max_pixels]``); with ``cap_pixels_per_frame`` (transformers'
  option, off unless the video processor's config sets it) ``max_pixels`` is first bounded by an
  even share of ``max_video_tokens`` tokens' worth of pixels (90% of them), floored at 1.05 x
  ``min_pixels``.
- Tokens: ``n / temporal_patch_size`` groups of the frame's merged patches. The template writes
  ``<|vision_start|><|video_pad|><|vision_end|>`` and ``<|video_pad|>`` is what repeats.

The video processor's settings come from ``processor_config.json``'s ``video_processor`` (how
transformers 5 saves them), else ``video_preprocessor_config.json``, else the image processor's
``preprocessor_config.json`` (what the published Qwen2-VL and Qwen2.5-VL checkpoints have, and
transformers reads for their video processor too), else transformers' defaults.

Qwen3-VL writes each frame's timestamp as text beside its tokens (not read: ``video_tokens``
returns None and a clip for it is refused as not built), and no other family's clips are read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dyn.core.model.info import ModelInfo, read_model_json, read_processor_files
from dyn.core.model.vision import DynamicResolution

VIDEO_FAMILIES = frozenset({"qwen2_vl", "qwen2_5_vl"})
"""The families whose clips are counted (``FrameSampling`` and ``DynamicResolution``)."""
QWEN_VIDEO_TOKENS = ("<|vision_start|>", "<|video_pad|>", "<|vision_end|>")
MAX_SOURCE_FPS = 30
"""vLLM's Qwen2-VL sampler never samples faster than this."""
_DEFAULTS = {
    "min_pixels": 128 * 28 * 28,
    "max_pixels": 768 * 28 * 28,
    "min_frames": 4,
    "max_frames": 768,
    "temporal_patch_size": 2,
    "max_video_tokens": 128000,
}
"""transformers' ``Qwen2VLVideoProcessor`` defaults."""
DEFAULT_FPS = 2.0
"""The rate vLLM's Qwen2-VL sampler samples at unless the video processor's config says."""


class VideoLengthError(ValueError):
    """A clip the model cannot take as counted (too few frames, an unknown rate or size); the
    message says why."""


@dataclass(frozen=True, slots=True)
class FrameSampling:
    """How many frames of a clip the model sees (see the module docstring)."""

    fps: float
    min_frames: int
    max_frames: int
    temporal_patch_size: int

    def frames(self, total: int, source_fps: float) -> int:
        """Frames sampled from a clip of ``total`` frames at ``source_fps`` frames a second."""
        if source_fps <= 0:
            raise VideoLengthError(
                "the video's frame rate is unknown (a variable or missing rate): send a clip with a constant rate"
            )
        step = self.temporal_patch_size
        most = math.floor(min(self.max_frames, total) / step) * step
        n = total / source_fps * min(self.fps, MAX_SOURCE_FPS)
        n = min(max(n, self.min_frames), most, total)
        n = math.floor(n / step) * step
        if n < step:
            raise VideoLengthError(
                f"the video has {total} frame(s): the model takes clips of at least {step} frames"
            )
        return n


@dataclass(frozen=True, slots=True)
class VideoTokens:
    """``token``: the placeholder token one clip's tokens repeat; ``token_id``: its id; ``text``:
    what a template that reads text writes for a clip; ``sampling`` and ``resolution``: its frames
    and their size (see the module docstring); ``max_video_tokens`` bounds the pixels of a frame
    when ``cap_pixels_per_frame``."""

    token: str
    token_id: int
    text: str
    sampling: FrameSampling
    resolution: DynamicResolution
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = _DEFAULTS["max_video_tokens"]

    @property
    def placeholder(self) -> str:
        return self.text or self.token

    def count(self, frames: int | None, fps: float | None, width: int | None, height: int | None) -> int:
        """Placeholder tokens of a clip of ``frames`` frames at ``fps``, ``width`` x ``height``
        pixels (``VideoLengthError`` for one the model cannot take, or whose shape is unknown)."""
        if frames is None or fps is None or width is None or height is None:
            raise VideoLengthError(
                "the video's frames, rate and size are unknown: the frontend reads them with OpenCV, "
                "which is not installed (pip install 'dyn[video]')"
            )
        n = self.sampling.frames(frames, fps)
        resolution = self.resolution
        if self.cap_pixels_per_frame:
            factor = resolution.patch_size * resolution.merge_size
            share = (
                int(self.max_video_tokens * factor * factor * 0.9) * self.sampling.temporal_patch_size // n
            )
            cap = max(min(resolution.max_pixels, share), int(resolution.min_pixels * 1.05))
            resolution = DynamicResolution(
                resolution.patch_size, resolution.merge_size, resolution.min_pixels, cap
            )
        try:
            per_group = resolution.count(width, height)
        except ValueError as exc:  # ImageSizeError: the frame's aspect ratio
            raise VideoLengthError(str(exc).replace("image", "video frame", 1)) from None
        return n // self.sampling.temporal_patch_size * per_group

    def tokens_for(self, item: Any) -> int:
        """``count`` of a loaded clip (its ``frames``, ``fps``, ``width`` and ``height``)."""
        return self.count(item.frames, item.fps, item.width, item.height)


def video_tokens(info: ModelInfo) -> VideoTokens | None:
    """The model's video placeholder, or None when it takes no clips (or none dyn can count)."""
    files = read_processor_files(info)
    config = files.config
    vision = config.get("vision_config")
    if config.get("model_type") not in VIDEO_FAMILIES or not isinstance(vision, dict):
        return None
    token_id = _int(config.get("video_token_id"))
    patch = _int(vision.get("patch_size")) or 14
    merge = _int(vision.get("spatial_merge_size")) or 2
    settings = _video_processor(info, files.processor, files.preprocessor)
    size = settings.get("size")
    if not isinstance(size, dict):
        size = {}
    low = _int(settings.get("min_pixels")) or _int(size.get("shortest_edge")) or _DEFAULTS["min_pixels"]
    high = _int(settings.get("max_pixels")) or _int(size.get("longest_edge")) or _DEFAULTS["max_pixels"]
    step = (
        _int(settings.get("temporal_patch_size"))
        or _int(vision.get("temporal_patch_size"))
        or _DEFAULTS["temporal_patch_size"]
    )
    fps = settings.get("fps")
    sampling = FrameSampling(
        float(fps) if isinstance(fps, int | float) and not isinstance(fps, bool) and fps > 0 else DEFAULT_FPS,
        _int(settings.get("min_frames")) or _DEFAULTS["min_frames"],
        _int(settings.get("max_frames")) or _DEFAULTS["max_frames"],
        step,
    )
    if token_id is None or patch <= 0 or merge <= 0 or not 0 < low <= high:
        return None
    start, pad, end = QWEN_VIDEO_TOKENS
    return VideoTokens(
        pad,
        token_id,
        start + pad + end,
        sampling,
        DynamicResolution(patch, merge, low, high),
        settings.get("cap_pixels_per_frame") is True,
        _int(settings.get("max_video_tokens")) or _DEFAULTS["max_video_tokens"],
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
