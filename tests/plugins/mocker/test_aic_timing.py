"""``--timing-model aic``: a pass takes the predicted prefill of each request it prefills (its new
tokens after those it holds) plus one predicted decode step of its decoding requests (their count
and mean context), scaled as the polynomials are; the flags it needs; a mocker whose tables
cannot be built does not start."""

from __future__ import annotations

import random

import anyio
import pytest
from typer.testing import CliRunner

from dyn.core.errors import ConfigError
from dyn.core.messages import Finish, GenerateRequest, StopConditions
from dyn.core.model import load_model_info
from dyn.core.router import prefill_model
from dyn.core.router.prefill_model import AicSetup, DecodeDurations, PrefillDurations
from dyn.plugins.mocker.aic_timing import AicPassTiming, aic_pass_timing
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.engine import CATCH_UP_S, MockerEngine
from dyn.plugins.mocker.scheduler import Scheduler, SimModel, SimRequest
from dyn.plugins.mocker.simulator import MockerSimulator

MODEL = SimModel(vocab_size=1000, context_length=32768)
AIC = {"aic_backend": "vllm", "aic_system": "h200_sxm", "aic_model_path": "Qwen/Qwen3-32B"}


def prefill_ms(new: int, held: int) -> float:
    return 2.0 + 0.01 * new + 0.001 * held


def decode_ms(batch: int, context: float) -> float:
    return 5.0 + 0.5 * batch + 0.002 * context


class FakePrefill:
    """``PrefillDurations``' lookup: ``prefill_ms`` in seconds, each call recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def expected_secs(self, new_tokens: int, prefix_tokens: int) -> float | None:
        self.calls.append((new_tokens, prefix_tokens))
        return None if new_tokens <= 0 else prefill_ms(new_tokens, prefix_tokens) / 1000


class FakeDecode:
    """``DecodeDurations``' lookup: ``decode_ms`` in seconds, each call recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, float]] = []

    def step_secs(self, batch: int, context: float) -> float | None:
        self.calls.append((batch, context))
        return decode_ms(batch, context) / 1000


def make(**cfg) -> tuple[Scheduler, FakePrefill, FakeDecode]:
    cfg.setdefault("block_size", 16)
    cfg.setdefault("num_gpu_blocks", 4096)
    prefill, decode = FakePrefill(), FakeDecode()
    return Scheduler(MockerConfig(**cfg), MODEL, timing=AicPassTiming(prefill, decode)), prefill, decode


def req(rid: str, prompt_len: int, max_tokens: int = 3, first: int = 0) -> SimRequest:
    return SimRequest(
        rid, list(range(first, first + prompt_len)), StopConditions(max_tokens=max_tokens, ignore_eos=True)
    )


def test_a_prefill_pass_takes_the_predicted_prefill_and_a_decode_pass_one_decode_step():
    s, prefill, decode = make()
    s.add(req("a", 1000, max_tokens=3))
    durations = [s.step().duration_ms for _ in range(3)]
    assert not s.has_work
    assert prefill.calls == [(1000, 0)]
    assert decode.calls == [(1, 1000), (1, 1001)]  # the KV each step reads: prompt, then + 1
    assert durations == pytest.approx([prefill_ms(1000, 0), decode_ms(1, 1000), decode_ms(1, 1001)])


def test_a_prefix_cache_hit_is_the_tables_second_dimension():
    s, prefill, _ = make()
    s.add(req("a", 100, max_tokens=1))
    s.step()
    s.add(req("b", 100, max_tokens=1))
    r = s.step()
    assert prefill.calls[-1] == (4, 96)  # 6 full blocks of 16 cached, 4 tokens computed
    assert r.duration_ms == pytest.approx(prefill_ms(4, 96))


def test_each_chunk_is_charged_after_the_tokens_computed_before_it():
    s, prefill, _ = make(max_num_batched_tokens=256)
    s.add(req("a", 600, max_tokens=1))
    durations = [s.step().duration_ms for _ in range(3)]
    assert prefill.calls == [(256, 0), (256, 256), (88, 512)]
    assert durations == pytest.approx([prefill_ms(256, 0), prefill_ms(256, 256), prefill_ms(88, 512)])


def test_a_mixed_pass_is_each_requests_prefill_plus_a_decode_step_at_the_mean_context():
    s, prefill, decode = make()
    s.add(req("a", 1000))
    s.add(req("b", 500, first=5000))
    first = s.step()
    assert first.duration_ms == pytest.approx(prefill_ms(1000, 0) + prefill_ms(500, 0))
    s.add(req("c", 300, first=9000))
    mixed = s.step()
    assert mixed.batch_size == 3 and mixed.prefill_tokens == 300
    assert decode.calls == [(2, 750.0)]  # a and b decode, holding 1000 and 500 tokens
    assert mixed.duration_ms == pytest.approx(prefill_ms(300, 0) + decode_ms(2, 750))


def test_the_speedup_ratios_scale_the_prefill_and_the_decode_part_as_the_polynomials_do():
    s, _, _ = make(speedup_ratio=2.0, decode_speedup_ratio=5.0)
    s.add(req("a", 1000))
    assert s.step().duration_ms == pytest.approx(prefill_ms(1000, 0) / 2)
    s.add(req("b", 300, first=5000))
    assert s.step().duration_ms == pytest.approx(prefill_ms(300, 0) / 2 + decode_ms(1, 1000) / 10)
    assert s.step().duration_ms == pytest.approx(decode_ms(2, (1001 + 300) / 2) / 10)


def test_the_decode_only_shortcut_and_the_general_pass_time_alike():
    """Streaming sessions turn the decode-only shortcut off: the same workload, same times."""
    rng = random.Random(4)
    work = [(f"r{i}", rng.randint(20, 400), rng.randint(1, 30)) for i in range(12)]

    def run(**cfg) -> list[float]:
        s, _, _ = make(max_num_batched_tokens=512, **cfg)
        times, pending = [], list(work)
        while pending or s.has_work:
            if pending and rng.random() < 0.4:
                rid, n, out = pending.pop()
                s.add(req(rid, n, out, first=1000 * int(rid[1:])))
            if s.has_work:
                times.append(s.step().duration_ms)
        return times

    rng.seed(9)
    shortcut = run()
    rng.seed(9)
    general = run(engine_type="sglang", enable_streaming_session=True)
    assert len(shortcut) > 20 and shortcut == pytest.approx(general)


def test_polynomial_is_the_default_and_reads_no_table():
    config = MockerConfig()
    assert config.timing_model == "polynomial" and not config.uses_aic
    s = Scheduler(MockerConfig(timing_model="polynomial", block_size=16, num_gpu_blocks=100), MODEL)
    s.add(req("a", 1000))
    # the polynomials (tests/plugins/mocker/test_timing.py), not a table
    assert s.step().duration_ms == pytest.approx(32.1058589)
    assert s.step().duration_ms == pytest.approx(29.550094)


# ---------------------------------------------------------------------------------------- flags


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"timing_model": "roofline"}, "--timing-model must be one of polynomial, aic, got 'roofline'"),
        (
            {"timing_model": "aic"},
            "--timing-model aic needs --aic-backend (the engine: vllm, sglang or trtllm), "
            "--aic-system (the GPU system, such as h200_sxm), --aic-model-path (the served model)",
        ),
        ({"timing_model": "aic", **AIC, "aic_system": ""}, "--timing-model aic needs --aic-system"),
        ({"timing_model": "aic", **AIC, "aic_tp_size": 0}, "--aic-tp-size must be a whole number"),
        ({"timing_model": "aic", **AIC, "aic_moe_ep_size": True}, "--aic-moe-ep-size must be a whole"),
    ],
)
def test_bad_timing_flags_are_refused_with_a_sentence(fields, says):
    with pytest.raises(ValueError) as err:
        MockerConfig(**fields).validate()
    assert says in str(err.value)


def test_the_aic_setup_needs_no_timing_model_of_aic():
    """The --aic-* flags alone change nothing: dyn serve hands them to the frontend and the
    workers alike."""
    config = MockerConfig(**AIC).validate()
    assert not config.uses_aic
    assert MockerConfig(timing_model="aic", **AIC, aic_tp_size=2).validate().uses_aic


def test_dyn_worker_mocker_refuses_an_incomplete_setup_before_it_starts():
    from dyn.cli.app import app

    argv = ["worker", "mocker", "--timing-model", "aic", "--aic-backend", "vllm", "--aic-system", "l40s"]
    result = CliRunner().invoke(app, argv, env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "--timing-model aic needs --aic-model-path (the served model)" in " ".join(result.output.split())


# ---------------------------------------------------------------------------------------- start


def test_without_the_extra_the_error_names_it_and_the_polynomials(monkeypatch):
    real = prefill_model.util.find_spec
    monkeypatch.setattr(
        prefill_model.util, "find_spec", lambda name: None if name == "aiconfigurator_core" else real(name)
    )
    config = MockerConfig(timing_model="aic", **AIC)
    with pytest.raises(ConfigError) as err:
        Scheduler(config, MODEL)
    assert str(err.value) == (
        "--timing-model aic needs NVIDIA's AIConfigurator (aiconfigurator-core): "
        "pip install 'dyn[aic]', or use --timing-model polynomial"
    )


class Estimator:
    """``prefill_ms`` and ``decode_ms`` times ``scale``; its decode step can fail."""

    context_length = 4096

    def __init__(self, fail: Exception | None = None, scale: float = 1.0) -> None:
        self.fail, self.scale = fail, scale

    def prefill_ms(self, new_tokens: int, prefix_tokens: int) -> float:
        return self.scale * prefill_ms(new_tokens, prefix_tokens)

    def decode_step_ms(self, batch: int, context: int) -> float:
        if self.fail is not None:
            raise self.fail
        return self.scale * decode_ms(batch, context)


@pytest.fixture
def tables(monkeypatch, tmp_path):
    """Put both tables of the setup of ``AIC``, from ``Estimator(fail)``, where the mocker finds
    them; the setup is checked against the real AIConfigurator."""
    pytest.importorskip("aiconfigurator_core")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    setup = AicSetup(backend="vllm", system="h200_sxm", model_path="Qwen/Qwen3-32B")

    def install(fail: Exception | None = None, scale: float = 1.0) -> None:
        made = {"estimator": lambda s: Estimator(fail, scale), "directory": tmp_path}
        monkeypatch.setitem(prefill_model._SHARED, setup, PrefillDurations(setup, **made).start())
        monkeypatch.setitem(prefill_model._SHARED_DECODE, setup, DecodeDurations(setup, **made).start())

    return install


def test_a_table_that_cannot_be_built_stops_the_mocker_with_the_tables_error(tables):
    tables(fail=RuntimeError("generation GEMM data missing"))
    config = MockerConfig(timing_model="aic", **AIC)
    says = (
        "the AIC decode table of Qwen/Qwen3-32B on h200_sxm vllm current, tp 1 could not be built: "
        "generation GEMM data missing"
    )
    with pytest.raises(ConfigError) as err:
        Scheduler(config, MODEL)
    assert str(err.value) == says
    with pytest.raises(ConfigError, match="generation GEMM data missing"):
        MockerSimulator(config).prepare()


def test_the_mocker_waits_for_the_shared_tables_and_times_passes_with_them(tables):
    tables()
    config = MockerConfig(timing_model="aic", **AIC, block_size=16)
    timing = aic_pass_timing(config)
    assert timing.prefill_ms(1000, 200) == pytest.approx(prefill_ms(1000, 200), rel=1e-6)
    assert timing.decode_ms(8, 8 * 3000) == pytest.approx(decode_ms(8, 3000), rel=1e-6)
    s = Scheduler(config, MODEL)
    s.add(req("a", 1000))
    assert s.step().duration_ms == pytest.approx(prefill_ms(1000, 0), rel=1e-6)
    assert s.step().duration_ms == pytest.approx(decode_ms(1, 1000), rel=1e-6)


@pytest.mark.anyio
async def test_a_live_mocker_sleeps_the_tables_times(tables):
    """Times 20: a 40-token prompt's prefill takes 48 ms and each decode step 111 ms, where the
    polynomials would take 17 and 6 ms; the engine sleeps at least that long."""
    tables(scale=20.0)
    config = MockerConfig(timing_model="aic", **AIC, block_size=16, num_gpu_blocks=64)
    engine = MockerEngine(config, load_model_info(None, None))
    request = GenerateRequest("a", list(range(40)), stop=StopConditions(max_tokens=3, ignore_eos=True))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(engine.run)
            out = [m async for m in engine.generate(request)]
            tg.cancel_scope.cancel()
    finish = out[-1]
    assert isinstance(finish, Finish) and finish.usage.completion_tokens == 3
    # a pass that wakes late is made up by the next ones (CATCH_UP_S), so each phase may end
    # that much before its modelled length; never more
    slack_ms = CATCH_UP_S * 1e3 + 1
    assert finish.timing.prefill_ms >= 20 * prefill_ms(40, 0) - slack_ms
    assert finish.timing.decode_ms >= 20 * (decode_ms(1, 40) + decode_ms(1, 41)) - slack_ms
