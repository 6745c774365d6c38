import msgspec
import pytest

from dyn.core.messages import (
    KIND_BATCH,
    KIND_GENERATE,
    CancelRequest,
    EngineTiming,
    ErrorReply,
    Finish,
    GenerateRequest,
    ReplyBatch,
    SamplingParams,
    StopConditions,
    TokenChunk,
    Usage,
)
from dyn.core.transport.codec import ProtocolError, decode_reply, decode_request, encode, encode_replies

REQUESTS = [
    GenerateRequest("r1", [1, 2, 3]),
    GenerateRequest(
        "r2",
        list(range(100)),
        SamplingParams(temperature=0.5, top_k=4, seed=9),
        StopConditions(max_tokens=8, min_tokens=2, ignore_eos=True, stop_token_ids=[5]),
        priority=-3,
        dp_rank=1,
        lora_name="a",
    ),
    CancelRequest("r1"),
]
REPLIES = [
    TokenChunk("r1", [4, 5, 6]),
    Finish("r1", "stop", Usage(3, 3, 0), EngineTiming(0.1, 2.5, 7.0), stop_token_id=7),
    Finish("r1", "length", Usage(3, 16, 64)),
    ErrorReply("r1", "bad_request", "why"),
]


@pytest.mark.parametrize("message", REQUESTS)
def test_request_round_trip(message):
    assert decode_request(encode(message)) == message


@pytest.mark.parametrize("message", REPLIES)
def test_reply_round_trip(message):
    assert decode_reply(encode(message)) == message


def test_token_chunk_is_a_compact_array():
    kind, payload = encode(TokenChunk("r", [1, 2]))
    assert kind == b"T" and msgspec.msgpack.decode(payload) == ["r", [1, 2], []]
    # a peer that predates logprobs sends two fields; it still decodes
    assert decode_reply([b"T", msgspec.msgpack.encode(["r", [1, 2]])]) == TokenChunk("r", [1, 2])


@pytest.mark.parametrize(
    ("frames", "message"),
    [
        ([b"G"], "2 frames"),
        ([b"Z", b"\x90"], "unknown request kind"),
        ([KIND_GENERATE, b"\xc1"], "malformed GenerateRequest"),
        ([KIND_GENERATE, msgspec.msgpack.encode(["r", "not-a-list"])], "malformed GenerateRequest"),
        ([KIND_GENERATE, msgspec.msgpack.encode([])], "malformed GenerateRequest"),
    ],
)
def test_malformed_request_frames_raise_protocol_error(frames, message):
    with pytest.raises(ProtocolError, match=message):
        decode_request(frames)


def test_a_reply_kind_is_not_a_request():
    with pytest.raises(ProtocolError, match="unknown request kind"):
        decode_request(encode(TokenChunk("r", [1])))


# --------------------------------------------------------------------------- reply batches


def c(rid, *ids):
    return TokenChunk(rid, list(ids))


def f(rid):
    return Finish(rid, "length", Usage(1, 1))


def unpack(frames_list):
    """What a client delivers, in order: each batch's chunks, then finishes, then errors."""
    out = []
    for frames in frames_list:
        msg = decode_reply(frames)
        if isinstance(msg, ReplyBatch):
            out += [*msg.chunks, *msg.finishes, *msg.errors]
        else:
            out.append(msg)
    return out


def per_request(replies):
    by: dict[str, list] = {}
    for r in replies:
        by.setdefault(r.request_id, []).append(r)
    return by


def test_reply_batch_round_trip_and_compact_form():
    batch = ReplyBatch([c("a", 1, 2), c("b", 3)], [f("a")], [ErrorReply("c", "engine_error", "x")])
    frames = encode(batch)
    assert frames[0] == KIND_BATCH == b"B"
    assert decode_reply(frames) == batch
    only_chunks = encode(ReplyBatch([c("a", 1)]))
    # three lists; each item is the single struct's own array
    assert msgspec.msgpack.decode(only_chunks[1]) == [[["a", [1], []]], [], []]
    assert decode_reply(only_chunks) == ReplyBatch([c("a", 1)], [], [])


def test_encode_replies_sends_a_lone_reply_as_its_own_kind():
    (frames,) = encode_replies([c("a", 1)])
    assert frames[0] == b"T" and decode_reply(frames) == c("a", 1)
    (frames,) = encode_replies([f("a")])
    assert frames[0] == b"F"


def test_encode_replies_packs_one_batch_in_order():
    replies = [
        c("a", 1),
        c("b", 2),
        c("a", 3),
        f("a"),
        c("b", 4),
        ErrorReply("b", "engine_error", "boom"),
        c("d", 5),
        f("d"),
    ]
    (frames,) = encode_replies(replies)
    assert frames[0] == KIND_BATCH
    batch = decode_reply(frames)
    assert batch.chunks == [c("a", 1), c("b", 2), c("a", 3), c("b", 4), c("d", 5)]
    assert batch.finishes == [f("a"), f("d")] and [e.request_id for e in batch.errors] == ["b"]
    assert per_request(unpack([frames])) == per_request(replies)


def test_encode_replies_splits_where_a_reply_follows_its_request_terminal():
    # "a" finished, then a new request reusing the id streams: the delivery order must hold
    replies = [c("a", 1), f("a"), c("b", 2), c("a", 9), f("a"), f("b")]
    frames_list = encode_replies(replies)
    assert len(frames_list) == 2
    assert unpack(frames_list)[:3] == [c("a", 1), c("b", 2), f("a")]
    assert per_request(unpack(frames_list)) == per_request(replies)
    # a lone leftover goes as its plain kind
    frames_list = encode_replies([f("a"), f("a")])
    assert [fr[0] for fr in frames_list] == [b"F", b"F"]


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",
        msgspec.msgpack.encode({"chunks": []}),
        msgspec.msgpack.encode([[["r", "not-a-list"]]]),
        msgspec.msgpack.encode([[["r"]]]),
        msgspec.msgpack.encode([[], [["r", "stop"]]]),  # a Finish without usage
        msgspec.msgpack.encode([[], [], [["r", "code"]]]),
    ],
)
def test_malformed_batches_raise_protocol_error(payload):
    with pytest.raises(ProtocolError, match="malformed ReplyBatch"):
        decode_reply([KIND_BATCH, payload])


def test_a_batch_is_a_reply_not_a_request():
    with pytest.raises(ProtocolError, match="unknown request kind"):
        decode_request(encode(ReplyBatch([c("a", 1)])))


def test_rejected_frames_are_counted_each_and_logged_once_per_interval(caplog):
    import logging

    from dyn.core.transport.codec import RejectedFrames

    now = [100.0]
    log = logging.getLogger("test.rejects")
    rejects = RejectedFrames(log, "malformed request frame", interval_s=5.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, "test.rejects"):
        for i in range(10_000):  # a flood within one interval: one line
            now[0] += 0.0001
            rejects.reject(f"bad {i}")
        assert [r.getMessage() for r in caplog.records] == [
            "rejected a malformed request frame: bad 0 (further ones are counted and logged at most every 5 s)"
        ]
        now[0] += 5.0
        rejects.reject("bad last")
        assert caplog.records[-1].getMessage() == (
            "rejected 10000 malformed request frames in the last 6 s (latest: bad last)"
        )
        now[0] += 60.0
        rejects.reject("lone")
        assert caplog.records[-1].getMessage() == (
            "rejected 1 malformed request frame in the last 60 s (latest: lone)"
        )
    assert rejects.total == 10_002 and len(caplog.records) == 3
