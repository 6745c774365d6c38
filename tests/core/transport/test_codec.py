import msgspec
import pytest

from dyn.core.messages import (
    KIND_GENERATE,
    CancelRequest,
    EngineTiming,
    ErrorReply,
    Finish,
    GenerateRequest,
    SamplingParams,
    StopConditions,
    TokenChunk,
    Usage,
)
from dyn.core.transport.codec import ProtocolError, decode_reply, decode_request, encode

REQUESTS = [
    GenerateRequest("r1", [1, 2, 3]),
    GenerateRequest("r2", list(range(100)), SamplingParams(temperature=0.5, top_k=4, seed=9),
                    StopConditions(max_tokens=8, min_tokens=2, ignore_eos=True, stop_token_ids=[5]),
                    priority=-3, dp_rank=1, lora_name="a"),
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
    assert kind == b"T" and msgspec.msgpack.decode(payload) == ["r", [1, 2]]


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
