"""Response templates and tiny model directories for the ``hf`` parsers' tests.

The templates are written as Hugging Face describes them (``transformers.utils.chat_parsing``; the
Qwen ones as transformers' own serving fallbacks for Qwen3 and Qwen3.5 write them), with the
``thinking`` field name checkpoints ship (Gemma 4's tokenizer_config.json) and vLLM reads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.model.info import TINY_MODEL_DIR

QWEN3 = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "thinking": {"open": "<think>", "close": "</think>", "content": "text"},
        "tool_calls": {
            "open_pattern": r"\s*<tool_call>",
            "close": "</tool_call>",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"\s*(?:<\|im_end\|>|<\|endoftext\|>)", "content": "text"},
    },
}
"""Qwen3: ``<think>`` reasoning, ``<tool_call>`` JSON calls, content up to ``<|im_end|>``."""

QWEN35 = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "thinking": {"open": "<think>", "close": "</think>", "content": "text"},
        "tool_calls": {
            "open_pattern": r"\s*<tool_call>\s*<function=(?P<name>[^>\n]+)>",
            "close_pattern": r"</function>\s*</tool_call>",
            "repeats": True,
            "content": "xml-inline",
            "content_args": {"tag_pattern": r"<parameter=(?P<key>[^>\n]+)>\s*(?P<value>.*?)\s*</parameter>"},
            "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
        },
        "content": {"close_pattern": r"\s*(?:<\|im_end\|>|<\|endoftext\|>)", "content": "text"},
    },
}
"""Qwen3.5 (and Qwen3-Coder): XML parameters, whose values the tools' schemas type."""

PROMPT = (
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n"
)
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}},
}


def model_dir(root: Path, template: object | None = None, **config: object) -> Path:
    """A model directory with dyn-tiny's tokenizer.json and a tokenizer_config.json holding
    ``template`` as its response_template (none when None) and ``config``."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(TINY_MODEL_DIR / "tokenizer.json", root / "tokenizer.json")
    if template is not None:
        config["response_template"] = template
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root


def tokenizer(root: Path, template: object | None = None) -> Tokenizer:
    return Tokenizer.from_dir(model_dir(root, template))
