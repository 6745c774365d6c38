"""dyn.core.frontend.detokenizer's stop-string matcher: for any stop strings and any split of the
stream, the shown text, the held-back tail and the stop reason are those of a naive matcher that
re-reads the whole text at every step; and the cost is linear (a 1 MB stop string, the case that
took the old prefix set to 19.6 GB, builds in a few MB)."""

from __future__ import annotations

import sys
import time
import tracemalloc
from functools import lru_cache

from hypothesis import given, settings
from hypothesis import strategies as st

from dyn.core.frontend.detokenizer import IncrementalDetokenizer, StopMatcher, StopScanner, stop_matcher
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.model.info import TINY_MODEL_DIR

# a small alphabet makes overlaps, shared prefixes and near-misses common; one wide character too
ALPHABET = "ab\n🎉"
stops_st = st.lists(st.text(ALPHABET, min_size=1, max_size=6), min_size=1, max_size=5)
pieces_st = st.lists(st.text(ALPHABET, max_size=8), max_size=30)


@lru_cache(maxsize=1)
def _tok() -> Tokenizer:
    return Tokenizer.from_dir(TINY_MODEL_DIR)


def naive(text: str, stops: list[str], final: bool) -> tuple[str, str | None]:
    """What may be shown of ``text`` so far: cut at the stop string that completes first (ties:
    the one starting first); else all but the longest tail that is a proper prefix of a stop."""
    found = [(text.find(s) + len(s), text.find(s), s) for s in stops if s in text]
    if found:
        _, start, stop = min(found)
        return text[:start], stop
    if final:
        return text, None
    hold = max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
    return text[: len(text) - hold], None


@settings(max_examples=400, deadline=None)
@given(stops=stops_st, pieces=pieces_st)
def test_scanner_matches_the_naive_matcher_on_any_split(stops: list[str], pieces: list[str]) -> None:
    scanner = StopScanner(StopMatcher(stops))
    text = shown = ""
    for i, piece in enumerate([*pieces, ""]):
        final = i == len(pieces)
        text += piece
        out, stop = scanner.feed(piece, final)
        shown += out
        expected, reason = naive(text, stops, final)
        assert (shown, stop) == (expected, reason), (stops, pieces[: i + 1])
        if stop is not None:
            return


@settings(max_examples=150, deadline=None)
@given(stops=stops_st, text=st.text(ALPHABET, max_size=120), cuts=st.lists(st.integers(1, 7), max_size=60))
def test_one_long_stream_any_split(stops: list[str], text: str, cuts: list[int]) -> None:
    pieces, at = [], 0
    for cut in cuts:
        pieces.append(text[at : at + cut])
        at += cut
    pieces.append(text[at:])
    scanner = StopScanner(StopMatcher(stops))
    shown, stop = "", None
    for piece in pieces:
        out, stop = scanner.feed(piece, False)
        shown += out
        if stop is not None:
            break
    if stop is None:
        out, stop = scanner.feed("", True)
        shown += out
    assert (shown, stop) == naive(text, stops, True)


@settings(max_examples=60, deadline=None)
@given(
    words=st.lists(
        st.sampled_from(["the", " end", "数据", "🎉", "\n", "STOP", "ST", "OP", " x"]), max_size=40
    ),
    stops=st.lists(
        st.sampled_from(["STOP", "end", "\n\n", "数据🎉", "OP x", "🎉\n"]), min_size=1, max_size=3
    ),
    include=st.booleans(),
    chunk=st.integers(1, 4),
)
def test_detokenizer_stops_like_the_naive_matcher(
    words: list[str], stops: list[str], include: bool, chunk: int
) -> None:
    tok = _tok()
    text = "".join(words)
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, stop=stops, include_stop_str_in_output=include)
    shown = "".join(detok.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)) + detok.finish()
    expected, reason = naive(text, stops, True)
    if include and reason is not None:
        expected += reason
    assert (shown, detok.stop_reason, detok.stopped) == (expected, reason, reason is not None)


def test_matcher_is_shared_and_accepts_a_prebuilt_one() -> None:
    tok = _tok()
    stops = ["</answer>", "\nUser:"]
    matcher = stop_matcher(stops)
    assert stop_matcher(list(stops)) is matcher  # every choice of a request builds it once
    ids = tok.encode("yes </answer> no", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, stop=matcher)
    assert detok.push(ids) == "yes " and detok.stop_reason == "</answer>"


def test_a_megabyte_stop_string_costs_megabytes_not_gigabytes() -> None:
    stop = "ab" * (1 << 19)  # 1 MiB; the old prefix set needed ~ len^2 / 2 = 550 GB of strings
    start = time.perf_counter()
    matcher = StopMatcher([stop])
    assert time.perf_counter() - start < 20  # about 1 s on an idle core
    kept = sum(sys.getsizeof(getattr(matcher, name)) for name in StopMatcher.__slots__)
    assert kept < 20 * len(stop), kept
    scanner = StopScanner(matcher)
    # a stream that keeps almost completing it: each push costs the characters pushed, not the held tail
    start = time.perf_counter()
    held_out = "".join(scanner.feed("ab" * 64, False)[0] for _ in range(2000))
    assert held_out == "" and time.perf_counter() - start < 5
    shown, stop_reason = scanner.feed("x", False)
    assert shown == "ab" * 128000 + "x" and stop_reason is None  # the held tail goes out once it cannot match


def test_building_allocates_linearly() -> None:
    stop = "ab" * (1 << 15)
    tracemalloc.start()
    try:
        StopMatcher([stop, stop[::-1], "b" * 1000])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * (2 * len(stop) + 1000), peak  # a few bytes a character, temporaries included


def test_hostile_near_misses_stay_linear() -> None:
    """A stop string that the stream keeps nearly completing, then breaks, scanned a character at a
    time: the old matcher re-sliced the held tail at every break (quadratic in the stop's length)."""
    stop = "a" * 4095 + "b"
    scanner = StopScanner(StopMatcher([stop]))
    stream = ("a" * 4094 + " ca") * 20
    start = time.perf_counter()
    shown = "".join(scanner.feed(c, False)[0] for c in stream) + scanner.feed("", True)[0]
    assert shown == stream
    assert time.perf_counter() - start < 5


def test_cache_is_bounded() -> None:
    from dyn.core.frontend import detokenizer

    for i in range(40):
        stop_matcher(["x" * 40000 + str(i)])
    assert detokenizer._cached_chars <= detokenizer._CACHED_CHARS
    assert sum(sum(map(len, k)) for k in detokenizer._MATCHERS) == detokenizer._cached_chars
