#!/usr/bin/env python3
"""Write `dyn-tiny-gemma3`: a random-weight Gemma 3 (image and text) small enough for vLLM on a
CPU, for tests of images whose placeholders merge with the newlines around them.

Usage: python scripts/make_tiny_gemma3.py OUT_DIR

Needs torch, transformers and Pillow (the venv of scripts/provision_vllm_cpu.sh has them). The
model is transformers' `Gemma3ForConditionalGeneration`: a SigLIP vision tower (64-pixel images in
8-pixel patches, hidden size 32, 2 layers), Gemma 3's average-pooling projector down to
``IMAGE_SEQ_LEN`` tokens an image, and a Gemma 3 decoder of dyn-tiny's sizes. The weights are
random (seeded) and saved as safetensors in bfloat16: the text it writes is noise, but a request
with images runs vLLM's whole Gemma 3 path (processor, newline merging, vision encoder, prefix
caching keyed by the images).

The tokenizer is dyn-tiny's plus Gemma 3's image tokens (`<start_of_image>`, `<end_of_image>`,
`<image_soft_token>`, named as the tokenizer's ``boi_token``, ``eoi_token`` and ``image_token``)
and, as Gemma's own vocabulary has them, one token each for one to four newlines (added tokens:
the longest run matches first). The chat template is Gemma 3's layout: `<start_of_turn>user`, a
newline, each part (an image as `<start_of_image>`, text trimmed), `<end_of_turn>`.

Placeholder tokens, the rule a frontend needs (transformers' `Gemma3Processor`, vLLM's
`Gemma3MultiModalProcessor`): each `<start_of_image>` becomes `\\n\\n<start_of_image>`,
``IMAGE_SEQ_LEN`` `<image_soft_token>`s and `<end_of_image>\\n\\n`; then a newline token beside one
of those `\\n\\n`s merges with it into the three- or four-newline token
(dyn.core.model.newlines).
"""

from __future__ import annotations

import sys
from pathlib import Path

NAME = "dyn-tiny-gemma3"
SEED = 0
CONTEXT = 2048
IMAGE_SIZE = 64
PATCH_SIZE = 8
IMAGE_SEQ_LEN = 16
"""Tokens per image: the 8x8 patches average-pooled to 4x4."""
IMAGE_TOKENS = {
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
}
NEWLINES = ("\n", "\n\n", "\n\n\n", "\n\n\n\n")
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<start_of_turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for part in message['content'] or [] %}"
    "{% if part['type'] in ('image', 'image_url') %}<start_of_image>"
    "{% elif part['type'] == 'text' %}{{ part['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def generate(out_dir: str | Path) -> Path:
    """Write the model directory into ``out_dir`` (created if needed) and return its path."""
    from make_tiny_llama import (
        TINY_SIZES,
        TINY_VISION,
        save_processor,
        save_random_model,
        special_token_ids,
        tiny_tokenizer,
    )
    from tokenizers import AddedToken
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessor,
        Gemma3Processor,
        Gemma3TextConfig,
        PreTrainedTokenizerFast,
        SiglipVisionConfig,
    )

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = tiny_tokenizer(tuple(IMAGE_TOKENS.values()), CHAT_TEMPLATE)
    base.add_tokens([AddedToken(text, special=False, normalized=False) for text in NEWLINES])
    base.save_pretrained(str(out))
    # reloaded with the image tokens named, as Gemma's tokenizer_config.json names them
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(out), extra_special_tokens=IMAGE_TOKENS)
    image_processor = Gemma3ImageProcessor(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, do_pan_and_scan=False
    )
    processor = Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
        image_seq_length=IMAGE_SEQ_LEN,
    )
    save_processor(processor, image_processor, out)
    ids = {name: tokenizer.convert_tokens_to_ids(text) for name, text in IMAGE_TOKENS.items()}
    text = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        **TINY_SIZES,
        max_position_embeddings=CONTEXT,
        sliding_window=512,
        **special_token_ids(tokenizer),
    )
    vision = SiglipVisionConfig(
        **TINY_VISION,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        vision_use_head=False,
    )
    config = Gemma3Config(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        mm_tokens_per_image=IMAGE_SEQ_LEN,
        boi_token_index=ids["boi_token"],
        eoi_token_index=ids["eoi_token"],
        image_token_index=ids["image_token"],
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    save_random_model(Gemma3ForConditionalGeneration, config, out, SEED)
    _name_vision_weights_as_published(out / "model.safetensors")
    return out


def _name_vision_weights_as_published(path: Path) -> None:
    """Rename the vision tower's weights as Gemma 3's published checkpoints (and vLLM's loader)
    name them, ``vision_tower.vision_model.*``: transformers 5 saves them without the
    ``vision_model`` level."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(path))
    renamed = {
        key.replace("vision_tower.", "vision_tower.vision_model.", 1)
        if key.startswith("vision_tower.") and not key.startswith("vision_tower.vision_model.")
        else key: value
        for key, value in weights.items()
    }
    save_file(renamed, str(path), metadata={"format": "pt"})


if __name__ == "__main__":
    from make_tiny_llama import one_directory_main  # this script's directory is on sys.path

    sys.exit(one_directory_main(sys.argv[1:], generate, NAME, __doc__))
