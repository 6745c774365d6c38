"""Quiet passes (``Scheduler.quiet_passes`` / ``skip_quiet``): the decode passes the offline replay
dates without stepping must be exactly the passes ``step`` would have run: decode only, no KV
event, nothing finishing, the counted duration, and the same tokens once skipped."""

import pytest

from dyn.core.messages import StopConditions
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.scheduler import Scheduler, SimModel, SimRequest

MODEL = SimModel(vocab_size=1000, context_length=32768, eos_token_ids=frozenset({7}))


def make(**cfg) -> Scheduler:
    fields = {"block_size": 16, "num_gpu_blocks": 64}
    return Scheduler(MockerConfig(**{**fields, **cfg}), MODEL)


def req(rid: str, prompt_len: int, max_tokens: int, first: int = 0, **stop) -> SimRequest:
    stop.setdefault("ignore_eos", True)
    tokens = list(range(first, first + prompt_len))
    return SimRequest(rid, tokens, StopConditions(max_tokens=max_tokens, **stop), seed=hash(rid) & 0xFFFF)


# (pass index, request): staggered arrivals that share a prefix, with a cache small enough to evict
ARRIVALS = [
    (0, ("a", 40, 90, 0)),
    (0, ("b", 17, 30, 0)),
    (5, ("c", 100, 120, 1000)),
    (37, ("d", 33, 60, 0)),
    (38, ("e", 250, 200, 2000)),
    (90, ("f", 15, 1, 3000)),
    (140, ("g", 64, 70, 4000)),
]


def stepped(s: Scheduler) -> tuple[list, dict]:
    """Every pass stepped: (per pass: duration, batch, events, finished ids), tokens per request."""
    passes, tokens = [], {}
    pending = list(ARRIVALS)
    i = 0
    while pending or s.has_work:
        while pending and pending[0][0] <= i:
            s.add(req(*pending.pop(0)[1]))
        r = s.step()
        passes.append((r.duration_ms, r.batch_size, list(r.events), [f.request_id for f in r.finished]))
        for rid, tok in r.tokens:
            tokens.setdefault(rid, []).append(tok)
        i += 1
    return passes, tokens


def test_skipped_passes_are_the_passes_step_runs():
    expected, expected_tokens = stepped(make())
    s = make()
    added: list[SimRequest] = []
    pending = list(ARRIVALS)
    i = skipped = 0
    while pending or s.has_work:
        while pending and pending[0][0] <= i:
            added.append(req(*pending.pop(0)[1]))
            s.add(added[-1])
        count, ms = s.quiet_passes()
        if count:
            count = min(count, pending[0][0] - i) if pending else count  # an arrival ends the count
            running = sorted(r.request_id for r in s.running())
            assert sorted(s.skip_quiet(count)) == running
            for k in range(count):
                assert expected[i + k] == (ms, len(running), [], [])
            i += count
            skipped += count
            continue
        r = s.step()
        assert (r.duration_ms, r.batch_size, r.events, [f.request_id for f in r.finished]) == expected[i]
        i += 1
    assert i == len(expected)
    assert skipped > len(expected) // 2  # most passes here are quiet
    assert {r.request_id: r.output_token_ids for r in added} == expected_tokens


@pytest.mark.parametrize(
    "case",
    ["nothing runs", "waiting", "stop token watched", "last token next", "block fills next", "sessions"],
)
def test_a_pass_that_does_something_is_not_quiet(case):
    s = make(engine_type="sglang", enable_streaming_session=True) if case == "sessions" else make()
    if case == "nothing runs":
        assert s.quiet_passes() == (0, 0.0)
        return
    max_tokens = 2 if case == "last token next" else 100
    prompt = 14 if case == "block fills next" else 20
    stop = {"ignore_eos": False} if case == "stop token watched" else {}
    s.add(req("a", prompt, max_tokens, **stop))
    s.step()  # the prefill: "a" computed `prompt` tokens and sampled one
    if case == "waiting":
        s.add(req("b", 20, 10, first=500))
    if case == "block fills next":
        s.step()  # computes token 15: the next pass computes token 16 and fills block 0
    assert s.quiet_passes() == (0, 0.0)


def test_the_count_stops_before_the_block_fills_and_the_last_token():
    s = make()
    s.add(req("a", 20, 100))
    s.step()  # computed 20 of block 1 (16..31): passes compute 21..31 quietly, 32 fills it
    assert s.quiet_passes()[0] == 31 - 20
    s = make()
    s.add(req("a", 20, 5))
    s.step()  # one token out: three more are quiet, the fifth finishes the request
    assert s.quiet_passes()[0] == 3
