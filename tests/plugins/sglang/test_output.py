"""SGLang's streamed dicts -> new tokens and the final outcome (incremental and cumulative)."""

from dyn.plugins.sglang.output import Outcome, OutputDecoder


def _out(ids, finish=None, **meta):
    return {"output_ids": ids, "meta_info": {"id": "x", "finish_reason": finish, **meta}}


def test_incremental_chunks_pass_through_and_the_stop_token_is_taken_off():
    decoder = OutputDecoder(incremental=True)
    assert decoder.feed(_out([5])).tokens == [5]
    assert decoder.feed(_out([6, 7])).tokens == [6, 7]  # coalesced chunks
    last = decoder.feed(_out([8, 2], {"type": "stop", "matched": 2}, prompt_tokens=3,
                             completion_tokens=5, cached_tokens=2))
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
    step = decoder.feed({"output_ids": [5], "meta_info": {
        "id": "x", "finish_reason": {"type": "abort", "message": "Abort in waiting queue"}}})
    assert step.tokens == []
    assert step.outcome == Outcome("abort", message="Abort in waiting queue")
    fresh = OutputDecoder(incremental=True)
    fresh.feed({"meta_info": {"finish_reason": {"type": "abort", "message": "bad", "status_code": 400}}})
    assert fresh.usage_counts(10, 0) == (10, 0, 0)
