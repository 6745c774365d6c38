"""Incremental detokenization of one generated stream, with stop strings, as vLLM does it.

Token ids arrive a few at a time; ``push`` returns the text that is safe to show now and ``finish``
what was held back when the stream ends. Decoding runs in ``tokenizers.decoders.DecodeStream``
(as vLLM's fast detokenizer does): the ids since the last emission point are decoded together with
the ids of the emission before it (the prefix), and the new text is the difference, so decoders
that depend on the previous token (SentencePiece's leading space) stay right while each push
decodes only a few ids. Around it, this class flushes what DecodeStream would hold forever
(endless invalid bytes, the stream's end) and decodes on its own what DecodeStream refuses (a
decoder that rewrites earlier text). A push of 8 ids or more (a fast engine's burst, a frontend
catching up) is decoded with the window in one call, the same way, instead of id by id.

Contract:
- Nothing ending in U+FFFD is emitted while more tokens may complete the character (the complete
  characters before it go out at once); ``finish`` emits it as decoded. With no stop string matched, everything pushed plus ``finish`` equals
  ``tokenizer.decode(all_ids, skip_special_tokens)`` (for byte-level BPE tokenizers exactly; the
  window can only differ from a full decode for decoders that are not left-to-right).
- Stop strings: the output ends at the first stop string to complete (ties: the one starting
  first), with the stop string itself only when ``include_stop_str_in_output``; then ``stopped``
  is True, ``stop_reason`` is the string, and pushes return "". The longest tail that could begin
  a stop string (at most len(longest stop) - 1 characters) is held back, so a client never sees
  part of a stop string that then matches, nor anything after one. Matching costs time linear in
  the text pushed and memory linear in the stop strings' total length (``StopMatcher``).
- ``spaces_between_special_tokens=False`` (only with ``skip_special_tokens=False``, as in vLLM):
  an added token right after another added token is emitted as its bare content, without the
  separator the decoder puts between them.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence

from tokenizers.decoders import DecodeStream

from dyn.core.frontend.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"
_PROMPT_TAIL = 6
"""Prompt ids that prime the window (vLLM: INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET + 1)."""
_BULK_IDS = 8
"""From this many ids a push decodes them in one call (``_bulk``); fewer are cheaper stepped."""
_MAX_HELD_IDS = 32
"""Once this many ids are held for an unfinished character (a real one needs at most 3 more byte
tokens), the next push emits the text anyway: a model that emits invalid bytes forever must not
make every push decode a longer window."""


class IncrementalDetokenizer:
    """Text of one generated stream, a push at a time; not thread-safe (one per stream)."""

    __slots__ = (
        "stopped",
        "stop_reason",
        "_backend",
        "_decode",
        "_skip",
        "_stream",
        "_stream_step",
        "_ids",
        "_read",
        "_stops",
        "_include_stop",
        "_added",
        "_last_added",
        "_done",
    )

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: Sequence[int] | None = None,
        *,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        stop: Sequence[str] | StopMatcher = (),
        include_stop_str_in_output: bool = False,
    ) -> None:
        """``stop``: the stop strings, or their matcher (``stop_matcher``), shared by a request's choices."""
        self.stopped = False
        self.stop_reason: str | None = None
        self._backend = tokenizer.backend
        self._decode = tokenizer.backend.decode
        self._skip = skip_special_tokens
        self._restart(_prompt_tail(self._decode, prompt_token_ids, skip_special_tokens))

        matcher = stop if isinstance(stop, StopMatcher) else stop_matcher(stop) if stop else None
        self._stops = StopScanner(matcher) if matcher is not None and matcher.stops else None
        self._include_stop = include_stop_str_in_output

        joined = skip_special_tokens or spaces_between_special_tokens or not tokenizer.added_tokens
        self._added: dict[int, str] | None = None if joined else tokenizer.added_tokens
        self._last_added = False
        self._done = False

    def push(self, token_ids: Sequence[int]) -> str:
        """Take newly generated ids; return the text to send now (often "", never part of a character)."""
        if self.stopped or self._done or not token_ids:
            return ""
        added = self._added
        if added is not None:
            new = "".join([self._step_unjoined(t, added) for t in token_ids])
        elif len(token_ids) == 1:
            new = self._step(token_ids[0])
        else:
            bulk = self._bulk(token_ids) if len(token_ids) >= _BULK_IDS else None
            # else token by token, so the complete characters of a chunk go out even if it ends inside one
            new = bulk if bulk is not None else "".join([self._step(t) for t in token_ids])
        return self._emit(new, False) if new else ""

    def finish(self) -> str:
        """The stream has ended: return what was held back (an unfinished character as decoded,
        the tail that could have begun a stop string); later calls return ""."""
        if self.stopped or self._done:
            return ""
        self._done = True
        new = self._flush() if len(self._ids) > self._read else ""
        return self._emit(new, True)

    def _restart(self, context: list[int]) -> None:
        """A new window primed with ``context`` (ids whose text was already shown, or none)."""
        self._stream = DecodeStream(context or None, skip_special_tokens=self._skip)
        self._stream_step = self._stream.step
        self._ids = context
        self._read = len(context)

    def _step(self, token_id: int) -> str:
        # ``_ids`` mirrors DecodeStream's window: the ids of the last emission (``[:_read]``, the
        # prefix) then the ids held since, so a flush can decode what the stream holds
        try:
            new = self._stream_step(self._backend, token_id)
        except Exception:
            self._ids.append(token_id)
            return self._flush(rewritten=True)
        ids = self._ids
        if new is None:
            ids.append(token_id)
            return self._flush() if len(ids) - self._read >= _MAX_HELD_IDS else ""
        window = ids[self._read :]
        window.append(token_id)
        self._ids = window
        self._read = len(window)
        return new

    def _bulk(self, token_ids: Sequence[int]) -> str | None:
        """The text of several ids, decoded with the window in one call: what stepping them one
        at a time would emit, for a third of the cost at 16 ids (12 us a stream, not 35). None
        (nothing consumed) where the steps must decide: the text ends inside a character, or the
        decoder rewrote the window's text."""
        ids, read, decode, skip = self._ids, self._read, self._decode, self._skip
        window = ids + list(token_ids)
        text = decode(window, skip_special_tokens=skip)
        if text.endswith(_REPLACEMENT):
            return None
        prefix_text = decode(ids[:read], skip_special_tokens=skip) if read else ""
        if not text.startswith(prefix_text):
            return None
        self._restart(_prompt_tail(decode, window[read:], skip))
        return text[len(prefix_text) :]

    def _flush(self, rewritten: bool = False) -> str:
        """Emit the held ids as they decode now (an unfinished character included) and restart
        the window after them."""
        ids, read, decode, skip = self._ids, self._read, self._decode, self._skip
        text = decode(ids, skip_special_tokens=skip)
        prefix_text = decode(ids[:read], skip_special_tokens=skip) if read else ""
        if not rewritten and text.startswith(prefix_text):
            new = text[len(prefix_text) :]
        else:
            new = decode(ids[read:], skip_special_tokens=skip)
        self._restart(_prompt_tail(decode, ids[read:], skip))
        return new

    def _step_unjoined(self, token_id: int, added: dict[int, str]) -> str:
        new = self._step(token_id)
        content = added.get(token_id)
        if content is not None and self._last_added:
            new = content
        self._last_added = content is not None
        return new

    def _emit(self, new: str, final: bool) -> str:
        scanner = self._stops
        if scanner is None:
            return new
        shown, stop = scanner.feed(new, final)
        if stop is not None:
            self.stopped = True
            self.stop_reason = stop
            if self._include_stop:
                shown += stop
        return shown


class StopMatcher:
    """An Aho-Corasick automaton over a set of stop strings: immutable, shared by every stream that
    stops on them (``stop_matcher`` caches it per set).

    Memory is a few bytes per character of the stop strings: the trie is stored as chains of
    consecutive node numbers (the child a string's next character leads to is usually the next
    node), with a dict only for the few nodes where strings branch apart.
    """

    __slots__ = (
        "stops",
        "tail_chars",
        "max_hold",
        "_heads",
        "_labels",
        "_chained",
        "_branches",
        "_fail",
        "_depth",
        "_out",
    )

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops: tuple[str, ...] = tuple(dict.fromkeys(s for s in stops if s))
        self.tail_chars = frozenset(c for s in self.stops for c in s[:-1])
        """Characters that can end a proper prefix of a stop string: text ending in any other
        character holds nothing back."""
        self.max_hold = max((len(s) for s in self.stops), default=1) - 1
        self._heads = "".join(dict.fromkeys(s[0] for s in self.stops if len(s) > 1))
        labels = ["\0"]  # the root's (never read): labels[v] is the character that leads to node v
        chained = bytearray(1)
        branches: dict[int, dict[str, int]] = {}
        branch_parent: dict[int, int] = {}
        chains: list[tuple[int, int, int]] = []  # runs of consecutive nodes: (first node, its depth, length)
        depth = array("i", [0])
        out = array("i", [-1])
        for index, stop in enumerate(self.stops):
            node, at = 0, 0
            while at < len(stop):  # follow the trie as far as it already spells the string
                c = stop[at]
                if chained[node] and labels[node + 1] == c:
                    node += 1
                elif node in branches and c in branches[node]:
                    node = branches[node][c]
                else:
                    break
                at += 1
            grow = len(stop) - at
            if grow:  # the rest of the string is a new chain of consecutive nodes
                first = len(labels)
                if first == node + 1:
                    chained[node] = 1
                else:
                    branches.setdefault(node, {})[stop[at]] = first
                    branch_parent[first] = node
                labels.extend(stop[at:])
                chained.extend(bytes(grow))
                chained[first : first + grow - 1] = b"\x01" * (grow - 1)
                depth.extend(range(depth[node] + 1, depth[node] + grow + 1))
                chains.append((first, depth[node] + 1, grow))
                out.frombytes(b"\xff" * (4 * grow))
                node = first + grow - 1
            out[node] = index
        self._labels = "".join(labels)
        self._chained = chained
        self._branches = branches
        self._depth = depth
        self._out = out
        self._fail = self._links(branch_parent, chains)

    def _by_depth(self, chains: list[tuple[int, int, int]]) -> Iterator[int]:
        """Every node but the root, shallowest first, walking the chains side by side."""
        chains.sort(key=lambda chain: chain[1])
        active: list[tuple[int, int, int]] = []
        at = 0
        for level in range(1, self.max_hold + 2):
            while at < len(chains) and chains[at][1] == level:
                active.append(chains[at])
                at += 1
            for first, top, _count in active:
                yield first + level - top
            active = [chain for chain in active if level < chain[1] + chain[2] - 1]

    def _links(self, branch_parent: dict[int, int], chains: list[tuple[int, int, int]]) -> array:
        """Failure links, in order of depth: each node's link is its longest proper suffix that is
        a trie node; ``out`` then names the longest stop string ending at every node."""
        labels, chained, branches, out = self._labels, self._chained, self._branches, self._out
        fail = array("i", bytes(4 * len(labels)))
        for node in self._by_depth(chains):
            parent = node - 1 if chained[node - 1] else branch_parent[node]
            if not parent:
                continue
            c = labels[node]
            f = fail[parent]
            while True:
                if chained[f] and labels[f + 1] == c:
                    fail[node] = f + 1
                    break
                found = branches.get(f)
                if found is not None and c in found:
                    fail[node] = found[c]
                    break
                if not f:
                    break
                f = fail[f]
            if out[node] < 0:
                out[node] = out[fail[node]]
        return fail

    def walk(self, node: int, text: str, at: int, to_end: bool) -> tuple[int, int, int]:
        """Run the automaton from ``node`` over ``text[at:]``; stop after the first character that
        completes a stop string, or (unless ``to_end``) once back at the root. Returns (node, the
        index after the last character read, index of the stop string completed or -1)."""
        labels, chained, branches = self._labels, self._chained, self._branches
        fail, out = self._fail, self._out
        end = len(text)
        while at < end:
            c = text[at]
            at += 1
            while True:
                if chained[node] and labels[node + 1] == c:
                    node += 1
                    break
                found = branches.get(node)
                if found is not None and c in found:
                    node = found[c]
                    break
                if not node:
                    break
                node = fail[node]
            if out[node] >= 0:
                return node, at, out[node]
            if not node and not to_end:
                break
        return node, at, -1

    def depth(self, node: int) -> int:
        """How many characters the state ``node`` has matched (the text to hold back)."""
        return self._depth[node]

    def first_head(self, text: str, at: int) -> int:
        """The first index from ``at`` of a character that can begin a held-back tail; -1: none."""
        first = -1
        for head in self._heads:
            found = text.find(head, at)
            if found >= 0 and (first < 0 or found < first):
                first = found
        return first


class StopScanner:
    """The stop-string state of one stream: where the automaton stands and the text held back."""

    __slots__ = ("_matcher", "_node", "_held")

    def __init__(self, matcher: StopMatcher) -> None:
        self._matcher = matcher
        self._node = 0
        self._held = ""

    def feed(self, new: str, final: bool) -> tuple[str, str | None]:
        """Take the stream's next text; return (the text that may be shown, the stop string that
        completed or None). The shown text never includes a completed stop string; without a stop,
        it leaves out the longest tail that could begin one (nothing when ``final``)."""
        matcher = self._matcher
        if self._node:  # a stop string may have begun: step through until it completes or fails
            pending = self._held + new
            node, at, hit = matcher.walk(self._node, pending, len(self._held), False)
            if hit >= 0:
                stop = matcher.stops[hit]
                return self._stopped(pending[: at - len(stop)], stop)
            if node or at == len(pending):
                return self._hold(pending, node, final)
        elif not new:
            return self._hold(new, 0, final)
        else:
            pending, at = new, 0
        # at the root: the rest of the text is searched by str.find, and the automaton runs only
        # over its last few characters, from the first one that can begin a stop string
        rest = pending[at:] if at else pending
        for stop in matcher.stops:
            if stop in rest:
                stop, start = _first_stop(rest, matcher.stops)
                return self._stopped(pending[: at + start], stop)
        if rest[-1] not in matcher.tail_chars:
            return self._hold(pending, 0, final)
        begin = matcher.first_head(pending, max(at, len(pending) - matcher.max_hold))
        node = matcher.walk(0, pending, begin, True)[0] if begin >= 0 else 0
        return self._hold(pending, node, final)

    def _hold(self, pending: str, node: int, final: bool) -> tuple[str, None]:
        hold = self._matcher.depth(node)
        if final or not hold:
            self._node, self._held = 0, ""
            return pending, None
        self._node, self._held = node, pending[-hold:]
        return pending[:-hold], None

    def _stopped(self, shown: str, stop: str) -> tuple[str, str]:
        self._node, self._held = 0, ""
        return shown, stop


_MATCHERS: OrderedDict[tuple[str, ...], StopMatcher] = OrderedDict()
_MATCHERS_LOCK = threading.Lock()
_CACHED_CHARS = 1 << 20
"""How many stop-string characters the matcher cache keeps (about 16 MB at most)."""
_cached_chars = 0


def stop_matcher(stops: Sequence[str]) -> StopMatcher:
    """The matcher for ``stops``, from a cache of recent sets (so a request's choices, and the
    requests that send the same stops, build it once); thread-safe."""
    global _cached_chars
    key = tuple(stops)
    with _MATCHERS_LOCK:
        found = _MATCHERS.get(key)
        if found is not None:
            _MATCHERS.move_to_end(key)
            return found
    matcher = StopMatcher(key)
    size = sum(map(len, key))
    if size > _CACHED_CHARS:
        return matcher
    with _MATCHERS_LOCK:
        if key not in _MATCHERS:
            _MATCHERS[key] = matcher
            _cached_chars += size
            while _cached_chars > _CACHED_CHARS:
                old, _ = _MATCHERS.popitem(last=False)
                _cached_chars -= sum(map(len, old))
    return matcher


def _first_stop(text: str, stops: tuple[str, ...]) -> tuple[str, int]:
    """The stop string that completes first in ``text`` and where it starts (ties: earliest start);
    ``text`` holds at least one of ``stops``."""
    best: tuple[str, int] | None = None
    best_end = best_start = 0
    for stop in stops:
        start = text.find(stop)
        if start < 0:
            continue
        end = start + len(stop)
        if best is None or end < best_end or (end == best_end and start < best_start):
            best, best_end, best_start = (stop, start), end, start
    if best is None:
        raise ValueError("no stop string occurs in the text")
    return best


def _prompt_tail(
    decode: Callable[..., str], prompt_token_ids: Sequence[int] | None, skip_special_tokens: bool
) -> list[int]:
    """The last few prompt ids, dropping leading ones until they decode to whole characters; none
    when the prompt ends inside a character (the output then decodes on its own)."""
    if not prompt_token_ids:
        return []
    tail = list(prompt_token_ids[-_PROMPT_TAIL:])
    while tail and _REPLACEMENT in decode(tail, skip_special_tokens=skip_special_tokens):
        del tail[0]
    return tail
