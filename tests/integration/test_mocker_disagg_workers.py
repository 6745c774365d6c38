"""Real ``dyn worker mocker --disaggregation-mode prefill`` and ``... decode`` processes driven over
the request plane as the frontend drives them (the contract of ``dyn.core.messages.KvTransfer``;
Dynamo's mocker has the same roles: ``python -m dynamo.mocker --disaggregation-mode``, Dynamo
1.6.1, docs/mocker/mocker.md)."""

from __future__ import annotations

import anyio
import pytest
import zmq
import zmq.asyncio

from dyn.core.discovery.file_store import FileDiscoveryStore
from dyn.core.kv.events import BlockStored, decode_event_batch, split_frames
from dyn.core.kv.hashing import block_hashes, sequence_hashes
from dyn.core.messages import Finish, GenerateRequest, KvTransfer, SamplingParams, StopConditions
from dyn.core.transport.request_plane import RemoteError, WorkerClient

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

BLOCK = 16
NS = "pd"


def records(discovery_dir):
    return anyio.run(FileDiscoveryStore(discovery_dir, NS).list)


def worker(dyn_process, role):
    return dyn_process(
        "worker",
        "mocker",
        "--namespace",
        NS,
        "--disaggregation-mode",
        role,
        "--block-size",
        str(BLOCK),
        "--speedup-ratio",
        "100",
        "--num-gpu-blocks-override",
        "256",
    )


def request(rid, prompt, max_tokens, transfer=None):
    return GenerateRequest(
        rid,
        prompt,
        SamplingParams(seed=21),
        StopConditions(max_tokens=max_tokens, ignore_eos=True),
        kv_transfer=transfer,
    )


async def collect(client, req):
    with anyio.fail_after(30):
        return [m async for m in client.generate(req)]


def tokens_of(out):
    return [t for m in out[:-1] for t in m.token_ids]


def test_prefill_then_decode_across_two_worker_processes(dyn_process, wait_for):
    prefill_proc = worker(dyn_process, "prefill")
    decode_proc = worker(dyn_process, "decode")
    found = wait_for(
        lambda: len(records(dyn_process.discovery_dir)) == 2 and records(dyn_process.discovery_dir),
        60,
        f"both workers to register:\n{prefill_proc.log()}\n{decode_proc.log()}",
    )
    roles = {r.disaggregation_mode: r for r in found}
    assert set(roles) == {"prefill", "decode"}  # discovery carries each worker's role
    prefill, decode = roles["prefill"], roles["decode"]
    prompt = list(range(200, 200 + 4 * BLOCK + 9))

    async def scenario():
        kv_sub = zmq.asyncio.Context.instance().socket(zmq.SUB)
        kv_sub.setsockopt(zmq.LINGER, 0)
        kv_sub.setsockopt(zmq.SUBSCRIBE, b"")
        kv_sub.connect(decode.endpoints.kv_events)
        await anyio.sleep(0.3)  # let the SUB join before anything is published
        async with WorkerClient(prefill.endpoints.request) as p, WorkerClient(decode.endpoints.request) as d:
            # the frontend's prefill request: max_tokens 1, kv_transfer phase prefill
            first = await collect(p, request("r1", prompt, 1, KvTransfer(phase="prefill")))
            descriptor = first[-1].kv_transfer
            assert isinstance(first[-1], Finish) and len(tokens_of(first)) <= 1
            assert descriptor == KvTransfer(
                phase="decode", source_instance_id=prefill.instance_id, prompt_tokens=len(prompt)
            )

            # the client's own request with the descriptor: every output token from the decode worker
            decoded = await collect(d, request("r1", prompt, 24, descriptor))
            # the same request served whole (the prefill worker takes one without kv_transfer)
            whole = await collect(p, request("r1-agg", prompt, 24))
            assert tokens_of(decoded) == tokens_of(whole) and len(tokens_of(decoded)) == 24
            fin = decoded[-1]
            assert (fin.reason, fin.usage.prompt_tokens, fin.usage.completion_tokens) == (
                "length",
                len(prompt),
                24,
            )
            assert fin.usage.cached_tokens == 0 and fin.kv_transfer is None

            # the decode worker's KV events name the received prompt blocks as the router hashes them
            stored: list[int] = []
            with anyio.fail_after(10):
                while len(stored) < 4:
                    _topic, _seq, payload = split_frames(await kv_sub.recv_multipart())
                    batch = decode_event_batch(payload).events
                    stored += [h for e in batch if isinstance(e, BlockStored) for h in e.block_hashes]
            assert stored[:4] == sequence_hashes(block_hashes(prompt, BLOCK))

            # a descriptor that disagrees with the prompt is an error reply, and the worker goes on
            with pytest.raises(RemoteError) as exc:
                await collect(d, request("r2", prompt[:-1], 4, descriptor))
            assert exc.value.code == "bad_request" and "prompt" in str(exc.value)
            local = await collect(d, request("r3", prompt, 4))  # no kv_transfer: prefilled locally
            assert len(tokens_of(local)) == 4 and local[-1].usage.cached_tokens == 4 * BLOCK
        kv_sub.close()

    anyio.run(scenario)
    for proc in (prefill_proc, decode_proc):
        assert proc.proc.poll() is None, proc.log()
        assert proc.terminate() == 0, proc.log()


def test_an_unknown_role_is_refused(dyn_process):
    proc = dyn_process("worker", "mocker", "--disaggregation-mode", "both")
    assert proc.proc.wait(60) == 2
    assert "--disaggregation-mode" in proc.log() and "Traceback" not in proc.log()
