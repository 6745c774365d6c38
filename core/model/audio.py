"""What an audio-language model's files say about its audio: the placeholder a chat template writes
for a clip, its token id, and how many placeholder tokens one clip becomes in the prompt the
engine sees (``AudioTokens``).

Read for the Qwen2-Audio family (``config.json`` with ``model_type`` ``qwen2_audio`` and an
``audio_config``), as vLLM's processor for it counts: the clip is mixed down to mono, resampled
to the feature extractor's ``sampling_rate`` (``ceil(frames * rate / clip_rate)`` samples, the
length every resampler vLLM offers makes), cut to ``chunk_length`` seconds (vLLM calls the
processor with ``truncation=True``), and framed every ``hop_length`` samples:
``F = ceil(samples / hop_length)`` mel frames. The encoder's convolution halves them and its
pooling halves them again: ``((F - 1) // 2 + 1 - 2) // 2 + 1`` tokens (25 a second at Whisper's
16 kHz and 160-sample hop; 750 for 30 s or more). A clip of under 3 frames makes no token: vLLM
refuses it as too short, and so does ``count``. The template writes ``<|audio_bos|><|AUDIO|>
<|audio_eos|>`` for a clip and ``<|AUDIO|>`` is what repeats.

Other audio models (Whisper's encoder-decoder, Ultravox, Gemma 3n, Qwen2.5-Omni) count by other
rules and are not read here: ``audio_tokens`` returns None for them, and they are served as text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dyn.core.model.info import ModelInfo, read_processor_files, token_content

QWEN2_AUDIO_TOKENS = ("<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>")
_WHISPER = {"sampling_rate": 16000, "hop_length": 160, "chunk_length": 30}
"""transformers' ``WhisperFeatureExtractor`` defaults, for a processor config that omits one."""


class AudioLengthError(ValueError):
    """A clip the model cannot take as counted (too short, or its length unknown); the message
    says why."""


@dataclass(frozen=True, slots=True)
class AudioTokens:
    """``token``: the placeholder token one clip's tokens repeat; ``token_id``: its id; ``text``:
    what a template that reads text writes for a clip; ``sampling_rate``, ``hop_length`` and
    ``max_samples``: the feature extractor's rate, hop and longest input (see the module
    docstring)."""

    token: str
    token_id: int
    text: str
    sampling_rate: int
    hop_length: int
    max_samples: int

    @property
    def placeholder(self) -> str:
        return self.text or self.token

    def count(self, frames: int | None, rate: int | None) -> int:
        """Placeholder tokens of a clip of ``frames`` samples per channel at ``rate`` Hz
        (``AudioLengthError`` for one the model cannot take, or whose length is unknown)."""
        if frames is None or rate is None:
            raise AudioLengthError(
                "the clip's length is unknown: the frontend reads WAV itself, and MP3, FLAC and Ogg "
                "only with soundfile installed (pip install 'dyn[audio]'); send WAV"
            )
        samples = frames if rate == self.sampling_rate else -(-frames * self.sampling_rate // rate)
        mel = -(-min(samples, self.max_samples) // self.hop_length)
        tokens = ((mel - 1) // 2 + 1 - 2) // 2 + 1 if mel > 0 else 0
        if tokens < 1:
            shortest = 2 * self.hop_length + 1
            raise AudioLengthError(
                f"the clip is too short for the model ({frames} samples at {rate} Hz): it needs at "
                f"least {shortest} samples at {self.sampling_rate} Hz"
            )
        return tokens

    def tokens_for(self, item: Any) -> int:
        """``count`` of a loaded clip (its ``frames`` and ``sample_rate``)."""
        return self.count(item.frames, item.sample_rate)


def audio_tokens(info: ModelInfo) -> AudioTokens | None:
    """The model's audio placeholder, or None when it takes no audio (or none dyn can count)."""
    files = read_processor_files(info)
    config, processor = files.config, files.processor
    nested = processor.get("feature_extractor")  # transformers 5 may save it inside the processor's
    extractor = files.preprocessor or (nested if isinstance(nested, dict) else {})
    if config.get("model_type") != "qwen2_audio" or not isinstance(config.get("audio_config"), dict):
        return None
    token_id = _int(config.get("audio_token_index", config.get("audio_token_id")))
    bos, token, eos = (
        token_content(processor.get(key)) or default
        for key, default in zip(("audio_bos_token", "audio_token", "audio_eos_token"), QWEN2_AUDIO_TOKENS)
    )
    rate, hop, chunk = (_int(extractor.get(key)) or default for key, default in _WHISPER.items())
    longest = _int(extractor.get("n_samples")) or chunk * rate
    if token_id is None or min(rate, hop, longest) <= 0:
        return None
    return AudioTokens(token, token_id, bos + token + eos, rate, hop, longest)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
