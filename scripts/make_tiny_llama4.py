#!/usr/bin/env python3
"""Write `dyn-tiny-llama4`: a random-weight Llama 4 (image and text) small enough for vLLM on a CPU,
for tests of images tiled onto the best-fitting canvas.

Usage: python scripts/make_tiny_llama4.py OUT_DIR

Needs torch, transformers, Pillow and torchvision (the venv of scripts/provision_vllm_cpu.sh has
them, its CPU torchvision on PYTHONPATH: transformers' Llama 4 image processor requires it). The
model is transformers' `Llama4ForConditionalGeneration`: a Llama 4 vision tower (``TILE``-pixel
tiles in 14-pixel patches, pixel-shuffled by 0.5: ``PATCHES_PER_TILE`` tokens a tile; hidden size
32, 2 layers) and a dense Llama 4 decoder of dyn-tiny's sizes (no experts, no chunked attention).
The weights are random (seeded) and saved as safetensors in bfloat16: the text it writes is noise,
but a request with images runs vLLM's whole Llama 4 path (processor, tiling, vision encoder, prefix
caching keyed by the images).

The tokenizer is dyn-tiny's plus Llama 4's image tokens; the chat template is dyn-tiny's Llama-3
layout, writing one `<|image|>` per image part.

Placeholder tokens, the rule a frontend needs (transformers' `Llama4Processor`, vLLM's
`Mllama4MultiModalProcessor`): an image is fitted onto the canvas of at most ``MAX_TILES`` tiles that
scales it up least (else down least, the smallest canvas of equals) and written
`<|image_start|>`, then, for a canvas of more than one tile, each row's tiles of
``PATCHES_PER_TILE`` `<|patch|>` tokens joined by `<|tile_x_separator|>` and ended by
`<|tile_y_separator|>`, then `<|image|>`, the whole image's ``PATCHES_PER_TILE`` `<|patch|>`
tokens and `<|image_end|>` (dyn.core.model.image_layouts' `TiledCanvas`).
"""

from __future__ import annotations

import sys
from pathlib import Path

NAME = "dyn-tiny-llama4"
SEED = 0
CONTEXT = 2048
TILE = 56
PATCH_SIZE = 14
PATCHES_PER_TILE = (TILE // PATCH_SIZE) ** 2 // 4
MAX_TILES = 6
IMAGE_TOKENS = (
    "<|image_start|>",
    "<|image_end|>",
    "<|image|>",
    "<|patch|>",
    "<|tile_x_separator|>",
    "<|tile_y_separator|>",
)
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
        Llama4Config,
        Llama4ForConditionalGeneration,
        Llama4ImageProcessor,
        Llama4Processor,
        Llama4TextConfig,
        Llama4VisionConfig,
    )

    out, chat_template, tokenizer = media_model_start(out_dir, IMAGE_PARTS, "<|image|>", IMAGE_TOKENS)
    image_processor = Llama4ImageProcessor(size={"height": TILE, "width": TILE}, max_patches=MAX_TILES)
    processor = Llama4Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        pixel_shuffle_ratio=0.5,
        chat_template=chat_template,
    )
    save_processor(processor, image_processor, out)
    text = Llama4TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=TINY_SIZES["hidden_size"],
        intermediate_size=TINY_SIZES["intermediate_size"],
        intermediate_size_mlp=TINY_SIZES["intermediate_size"],
        num_hidden_layers=TINY_SIZES["num_hidden_layers"],
        num_attention_heads=TINY_SIZES["num_attention_heads"],
        num_key_value_heads=TINY_SIZES["num_key_value_heads"],
        head_dim=TINY_SIZES["head_dim"],
        max_position_embeddings=CONTEXT,
        interleave_moe_layer_step=0,
        moe_layers=[],
        attention_chunk_size=None,
        **special_token_ids(tokenizer),
    )
    vision = Llama4VisionConfig(
        **{**TINY_VISION, "intermediate_size": 128},  # four times the width: the pixel shuffle's
        image_size=TILE,
        patch_size=PATCH_SIZE,
        pixel_shuffle_ratio=0.5,
        projector_input_dim=64,
        projector_output_dim=64,
        vision_output_dim=64,
    )
    ids = [tokenizer.convert_tokens_to_ids(token) for token in IMAGE_TOKENS[:3]]
    config = Llama4Config(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        boi_token_index=ids[0],
        eoi_token_index=ids[1],
        image_token_index=ids[2],
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    return save_random_model(Llama4ForConditionalGeneration, config, out, SEED)


if __name__ == "__main__":
    from make_tiny_llama import one_directory_main  # this script's directory is on sys.path

    sys.exit(one_directory_main(sys.argv[1:], generate, NAME, __doc__))
