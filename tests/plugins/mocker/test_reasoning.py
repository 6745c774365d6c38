"""--reasoning thinking sections (Dynamo's lengths) and the max_thinking_tokens cap."""

import random

import pytest

from dyn.core.messages import StopConditions
from dyn.plugins.mocker.config import MockerConfig, ReasoningConfig
from dyn.plugins.mocker.reasoning import end_index, forced_draws, thinking_length
from dyn.plugins.mocker.scheduler import Scheduler, SimModel, SimRequest

START, END = 990, 991
MODEL = SimModel(vocab_size=1000, context_length=4096)


def cfg(ratio):
    return ReasoningConfig(start_thinking_token_id=START, end_thinking_token_id=END, thinking_ratio=ratio)


@pytest.mark.parametrize(
    "max_tokens,ratio,length",
    [
        (10, 0.5, 5),
        (10, 0.15, 2),
        (10, 0.05, 0),
        (1, 1.0, 0),
        (2, 1.0, 2),
        (100, 1.0, 100),
        (7, 0.3, 2),
    ],
)
def test_thinking_length_follows_dynamo(max_tokens, ratio, length):
    assert thinking_length(cfg(ratio), max_tokens) == length


def test_end_index_is_capped_by_max_thinking_tokens():
    assert end_index(cfg(0.5), 40, None) == 19
    assert end_index(cfg(0.5), 40, 5) == 6  # start + 5 thinking tokens, then the end token
    assert end_index(cfg(0.5), 40, 0) == 1
    assert end_index(cfg(0.5), 40, 100) == 19
    assert end_index(cfg(0.0), 40, 5) == 0


def test_forced_draws_map_exactly_to_the_token_ids():
    for vocab in (2, 1000, 32000, 151_936, 1 << 20):
        for tid in {0, 1, vocab // 3, vocab - 2, vocab - 1}:
            draw = forced_draws(random.Random(0).random, vocab, tid, tid, 5)
            assert int(draw() * vocab) == tid


def outputs(reasoning=None, n=40, max_thinking=None, seed=3):
    s = Scheduler(MockerConfig(block_size=16, num_gpu_blocks=64, reasoning=reasoning), MODEL)
    s.add(
        SimRequest(
            "r",
            list(range(30)),
            StopConditions(max_tokens=n, ignore_eos=True),
            seed=seed,
            max_thinking_tokens=max_thinking,
        )
    )
    out = []
    while s.has_work:
        out += [t for _, t in s.step().tokens]
    return out


def test_output_starts_with_a_thinking_section_and_keeps_other_tokens():
    plain = outputs()
    think = outputs(cfg(0.5))
    assert think[0] == START and think[19] == END
    assert think[1:19] == plain[1:19] and think[20:] == plain[20:]  # the request's own RNG stream


def test_max_thinking_tokens_ends_the_section_early():
    think = outputs(cfg(0.5), max_thinking=5)
    assert think[0] == START and think[6] == END and len(think) == 40
    assert outputs(cfg(0.5), max_thinking=0)[:2] == [START, END]


def test_max_thinking_tokens_without_reasoning_has_no_effect():
    assert outputs(max_thinking=2) == outputs()


def test_negative_max_thinking_tokens_is_refused():
    s = Scheduler(MockerConfig(block_size=16, num_gpu_blocks=64, reasoning=cfg(0.5)), MODEL)
    with pytest.raises(ValueError, match="max_thinking_tokens"):
        s.add(SimRequest("r", [1, 2, 3], max_thinking_tokens=-1))


def test_thinking_boundaries_survive_preemption():
    s = Scheduler(MockerConfig(block_size=16, num_gpu_blocks=12, reasoning=cfg(0.5)), MODEL)
    for i in range(3):
        s.add(
            SimRequest(
                i, list(range(100 * i, 100 * i + 40)), StopConditions(max_tokens=60, ignore_eos=True), seed=i
            )
        )
    out: dict = {}
    preempted = 0
    while s.has_work:
        r = s.step()
        preempted += len(r.preempted)
        for rid, tok in r.tokens:
            out.setdefault(rid, []).append(tok)
    assert preempted > 0
    for i in range(3):
        assert out[i][0] == START and out[i][29] == END
