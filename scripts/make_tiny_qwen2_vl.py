#!/usr/bin/env python3
"""Write `dyn-tiny-qwen2-vl`: a random-weight Qwen2-VL small enough for vLLM on a CPU, for tests
of images (and clips) whose placeholder count follows their size; with `2.5`, `dyn-tiny-qwen2.5-vl`,
the same as Qwen2.5-VL (its vision tower's windowed attention and gated MLP, the same counts); with
`3`, `dyn-tiny-qwen3-vl`, as Qwen3-VL (16-pixel patches, and clips written with each frame pair's
timestamp); with `3.5`, `dyn-tiny-qwen3.5`, as Qwen3.5 (Qwen3-VL's tower and processor before a
hybrid decoder: one Gated DeltaNet layer, with 128-wide heads as vLLM's CPU kernel needs, and one
full-attention layer); with `jina`, `dyn-tiny-jina-vl-ranker`, jina-reranker-m0's architecture
(`JinaVLForRanking`: this Qwen2-VL with a one-class score head, `score.0` and `score.2`).

Usage: python scripts/make_tiny_qwen2_vl.py OUT_DIR [2.5|3|3.5|jina]

Needs torch, torchvision, transformers and Pillow: transformers' Qwen2-VL processor holds a video
processor, which needs torchvision (scripts/provision_vllm_cpu.sh installs one that runs on a CPU
beside the venv and puts it on PYTHONPATH for this script). The model is transformers'
`Qwen2VLForConditionalGeneration`: a vision tower of 14-pixel patches, 2 frames deep, merged 2x2
(hidden size 32, 2 layers) before a Qwen2 decoder of dyn-tiny-llama's sizes with multimodal rotary
positions. The weights are random (seeded) and saved as safetensors in bfloat16: the text it writes
is noise, but a request with images runs vLLM's whole Qwen2-VL path (processor, dynamic resolution,
vision encoder, prefix caching keyed by the images).

The tokenizer is dyn-tiny's plus Qwen2-VL's `<|vision_start|>`, `<|vision_end|>`, `<|image_pad|>`
and `<|video_pad|>`; the chat template is dyn-tiny's Llama-3 layout writing
`<|vision_start|><|image_pad|><|vision_end|>` for an image part and the `<|video_pad|>` twin for a
video part.

Placeholder tokens, the rule a frontend needs (transformers' `smart_resize`, vLLM's
`Qwen2VLProcessingInfo`): an image is resized so each side is a multiple of 28 pixels (the patch
times the merge) and its area is within ``MIN_PIXELS``..``MAX_PIXELS``; it is then
``(height / 28) * (width / 28)`` `<|image_pad|>` tokens (dyn.core.model.image_layouts'
`DynamicResolution`).
"""

from __future__ import annotations

import sys
from pathlib import Path

NAME = "dyn-tiny-qwen2-vl"
SEED = 0
CONTEXT = 4096
PATCH_SIZE = 14
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 64
"""At most 64 `<|image_pad|>` tokens an image, so that tests stay small."""
QWEN3_PATCH_SIZE = 16
QWEN3_MIN_PIXELS, QWEN3_MAX_PIXELS = 64 * 64, 32 * 32 * 64
QWEN3_VIDEO_MAX_PIXELS = 32 * 32 * 256
"""Qwen3-VL's video bound is on all of a clip's frames together (transformers' 3-D ``smart_resize``)."""
NAMES = {
    "2": NAME,
    "2.5": "dyn-tiny-qwen2.5-vl",
    "3": "dyn-tiny-qwen3-vl",
    "3.5": "dyn-tiny-qwen3.5",
    "jina": "dyn-tiny-jina-vl-ranker",
}
PREFIXES = {"2": "Qwen2VL", "2.5": "Qwen2_5_VL", "3": "Qwen3VL", "3.5": "Qwen3_5", "jina": "Qwen2VL"}
"""transformers' class-name prefix of each version's config and model (Qwen3.5 takes Qwen3-VL's
processor)."""
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"
SPECIAL = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
IMAGE_PARTS = ("image", "image_url")
VIDEO_PARTS = ("video", "video_url")


def generate(out_dir: str | Path, version: str = "2") -> Path:
    """Write the model directory into ``out_dir`` (created if needed) and return its path: Qwen2-VL,
    or Qwen2.5-VL when ``version`` is ``"2.5"``, or Qwen3-VL when it is ``"3"``."""
    import transformers
    from make_tiny_llama import (
        TINY_SIZES,
        media_chat_template,
        save_processor,
        save_random_model,
        tiny_tokenizer,
    )  # this script's directory is on sys.path
    from transformers import Qwen2VLImageProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    config_class, model_class = (
        getattr(transformers, PREFIXES[version] + suffix) for suffix in ("Config", "ForConditionalGeneration")
    )
    processor_class = getattr(
        transformers, ("Qwen3VL" if version == "3.5" else PREFIXES[version]) + "Processor"
    )
    qwen3 = version in ("3", "3.5")

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    image = media_chat_template(IMAGE_PARTS, VISION_START + IMAGE_PAD + VISION_END)
    video_branch = (
        f"{{% elif part['type'] in {VIDEO_PARTS!r} %}}{VISION_START}{VIDEO_PAD}{VISION_END}{{% endif %}}"
    )
    chat_template = image.replace(
        "{% endif %}{% endfor %}{% endif %}", video_branch + "{% endfor %}{% endif %}", 1
    )
    tokenizer = tiny_tokenizer(SPECIAL, chat_template)
    patch = QWEN3_PATCH_SIZE if qwen3 else PATCH_SIZE
    sizes = {"patch_size": patch, "merge_size": MERGE_SIZE, "temporal_patch_size": TEMPORAL_PATCH_SIZE}
    if qwen3:
        image_processor = Qwen2VLImageProcessor(
            min_pixels=QWEN3_MIN_PIXELS, max_pixels=QWEN3_MAX_PIXELS, **sizes
        )
        bounds = {"shortest_edge": QWEN3_MIN_PIXELS, "longest_edge": QWEN3_VIDEO_MAX_PIXELS}
        video_processor = Qwen3VLVideoProcessor(size=bounds, **sizes)
    else:
        pixels = {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS}
        image_processor = Qwen2VLImageProcessor(**pixels, **sizes)
        video_processor = Qwen2VLVideoProcessor(**pixels, **sizes)
    processor = processor_class(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=chat_template,
    )
    save_processor(processor, image_processor, out)
    # Qwen2-VL's and Qwen2.5-VL's text configs have no head_dim: hidden_size / num_attention_heads
    # is TINY_SIZES' 32.
    text = {key: value for key, value in TINY_SIZES.items() if key != "head_dim" or qwen3}
    # mrope splits each head's rotary half (head_dim / 2 frequencies) into time, height, width
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]}
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL}
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "num_heads": 2,
        "patch_size": patch,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
    }
    if version == "2":  # Qwen2-VL's tower's width is embed_dim, its output hidden_size
        vision.update(embed_dim=32, hidden_size=TINY_SIZES["hidden_size"], mlp_ratio=2)
    else:  # its tower's width is hidden_size, its output out_hidden_size
        vision.update(intermediate_size=64, out_hidden_size=TINY_SIZES["hidden_size"])
    if version == "2.5":
        vision.update(window_size=56, fullatt_block_indexes=[1])
    if qwen3:  # learned positions on a 4 x 4 grid
        vision.update(num_position_embeddings=16)
        rope["mrope_interleaved"] = True
    if version == "3":  # features also taken from the first block
        vision.update(deepstack_visual_indexes=[0])
    if (
        version == "3.5"
    ):  # a Gated DeltaNet layer (128-wide heads: vLLM's CPU kernel) and a full-attention one
        text.update(
            layer_types=["linear_attention", "full_attention"],
            linear_num_key_heads=2,
            linear_num_value_heads=2,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
        )
        rope["partial_rotary_factor"] = 1.0
    config = config_class(
        text_config={
            **text,
            "vocab_size": len(tokenizer),
            "max_position_embeddings": CONTEXT,
            "rms_norm_eps": 1e-6,
            "rope_parameters": rope,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            "tie_word_embeddings": True,
        },
        vision_config=vision,
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    save_random_model(model_class, config, out, SEED)
    if version == "jina":
        add_score_head(out, TINY_SIZES["hidden_size"])
    return out


def add_score_head(out: Path, hidden: int) -> None:
    """Make the Qwen2-VL in ``out`` jina-reranker-m0's ``JinaVLForRanking``: its score head (a
    ``hidden`` x ``hidden`` layer, ReLU, then one logit), random from the same seed, beside the
    weights, and the config naming the architecture and its one class."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    torch.manual_seed(SEED + 1)
    weights = load_file(str(out / "model.safetensors"))
    head = {
        "score.0.weight": (hidden, hidden),
        "score.0.bias": (hidden,),
        "score.2.weight": (1, hidden),
        "score.2.bias": (1,),
    }
    weights |= {name: (torch.randn(shape) * 0.5).to(torch.bfloat16) for name, shape in head.items()}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config.update(
        architectures=["JinaVLForRanking"], num_labels=1, id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0}
    )
    (out / "config.json").write_text(json.dumps(config, indent=2))


def main(argv: list[str]) -> int:
    if (
        not 1 <= len(argv) <= 2
        or argv[0].startswith("-")
        or argv[1:] not in ([], ["2.5"], ["3"], ["3.5"], ["jina"])
    ):
        print(next(line for line in __doc__.splitlines() if line.startswith("Usage:")), file=sys.stderr)
        return 2
    version = argv[1] if len(argv) == 2 else "2"
    print(f"wrote {generate(argv[0], version)} ({NAMES[version]})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
