"""Token sources inside the scheduler: their tokens go through the stop rules, their verdicts end the
request, and the default path (no source) samples exactly as before."""

import math
import random
from collections import Counter

from dyn.core.messages import StopConditions
from dyn.plugins.mocker.config import MockerConfig, ReasoningConfig
from dyn.plugins.mocker.scheduler import Scheduler, SimModel, SimRequest
from dyn.plugins.mocker.sources import FAIL, STOP, BiasedSource, ScriptedSource

EOS = 2
MODEL = SimModel(vocab_size=1000, context_length=4096, eos_token_ids=frozenset({EOS}))


class Counting:
    """Emits 100, 101, ... then STOP (or FAIL) after ``n`` tokens."""

    thinks = True
    end_token_id = EOS
    error = "out of fuel"

    def __init__(self, n, verdict=STOP):
        self.n, self.verdict, self.asked = n, verdict, []

    def next_token(self, req):
        self.asked.append(req.num_output)
        if req.num_output >= self.n:
            return self.verdict
        return 100 + req.num_output


def run(req, config=MockerConfig(block_size=16, num_gpu_blocks=64)):
    sched = Scheduler(config, MODEL)
    sched.add(req)
    tokens, finished = [], []
    while sched.has_work:
        result = sched.step()
        tokens += [t for _, t in result.tokens]
        finished += result.finished
    return tokens, finished[0]


def test_default_path_draws_the_same_tokens_as_before():
    tokens, fin = run(SimRequest("a", [1] * 20, StopConditions(max_tokens=30, ignore_eos=True), seed=5))
    rand = random.Random(5).random
    assert tokens == [int(rand() * 1000) for _ in range(30)] and fin.reason == "length"


def test_stop_verdict_finishes_with_the_end_token_even_with_ignore_eos():
    source = Counting(4)
    tokens, fin = run(
        SimRequest("a", [1] * 20, StopConditions(max_tokens=30, ignore_eos=True), source=source)
    )
    assert tokens == [100, 101, 102, 103]
    assert (fin.reason, fin.stop_token_id, fin.completion_tokens) == ("stop", EOS, 5)
    assert source.asked == [0, 1, 2, 3, 4]  # once per position


def test_fail_verdict_finishes_with_error_and_the_reason():
    tokens, fin = run(SimRequest("a", [1] * 20, StopConditions(max_tokens=30), source=Counting(2, FAIL)))
    assert tokens == [100, 101] and fin.reason == "error" and fin.error == "out of fuel"


def test_max_tokens_still_ends_a_source():
    tokens, fin = run(SimRequest("a", [1] * 20, StopConditions(max_tokens=3), source=Counting(10)))
    assert tokens == [100, 101, 102] and fin.reason == "length"


def test_scripted_tokens_then_eos_end_the_request():
    source = ScriptedSource([7, 8, 9], EOS, 1000)
    tokens, fin = run(SimRequest("a", [1] * 20, StopConditions(max_tokens=30), source=source))
    assert tokens == [7, 8, 9] and (fin.reason, fin.stop_token_id) == ("stop", EOS)


def test_scripted_eos_is_output_under_ignore_eos_and_random_tokens_follow():
    source = ScriptedSource([7, 8], EOS, 1000)
    tokens, fin = run(SimRequest("a", [1] * 20, StopConditions(max_tokens=6, ignore_eos=True), source=source))
    assert tokens[:3] == [7, 8, EOS] and len(tokens) == 6 and fin.reason == "length"


def test_a_thinking_section_comes_before_the_source():
    config = MockerConfig(
        block_size=16,
        num_gpu_blocks=64,
        reasoning=ReasoningConfig(start_thinking_token_id=900, end_thinking_token_id=901, thinking_ratio=0.5),
    )
    source = Counting(13)
    tokens, fin = run(
        SimRequest("a", [1] * 20, StopConditions(max_tokens=20, ignore_eos=True), source=source), config
    )
    # 10 thinking tokens (start, 8 random, end), then the source's output from position 10 to 12
    assert tokens[0] == 900 and tokens[9] == 901 and tokens[10:] == [110, 111, 112]
    assert fin.reason == "stop"
    scripted = ScriptedSource([7], EOS, 1000)  # a scripted reply is the raw output: no thinking added
    tokens, _ = run(SimRequest("b", [1] * 20, StopConditions(max_tokens=20), source=scripted), config)
    assert tokens == [7]


def test_a_source_that_raises_fails_only_its_request():
    class Broken(Counting):
        def next_token(self, req):
            raise RuntimeError("boom")

    sched = Scheduler(MockerConfig(block_size=16, num_gpu_blocks=64), MODEL)
    sched.add(SimRequest("bad", [1] * 20, StopConditions(max_tokens=5), source=Broken(3)))
    sched.add(SimRequest("good", [1] * 20, StopConditions(max_tokens=5, ignore_eos=True)))
    finished = {}
    while sched.has_work:
        finished.update({f.request_id: f for f in sched.step().finished})
    assert finished["bad"].reason == "error" and "boom" in finished["bad"].error
    assert finished["good"].reason == "length"


class Draws:
    """A request as a source sees it: only ``rand``."""

    def __init__(self, seed):
        self.rand = random.Random(seed).random


def test_biased_draws_follow_exp_bias_over_temperature():
    """Equal logits plus a bias: P(token) is proportional to exp(bias / temperature)."""
    source = BiasedSource({7: 2.0, 8: -100.0}, [7, 8, 9], 2.0, 1000)
    draws = Draws(1)
    counts = Counter(source.next_token(draws) for _ in range(20_000))
    assert counts[8] == 0 and set(counts) == {7, 9}
    assert abs(counts[7] / counts[9] - math.e) < 0.15  # exp(2 / 2)


def test_without_allowed_ids_every_unbanned_token_of_the_vocabulary_can_come_up():
    """The vocabulary minus the banned ids is drawn by index; compared with the set it stands for."""
    banned = sorted(random.Random(0).sample(range(50), 30))
    source = BiasedSource(dict.fromkeys(banned, -100.0), None, 1.0, 50)
    draws = Draws(2)
    seen = {source.next_token(draws) for _ in range(5_000)}
    assert seen == set(range(50)) - set(banned)


def test_greedy_takes_the_highest_bias_and_ties_are_drawn_among():
    draws = Draws(3)
    assert {BiasedSource({4: 1.0, 5: 3.0}, None, 0.0, 100).next_token(draws) for _ in range(50)} == {5}
    negative_only = BiasedSource({4: -1.0}, [4, 6, 9], 0.0, 100)  # unbiased ids beat a negative bias
    assert {negative_only.next_token(draws) for _ in range(200)} == {6, 9}
