"""Framing of request-plane messages: ``[kind, payload]`` with a typed decoder per kind.

``encode`` never fails for a catalogue struct. ``decode_request`` / ``decode_reply`` raise
``ProtocolError`` (and nothing else) for any frames they cannot turn into a catalogue struct,
with a message saying what was wrong, so a bad peer can be answered instead of crashing us.
``encode_replies`` packs a worker's replies to one client into as few messages as keep their
order (``ReplyBatch``); ``decode_reply`` returns a ``ReplyBatch`` for those, unpacked by the caller.
``RejectedFrames`` is how a receive loop reports what it could not decode: counted, and logged
at most once per interval, so a flood of garbage costs a counter increment per frame.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import msgspec

from dyn.core.messages import (
    INDEXER_KINDS,
    KIND_BATCH,
    KIND_OF,
    REPLY_KINDS,
    REQUEST_KINDS,
    ROUTER_KINDS,
    ErrorReply,
    Finish,
    ReplyBatch,
    TokenChunk,
)

_encoder = msgspec.msgpack.Encoder()
_request_decoders = {k: msgspec.msgpack.Decoder(cls) for k, cls in REQUEST_KINDS.items()}
_reply_decoders = {k: msgspec.msgpack.Decoder(cls) for k, cls in REPLY_KINDS.items()}


class ProtocolError(ValueError):
    """Frames that are not a valid request-plane message."""


REJECT_LOG_INTERVAL_S = 5.0


class RejectedFrames:
    """Counts the messages a receive loop rejected and logs them as warnings, at most one line
    per ``interval_s``: the first rejection at once with its reason, later ones as one line with
    how many were rejected since the previous line and the latest reason. Rejections after the
    last line are reported with the next one (``total`` always has them all). Thread-safe.
    ``verb`` words the line for other repeated troubles (``"lost"``: gaps in a stream)."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        plural: str | None = None,
        interval_s: float = REJECT_LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        verb: str = "rejected",
    ) -> None:
        self._log = logger
        self.what = what
        self.plural = plural or f"{what}s"
        self.verb = verb
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self.total = 0
        """Every rejection so far."""
        self._unlogged = 0
        self._logged_at: float | None = None

    def reject(self, reason: object) -> None:
        """Count one rejected message; log if the last line is ``interval_s`` old."""
        with self._lock:
            self.total += 1
            self._unlogged += 1
            now = self._clock()
            last = self._logged_at
            if last is not None and now - last < self.interval_s:
                return
            count, self._unlogged, self._logged_at = self._unlogged, 0, now
        if last is None:
            self._log.warning(
                "%s a %s: %s (further ones are counted and logged at most every %g s)",
                self.verb,
                self.what,
                reason,
                self.interval_s,
            )
        else:
            self._log.warning(
                "%s %d %s in the last %.0f s (latest: %s)",
                self.verb,
                count,
                self.plural if count != 1 else self.what,
                now - last,
                reason,
            )


def encode(message: msgspec.Struct) -> list[bytes]:
    """The two frames ``[kind, payload]`` of a catalogue message."""
    return [KIND_OF[type(message)], _encoder.encode(message)]


def encode_replies(replies: Sequence[TokenChunk | Finish | ErrorReply]) -> list[list[bytes]]:
    """The frames of the messages that carry ``replies`` (all to one client) in order.

    One reply goes as its own kind; more go as one ``ReplyBatch``, split only where a reply
    follows its request's ``Finish``/``ErrorReply`` (a batch delivers chunks before terminals).
    """
    if len(replies) == 1:
        return [encode(replies[0])]
    messages: list[list[bytes]] = []
    chunks: list[TokenChunk] = []
    finishes: list[Finish] = []
    errors: list[ErrorReply] = []
    ended: set[str] = set()
    for reply in replies:
        rid = reply.request_id
        if rid in ended:
            messages.append(_batch_frames(chunks, finishes, errors))
            chunks, finishes, errors, ended = [], [], [], set()
        if type(reply) is TokenChunk:
            chunks.append(reply)
        else:
            ended.add(rid)
            if type(reply) is Finish:
                finishes.append(reply)
            elif type(reply) is ErrorReply:
                errors.append(reply)
            else:
                raise TypeError(f"not a reply: {reply!r}")
    if chunks or finishes or errors:
        messages.append(_batch_frames(chunks, finishes, errors))
    return messages


def _batch_frames(chunks, finishes, errors) -> list[bytes]:
    if len(chunks) + len(finishes) + len(errors) == 1:
        return encode((chunks or finishes or errors)[0])
    return [KIND_BATCH, _encoder.encode(ReplyBatch(chunks, finishes, errors))]


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
    """Decode a message a client receives (``TokenChunk``, ``Finish``, ``ErrorReply`` or a
    ``ReplyBatch`` of them)."""
    return _decode(frames, _reply_decoders, "reply")


_router_decoders = {k: msgspec.msgpack.Decoder(cls) for k, cls in ROUTER_KINDS.items()}
_indexer_decoders = {k: msgspec.msgpack.Decoder(cls) for k, cls in INDEXER_KINDS.items()}


def decode_router_message(frames: Sequence[bytes]):
    """Decode a router-plane message (``RouteQuery``, ``RouteAnswer``, ``RouteRefused``,
    ``RouteProgress``)."""
    return _decode(frames, _router_decoders, "router message")


def decode_indexer_message(frames: Sequence[bytes]):
    """Decode an indexer-plane message (``OverlapQuery``, ``OverlapAnswer``, ``OverlapRefused``)."""
    return _decode(frames, _indexer_decoders, "indexer message")
