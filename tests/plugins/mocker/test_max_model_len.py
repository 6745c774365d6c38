"""--max-model-len on the mocker (vLLM's flag): the worker serves and advertises the capped context,
refuses a request whose prompt plus max_tokens exceeds it in vLLM's words, and refuses at start a
value above the model's own; a ~120k-token prompt fits dyn-tiny's 131072 and is prefilled in
bounded time."""

import time

import anyio
import pytest
import typer.main
from typer.testing import CliRunner

from dyn.cli.app import app
from dyn.core.engine import EngineError
from dyn.core.messages import GenerateRequest, SamplingParams, StopConditions
from dyn.core.model import load_model_info
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.engine import MockerEngine
from dyn.plugins.mocker.simulator import MockerSimulator

MODEL = load_model_info(None, None)
runner = CliRunner()


def test_the_flag_caps_the_models_context_and_is_checked():
    assert MODEL.context_length == 131072
    assert MockerConfig().context_length(MODEL.context_length, MODEL.name) == 131072
    assert MockerConfig(max_model_len=1024).validate().context_length(131072, "m") == 1024
    with pytest.raises(ValueError, match="--max-model-len must be at least 2"):
        MockerConfig(max_model_len=1).validate()
    with pytest.raises(ValueError) as exc:
        MockerConfig(max_model_len=200_000).context_length(131072, "dyn-tiny")
    assert str(exc.value) == (
        "--max-model-len 200000 is more than model dyn-tiny's context length of 131072 tokens; "
        "pass at most 131072"
    )


@pytest.mark.parametrize("command", [["worker", "mocker"], ["bench", "replay"]])
def test_both_mocker_commands_take_the_flag(command):
    cmd = typer.main.get_command(app)
    for name in command:
        cmd = cmd.commands[name]
    assert "--max-model-len" in {o for p in cmd.params for o in p.opts}


def test_a_value_over_the_models_context_stops_the_worker_with_one_sentence(tmp_path):
    result = runner.invoke(
        app, ["worker", "mocker", "--discovery-dir", str(tmp_path), "--max-model-len", "200000"]
    )
    assert result.exit_code == 2
    assert "--max-model-len 200000 is more than model dyn-tiny's context length of 131072" in result.output


def test_dyn_serve_passes_the_flag_to_its_workers_only(monkeypatch):
    configs = []
    monkeypatch.setattr("dyn.core.serve.run_stack", lambda config, **_: configs.append(config) or 0)
    monkeypatch.delenv("DYN_MAX_MODEL_LEN", raising=False)
    result = runner.invoke(app, ["serve", "--workers", "2", "--max-model-len", "1024"])
    assert result.exit_code == 0, result.output
    (config,) = configs
    assert all(list(w.argv[-2:]) == ["--max-model-len", "1024"] for w in config.workers)
    assert "--max-model-len" not in config.frontend.argv


def engine(**overrides):
    cfg = MockerConfig(block_size=16, num_gpu_blocks=512, speedup_ratio=1000, **overrides)
    return MockerEngine(cfg, MODEL)


async def collect(eng, request):
    return [m async for m in eng.generate(request)]


@pytest.mark.anyio
async def test_the_worker_advertises_the_cap_and_refuses_requests_over_it():
    eng = engine(max_model_len=1024)
    assert eng.info.context_length == 1024 and eng.model.context_length == 1024
    with pytest.raises(ValueError, match="more than model dyn-tiny's context length"):
        engine(max_model_len=MODEL.context_length + 1)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(eng.run)
            with pytest.raises(EngineError) as exc:
                await collect(eng, GenerateRequest("over", [7] * 1000, stop=StopConditions(max_tokens=100)))
            assert exc.value.code == "bad_request"
            assert str(exc.value) == (
                "This model's maximum context length is 1024 tokens. However, you requested 1100 "
                "tokens (1000 in the messages, 100 in the completion). Please reduce the length of "
                "the messages or completion."
            )
            with pytest.raises(EngineError, match="no room"):  # no max_tokens: the prompt alone
                await collect(eng, GenerateRequest("full", [7] * 1024))
            fits = await collect(
                eng,
                GenerateRequest("fits", [7] * 900, stop=StopConditions(max_tokens=124, ignore_eos=True)),
            )
            assert fits[-1].reason == "length" and fits[-1].usage.completion_tokens == 124
            capped = await collect(
                eng, GenerateRequest("capped", [7] * 1000, stop=StopConditions(ignore_eos=True))
            )
            assert capped[-1].usage.completion_tokens == 24  # up to the capped context
            tg.cancel_scope.cancel()


def test_offline_replay_caps_its_simulated_context():
    sim = MockerSimulator(MockerConfig(max_model_len=64))
    eng = sim.engine(time.monotonic, vocab_size=100, context_length=1 << 40)
    assert eng.scheduler.model.context_length == 64
    assert (
        MockerSimulator()
        .engine(time.monotonic, vocab_size=100, context_length=500)
        .scheduler.model.context_length
        == 500
    )


@pytest.mark.anyio
async def test_a_120k_token_prompt_is_accepted_and_prefilled_in_bounded_time():
    """Agents' prompts fit dyn-tiny's context: a ~120k-token prompt is admitted and prefilled in
    chunks of --max-num-batched-tokens (15 passes of 8192 tokens, ~2.6 s of simulated time at
    --speedup-ratio 1, so 0.26 s here at 10); the CPU cost of admitting it stays small."""
    cfg = MockerConfig(speedup_ratio=10)  # default block size, KV blocks and token budget
    eng = MockerEngine(cfg, MODEL)
    prompt = [(i * 7919) % 4000 + 5 for i in range(120_000)]
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(eng.run)
            start = time.perf_counter()
            out = await collect(
                eng, GenerateRequest("big", prompt, SamplingParams(seed=1), StopConditions(max_tokens=1))
            )
            took = time.perf_counter() - start
            tg.cancel_scope.cancel()
    finish = out[-1]
    assert finish.usage.prompt_tokens == 120_000 and finish.usage.completion_tokens == 1
    assert eng.passes == 15
    assert took < 5, took  # simulated 0.26 s plus the passes' CPU work
