"""Synthetic logprobs: deterministic per (seed, position), self-consistent, and blind to sampling."""

import math

import pytest

from dyn.plugins.mocker.logprobs import output_logprobs, position_logprobs, prompt_logprobs

VOCAB = 4096


@pytest.mark.parametrize("k", [0, 1, 5, 20])
def test_entries_are_self_consistent(k):
    in_top = out_of_top = 0
    for seed in range(20):
        for position in range(50):
            token = (seed * 131 + position * 7) % VOCAB
            lp = position_logprobs(seed, position, token, k, VOCAB)
            assert lp.logprob <= 0 and all(v <= 0 for v in lp.top_logprobs)
            assert len(lp.top_ids) == len(lp.top_logprobs) == k
            assert lp.top_logprobs == sorted(lp.top_logprobs, reverse=True)
            assert len(set(lp.top_ids)) == k and all(0 <= t < VOCAB for t in lp.top_ids)
            assert sum(math.exp(v) for v in lp.top_logprobs) <= 1 + 1e-12
            assert lp.rank >= 1
            if lp.rank <= k:
                in_top += 1
                assert lp.top_ids[lp.rank - 1] == token and lp.top_logprobs[lp.rank - 1] == lp.logprob
            else:
                out_of_top += 1
                assert token not in lp.top_ids
                assert k == 0 or lp.logprob <= lp.top_logprobs[-1]
    assert in_top or k == 0
    assert out_of_top  # the chosen token is sometimes outside the top list


def test_values_depend_only_on_seed_position_and_token():
    a = output_logprobs(7, 0, [10, 11, 12, 13], 3, VOCAB)
    b = output_logprobs(7, 0, [10, 11], 3, VOCAB) + output_logprobs(7, 2, [12, 13], 3, VOCAB)
    assert a == b  # chunking does not matter
    assert output_logprobs(8, 0, [10, 11, 12, 13], 3, VOCAB) != a


def test_prompt_logprobs_start_with_none():
    out = prompt_logprobs(3, [5, 6, 7], 2, VOCAB)
    assert out[0] is None and len(out) == 3
    assert all(lp.logprob <= 0 and len(lp.top_ids) == 2 for lp in out[1:])
    assert out == prompt_logprobs(3, [5, 6, 7], 2, VOCAB)
