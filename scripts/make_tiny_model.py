#!/usr/bin/env python3
"""Regenerate `dyn-tiny`, the model directory embedded in `dyn.core.model` (tokenizer + Llama config, no weights).

Usage: python scripts/make_tiny_model.py OUT_DIR      (the shipped copy: core/model/dyn-tiny)

Trains a byte-level BPE tokenizer (vocab 4096) with the `tokenizers` library on the first 200 sorted
`*.py` files of the running Python's standard library, so nothing is downloaded. It is the same
tokenizer, chat template and config as the anchor's make_model.py (real Dynamo's model directory), so
both stacks tokenize prompts identically; only the context length differs: 131072 tokens
(`max_position_embeddings`, `model_max_length`; the anchor's is 8192), so coding agents' first
requests (10k-20k tokens with their tools) fit.

Reproducible: the same CPython version (its standard-library sources are the training corpus) and the
same `tokenizers` version give byte-identical files. `dyn_tiny.json` records both, plus a SHA-256 of the
corpus, so a reader can tell how the files were made and whether a rerun can match them.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import platform
import sys
import sysconfig
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

NAME = "dyn-tiny"
VOCAB_SIZE = 4096
CORPUS_FILES = 200
SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
CHAT_TEMPLATE = (
    # Llama-3 headers; tools, tool calls and tool results the Hermes / Qwen2.5 way (dyn's "hermes"
    # tool-call parser reads the calls back). Without tools it renders exactly like the anchor's.
    # (A newline right after a {% tag %} is trimmed, as in transformers: {{ '\n' }} keeps one.)
    "{{ bos_token }}"
    "{% if tools %}<|start_header_id|>system<|end_header_id|>\n\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call><|eot_id|>{% endif %}"
    "{% for message in messages %}"
    "{% if not (tools and loop.first and message['role'] == 'system') %}"
    "{% if message['role'] == 'tool' %}"
    "<|start_header_id|>tool<|end_header_id|>\n\n<tool_response>\n{{ message['content'] }}\n</tool_response><|eot_id|>"
    "{% else %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] }}"
    "{% for call in message['tool_calls'] or [] %}"
    "{% if call['function'] is defined %}{% set call = call['function'] %}{% endif %}"
    "{% if not loop.first or message['content'] %}{{ '\\n' }}{% endif %}"
    '<tool_call>\n{"name": "{{ call[\'name\'] }}", "arguments": {{ call[\'arguments\'] | tojson }}}\n</tool_call>'
    "{% endfor %}<|eot_id|>"
    "{% endif %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
SPECIAL_MAP = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": "<|end_of_text|>"}
GENERATOR = "python scripts/make_tiny_model.py core/model/dyn-tiny"


def corpus_files() -> list[str]:
    """The training corpus: the first 200 sorted `*.py` files of this interpreter's standard library."""
    return sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:CORPUS_FILES]


def corpus_sha256(files: list[str]) -> str:
    """SHA-256 over each corpus file's base name and bytes, in order."""
    h = hashlib.sha256()
    for path in files:
        h.update(os.path.basename(path).encode() + b"\0")
        h.update(Path(path).read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def train_tokenizer(files: list[str]) -> Tokenizer:
    """Train the byte-level BPE tokenizer exactly as the anchor's make_model.py does."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    return tok


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def generate(out_dir: str | Path) -> dict:
    """Write the dyn-tiny files into `out_dir` (created if needed); return the metadata written to dyn_tiny.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = corpus_files()
    tok = train_tokenizer(files)
    (out / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
    vocab = tok.get_vocab_size()
    bos, eos = tok.token_to_id("<|begin_of_text|>"), tok.token_to_id("<|eot_id|>")
    _write_json(
        out / "tokenizer_config.json",
        dict(
            SPECIAL_MAP,
            model_max_length=131072,
            tokenizer_class="PreTrainedTokenizerFast",
            chat_template=CHAT_TEMPLATE,
            add_bos_token=False,
            clean_up_tokenization_spaces=False,
        ),
    )
    _write_json(out / "special_tokens_map.json", SPECIAL_MAP)
    _write_json(
        out / "config.json",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 256,
            "intermediate_size": 688,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "max_position_embeddings": 131072,
            "vocab_size": vocab,
            "bos_token_id": bos,
            "eos_token_id": eos,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "torch_dtype": "bfloat16",
            "hidden_act": "silu",
            "tie_word_embeddings": True,
        },
    )
    _write_json(
        out / "generation_config.json", {"bos_token_id": bos, "eos_token_id": eos, "max_new_tokens": 256}
    )
    meta = {
        "name": NAME,
        "generator": GENERATOR,
        "python_implementation": platform.python_implementation(),
        "python_version": platform.python_version(),
        "tokenizers_version": tokenizers.__version__,
        "corpus": f"first {CORPUS_FILES} sorted *.py files of the Python standard library",
        "corpus_sha256": corpus_sha256(files),
        "vocab_size": vocab,
        "note": "Tokenizer and config only, no weights. Byte-identical when regenerated with the same "
        "CPython version and tokenizers version.",
    }
    _write_json(out / "dyn_tiny.json", meta)
    return meta


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    meta = generate(argv[0])
    print(
        f"wrote {argv[0]}: vocab {meta['vocab_size']}, python {meta['python_version']}, "
        f"tokenizers {meta['tokenizers_version']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
