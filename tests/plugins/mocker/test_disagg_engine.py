"""MockerEngine's prefill and decode roles behind the Engine protocol, following the contract of
``dyn.core.messages.KvTransfer`` (Dynamo's mocker serves the same roles: docs/mocker/mocker.md,
``--disaggregation-mode``; the transfer time is its formula, reference 7.4)."""

from contextlib import aclosing

import anyio
import pytest

from dyn.core.engine import EngineError
from dyn.core.kv.events import BlockStored
from dyn.core.kv.hashing import block_hashes, sequence_hashes
from dyn.core.messages import Finish, GenerateRequest, KvTransfer, SamplingParams, StopConditions
from dyn.core.model import load_model_info
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.engine import MockerEngine

pytestmark = pytest.mark.anyio
MODEL = load_model_info(None, None)
BS = 16


def engine(role="agg", **overrides):
    events: list = []
    overrides.setdefault("speedup_ratio", 1000)
    cfg = MockerConfig(block_size=BS, num_gpu_blocks=256, **overrides)
    eng = MockerEngine(cfg, MODEL, lambda evs, dp: events.extend(evs), disaggregation_mode=role)
    return eng, events


def request(rid, prompt, max_tokens=12, transfer=None, seed=5):
    return GenerateRequest(
        rid,
        prompt,
        SamplingParams(seed=seed),
        StopConditions(max_tokens=max_tokens, ignore_eos=True),
        kv_transfer=transfer,
    )


async def collect(eng, req):
    return [m async for m in eng.generate(req)]


def tokens_of(out):
    return [t for m in out[:-1] for t in m.token_ids]


def stored(events):
    return [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]


async def serve(eng, scenario):
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(eng.run)
            try:
                return await scenario()
            finally:
                tg.cancel_scope.cancel()


async def test_prefill_request_outputs_one_token_and_hands_back_the_descriptor():
    eng, events = engine("prefill")
    prompt = list(range(40, 40 + 3 * BS + 7))
    out = await serve(eng, lambda: collect(eng, request("p", prompt, 50, KvTransfer(phase="prefill"))))
    finish = out[-1]
    assert len(tokens_of(out)) == 1 and finish.reason == "length"
    assert finish.kv_transfer == KvTransfer(phase="decode", source_instance_id=0, prompt_tokens=len(prompt))
    assert finish.usage.prompt_tokens == len(prompt) and finish.usage.completion_tokens == 1
    assert stored(events) == sequence_hashes(block_hashes(prompt, BS))  # the router learns them


async def test_prefill_worker_serves_a_request_without_kv_transfer_whole():
    eng, _ = engine("prefill")
    out = await serve(eng, lambda: collect(eng, request("w", list(range(30)), 9)))
    assert len(tokens_of(out)) == 9 and out[-1].kv_transfer is None


async def test_decode_output_equals_aggregated_output_and_events_name_the_received_blocks():
    prompt = list(range(700, 700 + 5 * BS + 3))
    agg, _ = engine("agg")
    agg_out = await serve(agg, lambda: collect(agg, request("r", prompt, 20)))
    dec, events = engine("decode")
    descriptor = KvTransfer(phase="decode", source_instance_id=42, prompt_tokens=len(prompt))
    dec_out = await serve(dec, lambda: collect(dec, request("r", prompt, 20, descriptor)))
    assert tokens_of(dec_out) == tokens_of(agg_out) and len(tokens_of(dec_out)) == 20
    a, d = agg_out[-1].usage, dec_out[-1].usage
    assert (d.prompt_tokens, d.completion_tokens, d.cached_tokens) == (
        a.prompt_tokens,
        a.completion_tokens,
        0,
    )
    assert dec_out[-1].kv_transfer is None
    received = next(e for e in events if isinstance(e, BlockStored))  # stored as the transfer lands
    assert received.block_hashes == sequence_hashes(block_hashes(prompt, BS))
    assert received.token_ids == prompt[: 5 * BS] and received.parent_block_hash is None


async def test_decode_worker_prefills_a_request_without_kv_transfer_locally():
    prompt = list(range(3 * BS))
    agg, _ = engine("agg")
    dec, _ = engine("decode")
    agg_out = await serve(agg, lambda: collect(agg, request("c", prompt)))
    dec_out = await serve(dec, lambda: collect(dec, request("c", prompt)))
    assert tokens_of(dec_out) == tokens_of(agg_out)


async def test_decode_prefill_time_includes_the_transfer_and_a_cached_prefix_is_not_transferred():
    # 1 MB per token at 1 GB/s: 1 ms per token, 0.1 ms at --speedup-ratio 10
    eng, _ = engine("decode", speedup_ratio=10, kv_bytes_per_token=1_000_000, kv_transfer_bandwidth=1.0)
    shared = list(range(4 * BS))
    prompt = shared + list(range(900, 900 + 4 * BS))

    async def scenario():
        await collect(eng, request("warm", shared + [1], 1))  # caches 4 blocks locally
        wait = eng._scheduler.transfer_time(len(prompt) - len(shared))
        assert wait == pytest.approx(len(prompt[len(shared) :]) * 1e-3 / 10)
        descriptor = KvTransfer(phase="decode", prompt_tokens=len(prompt))
        out = await collect(eng, request("d", prompt, 3, descriptor))
        return wait, out[-1]

    wait, finish = await serve(eng, scenario)
    assert finish.usage.cached_tokens == len(shared)  # local blocks only, not the received ones
    assert finish.timing.prefill_ms >= wait * 1000  # the engine's own clock: the wait is in it


async def test_cancelling_a_decode_request_mid_transfer_frees_its_blocks():
    eng, _ = engine("decode", kv_bytes_per_token=10**9, kv_transfer_bandwidth=1.0)  # capped: 60 s
    prompt = list(range(5 * BS))
    descriptor = KvTransfer(phase="decode", prompt_tokens=len(prompt))

    async def receiving():
        while eng._scheduler.num_receiving != 1:
            await anyio.sleep(0.005)

    async def scenario():
        got = []
        async with anyio.create_task_group() as tg:

            async def run_it():
                got.extend(await collect(eng, request("x", prompt, 5, descriptor)))

            tg.start_soon(run_it)
            await receiving()
            assert eng.load_metrics()[0].num_waiting == 1
            assert eng.load_metrics()[0].active_kv_blocks == 5
            assert await eng.abort("x")
        assert isinstance(got[-1], Finish) and got[-1].reason == "cancelled"
        assert got[-1].kv_transfer is None
        assert eng._scheduler.num_receiving == 0 and eng.load_metrics()[0].active_kv_blocks == 0

        # a client that goes away mid-transfer frees the blocks too
        async with aclosing(eng.generate(request("y", prompt, 5, descriptor))) as stream:
            async with anyio.create_task_group() as tg:
                tg.start_soon(anext, stream)
                await receiving()
                tg.cancel_scope.cancel()
        assert eng._scheduler.num_receiving == 0 and eng.load_metrics()[0].active_kv_blocks == 0

    await serve(eng, scenario)


@pytest.mark.parametrize(
    ("role", "transfer", "words"),
    [
        ("prefill", KvTransfer(phase="decode", prompt_tokens=20), "prefill worker"),
        ("decode", KvTransfer(phase="prefill"), "decode worker"),
        ("decode", KvTransfer(phase="decode", prompt_tokens=19), "holds 19 prompt tokens"),
        ("agg", KvTransfer(phase="decode", prompt_tokens=0), "holds 0 prompt tokens"),
    ],
)
async def test_a_phase_against_the_role_or_a_wrong_descriptor_is_a_bad_request(role, transfer, words):
    eng, _ = engine(role)
    with pytest.raises(EngineError, match=words) as exc:
        await collect(eng, request("b", list(range(20)), 3, transfer))  # refused before queueing
    assert exc.value.code == "bad_request"
