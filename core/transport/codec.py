"""Framing of request-plane messages: ``[kind, payload]`` with a typed decoder per kind.

``encode`` never fails for a catalogue struct. ``decode_request`` / ``decode_reply`` raise
``ProtocolError`` (and nothing else) for any frames they cannot turn into a catalogue struct,
with a message saying what was wrong, so a bad peer can be answered instead of crashing us.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from dyn.core.messages import KIND_OF, REPLY_KINDS, REQUEST_KINDS

_encoder = msgspec.msgpack.Encoder()
_request_decoders = {k: msgspec.msgpack.Decoder(cls) for k, cls in REQUEST_KINDS.items()}
_reply_decoders = {k: msgspec.msgpack.Decoder(cls) for k, cls in REPLY_KINDS.items()}


class ProtocolError(ValueError):
    """Frames that are not a valid request-plane message."""


def encode(message: msgspec.Struct) -> list[bytes]:
    """The two frames ``[kind, payload]`` of a catalogue message."""
    return [KIND_OF[type(message)], _encoder.encode(message)]


def _decode(frames: Sequence[bytes], decoders: dict, what: str):
    if len(frames) != 2:
        raise ProtocolError(f"a {what} has 2 frames [kind, payload], got {len(frames)}")
    kind, payload = bytes(frames[0]), frames[1]
    decoder = decoders.get(kind)
    if decoder is None:
        known = ", ".join(sorted(k.decode() for k in decoders))
        raise ProtocolError(f"unknown {what} kind {kind!r} (expected one of {known})")
    try:
        return decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"malformed {decoder.type.__name__}: {exc}") from None


def decode_request(frames: Sequence[bytes]):
    """Decode a message a worker receives (``GenerateRequest`` or ``CancelRequest``)."""
    return _decode(frames, _request_decoders, "request")


def decode_reply(frames: Sequence[bytes]):
    """Decode a message a client receives (``TokenChunk``, ``Finish`` or ``ErrorReply``)."""
    return _decode(frames, _reply_decoders, "reply")
