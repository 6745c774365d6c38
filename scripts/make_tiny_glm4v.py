#!/usr/bin/env python3
"""Write `dyn-tiny-glm4v`: a random-weight GLM-4.1V (the architecture of GLM-4.1V-Thinking; GLM-4.5V
is its mixture-of-experts twin) small enough for vLLM on a CPU, for tests of images counted by
their size as GLM-4V's processor resizes them.

Usage: python scripts/make_tiny_glm4v.py OUT_DIR

Needs torch, torchvision, transformers and Pillow: transformers' GLM-4V processor holds a video
processor, which needs torchvision (scripts/provision_vllm_cpu.sh puts its CPU one on PYTHONPATH
for this script). The model is transformers' `Glm4vForConditionalGeneration`: a vision tower of
14-pixel patches, 2 frames deep, merged 2x2 (hidden size 32, 2 layers) before a GLM-4 decoder of
dyn-tiny's sizes with multimodal rotary positions. The weights are random (seeded) and saved as
safetensors in bfloat16: the text it writes is noise, but a request with images runs vLLM's whole
GLM-4V path (processor, resizing, vision encoder, prefix caching keyed by the images).

The tokenizer is dyn-tiny's plus GLM-4V's `<|begin_of_image|>`, `<|image|>`, `<|end_of_image|>`
and their video twins; the chat template is dyn-tiny's Llama-3 layout writing
`<|begin_of_image|><|image|><|end_of_image|>` for an image part.

Placeholder tokens, the rule a frontend needs (transformers' `Glm4vImageProcessor`, vLLM's
`Glm4vMultiModalProcessor`): an image with a side under 28 pixels is scaled up until it has none,
then resized so each side is a multiple of 28 and two frames of it hold between ``MIN_PIXELS`` and
``MAX_PIXELS`` pixels; it is then ``(height / 28) * (width / 28)`` `<|image|>` tokens
(dyn.core.model.image_layouts' `DynamicResolution`, with ``frames=2``).
"""

from __future__ import annotations

import sys
from pathlib import Path

NAME = "dyn-tiny-glm4v"
SEED = 0
CONTEXT = 4096
PATCH_SIZE = 14
MIN_PIXELS = 112 * 112
MAX_PIXELS = 2 * 28 * 28 * 64
"""At most 64 `<|image|>` tokens an image (the bound is on two frames of it), so tests stay small."""
SPECIAL = (
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|video|>",
)
IMAGE_PARTS = ("image", "image_url")
IMAGE_PLACEHOLDER = "<|begin_of_image|><|image|><|end_of_image|>"


def generate(out_dir: str | Path) -> Path:
    """Write the model directory into ``out_dir`` (created if needed) and return its path."""
    from make_tiny_llama import (
        TINY_SIZES,
        media_model_start,
        save_processor,
        save_random_model,
        special_token_ids,
    )
    from transformers import (
        Glm4vConfig,
        Glm4vForConditionalGeneration,
        Glm4vImageProcessor,
        Glm4vProcessor,
        Glm4vVideoProcessor,
    )

    out, chat_template, tokenizer = media_model_start(out_dir, IMAGE_PARTS, IMAGE_PLACEHOLDER, SPECIAL)
    bounds = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    image_processor = Glm4vImageProcessor(
        size=bounds, patch_size=PATCH_SIZE, merge_size=2, temporal_patch_size=2
    )
    video_processor = Glm4vVideoProcessor(
        size=bounds, patch_size=PATCH_SIZE, merge_size=2, temporal_patch_size=2
    )
    processor = Glm4vProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=chat_template,
    )
    save_processor(processor, image_processor, out)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL}
    text = {
        **{key: value for key, value in TINY_SIZES.items() if key != "head_dim"},
        "vocab_size": len(tokenizer),
        "max_position_embeddings": CONTEXT,
        # a 32-wide head rotates half its width: 8 frequencies for time, height and width
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 3, 3],
            "partial_rotary_factor": 0.5,
        },
        **special_token_ids(tokenizer),
    }
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "num_heads": 2,
        "intermediate_size": 64,
        "out_hidden_size": TINY_SIZES["hidden_size"],
        "image_size": 28,
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    config = Glm4vConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"],
        image_start_token_id=ids["<|begin_of_image|>"],
        image_end_token_id=ids["<|end_of_image|>"],
        video_start_token_id=ids["<|begin_of_video|>"],
        video_end_token_id=ids["<|end_of_video|>"],
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    return save_random_model(Glm4vForConditionalGeneration, config, out, SEED)


if __name__ == "__main__":
    from make_tiny_llama import one_directory_main  # this script's directory is on sys.path

    sys.exit(one_directory_main(sys.argv[1:], generate, NAME, __doc__))
