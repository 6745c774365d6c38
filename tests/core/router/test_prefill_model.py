"""The AIC prefill table: its grid and interpolation, the disk cache, the background build (none
until ready), and the start-time checks against the real AIConfigurator; the decode step table
the mocker's --timing-model aic reads beside it."""

from __future__ import annotations

import logging
import math
import random
import threading
from pathlib import Path

import orjson
import pytest

from dyn.core.errors import ConfigError
from dyn.core.router import prefill_model
from dyn.core.router.prefill_model import (
    AicSetup,
    DecodeDurations,
    DecodeTable,
    PrefillDurations,
    PrefillTable,
    cache_path,
    check_setup,
    token_grid,
)

SETUP = AicSetup(backend="vllm", system="h200_sxm", model_path="Qwen/Qwen3-32B")


def bilinear_ms(new: int, prefix: int) -> float:
    """A duration bilinear in (new, prefix): interpolation and extrapolation reproduce it."""
    return 5.0 + 2.0 * new + 0.5 * prefix + 0.001 * new * prefix


class FakeEstimator:
    """An estimator of ``ms(new, prefix)`` that counts its calls and can be held back."""

    def __init__(self, setup: AicSetup, *, ms=bilinear_ms, context: int = 4096, gate=None, fail=None):
        self.context_length = context
        self.calls = 0
        self._ms, self._gate, self._fail = ms, gate, fail

    def prefill_ms(self, new_tokens: int, prefix_tokens: int) -> float:
        if self._gate is not None:
            self._gate.wait()
        if self._fail is not None:
            raise self._fail
        self.calls += 1
        return self._ms(new_tokens, prefix_tokens)


def durations(tmp_path: Path, setup: AicSetup = SETUP, **estimator_kw) -> tuple[PrefillDurations, list]:
    made: list[FakeEstimator] = []

    def factory(s: AicSetup) -> FakeEstimator:
        made.append(FakeEstimator(s, **estimator_kw))
        return made[-1]

    return PrefillDurations(setup, estimator=factory, directory=tmp_path), made


# ---------------------------------------------------------------------------------------- grid and table


def test_token_grid_has_every_power_of_two_and_quarter_octave_steps():
    grid = token_grid(40960, 4)
    assert grid[0] == 1 and grid[-1] == 40960
    assert all(b > a for a, b in zip(grid, grid[1:]))
    assert {1 << k for k in range(16)} <= set(grid)
    big = [b / a for a, b in zip(grid, grid[1:]) if a >= 64]
    assert max(big) < 2 ** (1 / 4) * 1.02
    assert len([g for g in token_grid(1 << 20, 4) if g >= 16]) == 4 * 16 + 1  # 4 an octave from 16
    with pytest.raises(ValueError):
        token_grid(1, 4)


def test_bilinear_durations_are_reproduced_between_and_beyond_the_grid():
    table = PrefillTable.build(bilinear_ms, token_grid(4096, 2), [0, *token_grid(4096, 2)])
    rng = random.Random(3)
    for _ in range(200):
        new, prefix = rng.randint(1, 9000), rng.randint(0, 9000)  # past 4096: extrapolated
        assert table.predict_ms(new, prefix) == pytest.approx(bilinear_ms(new, prefix), rel=1e-9)


def test_a_quadratic_prefill_curve_stays_within_a_percent_at_four_points_an_octave():
    def quadratic(new: int, prefix: int) -> float:  # attention grows with the whole prompt
        return 20.0 + 0.015 * new + 4.2e-7 * new * (new + 2 * prefix)

    grid = token_grid(32768, 4)
    table = PrefillTable.build(quadratic, grid, [0, *grid])
    rng = random.Random(7)
    worst = 0.0
    for _ in range(500):
        new, prefix = rng.randint(1, 32768), rng.choice([0, rng.randint(0, 32768)])
        truth = quadratic(new, prefix)
        worst = max(worst, abs(table.predict_ms(new, prefix) - truth) / truth)
    assert worst < 0.01


def test_the_table_never_predicts_below_zero():
    table = PrefillTable([1, 2], [0, 1], [[1.0, 0.5], [0.5, 0.0]])
    assert table.predict_ms(5, 5) == 0.0


@pytest.mark.parametrize(
    ("new", "prefix", "ms"),
    [
        ([1], [0, 1], [[1.0, 1.0]]),  # one point on an axis
        ([1, 1], [0, 1], [[1.0, 1.0], [1.0, 1.0]]),  # not rising
        ([0, 2], [0, 1], [[1.0, 1.0], [1.0, 1.0]]),  # no new tokens
        ([1, 2], [-1, 1], [[1.0, 1.0], [1.0, 1.0]]),  # negative prefix
        ([1, 2.5], [0, 1], [[1.0, 1.0], [1.0, 1.0]]),  # not whole
        ([1, 2], [0, 1], [[1.0, 1.0]]),  # short of a row
        ([1, 2], [0, 1], [[1.0, 1.0], [1.0]]),  # short of a column
        ([1, 2], [0, 1], [[1.0, 1.0], [1.0, -1.0]]),  # negative
        ([1, 2], [0, 1], [[1.0, 1.0], [1.0, math.nan]]),  # not finite
    ],
)
def test_a_malformed_table_is_refused(new, prefix, ms):
    with pytest.raises(ValueError):
        PrefillTable(new, prefix, ms)


@pytest.mark.parametrize("data", [[], {"new": [1, 2]}, {"new": [1, 2], "prefix": [0, 1], "ms": None}])
def test_json_that_is_not_a_table_is_a_value_error(data):
    with pytest.raises(ValueError):
        PrefillTable.from_json(data)


def test_json_round_trip():
    table = PrefillTable([1, 4, 16], [0, 8], [[1.0, 2.0], [3.0, 4.0], [5.0, 6.5]])
    again = PrefillTable.from_json(orjson.loads(orjson.dumps(table.to_json())))
    assert (again.new, again.prefix, again.ms) == (table.new, table.prefix, table.ms)


# ---------------------------------------------------------------------------------------- background build


def test_no_duration_until_the_table_is_built_in_the_background(tmp_path):
    gate = threading.Event()
    d, made = durations(tmp_path, gate=gate)
    assert d.start() is d
    assert d.expected_secs(1000, 0) is None and not d.ready.is_set()  # start did not wait
    gate.set()
    assert d.wait(10) is not None and d.error is None
    assert d.expected_secs(1000, 300) == pytest.approx(bilinear_ms(1000, 300) / 1000)
    assert d.expected_secs(0, 300) is None  # nothing to prefill
    assert len(made) == 1 and made[0].calls == len(d.table.new) * len(d.table.prefix)
    d.start()  # once only
    assert len(made) == 1


def test_a_failed_build_keeps_its_error_and_predicts_nothing(tmp_path, caplog):
    d, _ = durations(tmp_path, fail=RuntimeError("context MLA data missing"))
    with caplog.at_level(logging.ERROR, logger="dyn.router"):
        d.build()
    assert d.ready.is_set() and d.table is None and d.expected_secs(100, 0) is None
    assert "context MLA data missing" in d.error and "Qwen/Qwen3-32B on h200_sxm vllm" in d.error
    assert "context MLA data missing" in caplog.text
    assert not list(tmp_path.iterdir())  # nothing cached


def test_the_grid_ends_at_the_models_context(tmp_path):
    d, _ = durations(tmp_path, context=1000)
    d.build()
    assert d.table.new[-1] == 1000 and d.table.prefix[-1] == 1000 and d.table.prefix[0] == 0


# ---------------------------------------------------------------------------------------- disk cache


def test_the_table_is_cached_and_read_back_without_estimating(tmp_path):
    d, _ = durations(tmp_path)
    d.build()
    [cached] = tmp_path.iterdir()
    assert cached == cache_path(SETUP, tmp_path) and not cached.name.startswith(".")
    again, made = durations(tmp_path, fail=AssertionError("estimated despite the cache"))
    again.start()
    assert again.ready.is_set() and not made  # read at once, no estimator made
    assert again.expected_secs(777, 55) == d.expected_secs(777, 55)


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"",
        b'{"format": 1, "table": {"new": [1], "prefix": [0, 1], "ms": [[1, 2]]}}',
        b'{"format": 99, "table": {"new": [1, 2], "prefix": [0, 1], "ms": [[1, 2], [3, 4]]}}',
        b"[1, 2]",
    ],
)
def test_a_corrupt_cache_file_is_rebuilt_and_replaced(tmp_path, caplog, content):
    path = cache_path(SETUP, tmp_path)
    path.write_bytes(content)
    d, made = durations(tmp_path)
    with caplog.at_level(logging.WARNING, logger="dyn.router"):
        d.start()
        assert d.wait(10) is not None
    assert made and "rebuilding it" in caplog.text
    assert PrefillTable.from_json(orjson.loads(path.read_bytes())["table"]).ms == d.table.ms


def test_the_cache_key_follows_every_input(tmp_path):
    base = cache_path(SETUP, tmp_path)
    others = [
        AicSetup(backend="sglang", system="h200_sxm", model_path="Qwen/Qwen3-32B"),
        AicSetup(backend="vllm", system="b200_sxm", model_path="Qwen/Qwen3-32B"),
        AicSetup(backend="vllm", system="h200_sxm", model_path="Qwen/Qwen3-32B", tp_size=2),
        AicSetup(backend="vllm", system="h200_sxm", model_path="Qwen/Qwen3-32B", backend_version="0.27.0"),
        AicSetup(backend="vllm", system="h200_sxm", model_path="Qwen/Qwen3-32B", moe_ep_size=2),
    ]
    paths = {base, *(cache_path(s, tmp_path) for s in others), cache_path(SETUP, tmp_path, per_octave=2)}
    assert len(paths) == len(others) + 2
    assert cache_path(SETUP, tmp_path) == base  # stable


def test_an_edited_model_config_is_another_table(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"max_position_embeddings": 4096}')
    setup = AicSetup(backend="vllm", system="h200_sxm", model_path=str(model))
    before = cache_path(setup, tmp_path)
    (model / "config.json").write_text('{"max_position_embeddings": 8192}')
    assert cache_path(setup, tmp_path) != before


def test_an_unwritable_cache_only_warns(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    d, _ = durations(blocker)
    with caplog.at_level(logging.WARNING, logger="dyn.router"):
        d.build()
    assert d.table is not None and "cannot cache the AIC prefill table" in caplog.text


def test_the_write_is_atomic(tmp_path, monkeypatch):
    d, _ = durations(tmp_path)
    d.build()
    path = cache_path(SETUP, tmp_path)
    good = path.read_bytes()

    def interrupted(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(prefill_model.os, "replace", interrupted)
    with pytest.raises(OSError, match="disk full"):
        prefill_model._write_cached(SETUP, tmp_path, prefill_model.PER_OCTAVE, d.table)
    assert path.read_bytes() == good and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_the_cache_lives_under_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert prefill_model.cache_dir() == tmp_path / "dyn" / "aic"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert prefill_model.cache_dir() == tmp_path / "home" / ".cache" / "dyn" / "aic"


# ---------------------------------------------------------------------------------------- start-time checks


def test_without_the_extra_the_error_says_what_to_install(monkeypatch):
    real = prefill_model.util.find_spec
    monkeypatch.setattr(
        prefill_model.util, "find_spec", lambda name: None if name == "aiconfigurator_core" else real(name)
    )
    with pytest.raises(ConfigError, match=r"pip install 'dyn\[aic\]'"):
        check_setup(SETUP)


@pytest.fixture
def cold_cache(monkeypatch, tmp_path):
    """An empty disk cache; the tests that use it read AIConfigurator's own database."""
    pytest.importorskip("aiconfigurator_core")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"system": "h999_sxm"}, ["--aic-system 'h999_sxm'", "h200_sxm", "b200_sxm", "l40s"]),
        ({"backend": "tensorrt"}, ["--aic-backend 'tensorrt'", "sglang, trtllm, vllm"]),
        ({"backend_version": "0.1.0"}, ["--aic-backend-version '0.1.0'", "0.24.0"]),
        (
            {"model_path": "Qwen/Qwen3-32"},
            ["--aic-model-path 'Qwen/Qwen3-32'", "did you mean Qwen/Qwen3-32B"],
        ),
        ({"model_path": "acme/unknown"}, ["neither a local directory", "pass the directory"]),
        (
            {"model_path": "Qwen/Qwen3-30B-A3B", "tp_size": 2, "moe_ep_size": 2},
            [
                "MoE model",
                "--aic-tp-size 2 x --aic-attention-dp-size 1",
                "--aic-moe-tp-size 2 x --aic-moe-ep-size 2",
            ],
        ),
        (
            {"model_path": "Qwen/Qwen3-30B-A3B", "tp_size": 4, "moe_tp_size": 1, "moe_ep_size": 2},
            ["--aic-moe-tp-size 4 --aic-moe-ep-size 1 --aic-attention-dp-size 1"],
        ),
    ],
)
def test_a_setup_aiconfigurator_does_not_know_is_named(cold_cache, changes, says):
    fields = {"backend": "vllm", "system": "h200_sxm", "model_path": "Qwen/Qwen3-32B", **changes}
    with pytest.raises(ConfigError) as err:
        check_setup(AicSetup(**fields))
    for needle in says:
        assert needle in str(err.value)


def test_a_model_directory_needs_its_config(cold_cache, tmp_path):
    with pytest.raises(ConfigError, match="has no config.json"):
        check_setup(AicSetup(backend="vllm", system="h200_sxm", model_path=str(tmp_path)))
    (tmp_path / "config.json").write_text('{"architectures": ["NoSuchForCausalLM"]}')
    with pytest.raises(ConfigError, match="NoSuchForCausalLM is not supported"):
        check_setup(AicSetup(backend="vllm", system="h200_sxm", model_path=str(tmp_path)))


def test_good_setups_pass_and_moe_sizes_default_to_tensor_parallelism(cold_cache):
    check_setup(SETUP)
    check_setup(AicSetup(backend="sglang", system="h200_sxm", model_path="Qwen/Qwen3-30B-A3B", tp_size=2))
    check_setup(
        AicSetup(
            backend="sglang",
            system="h200_sxm",
            model_path="Qwen/Qwen3-30B-A3B",
            tp_size=2,
            moe_tp_size=1,
            moe_ep_size=4,
            attention_dp_size=2,
        )
    )
    check_setup(
        AicSetup(backend="vllm", system="h200_sxm", model_path="Qwen/Qwen3-32B", backend_version="next")
    )


def test_a_cached_table_needs_no_aiconfigurator_check(cold_cache):
    bogus = AicSetup(backend="vllm", system="h999_sxm", model_path="Qwen/Qwen3-32B")
    d, _ = durations(prefill_model.cache_dir(), setup=bogus)
    d.build()  # the fake estimator does not check
    check_setup(bogus)  # the cached table stands for a check that passed


def test_the_real_aiconfigurator_table_agrees_with_its_estimates(cold_cache):
    """Qwen/Qwen3-32B on h200_sxm with vLLM, a coarse grid (one point an octave): the values at
    grid points are AIConfigurator's, in between within 15 % of it."""
    estimator = prefill_model.AicEstimator(SETUP)
    assert estimator.context_length == 40960
    d = PrefillDurations(SETUP, directory=cold_cache, per_octave=1)
    d.build()
    assert d.error is None
    assert d.expected_secs(2048, 0) * 1000 == pytest.approx(estimator.prefill_ms(2048, 0))
    assert 0.04 < d.expected_secs(512, 0) < 0.06  # about 48 ms
    rng = random.Random(5)
    for _ in range(50):
        new, prefix = rng.randint(64, 30000), rng.randint(0, 8000)
        truth = estimator.prefill_ms(new, prefix)
        assert abs(d.expected_secs(new, prefix) * 1000 - truth) / truth < 0.15, (new, prefix)
    assert d.expected_secs(512, 16384) > d.expected_secs(512, 0)  # attention over the cached prefix


# ---------------------------------------------------------------------------------------- the decode table


def linear_step_ms(batch: int, context: int) -> float:
    """A step bilinear in (batch, context), as a memory-bound decode step nearly is."""
    return 6.0 + 0.05 * batch + 0.0001 * batch * context


class FakeDecodeEstimator:
    context_length = 8192

    def __init__(self, fail: Exception | None = None) -> None:
        self.fail = fail
        self.calls = 0

    def decode_step_ms(self, batch: int, context: int) -> float:
        if self.fail is not None:
            raise self.fail
        self.calls += 1
        return linear_step_ms(batch, context)


def test_the_decode_table_spans_batches_to_the_cap_and_contexts_to_the_models(tmp_path):
    estimator = FakeDecodeEstimator()
    d = DecodeDurations(SETUP, estimator=lambda s: estimator, directory=tmp_path)
    assert d.step_secs(4, 1000) is None  # nothing before the build
    d.build()
    table = d.table
    assert (table.batch[0], table.batch[-1]) == (1, prefill_model.MAX_DECODE_BATCH)
    assert (table.context[0], table.context[-1]) == (1, 8192)
    assert estimator.calls == table.points
    rng = random.Random(2)
    for _ in range(100):
        batch, context = rng.randint(1, 5000), rng.uniform(0, 9000)  # beyond the grid: extrapolated
        expected = linear_step_ms(batch, max(context, 1.0)) / 1000
        assert d.step_secs(batch, context) == pytest.approx(expected, rel=1e-9)
    assert d.step_secs(0, 1000) is None


def test_the_decode_table_has_its_own_cache_file_and_both_stand_for_the_setup_check(cold_cache):
    bogus = AicSetup(backend="vllm", system="h999_sxm", model_path="Qwen/Qwen3-32B")
    directory = prefill_model.cache_dir()
    decode = DecodeDurations(bogus, estimator=lambda s: FakeDecodeEstimator(), directory=directory)
    decode.build()
    decode_file = cache_path(bogus, directory, kind=DecodeTable.KIND)
    assert [p.name for p in directory.iterdir()] == [decode_file.name]
    assert decode_file != cache_path(bogus, directory)  # the prefill table's
    with pytest.raises(ConfigError, match="h999_sxm"):  # the prefill table is not cached
        check_setup(bogus, tables=(PrefillTable, DecodeTable))
    durations(directory, setup=bogus)[0].build()
    check_setup(bogus, tables=(PrefillTable, DecodeTable))
    again = DecodeDurations(
        bogus, estimator=lambda s: FakeDecodeEstimator(AssertionError("built")), directory=directory
    )
    assert again.start().ready.is_set() and again.table.ms == decode.table.ms


def test_a_prefill_file_is_not_read_as_a_decode_table(tmp_path, caplog):
    d, _ = durations(tmp_path)
    d.build()
    prefill_file = cache_path(SETUP, tmp_path)
    cache_path_of_decode = cache_path(SETUP, tmp_path, kind=DecodeTable.KIND)
    cache_path_of_decode.write_bytes(prefill_file.read_bytes())
    decode = DecodeDurations(SETUP, estimator=lambda s: FakeDecodeEstimator(), directory=tmp_path)
    with caplog.at_level(logging.WARNING, logger="dyn.router"):
        decode.start()
        assert decode.wait(10) is not None
    assert "ignoring the AIC decode table cache" in caplog.text  # rebuilt, not misread


def test_the_real_aiconfigurator_decode_table_agrees_with_its_estimates(cold_cache):
    """Qwen/Qwen3-32B on h200_sxm with vLLM, one point an octave: AIConfigurator's step time at
    grid points, within 10 % of it in between (4 points an octave: median 0.03 %, worst 3.4 %)."""
    estimator = prefill_model.AicEstimator(SETUP)
    d = DecodeDurations(SETUP, directory=cold_cache, per_octave=1)
    d.build()
    assert d.error is None
    assert d.step_secs(64, 8192) * 1000 == pytest.approx(estimator.decode_step_ms(64, 8192))
    assert 0.015 < d.step_secs(1, 1024) < 0.025  # about 18 ms: the weights read once
    assert d.step_secs(256, 8192) > 5 * d.step_secs(1, 8192)  # and the KV of every request
    rng = random.Random(6)
    for _ in range(50):
        batch, context = rng.randint(1, 1024), rng.randint(1, 40000)
        truth = estimator.decode_step_ms(batch, context)
        assert abs(d.step_secs(batch, context) * 1000 - truth) / truth < 0.10, (batch, context)
