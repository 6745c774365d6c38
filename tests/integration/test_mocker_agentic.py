"""Real ``dyn worker mocker`` processes serving the agentic calls over the request plane:
streaming sessions (SGLang flavour), prefix pinning, and ``unsupported`` from a vLLM-flavour worker."""

from __future__ import annotations

import anyio
import pytest

from dyn.core.discovery.backends import open_store
from dyn.core.messages import (
    Finish,
    GenerateRequest,
    PinPrefixRequest,
    SessionControlRequest,
    StopConditions,
    TokenChunk,
)
from dyn.core.transport.request_plane import RemoteError, WorkerClient

pytestmark = [pytest.mark.integration]

BLOCK = 16


def records(discovery_dir, namespace):
    return anyio.run(open_store("file", namespace, discovery_dir).list)


def start_worker(dyn_process, wait_for, namespace, *flags):
    worker = dyn_process(
        "worker",
        "mocker",
        "--namespace",
        namespace,
        "--block-size",
        str(BLOCK),
        "--speedup-ratio",
        "1000",
        "--num-gpu-blocks-override",
        "256",
        *flags,
    )
    (rec,) = wait_for(
        lambda: records(dyn_process.discovery_dir, namespace),
        60,
        f"the {namespace} worker to register:\n{worker.log()}",
    )
    return worker, rec


async def turn(client, rid, prompt, session_id, max_tokens):
    out = [
        m
        async for m in client.generate(
            GenerateRequest(
                rid,
                prompt,
                stop=StopConditions(max_tokens=max_tokens, ignore_eos=True),
                session_id=session_id,
            )
        )
    ]
    assert all(isinstance(m, TokenChunk) for m in out[:-1]) and isinstance(out[-1], Finish)
    return [t for m in out[:-1] for t in m.token_ids], out[-1]


def test_sessions_pins_and_unsupported_over_the_request_plane(dyn_process, wait_for):
    sglang, rec = start_worker(
        dyn_process,
        wait_for,
        "agentic",
        "--engine-type",
        "sglang",
        "--enable-streaming-session",
        "--enable-priority-scheduling",
    )
    vllm, plain = start_worker(dyn_process, wait_for, "agentic-vllm")
    assert rec.priority_order == "higher_first"
    assert sorted(rec.features) == ["pin_prefix", "streaming_sessions"]
    assert plain.priority_order == "lower_first" and plain.features == ["pin_prefix"]

    async def scenario():
        prompt = list(range(100, 100 + 3 * BLOCK + 5))  # 53 tokens
        async with WorkerClient(rec.endpoints.request) as client:
            with anyio.fail_after(30):
                opened = await client.call(SessionControlRequest("open-1", "open", "agent-7", timeout_s=60))
                assert opened.value == 1
                again = await client.call(SessionControlRequest("open-2", "open", "agent-7", timeout_s=60))
                assert again.value == 0  # already open: timeout refreshed

                out1, fin1 = await turn(client, "turn-1", prompt, "agent-7", 12)
                assert len(out1) == 12 and fin1.usage.cached_tokens == 0
                second = prompt + out1 + list(range(5000, 5020))
                out2, fin2 = await turn(client, "turn-2", second, "agent-7", 4)
                assert fin2.usage.cached_tokens == len(prompt) + len(out1) - 1  # all of turn 1's KV
                assert fin2.usage.prompt_tokens == len(second)

                pinned = await client.call(PinPrefixRequest("pin-1", prompt, 30.0))
                assert pinned.value == 3  # turn 1 stored 3 full prompt blocks

                closed = await client.call(SessionControlRequest("close-1", "close", "agent-7"))
                assert closed.value == 1
                closed = await client.call(SessionControlRequest("close-2", "close", "agent-7"))
                assert closed.value == 0

                # a closed session id is served as an ordinary request: only the blocks turn 1
                # stored in the prefix cache match, not turn 2's (they were outside it)
                out3, fin3 = await turn(client, "turn-3", second, "agent-7", 2)
                assert len(out3) == 2
                assert fin3.usage.cached_tokens == (len(prompt) + len(out1) - 1) // BLOCK * BLOCK

        async with WorkerClient(plain.endpoints.request) as client:
            with anyio.fail_after(30):
                with pytest.raises(RemoteError) as exc:
                    await client.call(SessionControlRequest("open-1", "open", "agent-7", timeout_s=60))
                assert exc.value.code == "unsupported"
                out, fin = await turn(client, "plain-1", prompt, "agent-7", 3)  # session id ignored
                assert len(out) == 3 and fin.reason == "length"
                pinned = await client.call(PinPrefixRequest("pin-1", prompt, 30.0))
                assert pinned.value == 3

    anyio.run(scenario)
    for worker in (sglang, vllm):
        assert worker.proc.poll() is None, worker.log()
        assert worker.terminate() == 0, worker.log()


def test_flag_of_the_other_flavour_is_a_clear_error(dyn_process):
    worker = dyn_process("worker", "mocker", "--enable-streaming-session")
    assert worker.proc.wait(60) == 2
    log = worker.log()
    assert "--engine-type sglang" in log and "Traceback" not in log
