#!/usr/bin/env python3
"""Write `dyn-tiny-llama`: a random-weight Llama small enough for vLLM on a CPU, for tests.

Usage: python scripts/make_tiny_llama.py OUT_DIR [CONTEXT]

CONTEXT is the model's context length (``max_position_embeddings``), default 2048; the SGLang venv
of scripts/provision_sglang_cpu.sh asks for 131072, dyn-tiny's, so coding agents' prompts fit.

Needs torch and transformers (the venvs of scripts/provision_vllm_cpu.sh and
scripts/provision_sglang_cpu.sh have both). The
tokenizer is dyn-tiny's (a byte-level BPE trained locally on the Python standard library, see
scripts/make_tiny_model.py), loaded and written back with transformers' `save_pretrained`, so the
frontend and the engine tokenize alike. The weights are random (seeded), hidden size 64 and 2
layers, saved as safetensors in bfloat16: the text the model writes is noise, but it runs the real
engine end to end (scheduling, prefix caching, KV events) in seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

NAME = "dyn-tiny-llama"
SEED = 0
DEFAULT_CONTEXT = 2048


def tiny_tokenizer(special: tuple[str, ...] = (), chat_template: str | None = None):
    """dyn-tiny's tokenizer (``PreTrainedTokenizerFast``) with ``special`` tokens added after its
    vocabulary, in order, and ``chat_template`` when given: what every tiny model here starts from."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    from dyn.core.model import TINY_MODEL_DIR

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(TINY_MODEL_DIR))
    if special:
        tokenizer.add_tokens(
            [AddedToken(token, special=True, normalized=False) for token in special], special_tokens=True
        )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def media_chat_template(part_types: tuple[str, ...], placeholder: str) -> str:
    """dyn-tiny's Llama-3 chat template for a model with media input: a message whose content is
    a list of parts renders each text part's text and each part whose ``type`` is in
    ``part_types`` as ``placeholder``, in place (dyn-tiny-llava's images, dyn-tiny-qwen2-audio's
    clips)."""
    return (
        "{{ bos_token }}"
        "{% for message in messages %}"
        "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for part in message['content'] or [] %}"
        "{% if part['type'] == 'text' %}{{ part['text'] }}"
        f"{{% elif part['type'] in {part_types!r} %}}{placeholder}{{% endif %}}"
        "{% endfor %}{% endif %}<|eot_id|>"
        "{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    )


TINY_SIZES = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 32,
}
"""The decoder's sizes in every tiny model here (the Llama, and the Qwen3 of the tiny ranker)."""


TINY_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
"""The vision towers' sizes in the tiny vision-language models here (in transformers' usual names)."""


def special_token_ids(tokenizer) -> dict:
    """``bos_token_id``, ``eos_token_id`` and ``pad_token_id`` of ``tokenizer``, for a text config."""
    return {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


def llama_config(tokenizer, context: int = DEFAULT_CONTEXT):
    """The tiny Llama's ``LlamaConfig`` for ``tokenizer`` (dyn-tiny's, maybe with added tokens)
    and a context of ``context`` tokens; dyn-tiny-llava's language model is the same."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        **TINY_SIZES,
        max_position_embeddings=context,
        **special_token_ids(tokenizer),
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        torch_dtype="bfloat16",
    )


def generate(out_dir: str | Path, context: int = DEFAULT_CONTEXT) -> Path:
    """Write the model directory into ``out_dir`` (created if needed), with a context of
    ``context`` tokens, and return its path."""
    from transformers import LlamaForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(str(out))
    return save_random_model(LlamaForCausalLM, llama_config(tokenizer, context), out, SEED)


def media_model_start(
    out_dir: str | Path, part_types: tuple[str, ...], placeholder: str, special: tuple[str, ...]
):
    """How each tiny media model's generator starts: ``(out, chat_template, tokenizer)``, the
    output directory (made), its ``media_chat_template`` and dyn-tiny's tokenizer with ``special``
    tokens added and that template."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    chat_template = media_chat_template(part_types, placeholder)
    return out, chat_template, tiny_tokenizer(special, chat_template)


def save_processor(processor, inner, out: Path) -> None:
    """Write ``processor`` into ``out`` and, beside it, its ``inner`` image processor or feature
    extractor on its own: transformers 5 keeps that inside processor_config.json, and earlier
    versions (and tools that read only its own file) look for it alone."""
    processor.save_pretrained(str(out))
    inner.save_pretrained(str(out))


def save_random_model(model_class, config, out: Path, seed: int) -> Path:
    """Write ``model_class(config)`` into ``out`` (its config, and its weights as safetensors in
    bfloat16, random from torch's generator seeded with ``seed``) and return ``out``."""
    import torch

    torch.manual_seed(seed)
    model = model_class(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def one_directory_main(argv: list[str], generate, name: str, doc: str) -> int:
    """The ``main`` of a generator whose one argument is the output directory (the other tiny
    models' scripts): writes the model, or prints the ``Usage:`` line of its ``doc`` and returns 2."""
    if len(argv) != 1 or argv[0].startswith("-"):
        print(next(line for line in doc.splitlines() if line.startswith("Usage:")), file=sys.stderr)
        return 2
    out = generate(argv[0])
    print(f"wrote {out} ({name})")
    return 0


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2 or argv[0].startswith("-") or not all(a.isdigit() for a in argv[1:]):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    out = generate(argv[0], *(int(a) for a in argv[1:]))
    print(f"wrote {out} ({NAME})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
