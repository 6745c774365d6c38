#!/usr/bin/env python3
"""Write `dyn-tiny-jina-ranker`: a random-weight listwise reranker in jina-reranker-v3's shape
(vLLM's `JinaForRanking`: a Qwen3 model and a two-layer projector), for tests of /rerank and /score.

Usage: python scripts/make_tiny_jina_ranker.py OUT_DIR

Needs torch, transformers and safetensors (the venv of scripts/provision_vllm_cpu.sh has them).
vLLM's pooler embeds the tokens whose ids are 151670 and 151671 (`<|embed_token|>` and
`<|rerank_token|>` in Qwen3's vocabulary), so the tokenizer is dyn-tiny's with its vocabulary
padded up to those ids by pieces no text tokenizes to, and the two markers added there
(`write_ranking_tokenizer`, which the mocker's tests use alone). The weights are random (seeded):
a Qwen3 of hidden size 64 and 2 layers and a projector to 512 values, in bfloat16; the scores are
noise, but they come from vLLM's JinaForRanking pooler.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

NAME = "dyn-tiny-jina-ranker"
SEED = 0
MARKERS = (("<|embed_token|>", 151670), ("<|rerank_token|>", 151671))
"""The document and query markers at the ids vLLM's ``JinaForRankingPool`` embeds."""
VOCAB_SIZE = 151680
"""The embedding table's rows (the markers' ids and a few more, as Qwen3 pads its table)."""
EMBEDDING_SIZE = 512
"""The projector's width: vLLM sets every JinaForRanking's to 512, whatever config.json says."""


def write_ranking_tokenizer(out: Path) -> None:
    """Write dyn-tiny's tokenizer files into ``out`` with the markers at their ids."""
    from dyn.core.model import TINY_MODEL_DIR

    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(TINY_MODEL_DIR / name, out / name)
    tokenizer = json.loads((TINY_MODEL_DIR / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    first = MARKERS[0][1]
    vocab.update({f"<|dyn_filler_{i}|>": i for i in range(len(vocab), first)})  # no merge makes these
    for content, token_id in MARKERS:
        tokenizer["added_tokens"].append(
            {
                "id": token_id,
                "content": content,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))


def generate(out_dir: str | Path) -> Path:
    """Write the model directory into ``out_dir`` (created if needed) and return its path."""
    import torch
    from make_tiny_llama import DEFAULT_CONTEXT, TINY_SIZES  # this script's directory is on sys.path
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3Model

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_ranking_tokenizer(out)
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        **TINY_SIZES,
        max_position_embeddings=DEFAULT_CONTEXT,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        bos_token_id=0,
        eos_token_id=4,
    )
    config.architectures = ["JinaForRanking"]
    config.embedding_size = EMBEDDING_SIZE
    config.dtype = "bfloat16"
    torch.manual_seed(SEED)
    model = Qwen3Model(config).to(torch.bfloat16)
    hidden = config.hidden_size
    tensors = {f"model.{name}": t.contiguous() for name, t in model.state_dict().items()}
    tensors["projector.0.weight"] = (torch.randn(hidden // 2, hidden) / hidden**0.5).to(torch.bfloat16)
    tensors["projector.2.weight"] = (torch.randn(EMBEDDING_SIZE, hidden // 2) / (hidden // 2) ** 0.5).to(
        torch.bfloat16
    )
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(str(out))
    return out


if __name__ == "__main__":
    from make_tiny_llama import one_directory_main  # this script's directory is on sys.path

    sys.exit(one_directory_main(sys.argv[1:], generate, NAME, __doc__))
