"""Gemma 3's newline merging: where its images' tokens are once the newlines they are written with
have merged with the prompt's own, as vLLM 0.32 places them (``Gemma3MultiModalProcessor``'s
``_apply_token_matches`` and ``_find_mm_placeholders``).

Gemma's vocabulary has one token for each run of one to four newlines. An image is written
``\\n\\n<start_of_image>...<end_of_image>\\n\\n`` (``dyn.core.model.image_layouts.PanAndScan``), so a
newline token the chat template wrote beside it would, in the text Gemma's processor tokenizes
whole, be part of a longer run. vLLM reproduces that on the token ids: after expanding every image
it replaces each ``\\n`` ``\\n\\n`` pair by ``\\n\\n\\n``, then each ``\\n\\n`` ``\\n`` pair, then each
``\\n\\n`` ``\\n\\n`` pair by ``\\n\\n\\n\\n`` (left to right, matches not overlapping). It finds the
images again by splitting each ``\\n\\n\\n`` back into ``\\n`` ``\\n\\n`` and each ``\\n\\n\\n\\n`` into
``\\n\\n`` ``\\n\\n``, scanning for each image's tokens in order; an image starts at the merged token
its first ``\\n\\n`` is in and is as long as its own tokens. So two images side by side share the
``\\n\\n\\n\\n`` between them, and an image followed by one newline (``\\n\\n`` ``\\n`` merged, split
back the other way round) is not found: vLLM refuses that prompt, and so does ``merge_newlines``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple


class Newlines(NamedTuple):
    """The ids of the tokens of one, two, three and four newlines."""

    one: int
    two: int
    three: int
    four: int

    @classmethod
    def of(cls, encode: Callable[[str], list[int]]) -> Newlines | None:
        """The tokenizer's (``encode``, without special tokens), or None when a run of one to four
        newlines is not one token (vLLM's Gemma 3 processor fails on such a tokenizer)."""
        ids = [encode("\n" * n) for n in range(1, 5)]
        if any(len(one) != 1 for one in ids):
            return None
        return cls(*(one[0] for one in ids))


class MergedPrompt(NamedTuple):
    """``token_ids`` after the merge; each item's ``spans`` (offset, length) in them, as vLLM
    places it; and each item's ``sources``: the tokens its span stands for in the prompt the chat
    template wrote (its placeholder token, with the newlines of the template's that merged into
    the span's ends), what an engine that expands the placeholder itself is given instead."""

    token_ids: list[int]
    spans: list[tuple[int, int]]
    sources: list[list[int]]


class UnplacedItemError(ValueError):
    """An ``item`` (its index) vLLM would not find in the merged prompt; the message says why."""

    def __init__(self, item: int, message: str) -> None:
        super().__init__(message)
        self.item = item


_TEMPLATE = -1
"""The owner of a token the chat template wrote (an item's tokens are owned by its index)."""


def merge_newlines(
    token_ids: Sequence[int], spans: Sequence[tuple[int, int]], placeholder: int, newlines: Newlines
) -> MergedPrompt:
    """Merge the newlines of ``token_ids``, a prompt with each item's tokens expanded at its
    ``spans`` (offset, length; in order, not overlapping), as vLLM does, and place the items
    again. ``placeholder``: the token the chat template wrote for each item.
    ``UnplacedItemError`` for an item vLLM would not find. Linear in the prompt, in C-level list
    operations but for the newline tokens."""
    one, two, three, four = newlines
    tokens, starts = list(token_ids), list(range(len(token_ids)))
    for pair, into in (((one, two), three), ((two, one), three), ((two, two), four)):
        tokens, starts = _replace_pairs(tokens, starts, pair, into)
    unmerged, origin = _split_back(tokens, {three: [one, two], four: [two, two]})
    placed: list[tuple[int, int]] = []
    at = 0
    for item, (offset, length) in enumerate(spans):
        found = _find(unmerged, list(token_ids[offset : offset + length]), at)
        if found is None:
            raise UnplacedItemError(
                item,
                "a newline right after it merges with the newlines it is written with in a way "
                "vLLM's Gemma 3 processor cannot place; put no single newline right after an image",
            )
        placed.append((origin[found], length))
        at = found + length
    owners = [_TEMPLATE] * len(token_ids)
    for item, (offset, length) in enumerate(spans):
        owners[offset : offset + length] = [item] * length
    starts.append(len(token_ids))
    sources = []
    for item, (offset, length) in enumerate(placed):
        source: list[int] = []
        for position in range(starts[offset], starts[offset + length]):
            owner = owners[position]
            if owner == _TEMPLATE:
                source.append(token_ids[position])
            elif owner == item and (position == 0 or owners[position - 1] != item):
                source.append(placeholder)  # where the item's own tokens start
        sources.append(source)
    return MergedPrompt(tokens, placed, sources)


def _replace_pairs(
    tokens: list[int], starts: list[int], pair: tuple[int, int], into: int
) -> tuple[list[int], list[int]]:
    """``tokens`` with each ``pair`` replaced by ``into``, left to right, matches not overlapping
    (vLLM's ``replace_token_matches``), and each token's first position in the original prompt
    (``starts``: a merged token covers the positions up to the next one's)."""
    first, second = pair
    out, out_starts = [], []
    i, end = 0, len(tokens) - 1
    while True:
        try:
            j = tokens.index(first, i, max(end, i))
        except ValueError:
            break
        if tokens[j + 1] == second:
            out += tokens[i:j]
            out.append(into)
            out_starts += starts[i : j + 1]
            i = j + 2
        else:
            out += tokens[i : j + 1]
            out_starts += starts[i : j + 1]
            i = j + 1
    out += tokens[i:]
    out_starts += starts[i:]
    return out, out_starts


def _split_back(tokens: list[int], split: dict[int, list[int]]) -> tuple[list[int], list[int]]:
    """``tokens`` with each token in ``split`` replaced by its parts, and the index in ``tokens``
    each resulting token comes from."""
    out: list[int] = []
    origin: list[int] = []
    i = 0
    for j in sorted(j for token in split for j in _indices(tokens, token)):
        out += tokens[i:j]
        out += split[tokens[j]]
        origin += range(i, j)
        origin += [j] * len(split[tokens[j]])
        i = j + 1
    out += tokens[i:]
    origin += range(i, len(tokens))
    return out, origin


def _indices(tokens: list[int], token: int) -> list[int]:
    out: list[int] = []
    i = 0
    while True:
        try:
            i = tokens.index(token, i)
        except ValueError:
            return out
        out.append(i)
        i += 1


def _find(tokens: list[int], wanted: list[int], start: int) -> int | None:
    """The first index from ``start`` where ``wanted`` is in ``tokens``."""
    first, last = wanted[0], len(tokens) - len(wanted)
    while start <= last:
        try:
            start = tokens.index(first, start, last + 1)
        except ValueError:
            return None
        if tokens[start : start + len(wanted)] == wanted:
            return start
        start += 1
    return None
