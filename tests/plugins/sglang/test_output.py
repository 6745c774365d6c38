"""SGLang's streamed dicts -> new tokens, their logprobs and the final outcome (incremental and
cumulative)."""

import pytest

from dyn.core.engine import EngineError
from dyn.core.messages import TokenLogprobs
from dyn.plugins.sglang.output import Outcome, OutputDecoder


def _out(ids, finish=None, **meta):
    return {"output_ids": ids, "meta_info": {"id": "x", "finish_reason": finish, **meta}}


def test_incremental_chunks_pass_through_and_the_stop_token_is_taken_off():
    decoder = OutputDecoder(incremental=True)
    assert decoder.feed(_out([5])).tokens == [5]
    assert decoder.feed(_out([6, 7])).tokens == [6, 7]  # coalesced chunks
    last = decoder.feed(
        _out([8, 2], {"type": "stop", "matched": 2}, prompt_tokens=3, completion_tokens=5, cached_tokens=2)
    )
    assert last.tokens == [8] and last.outcome == Outcome("stop", stop_token_id=2)
    assert decoder.output_ids == [5, 6, 7, 8, 2]  # SGLang's history keeps the stop token
    assert decoder.usage_counts(3, 4) == (3, 5, 2)  # completion_tokens counts it (as the mocker)


def test_cumulative_chunks_yield_only_what_is_new():
    decoder = OutputDecoder(incremental=False)
    live = [5]
    assert decoder.feed(_out(live)).tokens == [5]
    live.extend([6, 7])
    assert decoder.feed(_out(live)).tokens == [6, 7]
    assert decoder.feed(_out(live)).tokens == []
    last = decoder.feed(_out([5, 6, 7, 9], {"type": "stop", "matched": 9}))
    assert last.tokens == [] and last.outcome == Outcome("stop", stop_token_id=9)


def test_length_and_other_stops_keep_every_token():
    decoder = OutputDecoder(incremental=True)
    assert decoder.feed(_out([4, 4], {"type": "length", "length": 2})).outcome == Outcome("length")
    decoder = OutputDecoder(incremental=True)
    step = decoder.feed(_out([4, 3], {"type": "stop", "matched": "</s>"}))  # a stop string
    assert step.tokens == [4, 3] and step.outcome == Outcome("stop")
    decoder = OutputDecoder(incremental=True)
    step = decoder.feed(_out([4, 3], {"type": "stop", "matched": 9}))  # not the last token: kept
    assert step.tokens == [4, 3] and step.outcome == Outcome("stop")


def test_an_abort_carries_no_tokens_and_its_counts_fall_back():
    decoder = OutputDecoder(incremental=True)
    decoder.feed(_out([5]))
    # _handle_abort_req repeats the last id under incremental output, and sends no prompt counts
    step = decoder.feed(
        {
            "output_ids": [5],
            "meta_info": {"id": "x", "finish_reason": {"type": "abort", "message": "Abort in waiting queue"}},
        }
    )
    assert step.tokens == []
    assert step.outcome == Outcome("abort", message="Abort in waiting queue")
    fresh = OutputDecoder(incremental=True)
    fresh.feed({"meta_info": {"finish_reason": {"type": "abort", "message": "bad", "status_code": 400}}})
    assert fresh.usage_counts(10, 0) == (10, 0, 0)


# --------------------------------------------------------------------------- logprobs
# meta_info as TokenizerManager.add_logprob_to_meta_info builds it with --skip-tokenizer-init:
# (logprob, token_id, None) per position, top rows as lists of such tuples (None for the first
# prompt position); output lists sliced to the chunk under incremental streaming.


def _lp(ids, finish=None, chosen=(), tops=None, **meta):
    meta["output_token_logprobs"] = list(chosen)
    if tops is not None:
        meta["output_top_logprobs"] = tops
    return _out(ids, finish, **meta)


def test_output_logprobs_are_cut_to_k_sorted_and_leave_with_the_stop_token():
    decoder = OutputDecoder(incremental=True, logprobs=1)
    step = decoder.feed(
        _lp(
            [5, 6],
            chosen=[(-0.5, 5, None), (-3.0, 6, None)],
            tops=[[(-0.5, 5, None), (-1.0, 9, None)], [(-0.2, 8, None), (-0.1, 7, None)]],
        )
    )
    assert step.tokens == [5, 6]
    assert step.logprobs == [
        TokenLogprobs(-0.5, [5], [-0.5], rank=1),  # found in its row: rank known
        TokenLogprobs(-3.0, [7], [-0.1], rank=0),
    ]  # row re-sorted; rank unknown
    last = decoder.feed(
        _lp(
            [4, 2],
            {"type": "stop", "matched": 2},
            chosen=[(-0.4, 4, None), (-0.9, 2, None)],
            tops=[[(-0.4, 4, None)], [(-0.9, 2, None)]],
        )
    )
    assert last.tokens == [4] and last.logprobs == [TokenLogprobs(-0.4, [4], [-0.4], rank=1)]


def test_cumulative_output_logprobs_are_taken_from_where_the_new_ids_start():
    decoder = OutputDecoder(incremental=False, logprobs=0)
    ids, chosen = [5], [(-0.5, 5, None)]
    assert decoder.feed(_lp(ids, chosen=chosen)).logprobs == [TokenLogprobs(-0.5)]
    ids += [6, 7]
    chosen += [(-0.6, 6, None), (-0.7, 7, None)]
    assert decoder.feed(_lp(ids, chosen=chosen)).logprobs == [TokenLogprobs(-0.6), TokenLogprobs(-0.7)]


def test_logprobs_are_left_out_unless_asked_for_and_a_short_list_is_an_error():
    assert OutputDecoder(incremental=True).feed(_lp([5], chosen=[(-0.5, 5, None)])).logprobs == []
    with pytest.raises(EngineError, match="1 output logprobs for 2 new tokens"):
        OutputDecoder(incremental=True, logprobs=0).feed(_lp([5, 6], chosen=[(-0.5, 5, None)]))


def test_prompt_logprobs_come_from_the_last_meta_info_with_the_first_position_empty():
    decoder = OutputDecoder(incremental=True, logprobs=None, prompt_logprobs=1)
    rows = [None, [(-0.1, 3, None), (-0.2, 8, None)], [(-0.3, 9, None), (-1.0, 4, None)]]
    decoder.feed(
        _out(
            [5],
            None,
            input_token_logprobs=[(None, 1, None), (-0.1, 3, None), (-1.0, 4, None)],
            input_top_logprobs=rows,
        )
    )
    assert decoder.prompt_logprobs() == [
        None,
        TokenLogprobs(-0.1, [3], [-0.1], rank=1),
        TokenLogprobs(-1.0, [9], [-0.3], rank=0),
    ]
    assert OutputDecoder(incremental=True).prompt_logprobs() is None
