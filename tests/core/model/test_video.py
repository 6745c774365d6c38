"""The Qwen2-VL family's clips (``dyn.core.model.video``): how many frames vLLM's sampler takes and
how many ``<|video_pad|>`` tokens they become, read from the model's files.

The figures marked "vLLM" were run through vLLM 0.32's own Qwen2-VL path (its OpenCV loader and
``Qwen2VLVideoBackend``, transformers' ``Qwen2VLVideoProcessor``) with dyn-tiny-qwen2-vl, whose
pixel bounds these models share; tests/plugins/vllm/test_real_vllm_video.py runs them there."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from dyn.core.errors import ConfigError
from dyn.core.model import load_model_info
from dyn.core.model.multimodal import MediaProcessing, placeholder_rules, uncounted_modalities
from dyn.core.model.video import FrameSampling, VideoLengthError, video_tokens
from tests.media_models import QWEN_TOKENS, make_qwen_vl_model

TINY_QWEN_PIXELS = {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 64}
"""dyn-tiny-qwen2-vl's (scripts/make_tiny_qwen2_vl.py)."""


def rewrite(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.fixture
def tiny(tmp_path):
    return video_tokens(load_model_info(make_qwen_vl_model(tmp_path / "qwen", **TINY_QWEN_PIXELS)))


def test_a_qwen2_vl_model_takes_clips_written_as_its_video_pad(tiny):
    assert (tiny.token, tiny.token_id) == ("<|video_pad|>", QWEN_TOKENS["<|video_pad|>"])
    assert tiny.placeholder == "<|vision_start|><|video_pad|><|vision_end|>"
    assert tiny.sampling == FrameSampling(fps=2.0, min_frames=4, max_frames=768, temporal_patch_size=2)
    assert (tiny.resolution.min_pixels, tiny.resolution.max_pixels) == (56 * 56, 28 * 28 * 64)


@pytest.mark.parametrize(
    ("frames", "fps", "width", "height", "tokens"),
    [
        (30, 10.0, 320, 240, 162),  # 6 frames at 2 a second: 3 groups of 6 x 9 merged patches
        (7, 25.0, 100, 60, 16),  # raised to the 4-frame minimum: 2 groups of 2 x 4
        (3, 30.0, 64, 64, 4),  # fewer frames than the minimum: 2, one group of 2 x 2
        (200, 30.0, 128, 96, 90),  # 13.3 frames rounded down to 12: 6 groups of 3 x 5
    ],
)
def test_a_clip_counts_as_vllm_counted_it(tiny, frames, fps, width, height, tokens):
    assert tiny.count(frames, fps, width, height) == tokens
    assert tiny.tokens_for(SimpleNamespace(frames=frames, fps=fps, width=width, height=height)) == tokens


def test_frames_are_sampled_at_the_processors_rate_within_its_bounds():
    sampling = FrameSampling(fps=2.0, min_frames=4, max_frames=768, temporal_patch_size=2)
    assert sampling.frames(300, 30.0) == 20  # 10 s at 2 a second
    assert sampling.frames(301, 30.0) == 20  # 20.07 rounded down to the temporal patch
    assert sampling.frames(30 * 3600, 30.0) == 768  # an hour: the most frames
    assert sampling.frames(900, 240.0) == 6  # 3.75 s: 7.5 frames, rounded down to the temporal patch
    # a processor asking for 60 frames a second gets at most 30
    assert FrameSampling(fps=60.0, min_frames=4, max_frames=768, temporal_patch_size=2).frames(60, 60.0) == 30
    assert sampling.frames(5, 30.0) == 4  # the minimum, within the clip
    assert sampling.frames(2, 30.0) == 2
    with pytest.raises(VideoLengthError, match="has 1 frame.s.: the model takes clips of at least 2 frames"):
        sampling.frames(1, 30.0)
    for unknown in (0.0, float("nan"), float("inf")):
        with pytest.raises(VideoLengthError, match="frame rate is unknown"):
            sampling.frames(100, unknown)
    # whatever the loader's max_frames, vLLM samples at most 768
    assert (
        FrameSampling(fps=2.0, min_frames=4, max_frames=5000, temporal_patch_size=2).frames(30 * 3600, 30.0)
        == 768
    )


def test_a_clip_whose_shape_is_unknown_or_frames_too_narrow_is_refused_with_the_reason(tiny):
    with pytest.raises(VideoLengthError, match=r"pip install 'dyn\[video\]'"):
        tiny.count(None, None, None, None)
    with pytest.raises(VideoLengthError, match="video frame"):
        tiny.count(30, 10.0, 4020, 20)


def test_cap_pixels_per_frame_bounds_a_long_clips_frames_by_an_even_share(tmp_path):
    model = make_qwen_vl_model(tmp_path / "capped", max_pixels=28 * 28 * 768)
    plain = video_tokens(load_model_info(model))
    rewrite(model / "preprocessor_config.json", cap_pixels_per_frame=True, max_video_tokens=1000)
    capped = video_tokens(load_model_info(model))
    # 768 frames of 1280x720 (384 groups): each 1008x560 within max_pixels, 36 x 20 merged
    # patches; capped, 900 tokens' worth of pixels shared by 384 groups is under the floor of
    # 1.05 x 3136 pixels, and a frame is 56x28: 2
    assert plain.count(30 * 3600, 30.0, 1280, 720) == 384 * 720
    assert capped.count(30 * 3600, 30.0, 1280, 720) == 384 * 2
    assert capped.count(30, 30.0, 1280, 720) < plain.count(30, 30.0, 1280, 720)


def test_the_video_processors_settings_are_read_where_transformers_reads_them(tmp_path):
    model = make_qwen_vl_model(tmp_path / "q")
    rewrite(model / "preprocessor_config.json", max_pixels=28 * 28 * 100, fps=1.0)
    rule = video_tokens(load_model_info(model))  # the image processor's file, as the checkpoints have it
    assert rule.resolution.max_pixels == 28 * 28 * 100
    assert rule.sampling.fps == 2.0  # vLLM's loader samples at its own rate, not the processor's
    (model / "video_preprocessor_config.json").write_text(json.dumps({"max_pixels": 28 * 28 * 200}))
    rule = video_tokens(load_model_info(model))  # its own file: transformers' defaults for the rest
    assert (rule.resolution.min_pixels, rule.resolution.max_pixels) == (128 * 28 * 28, 28 * 28 * 200)
    (model / "processor_config.json").write_text(
        json.dumps({"video_processor": {"size": {"shortest_edge": 3136, "longest_edge": 6272}}})
    )
    rule = video_tokens(load_model_info(model))  # transformers 5's processor_config.json wins
    assert (rule.resolution.min_pixels, rule.resolution.max_pixels) == (3136, 6272)


def test_the_engines_processing_flags_change_the_count_as_they_change_vllms(tmp_path):
    """vLLM's ``--mm-processor-kwargs`` replace the processors' pixel bounds (a ``size`` replaces
    ``min_pixels``/``max_pixels`` too), and ``--media-io-kwargs``' video ``fps``, ``min_frames``
    and ``max_frames`` are its loader's: figures from vLLM 0.32 with dyn-tiny-qwen2-vl."""
    info = load_model_info(make_qwen_vl_model(tmp_path / "qwen", **TINY_QWEN_PIXELS))
    rules = placeholder_rules(info, MediaProcessing({"max_pixels": 28 * 28 * 16}))
    assert rules["image"].count_for(300, 200) == 12 and rules["video"].count(30, 10.0, 320, 240) == 36
    faster = placeholder_rules(info, MediaProcessing(media_io_kwargs={"video": {"fps": 4}}))
    assert faster["image"].count_for(300, 200) == 54 and faster["video"].count(30, 10.0, 320, 240) == 324
    sized = placeholder_rules(
        info, MediaProcessing({"size": {"shortest_edge": 3136, "longest_edge": 28 * 28 * 16}})
    )
    assert sized["image"].count_for(300, 200) == 12 == sized["video"].count(30, 10.0, 320, 240) // 3
    bounded = placeholder_rules(info, MediaProcessing(media_io_kwargs={"video": {"max_frames": 4}}))
    assert bounded["video"].sampling.max_frames == 4


@pytest.mark.parametrize(
    ("processor_kwargs", "media_io_kwargs", "says"),
    [
        ("{", None, "--mm-processor-kwargs: not JSON"),
        ("[1]", None, "--mm-processor-kwargs: give a JSON object"),
        (None, '{"video": 2}', "--media-io-kwargs: 'video' must map to an object"),
    ],
)
def test_processing_flags_that_are_not_json_objects_are_refused_naming_the_flag(
    processor_kwargs, media_io_kwargs, says
):
    with pytest.raises(ConfigError, match=re.escape(says)):
        MediaProcessing.parse(processor_kwargs, media_io_kwargs)
    assert MediaProcessing.parse('{"max_pixels": 1}', '{"video": {"fps": 1}}') == MediaProcessing(
        {"max_pixels": 1}, {"video": {"fps": 1}}
    )


QWEN3_PIXELS = {"min_pixels": 64 * 64, "max_pixels": 32 * 32 * 256}
"""dyn-tiny-qwen3-vl's video bounds (on a whole clip's pixels)."""


@pytest.fixture(params=["qwen3_vl", "qwen3_5"])
def qwen3(tmp_path, request):
    """A Qwen3-VL model, or a Qwen3.5 one (vLLM serves it with Qwen3-VL's processor)."""
    model = make_qwen_vl_model(tmp_path / "qwen3", family=request.param, **QWEN3_PIXELS)
    return video_tokens(load_model_info(model))


def encode(text: str) -> list[int]:
    """Stands for the tokenizer: a time's text as its characters' code points."""
    return [ord(c) for c in text]


def written(rule, frames, fps, width, height) -> str:
    ids = rule.ids_for(SimpleNamespace(frames=frames, fps=fps, width=width, height=height), encode)
    marks = {rule.start_id: "[", rule.end_id: "]", rule.token_id: "v"}
    return "".join(marks.get(i, chr(i)) for i in ids)


@pytest.mark.parametrize(
    ("frames", "fps", "width", "height", "text"),
    [
        # 6 frames at indices 0, 6, 12, 17, 23, 29; 256x320 pixels x 6 over the bound: 160x224
        (
            30,
            10.0,
            320,
            240,
            "<0.3 seconds>[" + "v" * 35 + "]<1.4 seconds>[" + "v" * 35 + "]<2.6 seconds>[" + "v" * 35 + "]",
        ),
        (7, 25.0, 100, 60, "<0.0 seconds>[vvvvvv]<0.2 seconds>[vvvvvv]"),  # 4 frames, 64x96
        (3, 30.0, 64, 64, "<0.0 seconds>[vvvv]<0.1 seconds>[vvvv]"),  # 3 frames, the last repeated
    ],
)
def test_a_qwen3_vl_clip_is_written_as_vllm_wrote_it_each_frame_pair_with_its_time(
    qwen3, frames, fps, width, height, text
):
    assert qwen3.timed and (qwen3.start_id, qwen3.end_id) == (
        QWEN_TOKENS["<|vision_start|>"],
        QWEN_TOKENS["<|vision_end|>"],
    )
    assert written(qwen3, frames, fps, width, height) == text
    assert qwen3.count(frames, fps, width, height) == text.count("v")


def test_qwen3_vl_samples_frames_as_vllms_sampler_does():
    """vLLM's ``Qwen3VLVideoBackend``: ``int(total / fps * 2)`` frames within [4, 768] and the
    clip, at numpy's ``linspace(0, total - 1, n).round()``, checked against numpy itself."""
    np = pytest.importorskip("numpy")
    sampling = FrameSampling(fps=2.0, min_frames=4, max_frames=768, temporal_patch_size=2)
    assert sampling.indices(30, 10.0) == [0, 6, 12, 17, 23, 29]
    assert sampling.indices(7, 25.0) == [0, 2, 4, 6]  # the 4-frame minimum
    assert sampling.indices(48, 0.0) == [0, 16, 31, 47]  # an unknown rate read as 24: 4 frames
    assert len(sampling.indices(30 * 3600, 30.0)) == 768
    assert sampling.indices(48, float("nan")) == sampling.indices(48, float("inf")) == [0, 16, 31, 47]
    assert FrameSampling(fps=2.0, min_frames=1, max_frames=768, temporal_patch_size=1).indices(1, 30.0) == [0]
    for total in range(2, 700, 3):
        for fps in (1.0, 7.5, 23.976, 29.97, 30.0, 60.0):
            n = min(max(int(total / fps * 2), 4), 768, total)
            assert sampling.indices(total, fps) == np.linspace(0, total - 1, n).round().astype(int).tolist()
    with pytest.raises(VideoLengthError, match="has 1 frame"):
        sampling.indices(1, 30.0)


def test_qwen3_vl_frames_narrower_than_a_merged_patch_are_scaled_up_first(qwen3):
    # 10x600: scaled to 32x1920 before the bounds (a 60:1 frame), within them for 4 frames: 2 pairs
    # of 120 x 2 patches merged 2x2 (rounding 10 pixels to a merged patch first would give 16)
    assert qwen3.count(4, 2.0, 10, 600) == 2 * 60
    with pytest.raises(VideoLengthError, match="at most 200 times"):
        qwen3.count(4, 2.0, 4020, 20)


def test_other_families_clips_are_not_counted(tmp_path):
    model = make_qwen_vl_model(tmp_path / "glm")
    rewrite(model / "config.json", model_type="glm4v")
    info = load_model_info(model)
    assert video_tokens(info) is None and "video" not in placeholder_rules(info)
    # GLM-4V's images are counted, its clips (written with their times, its own way) are not
    assert uncounted_modalities(info, placeholder_rules(info)) == {"video": "glm4v"}
    qwen2 = load_model_info(make_qwen_vl_model(tmp_path / "q2"))
    assert set(placeholder_rules(qwen2)) == {"image", "video"} and uncounted_modalities(qwen2, {}) == {
        "image": "qwen2_vl",
        "video": "qwen2_vl",
    }
    model = make_qwen_vl_model(tmp_path / "q3", family="qwen3_vl")
    rewrite(model / "config.json", vision_end_token_id=None)  # a timed clip needs both markers
    info = load_model_info(model)
    assert video_tokens(info) is None and uncounted_modalities(info, placeholder_rules(info)) == {
        "video": "qwen3_vl"
    }
