#!/usr/bin/env python3
"""Write `dyn-tiny-qwen2-audio`: a random-weight Qwen2-Audio-style audio-language model small
enough for vLLM on a CPU, for tests of audio input.

Usage: python scripts/make_tiny_qwen2_audio.py OUT_DIR

Needs torch and transformers (the venv of scripts/provision_vllm_cpu.sh has them). The model is
transformers' `Qwen2AudioForConditionalGeneration`: a Whisper-style audio encoder
(`Qwen2AudioEncoder`: 128 mel bins, d_model 32, 2 layers, 1500 source positions, i.e. 30 s), the
one-layer projector, and a Qwen2 language model with dyn-tiny-llama's sizes (hidden size 64,
2 layers). The weights are random (seeded) and saved as safetensors in bfloat16: the text it
writes is noise, but a request with audio runs vLLM's whole multimodal path (processor, audio
encoder, encoder cache, prefix caching keyed by the clips' identifiers, KV events). vLLM 0.32
loads it with its own Qwen2-Audio module (which runs transformers' encoder; no torchaudio needed
unless a clip must be resampled).

The tokenizer is dyn-tiny's (scripts/make_tiny_model.py) plus three special tokens: `<|AUDIO|>`
(id 4096, ``audio_token_index``), `<|audio_bos|>` (4097) and `<|audio_eos|>` (4098).
`AutoProcessor` loads a `Qwen2AudioProcessor` from `processor_config.json` (it names the three
tokens and holds the feature extractor's settings; `preprocessor_config.json` repeats those for
older transformers): Whisper's feature extractor, 128 mel bins of 16000 Hz audio, a hop of 160
samples (10 ms), clips cut at 30 s.

Placeholder tokens, the rule a frontend needs: the chat template renders each audio part as
`<|audio_bos|><|AUDIO|><|audio_eos|>`; vLLM's processor replaces the one `<|AUDIO|>` with
N `<|AUDIO|>` tokens (the bos and eos tokens stay), N from the clip's length alone. With L the
clip's samples per channel at its rate SR (channels are averaged to mono):
  L' = ceil(L * 16000 / SR)   (vLLM resamples to 16 kHz; nothing to do when SR is 16000)
  F  = ceil(min(L', 480000) / 160)   mel frames of the clip (the rest of 30 s is padding)
  N  = ((F - 1) // 2 + 1 - 2) // 2 + 1   (the encoder's stride-2 convolution, then its 2x pooling)
So 1 s gives 25 tokens, 30 s and longer 750 (``MAX_AUDIO_TOKENS``); N is 0 for a clip of 320
samples or fewer (F <= 2) and vLLM refuses it ("too short to be represented inside the model").
L' is the length vLLM's default resampler for Qwen2-Audio, torchaudio's, makes; the vllm-cpu venv
has no torchaudio, so there dyn's worker refuses a clip at another rate than 16000 Hz.

The chat template is dyn-tiny's Llama-3 layout; a message whose content is a list of parts renders
each text part's text and each audio part (``type`` "audio", "audio_url" or "input_audio") as
`<|audio_bos|><|AUDIO|><|audio_eos|>`, in place.
"""

from __future__ import annotations

import sys
from pathlib import Path

NAME = "dyn-tiny-qwen2-audio"
SEED = 0
CONTEXT = 2048
AUDIO_TOKEN = "<|AUDIO|>"
AUDIO_BOS = "<|audio_bos|>"
AUDIO_EOS = "<|audio_eos|>"
AUDIO_PART = AUDIO_BOS + AUDIO_TOKEN + AUDIO_EOS
"""What the chat template writes for a clip; vLLM's processor expands the ``<|AUDIO|>``."""
SAMPLING_RATE = 16000
HOP_LENGTH = 160
CHUNK_SECONDS = 30
MAX_AUDIO_TOKENS = 750
"""Placeholder tokens of a clip of 30 s or more: 3000 mel frames, 1500 encoder positions, pooled."""

AUDIO_PARTS = ("audio", "audio_url", "input_audio")
"""The content part types the chat template renders as ``AUDIO_PART``."""


def qwen2_config(tokenizer):
    """A ``Qwen2Config`` with dyn-tiny-llama's sizes (``make_tiny_llama.llama_config``): the
    settings both model types have, Qwen2's defaults for the rest."""
    from make_tiny_llama import llama_config  # this script's directory is on sys.path
    from transformers import Qwen2Config

    known = Qwen2Config().to_dict().keys() - {"model_type", "transformers_version"}
    llama = llama_config(tokenizer, CONTEXT).to_dict()
    settings = {key: value for key, value in llama.items() if key in known}
    # transformers' Qwen2-Audio never ties its lm_head to the embeddings: untied, vLLM loads the
    # lm_head transformers runs instead of reusing the embeddings
    return Qwen2Config(**{**settings, "tie_word_embeddings": False})


def hub_name(name: str) -> str:
    """A weight's name in Qwen2-Audio's checkpoints on the hub (what vLLM loads), from its name in
    transformers 5's module tree (``model.language_model.*``, ``model.audio_tower.*``, ...)."""
    for prefix, hub in (
        ("model.language_model.", "language_model.model."),
        ("lm_head.", "language_model.lm_head."),
    ):
        if name.startswith(prefix):
            return hub + name.removeprefix(prefix)
    return name.removeprefix("model.")


def generate(out_dir: str | Path) -> Path:
    """Write the model directory into ``out_dir`` (created if needed) and return its path."""
    import torch
    from make_tiny_llama import (  # this script's directory is on sys.path
        media_model_start,
        save_processor,
    )
    from safetensors.torch import save_file
    from transformers import (
        Qwen2AudioConfig,
        Qwen2AudioEncoderConfig,
        Qwen2AudioForConditionalGeneration,
        Qwen2AudioProcessor,
        WhisperFeatureExtractor,
    )

    out, chat_template, tokenizer = media_model_start(
        out_dir, AUDIO_PARTS, AUDIO_PART, (AUDIO_TOKEN, AUDIO_BOS, AUDIO_EOS)
    )
    feature_extractor = WhisperFeatureExtractor(
        feature_size=128,
        sampling_rate=SAMPLING_RATE,
        hop_length=HOP_LENGTH,
        chunk_length=CHUNK_SECONDS,
        n_fft=400,
        padding_value=0.0,
        return_attention_mask=True,
    )
    processor = Qwen2AudioProcessor(
        feature_extractor=feature_extractor,
        tokenizer=tokenizer,
        chat_template=chat_template,
        audio_token=AUDIO_TOKEN,
        audio_bos_token=AUDIO_BOS,
        audio_eos_token=AUDIO_EOS,
    )
    save_processor(processor, feature_extractor, out)
    audio = Qwen2AudioEncoderConfig(
        num_mel_bins=128,
        encoder_layers=2,
        encoder_attention_heads=2,
        encoder_ffn_dim=64,
        d_model=32,
        max_source_positions=CHUNK_SECONDS * SAMPLING_RATE // HOP_LENGTH // 2,
    )
    config = Qwen2AudioConfig(
        audio_config=audio,
        text_config=qwen2_config(tokenizer),
        audio_token_index=tokenizer.convert_tokens_to_ids(AUDIO_TOKEN),
        torch_dtype="bfloat16",
        architectures=[Qwen2AudioForConditionalGeneration.__name__],
    )
    torch.manual_seed(SEED)
    model = Qwen2AudioForConditionalGeneration(config).to(torch.bfloat16)
    # not save_pretrained: transformers 5.19 writes the language model's weights as
    # language_model.model.model.*, which vLLM's loader does not know
    config.save_pretrained(str(out))
    model.generation_config.save_pretrained(str(out))
    weights = {hub_name(name): tensor.contiguous() for name, tensor in model.state_dict().items()}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


if __name__ == "__main__":
    from make_tiny_llama import one_directory_main  # this script's directory is on sys.path

    sys.exit(one_directory_main(sys.argv[1:], generate, NAME, __doc__))
