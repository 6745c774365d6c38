"""A real ``dyn worker mocker`` process: discovery, request plane, KV events, metrics, shutdown."""

from __future__ import annotations

import anyio
import msgspec
import pytest
import zmq
import zmq.asyncio

from dyn.core.discovery.file_store import FileDiscoveryStore
from dyn.core.kv.events import BlockStored, decode_event_batch, split_frames
from dyn.core.kv.hashing import block_hashes, sequence_hashes
from dyn.core.messages import (
    LOAD_METRICS_TOPIC,
    ErrorReply,
    Finish,
    GenerateRequest,
    StopConditions,
    TokenChunk,
)
from dyn.core.model import load_model_info
from dyn.core.transport.event_plane import decode_load_metrics
from dyn.core.transport.request_plane import WorkerClient

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

BLOCK = 16


def records(discovery_dir, namespace):
    return anyio.run(FileDiscoveryStore(discovery_dir, namespace).list)


def sub_socket(endpoint: str, topic: bytes = b"") -> zmq.asyncio.Socket:
    sub = zmq.asyncio.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.connect(endpoint)
    return sub


async def collect(client: WorkerClient, request: GenerateRequest):
    return [m async for m in client.generate(request)]


def test_mocker_worker_end_to_end(dyn_process, wait_for):
    worker = dyn_process(
        "--log-format",
        "json",
        "worker",
        "mocker",
        "--namespace",
        "it",
        "--num-workers",
        "2",
        "--block-size",
        str(BLOCK),
        "--speedup-ratio",
        "100",
        "--num-gpu-blocks-override",
        "256",
    )
    found = wait_for(
        lambda: (
            len(records(dyn_process.discovery_dir, "it")) == 2 and records(dyn_process.discovery_dir, "it")
        ),
        60,
        f"2 workers to register:\n{worker.log()}",
    )
    assert len({r.instance_id for r in found}) == 2
    assert len({r.endpoints.request for r in found}) == 2
    assert records(dyn_process.discovery_dir, "other-namespace") == []
    rec = found[0]
    assert rec.engine == "mocker" and rec.model_name == "dyn-tiny" and rec.block_size == BLOCK
    assert rec.total_kv_blocks == 256 and rec.kv_events_topic == "kv-events"
    eos = set(load_model_info(None, None).eos_token_ids)

    async def scenario():
        kv_sub = sub_socket(rec.endpoints.kv_events)
        metrics_sub = sub_socket(rec.endpoints.metrics, LOAD_METRICS_TOPIC)
        await anyio.sleep(0.3)  # let the SUBs join before anything is published
        prompt = list(range(100, 100 + 4 * BLOCK + 5))
        async with WorkerClient(rec.endpoints.request) as client:
            with anyio.fail_after(30):
                out = await collect(
                    client,
                    GenerateRequest("it-1", prompt, stop=StopConditions(max_tokens=20, ignore_eos=True)),
                )
            chunks, finish = out[:-1], out[-1]
            assert chunks and all(isinstance(c, TokenChunk) for c in chunks)
            tokens = [t for c in chunks for t in c.token_ids]
            assert len(tokens) == 20
            assert isinstance(finish, Finish) and finish.reason == "length"
            assert (finish.usage.prompt_tokens, finish.usage.completion_tokens) == (len(prompt), 20)
            assert finish.usage.cached_tokens == 0

            # BlockStored for the prompt's 4 full blocks, hashed as the router will hash them
            stored: list[BlockStored] = []
            with anyio.fail_after(10):
                while sum(len(e.block_hashes) for e in stored) < 4:
                    topic, _seq, payload = split_frames(await kv_sub.recv_multipart())
                    assert topic == b"kv-events"
                    stored += [e for e in decode_event_batch(payload).events if isinstance(e, BlockStored)]
            first = stored[0]
            assert first.parent_block_hash is None and first.block_size == BLOCK
            hashes = [h for e in stored for h in e.block_hashes][:4]
            assert hashes == sequence_hashes(block_hashes(prompt, BLOCK))
            assert [t for e in stored for t in e.token_ids][: 4 * BLOCK] == prompt[: 4 * BLOCK]

            # same prompt again: served from the prefix cache, same seed -> same tokens
            with anyio.fail_after(30):
                again = await collect(
                    client,
                    GenerateRequest("it-1", prompt, stop=StopConditions(max_tokens=20, ignore_eos=True)),
                )
            assert again[-1].usage.cached_tokens == 4 * BLOCK
            assert [t for c in again[:-1] for t in c.token_ids] == tokens

            # without ignore_eos the model's EOS may end it early, never appearing in the output
            with anyio.fail_after(30):
                out = await collect(
                    client, GenerateRequest("it-2", prompt, stop=StopConditions(max_tokens=50))
                )
            assert not eos & {t for c in out[:-1] for t in c.token_ids}

            # cancel mid-stream
            with anyio.fail_after(30):
                got = []
                async for m in client.generate(
                    GenerateRequest("it-3", prompt, stop=StopConditions(max_tokens=100000, ignore_eos=True))
                ):
                    got.append(m)
                    if len(got) == 2:
                        break
            assert all(isinstance(m, TokenChunk) for m in got)

        # a malformed frame gets an error reply and the worker keeps serving
        raw = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(rec.endpoints.request)
        await raw.send_multipart([b"G", b"\x93garbage"])
        with anyio.fail_after(10):
            kind, payload = await raw.recv_multipart()
        assert kind == b"E" and msgspec.msgpack.decode(payload, type=ErrorReply).code == "bad_request"
        raw.close()

        with anyio.fail_after(10):  # the SUB may hold snapshots from before the first request
            while True:
                topic, payload = await metrics_sub.recv_multipart()
                metrics = decode_load_metrics(payload)
                assert metrics.instance_id == rec.instance_id and metrics.total_kv_blocks == 256
                if metrics.num_passes > 0:
                    break
        kv_sub.close()
        metrics_sub.close()

    anyio.run(scenario)
    assert worker.proc.poll() is None, worker.log()
    assert worker.terminate() == 0, worker.log()
    assert records(dyn_process.discovery_dir, "it") == []


def test_bad_model_path_is_a_clear_error(dyn_process, tmp_path):
    worker = dyn_process("worker", "mocker", "--model-path", str(tmp_path / "missing"))
    assert worker.proc.wait(60) == 2
    log = worker.log()
    assert "error:" in log and "--model-path" in log and "Traceback" not in log
