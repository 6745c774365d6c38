#!/usr/bin/env python3
"""Write `dyn-tiny-internvl`: a random-weight InternVL (InternVL3's architecture in transformers'
format) small enough for vLLM on a CPU, for tests of images cut into the tiles whose aspect ratio is
closest to theirs.

Usage: python scripts/make_tiny_internvl.py OUT_DIR

Needs torch, torchvision, transformers and Pillow (the venv of scripts/provision_vllm_cpu.sh has
them, its CPU torchvision on PYTHONPATH: transformers' GOT-OCR2 image processor requires it). The
model is transformers' `InternVLForConditionalGeneration`: an InternViT tower of ``TILE``-pixel
tiles in 14-pixel patches (hidden size 32, 2 layers), pixel-shuffled by 0.5 (``IMAGE_SEQ_LENGTH``
tokens a tile), before a Qwen2 decoder of dyn-tiny's sizes. The weights are random (seeded) and
saved as safetensors in bfloat16: the text it writes is noise, but a request with images runs
vLLM's whole InternVL path (processor, tiling, vision encoder, prefix caching keyed by the images).

The tokenizer is dyn-tiny's plus InternVL's `<img>`, `</img>`, `<IMG_CONTEXT>` and `<video>` (named
as its tokenizer names them); the chat template is dyn-tiny's Llama-3 layout, writing one
`<IMG_CONTEXT>` per image part.

Placeholder tokens, the rule a frontend needs (transformers' `GotOcr2ImageProcessor` and
`InternVLProcessor`, vLLM's `InternS1MultiModalProcessor`): an image is cut into the grid of at
most ``MAX_TILES`` tiles whose aspect ratio is closest to its own (on a tie, more tiles while they
cover at most twice its area), plus a thumbnail tile when the grid has more than one; it is written
`<img>`, ``IMAGE_SEQ_LENGTH`` `<IMG_CONTEXT>` tokens a tile, `</img>`
(dyn.core.model.image_layouts' `ClosestGrid`).
"""

from __future__ import annotations

import sys
from pathlib import Path

NAME = "dyn-tiny-internvl"
SEED = 0
CONTEXT = 2048
TILE = 56
PATCH_SIZE = 14
IMAGE_SEQ_LENGTH = (TILE // PATCH_SIZE) ** 2 // 4
MAX_TILES = 6
IMAGE_TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}
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
        GotOcr2ImageProcessor,
        InternVLConfig,
        InternVLForConditionalGeneration,
        InternVLProcessor,
        InternVLVideoProcessor,
        PreTrainedTokenizerFast,
    )

    out, chat_template, base = media_model_start(
        out_dir, IMAGE_PARTS, IMAGE_TOKENS["context_image_token"], tuple(IMAGE_TOKENS.values())
    )
    base.save_pretrained(str(out))
    # reloaded with the image tokens named, as InternVL's tokenizer_config.json names them
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(out), extra_special_tokens=IMAGE_TOKENS)
    tile = {"height": TILE, "width": TILE}
    image_processor = GotOcr2ImageProcessor(
        size=tile, crop_to_patches=True, min_patches=1, max_patches=MAX_TILES
    )
    processor = InternVLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=InternVLVideoProcessor(size=tile),
        image_seq_length=IMAGE_SEQ_LENGTH,
        chat_template=chat_template,
    )
    save_processor(processor, image_processor, out)
    text = {
        **TINY_SIZES,
        "model_type": "qwen2",
        "vocab_size": len(tokenizer),
        "max_position_embeddings": CONTEXT,
        "rope_theta": 10000.0,
        **special_token_ids(tokenizer),
        "tie_word_embeddings": True,
    }
    vision = {**TINY_VISION, "image_size": [TILE, TILE], "patch_size": [PATCH_SIZE, PATCH_SIZE]}
    config = InternVLConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKENS["context_image_token"]),
        image_seq_length=IMAGE_SEQ_LENGTH,
        downsample_ratio=0.5,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    return save_random_model(InternVLForConditionalGeneration, config, out, SEED)


if __name__ == "__main__":
    from make_tiny_llama import one_directory_main  # this script's directory is on sys.path

    sys.exit(one_directory_main(sys.argv[1:], generate, NAME, __doc__))
