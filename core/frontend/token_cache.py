"""A prefix-keyed token cache for chat prompts: agents resend their whole conversation every turn,
so most of each prompt was tokenized the turn before.

A rendered chat prompt is cut right after a special token (``<|im_start|>``, ``</s>``, ...): the
tokenizer splits added tokens out before it normalizes and pre-tokenizes what lies between them,
so the ids of the text are the ids of the part up to that cut followed by the ids of the rest. The
rest is encoded behind the special token it follows and that token's id is dropped, so the rest is
tokenized as a segment that does not start the text, as in the whole (some pre-tokenizers treat
the first segment differently). ``encode`` looks for the longest cut whose prefix is cached (a cut's
position is looked up first, so every cut can be tried), encodes only the rest, and caches the
prompt's own longest cut for the next turn: a turn's prompt ends with the generation prompt's
special token and a role name, and the next turn's prompt holds that prefix exactly. A prompt
with no cached prefix is encoded whole (plus the few tokens after its last cut, to know where the
cut falls in its ids).

Self-checked: the first ``VERIFY`` prompts (or prefixes) taken in parts are also encoded whole; one
disagreement (a tokenizer this reasoning does not fit, such as one with an added token that
extends across a cut) turns the cache off for good, with a warning, and the whole encoding is
used. Bounded: ``max_entries`` prefixes and ``max_chars`` characters of them, least recently used
first out; a thread-safe LRU (chat prompts are tokenized in preprocessing threads too).
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

VERIFY = 32
"""Prompts encoded through a cut that are checked against a whole encoding first."""
MIN_PREFIX_CHARS = 1024
"""Shorter prefixes are not worth a cache entry."""
TAIL_KEY_CHARS = 128
"""A cached prefix is found by its length and its last characters, then compared whole."""

Encode = Callable[[list[str]], list[list[int]]]
"""Encodes a batch of texts without the post-processor (no BOS/EOS added)."""


class PrefixTokenCache:
    """See the module docstring. ``encode_batch`` tokenizes texts as the tokenizer does;
    ``specials`` maps each special token's text to its id."""

    def __init__(
        self,
        encode_batch: Encode,
        specials: dict[str, int],
        *,
        max_entries: int = 4096,
        max_chars: int = 64 << 20,
    ) -> None:
        self._encode = encode_batch
        self._specials = specials
        ordered = sorted(specials, key=len, reverse=True)  # leftmost-longest, as the tokenizer
        self._cut = re.compile("|".join(re.escape(s) for s in ordered)) if ordered else None
        self._entries: OrderedDict[str, list[int]] = OrderedDict()
        self._by_end: dict[tuple[int, str], list[str]] = {}
        """The cached prefixes by (length, last ``TAIL_KEY_CHARS`` characters): each cut of a
        prompt is looked up by its position and the text before it, without hashing the prefix."""
        self._chars = 0
        self._lock = threading.Lock()
        self.max_entries = max_entries
        self.max_chars = max_chars
        self.enabled = self._cut is not None
        self._unverified = VERIFY
        self.hits = 0
        self.misses = 0

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` (as ``encode_batch([text])[0]``), from the cache where it can."""
        if not self.enabled or len(text) < MIN_PREFIX_CHARS:
            return self._encode([text])[0]
        cuts = [(m.end(), m.group()) for m in self._cut.finditer(text)]  # type: ignore[union-attr]
        last, last_special = cuts[-1] if cuts else (0, "")
        if last < MIN_PREFIX_CHARS:
            return self._encode([text])[0]
        hit = self._longest_cached(text, cuts)
        if hit is None:  # the whole prompt, then the ids of its part up to the last cut
            self.misses += 1
            ids = self._encode([text])[0]
            head = ids[: len(ids) - self._after(last_special, text[last:])]
            if self._unverified > 0 and not self._verified(text[:last], head):
                return ids
        else:
            self.hits += 1
            (end, special), cached = hit
            (rest,) = self._encode([special + text[end:]])
            ids = cached + rest[1:]
            head = ids if end == last else ids[: len(ids) - self._after(last_special, text[last:])]
            if self._unverified > 0 and not self._verified(text, ids):
                return self._encode([text])[0]
        self._store(text[:last], head)
        return ids

    def _after(self, special: str, piece: str) -> int:
        """How many ids ``piece`` encodes to where it follows ``special`` in a prompt."""
        (ids,) = self._encode([special + piece])
        return len(ids) - 1

    def _longest_cached(
        self, text: str, cuts: list[tuple[int, str]]
    ) -> tuple[tuple[int, str], list[int]] | None:
        by_end = self._by_end
        for cut in reversed(cuts):
            end = cut[0]
            if end < MIN_PREFIX_CHARS:
                return None
            candidates = by_end.get((end, text[end - TAIL_KEY_CHARS : end]))
            if not candidates:
                continue
            with self._lock:
                for prefix in candidates:
                    if text.startswith(prefix):
                        self._entries.move_to_end(prefix)
                        return cut, self._entries[prefix]
        return None

    def _verified(self, text: str, ids: list[int]) -> bool:
        """Whether ``ids`` are the whole encoding of ``text``; the cache goes off when not."""
        self._unverified -= 1
        if self._encode([text])[0] == ids:
            return True
        self.enabled = False
        with self._lock:
            self._entries.clear()
            self._by_end.clear()
            self._chars = 0
        log.warning(
            "the prefix token cache disagreed with a whole encoding of a prompt; it is off for "
            "this tokenizer (prompts are tokenized whole)"
        )
        return False

    def _store(self, prefix: str, ids: list[int]) -> None:
        if not self.enabled:
            return
        with self._lock:
            entries = self._entries
            if prefix in entries:
                entries.move_to_end(prefix)
                return
            entries[prefix] = ids
            self._by_end.setdefault(_key(prefix), []).append(prefix)
            self._chars += len(prefix)
            while len(entries) > self.max_entries or self._chars > self.max_chars:
                old, _ = entries.popitem(last=False)
                self._chars -= len(old)
                key = _key(old)
                same = self._by_end[key]
                same.remove(old)
                if not same:
                    del self._by_end[key]

    def __len__(self) -> int:
        return len(self._entries)


def _key(prefix: str) -> tuple[int, str]:
    return len(prefix), prefix[-TAIL_KEY_CHARS:]


def special_token_ids(added: Iterable[tuple[int, str, bool]]) -> dict[str, int]:
    """``{text: id}`` of the special added tokens among ``(id, text, special)``."""
    return {text: i for i, text, special in added if special and text}
