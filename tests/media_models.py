"""Multimodal model directories for the tests that need one without weights (the frontend and the
mocker read only their JSON files), all on dyn-tiny's tokenizer:

- ``make_vision_model``: an ``<image>`` special token added, a LLaVA-1.5-style ``config.json`` (a
  28x28 image, 14-pixel patches: 4 placeholder tokens per image with the ``default`` feature
  strategy and one additional token) and a chat template that iterates over the content parts,
  as llava-hf's do;
- ``make_qwen_vl_model``: the Qwen2-VL family's dynamic resolution, for images and clips;
- ``make_idefics3_model``: Idefics3's (and SmolVLM's) images cut into tiles, written as text
  around their tokens;
- ``make_audio_model``: a Qwen2-Audio-style model (Whisper's feature extractor at 16 kHz: 25
  ``<|AUDIO|>`` tokens a second, 750 at most), its template writing
  ``<|audio_bos|><|AUDIO|><|audio_eos|>`` for an audio part."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dyn.core.model import TINY_MODEL_DIR

IMAGE_TOKEN = "<image>"
IMAGE_TOKEN_ID = 4096
IMAGE_TOKENS = 4
"""Placeholder tokens per image: (28 // 14) ** 2 + 1 - 1."""

TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
    "<|end_header_id|>\n\n{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>\n"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant"
    "<|end_header_id|>\n\n{% endif %}"
)


def make_vision_model(directory: Path) -> Path:
    """Write the model into ``directory`` (created) and return it."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "special_tokens_map.json", "generation_config.json"):
        shutil.copy(TINY_MODEL_DIR / name, directory / name)
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    tokenizer["added_tokens"].append(
        {
            "id": IMAGE_TOKEN_ID,
            "content": IMAGE_TOKEN,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    )
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    tok_config = json.loads((TINY_MODEL_DIR / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = TEMPLATE
    (directory / "tokenizer_config.json").write_text(json.dumps(tok_config))
    text = json.loads((TINY_MODEL_DIR / "config.json").read_text())
    text["vocab_size"] = IMAGE_TOKEN_ID + 1
    config = {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "image_token_index": IMAGE_TOKEN_ID,
        "vision_feature_select_strategy": "default",
        "text_config": text,
        "vision_config": {"model_type": "clip_vision_model", "image_size": 28, "patch_size": 14},
        "vocab_size": IMAGE_TOKEN_ID + 1,
        "max_position_embeddings": 4096,
    }
    (directory / "config.json").write_text(json.dumps(config))
    processor = {
        "image_token": IMAGE_TOKEN,
        "num_additional_image_tokens": 1,
        "patch_size": 14,
        "vision_feature_select_strategy": "default",
        "processor_class": "LlavaProcessor",
    }
    (directory / "processor_config.json").write_text(json.dumps(processor))
    image_processor = {"crop_size": {"height": 28, "width": 28}, "size": {"shortest_edge": 28}}
    (directory / "preprocessor_config.json").write_text(json.dumps(image_processor))
    return directory


def add_special_tokens(directory: Path, tokens: dict[str, int]) -> None:
    """Add ``tokens`` (content: id) to the model's ``tokenizer.json`` as special tokens, like its
    ``<image>``."""
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    tokenizer["added_tokens"] += [
        {**tokenizer["added_tokens"][-1], "id": token_id, "content": token}
        for token, token_id in tokens.items()
    ]
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))


LLAVA_NEXT_PINPOINTS = [[28, 56], [56, 28], [56, 56], [84, 28], [28, 84]]
"""LLaVA-NeXT's grid (336 x 672, 672 x 336, 672 x 672, 1008 x 336, 336 x 1008) at the tiny
model's 28-pixel tile."""


def make_llava_next_model(directory: Path) -> Path:
    """A LLaVA-NeXT-style model (the tiny vision model's tokenizer and 28-pixel CLIP tower, tiled
    at ``LLAVA_NEXT_PINPOINTS``) in ``directory``; transformers' ``AutoProcessor`` loads it."""
    make_vision_model(directory)
    config = json.loads((directory / "config.json").read_text())
    config.update(
        architectures=["LlavaNextForConditionalGeneration"],
        model_type="llava_next",
        image_grid_pinpoints=LLAVA_NEXT_PINPOINTS,
    )
    (directory / "config.json").write_text(json.dumps(config))
    processor = json.loads((directory / "processor_config.json").read_text())
    processor["processor_class"] = "LlavaNextProcessor"
    (directory / "processor_config.json").write_text(json.dumps(processor))
    image_processor = {
        "image_processor_type": "LlavaNextImageProcessor",
        "processor_class": "LlavaNextProcessor",
        "crop_size": {"height": 28, "width": 28},
        "size": {"shortest_edge": 28},
        "image_grid_pinpoints": LLAVA_NEXT_PINPOINTS,
    }
    (directory / "preprocessor_config.json").write_text(json.dumps(image_processor))
    return directory


QWEN_TOKENS = {"<|vision_start|>": 4097, "<|image_pad|>": 4098, "<|vision_end|>": 4099, "<|video_pad|>": 4100}
QWEN_TEMPLATE = TEMPLATE.replace(
    "<image>\n",
    "<|vision_start|><|image_pad|><|vision_end|>{% elif part['type'] == 'video' %}"
    "<|vision_start|><|video_pad|><|vision_end|>",
)


def make_qwen_vl_model(
    directory: Path, min_pixels: int = 56 * 56, max_pixels: int = 28 * 28 * 1280, family: str = "qwen2_vl"
) -> Path:
    """A Qwen2-VL-style model (the same tokenizer with Qwen's vision tokens added, a vision tower
    with 14-pixel patches merged 2x2 and 2 frames deep, the image processor's pixel bounds, which
    its video processor reads too, as the published checkpoints have it) in ``directory``; with
    ``family`` ``qwen3_vl`` (or Qwen3.5's ``qwen3_5``), Qwen3-VL's 16-pixel patches."""
    patch = 16 if family in ("qwen3_vl", "qwen3_5") else 14
    make_vision_model(directory)
    add_special_tokens(directory, QWEN_TOKENS)
    tok_config = json.loads((directory / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = QWEN_TEMPLATE
    (directory / "tokenizer_config.json").write_text(json.dumps(tok_config))
    config = json.loads((directory / "config.json").read_text())
    config.update(
        architectures=[
            {"qwen3_vl": "Qwen3VLForConditionalGeneration", "qwen3_5": "Qwen3_5ForConditionalGeneration"}.get(
                family, "Qwen2VLForConditionalGeneration"
            )
        ],
        model_type=family,
        image_token_id=QWEN_TOKENS["<|image_pad|>"],
        video_token_id=QWEN_TOKENS["<|video_pad|>"],
        vision_start_token_id=QWEN_TOKENS["<|vision_start|>"],
        vision_end_token_id=QWEN_TOKENS["<|vision_end|>"],
        vision_config={"patch_size": patch, "spatial_merge_size": 2, "temporal_patch_size": 2},
        vocab_size=4101,
    )
    del config["image_token_index"]
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "processor_config.json").unlink()
    (directory / "preprocessor_config.json").write_text(
        json.dumps({"min_pixels": min_pixels, "max_pixels": max_pixels, "patch_size": patch, "merge_size": 2})
    )
    return directory


IDEFICS3_TOKENS = {
    "<fake_token_around_image>": 4097,
    "<global-img>": 4098,
    **{f"<row_{r}_col_{c}>": 4099 + 6 * (r - 1) + (c - 1) for r in range(1, 7) for c in range(1, 7)},
}
"""Idefics3's tokens beside ``<image>`` (4096): the tile tags up to 6 x 6, as its tokenizer has them."""
IDEFICS3_TILE = 56
IDEFICS3_SEQ_LEN = 4
"""``<image>`` tokens a tile: (56 // 14) ** 2 patches, pixel-shuffled by a scale factor of 2."""


def make_idefics3_model(directory: Path, family: str = "idefics3") -> Path:
    """An Idefics3-style model (``family``: ``idefics3``, or ``smolvlm`` for SmolVLM, the same
    rule) in ``directory``: the tiny vision model's tokenizer with Idefics3's tokens added, images
    resized to a longest edge of 4 tiles of ``IDEFICS3_TILE`` pixels and cut into those tiles,
    ``IDEFICS3_SEQ_LEN`` image tokens a tile; transformers' ``AutoProcessor`` loads it."""
    make_vision_model(directory)
    add_special_tokens(directory, IDEFICS3_TOKENS)
    config = json.loads((directory / "config.json").read_text())
    vocab = max(IDEFICS3_TOKENS.values()) + 1
    config.update(
        architectures=[f"{'SmolVLM' if family == 'smolvlm' else 'Idefics3'}ForConditionalGeneration"],
        model_type=family,
        image_token_id=IMAGE_TOKEN_ID,
        scale_factor=2,
        vision_config={"model_type": f"{family}_vision", "image_size": IDEFICS3_TILE, "patch_size": 14},
        vocab_size=vocab,
    )
    config["text_config"]["vocab_size"] = vocab
    del config["image_token_index"], config["vision_feature_select_strategy"]
    (directory / "config.json").write_text(json.dumps(config))
    processor_class = "SmolVLMProcessor" if family == "smolvlm" else "Idefics3Processor"
    image_processor = {
        "image_processor_type": f"{processor_class[:-9]}ImageProcessor",
        "do_image_splitting": True,
        "size": {"longest_edge": 4 * IDEFICS3_TILE},
        "max_image_size": {"longest_edge": IDEFICS3_TILE},
    }
    processor = {"image_seq_len": IDEFICS3_SEQ_LEN, "processor_class": processor_class}
    (directory / "processor_config.json").write_text(json.dumps(processor))
    (directory / "preprocessor_config.json").write_text(json.dumps(image_processor))
    return directory


AUDIO_TOKENS = {"<|audio_bos|>": 4096, "<|AUDIO|>": 4097, "<|audio_eos|>": 4098}
AUDIO_TOKEN_ID = AUDIO_TOKENS["<|AUDIO|>"]
AUDIO_TEMPLATE = TEMPLATE.replace(
    "{% if part['type'] == 'image' %}<image>\n",
    "{% if part['type'] == 'audio' %}<|audio_bos|><|AUDIO|><|audio_eos|>",
)


def make_audio_model(directory: Path) -> Path:
    """A Qwen2-Audio-style model (the same tokenizer with Qwen2-Audio's tokens added in place of
    ``<image>``, an audio encoder's config, Whisper's feature extractor) in ``directory``."""
    make_vision_model(directory)
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    image = tokenizer["added_tokens"].pop()
    tokenizer["added_tokens"] += [
        {**image, "id": token_id, "content": token} for token, token_id in AUDIO_TOKENS.items()
    ]
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    tok_config = json.loads((directory / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = AUDIO_TEMPLATE
    (directory / "tokenizer_config.json").write_text(json.dumps(tok_config))
    text = json.loads((directory / "config.json").read_text())["text_config"]
    config = {
        "architectures": ["Qwen2AudioForConditionalGeneration"],
        "model_type": "qwen2_audio",
        "audio_token_index": AUDIO_TOKEN_ID,
        "audio_config": {"model_type": "qwen2_audio_encoder", "num_mel_bins": 128},
        "text_config": {**text, "vocab_size": 4099},
        "vocab_size": 4099,
        "max_position_embeddings": 4096,
    }
    (directory / "config.json").write_text(json.dumps(config))
    processor = {"audio_token": "<|AUDIO|>", "processor_class": "Qwen2AudioProcessor"}
    (directory / "processor_config.json").write_text(json.dumps(processor))
    extractor = {
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": 128,
        "sampling_rate": 16000,
        "hop_length": 160,
        "chunk_length": 30,
        "n_samples": 480000,
    }
    (directory / "preprocessor_config.json").write_text(json.dumps(extractor))
    return directory


GEMMA3_TOKENS = {"<start_of_image>": 4096, "<end_of_image>": 4097, "<image_soft_token>": 4098}
GEMMA3_NEWLINES = {"\n" * n: 4098 + n for n in range(1, 5)}
"""One token for each run of one to four newlines, as Gemma's vocabulary has them (4099-4102)."""
GEMMA3_SEQ_LEN = 4
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] | trim }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<start_of_image>"
    "{% elif part['type'] == 'text' %}{{ part['text'] | trim }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
"""Gemma 3's layout: each image part written ``<start_of_image>``, each text part trimmed."""


def make_gemma3_model(directory: Path) -> Path:
    """A Gemma 3-style model in ``directory``: dyn-tiny's tokenizer with Gemma 3's image tokens
    (``GEMMA3_TOKENS``, named as its tokenizer names them) and newline tokens
    (``GEMMA3_NEWLINES``) added, ``GEMMA3_SEQ_LEN`` soft tokens an image, a 28-pixel SigLIP tower;
    transformers' ``AutoProcessor`` loads it (``Gemma3Processor``)."""
    make_vision_model(directory)
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    image = tokenizer["added_tokens"].pop()
    tokenizer["added_tokens"] += [{**image, "id": i, "content": t} for t, i in GEMMA3_TOKENS.items()]
    tokenizer["added_tokens"] += [
        {**image, "id": i, "content": t, "special": False} for t, i in GEMMA3_NEWLINES.items()
    ]
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    tok_config = json.loads((directory / "tokenizer_config.json").read_text())
    names = dict(zip(("boi_token", "eoi_token", "image_token"), GEMMA3_TOKENS, strict=True))
    tok_config.update(names, extra_special_tokens=names, chat_template=GEMMA3_TEMPLATE)
    (directory / "tokenizer_config.json").write_text(json.dumps(tok_config))
    config = json.loads((directory / "config.json").read_text())
    vocab = max(GEMMA3_NEWLINES.values()) + 1
    config.update(
        architectures=["Gemma3ForConditionalGeneration"],
        model_type="gemma3",
        boi_token_index=GEMMA3_TOKENS["<start_of_image>"],
        eoi_token_index=GEMMA3_TOKENS["<end_of_image>"],
        image_token_index=GEMMA3_TOKENS["<image_soft_token>"],
        mm_tokens_per_image=GEMMA3_SEQ_LEN,
        vision_config={"model_type": "siglip_vision_model", "image_size": 28, "patch_size": 14},
        vocab_size=vocab,
    )
    config["text_config"]["vocab_size"] = vocab
    del config["vision_feature_select_strategy"]
    (directory / "config.json").write_text(json.dumps(config))
    processor = {"image_seq_length": GEMMA3_SEQ_LEN, "processor_class": "Gemma3Processor"}
    (directory / "processor_config.json").write_text(json.dumps(processor))
    image_processor = {"image_processor_type": "Gemma3ImageProcessor", "size": {"height": 28, "width": 28}}
    (directory / "preprocessor_config.json").write_text(json.dumps(image_processor))
    return directory


MISTRAL3_TOKENS = {"[IMG]": 4096, "[IMG_BREAK]": 4097, "[IMG_END]": 4098}


def make_mistral3_model(directory: Path, family: str = "mistral3") -> Path:
    """A Mistral 3-style model in ``directory``: the tiny vision model's tokenizer with Pixtral's
    image tokens (``MISTRAL3_TOKENS``; its template writes ``[IMG]``), a Pixtral tower of 14-pixel
    patches merged 2x2, images at most 224 pixels a side (the image processor's longest edge; the
    tower's ``image_size`` says 112, which Mistral 3 does not read). With ``family`` ``llava``,
    Pixtral-12B's form in transformers: LLaVA with that tower, no merging, at most 112 pixels."""
    make_vision_model(directory)
    add_special_tokens(directory, {t: i for t, i in MISTRAL3_TOKENS.items() if t != "[IMG]"})
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    for token in tokenizer["added_tokens"]:
        if token["content"] == IMAGE_TOKEN:
            token["content"] = "[IMG]"
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    tok_config = json.loads((directory / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = TEMPLATE.replace("<image>\n", "[IMG]")
    (directory / "tokenizer_config.json").write_text(json.dumps(tok_config))
    config = json.loads((directory / "config.json").read_text())
    vocab = max(MISTRAL3_TOKENS.values()) + 1
    config.update(
        architectures=[
            "Mistral3ForConditionalGeneration" if family == "mistral3" else "LlavaForConditionalGeneration"
        ],
        model_type=family,
        image_token_index=MISTRAL3_TOKENS["[IMG]"],
        vision_config={"model_type": "pixtral", "image_size": 112, "patch_size": 14},
        vocab_size=vocab,
    )
    if family == "mistral3":
        config["spatial_merge_size"] = 2
    config["text_config"]["vocab_size"] = vocab
    (directory / "config.json").write_text(json.dumps(config))
    processor = {
        "image_token": "[IMG]",
        "patch_size": 14,
        "spatial_merge_size": 2,
        "processor_class": "PixtralProcessor",
    }
    (directory / "processor_config.json").write_text(json.dumps(processor))
    image_processor = {"image_processor_type": "PixtralImageProcessor", "size": {"longest_edge": 224}}
    (directory / "preprocessor_config.json").write_text(json.dumps(image_processor))
    return directory


LLAMA4_TOKENS = {
    "<|image_start|>": 4096,
    "<|image_end|>": 4097,
    "<|patch|>": 4098,
    "<|tile_x_separator|>": 4099,
    "<|tile_y_separator|>": 4100,
}
"""Llama 4's image tokens beside ``<|image|>`` (4101)."""
LLAMA4_IMAGE = 4101


def make_llama4_model(directory: Path) -> Path:
    """A Llama 4-style model in ``directory``: the tiny vision model's tokenizer with Llama 4's image
    tokens (its template writes ``<|image|>``), 56-pixel tiles of 14-pixel patches pixel-shuffled
    by 0.5 (4 tokens a tile), canvases of at most 6 tiles: dyn-tiny-llama4's sizes."""
    make_vision_model(directory)
    add_special_tokens(directory, {**LLAMA4_TOKENS, "<|image|>": LLAMA4_IMAGE})
    tok_config = json.loads((directory / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = TEMPLATE.replace("<image>\n", "<|image|>")
    (directory / "tokenizer_config.json").write_text(json.dumps(tok_config))
    config = json.loads((directory / "config.json").read_text())
    vocab = LLAMA4_IMAGE + 1
    config.update(
        architectures=["Llama4ForConditionalGeneration"],
        model_type="llama4",
        image_token_index=LLAMA4_IMAGE,
        vision_config={
            "model_type": "llama4_vision_model",
            "image_size": 56,
            "patch_size": 14,
            "pixel_shuffle_ratio": 0.5,
        },
        vocab_size=vocab,
    )
    config["text_config"]["vocab_size"] = vocab
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "processor_config.json").write_text(json.dumps({"processor_class": "Llama4Processor"}))
    image_processor = {
        "image_processor_type": "Llama4ImageProcessor",
        "size": {"height": 56, "width": 56},
        "max_patches": 6,
    }
    (directory / "preprocessor_config.json").write_text(json.dumps(image_processor))
    return directory
