#!/usr/bin/env python3
"""Write a random LoRA adapter for `dyn-tiny-llama` (scripts/make_tiny_llama.py), for tests.

Usage: python scripts/make_tiny_lora.py OUT_DIR [--base-model MODEL_DIR] [--seed N] [--scale X]

Writes what PEFT's `save_pretrained` writes for a LoRA of a Llama causal LM: `adapter_config.json`
(peft_type LORA, r 8, lora_alpha 16, every projection of every decoder layer targeted) and
`adapter_model.safetensors` with, per targeted module, `base_model.model.<module>.lora_A.weight`
(r x in_features) and `lora_B.weight` (out_features x r) in float32 (PEFT keeps adapter weights
of a bfloat16 model in float32 and saves them so). vLLM reads exactly these two files
(vllm/lora/peft_helper.py, vllm/lora/lora_model.py).

Unlike a freshly initialised PEFT adapter (lora_B zero: no effect), both matrices are random
(numpy, seeded: the same arguments write the same bytes) and scaled so that the update B @ A x
alpha/r is several times the base model's weights (initializer_range 0.02): the adapter changes
the model's greedy output, so a test can tell whether it was applied. Different seeds make
different adapters.

The layer shapes come from MODEL_DIR/config.json when --base-model is given, else are
dyn-tiny-llama's. Needs only numpy and safetensors (both come with transformers). Prints the
adapter directory.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BASE_MODEL = "dyn-tiny-llama"
RANK = 8
ALPHA = 16
SEED = 0
SCALE = 0.1
"""Standard deviation of every entry of A and B: the update's entries are then about
sqrt(RANK) x SCALE**2 x ALPHA/RANK = 0.057, three times the base weights' 0.02."""
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def module_shapes(config: dict) -> dict[str, tuple[int, int]]:
    """``{module name as PEFT saves it: (in_features, out_features)}`` for every targeted module."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv = config.get("num_key_value_heads") or heads
    io = {
        "self_attn.q_proj": (hidden, heads * head_dim),
        "self_attn.k_proj": (hidden, kv * head_dim),
        "self_attn.v_proj": (hidden, kv * head_dim),
        "self_attn.o_proj": (heads * head_dim, hidden),
        "mlp.gate_proj": (hidden, inter),
        "mlp.up_proj": (hidden, inter),
        "mlp.down_proj": (inter, hidden),
    }
    return {
        f"model.layers.{layer}.{name}": shape
        for layer in range(config["num_hidden_layers"])
        for name, shape in io.items()
    }


def generate(
    out_dir: str | Path, base_model: str | Path | None = None, *, seed: int = SEED, scale: float = SCALE
) -> Path:
    """Write the adapter into ``out_dir`` (created if needed) and return its path."""
    import numpy as np
    from make_tiny_llama import TINY_SIZES  # this script's directory is on sys.path
    from safetensors.numpy import save_file

    config = TINY_SIZES  # dyn-tiny-llama's sizes fix the LoRA shapes
    base_name = BASE_MODEL
    if base_model is not None:
        config = json.loads((Path(base_model) / "config.json").read_text())
        base_name = str(base_model)
    rng = np.random.default_rng(seed)
    tensors = {}
    for module, (fan_in, fan_out) in module_shapes(config).items():
        prefix = f"base_model.model.{module}"
        tensors[f"{prefix}.lora_A.weight"] = (rng.standard_normal((RANK, fan_in)) * scale).astype(np.float32)
        tensors[f"{prefix}.lora_B.weight"] = (rng.standard_normal((fan_out, RANK)) * scale).astype(np.float32)
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_name,
        "r": RANK,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "target_modules": sorted(TARGET_MODULES),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "inference_mode": True,
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--base-model", help="model directory whose config.json gives the layer shapes")
    parser.add_argument("--seed", type=int, default=SEED, help=f"random seed (default {SEED})")
    parser.add_argument(
        "--scale", type=float, default=SCALE, help=f"std of A's and B's entries (default {SCALE})"
    )
    args = parser.parse_args(argv)
    print(generate(args.out_dir, args.base_model, seed=args.seed, scale=args.scale))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
