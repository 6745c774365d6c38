#!/usr/bin/env python3
"""Write `dyn-tiny-idefics3`: a random-weight Idefics3 (the architecture of SmolVLM) small enough
for vLLM on a CPU, for tests of images whose placeholders are split into tiles.

Usage: python scripts/make_tiny_idefics3.py OUT_DIR

Needs torch, transformers and Pillow (the venv of scripts/provision_vllm_cpu.sh has them). The
model is transformers' `Idefics3ForConditionalGeneration`: a SigLIP-style vision tower (56-pixel
tiles in 14-pixel patches, hidden size 32, 2 layers), Idefics3's pixel-shuffle connector (scale
factor 2) and a Llama like dyn-tiny-llama's. The weights are random (seeded) and saved as
safetensors in bfloat16: the text it writes is noise, but a request with images runs vLLM's whole
Idefics3 path (processor, tiling, vision encoder, prefix caching keyed by the images).

The tokenizer is dyn-tiny's plus Idefics3's special tokens: `<fake_token_around_image>`,
`<image>` (``image_token_id``), `<global-img>`, and the tile tags `<row_R_col_C>` for R and C up
to ``ROW_TAGS``, as Idefics3's and SmolVLM's tokenizers have them. The chat template is dyn-tiny's
Llama-3 layout, writing one `<image>` per image part.

Placeholder tokens, the rule a frontend needs (transformers' `Idefics3Processor`, vLLM's
`Idefics3ProcessingInfo`): an image is resized so its longest edge is ``LONGEST_EDGE``, then cut
into ``TILE``-pixel tiles (rows and columns rounded up); each tile is written
`<fake_token_around_image><row_R_col_C>` and ``IMAGE_SEQ_LEN`` `<image>` tokens, a newline after
each row, then a newline and the whole image, `<fake_token_around_image><global-img>`,
``IMAGE_SEQ_LEN`` `<image>` tokens, `<fake_token_around_image>`. An image that fits in one tile is
only that last part (dyn.core.model.image_layouts' `SplitTiles`).
"""

from __future__ import annotations

import sys
from pathlib import Path

NAME = "dyn-tiny-idefics3"
SEED = 0
CONTEXT = 2048
TILE = 56
PATCH_SIZE = 14
SCALE_FACTOR = 2
LONGEST_EDGE = 4 * TILE
IMAGE_SEQ_LEN = (TILE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2
"""`<image>` tokens per tile: the tile's patches after the connector's pixel shuffle."""
ROW_TAGS = 6
IMAGE_TOKEN = "<image>"
SPECIAL = (
    "<fake_token_around_image>",
    IMAGE_TOKEN,
    "<global-img>",
    *(f"<row_{r}_col_{c}>" for r in range(1, ROW_TAGS + 1) for c in range(1, ROW_TAGS + 1)),
)
IMAGE_PARTS = ("image", "image_url")


def generate(out_dir: str | Path) -> Path:
    """Write the model directory into ``out_dir`` (created if needed) and return its path."""
    from make_tiny_llama import (
        TINY_VISION,
        llama_config,
        media_model_start,
        save_processor,
        save_random_model,
    )  # this script's directory is on sys.path
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
        Idefics3VisionConfig,
    )

    out, chat_template, tokenizer = media_model_start(out_dir, IMAGE_PARTS, IMAGE_TOKEN, SPECIAL)
    image_processor = Idefics3ImageProcessor(
        do_image_splitting=True,
        size={"longest_edge": LONGEST_EDGE},
        max_image_size={"longest_edge": TILE},
    )
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=IMAGE_SEQ_LEN,
        chat_template=chat_template,
    )
    save_processor(processor, image_processor, out)
    vision = Idefics3VisionConfig(
        **TINY_VISION,
        image_size=TILE,
        patch_size=PATCH_SIZE,
    )
    text = llama_config(tokenizer, CONTEXT)
    config = Idefics3Config(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        scale_factor=SCALE_FACTOR,
        pad_token_id=text.pad_token_id,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    return save_random_model(Idefics3ForConditionalGeneration, config, out, SEED)


if __name__ == "__main__":
    from make_tiny_llama import one_directory_main  # this script's directory is on sys.path

    sys.exit(one_directory_main(sys.argv[1:], generate, NAME, __doc__))
