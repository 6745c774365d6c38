"""``audio_tokens``: an audio-language model's placeholder and its count per clip, as vLLM's
Qwen2-Audio processor counts it (Whisper's features at 16 kHz, a 160-sample hop, 30 s at most;
the encoder halves the frames twice: 25 tokens a second)."""

from __future__ import annotations

import json

import pytest

from dyn.core.model import load_model_info
from dyn.core.model.audio import AudioLengthError, AudioTokens, audio_tokens
from dyn.core.model.multimodal import placeholder_rules
from tests.media_models import AUDIO_TOKEN_ID, make_audio_model, make_vision_model


@pytest.fixture
def rule(tmp_path) -> AudioTokens:
    found = audio_tokens(load_model_info(make_audio_model(tmp_path / "audio")))
    assert found is not None
    return found


def test_a_qwen2_audio_model_names_its_token_template_text_and_feature_extractor(rule):
    assert rule == AudioTokens(
        "<|AUDIO|>", AUDIO_TOKEN_ID, "<|audio_bos|><|AUDIO|><|audio_eos|>", 16000, 160, 480000
    )


@pytest.mark.parametrize(
    "frames, rate, tokens",
    [
        (16000, 16000, 25),  # 1 s
        (40000, 16000, 62),  # 2.5 s: 250 frames -> 125 -> 62
        (321, 16000, 1),  # 3 mel frames, the fewest that make a token
        (480000, 16000, 750),  # 30 s
        (560000, 16000, 750),  # cut to 30 s, as vLLM's processor truncates
        (8000, 8000, 25),  # 1 s at 8 kHz: resampled to 16000 samples
        (44100, 44100, 25),
        (22050, 44100, 12),  # 0.5 s: 8000 samples, 50 frames -> 25 -> 12
        (7, 22050, None),  # 6 samples at 16 kHz: too short
    ],
)
def test_the_count_follows_the_resampled_length_cut_to_thirty_seconds(rule, frames, rate, tokens):
    if tokens is None:
        with pytest.raises(AudioLengthError, match="too short.*at least 321 samples at 16000 Hz"):
            rule.count(frames, rate)
    else:
        assert rule.count(frames, rate) == tokens


def test_a_clip_of_unknown_length_is_refused_with_what_to_install(rule):
    with pytest.raises(AudioLengthError, match=r"pip install 'dyn\[audio\]'"):
        rule.count(None, None)


def test_a_feature_extractor_with_another_rate_and_hop_counts_by_them(tmp_path):
    directory = make_audio_model(tmp_path / "audio")
    extractor = directory / "preprocessor_config.json"
    extractor.write_text(json.dumps({"sampling_rate": 8000, "hop_length": 80, "chunk_length": 10}))
    rule = audio_tokens(load_model_info(directory))
    assert rule is not None and (rule.sampling_rate, rule.hop_length, rule.max_samples) == (8000, 80, 80000)
    assert rule.count(16000, 16000) == 25 and rule.count(10**6, 8000) == 250


def test_models_that_take_no_audio_or_count_it_otherwise_have_no_audio_rule(tmp_path):
    assert audio_tokens(load_model_info(None, None)) is None
    vision = load_model_info(make_vision_model(tmp_path / "vlm"))
    assert audio_tokens(vision) is None and set(placeholder_rules(vision)) == {"image"}
    directory = make_audio_model(tmp_path / "whisper")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "model_type": "whisper"}))
    assert audio_tokens(load_model_info(directory)) is None


def test_the_multimodal_rules_of_an_audio_model(tmp_path):
    assert set(placeholder_rules(load_model_info(make_audio_model(tmp_path / "audio")))) == {"audio"}


def test_a_feature_extractor_saved_inside_the_processor_config_is_read(tmp_path):
    """transformers 5 may save the feature extractor inside ``processor_config.json``."""
    directory = make_audio_model(tmp_path / "audio")
    (directory / "preprocessor_config.json").unlink()
    processor = json.loads((directory / "processor_config.json").read_text())
    processor["feature_extractor"] = {"sampling_rate": 8000, "hop_length": 80, "chunk_length": 10}
    (directory / "processor_config.json").write_text(json.dumps(processor))
    rule = audio_tokens(load_model_info(directory))
    assert rule is not None and (rule.sampling_rate, rule.hop_length, rule.max_samples) == (8000, 80, 80000)
