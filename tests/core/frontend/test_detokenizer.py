"""dyn.core.frontend.detokenizer: streamed text equals a full decode, never splits a character, and
stops at stop strings without showing any part of them or anything after them."""

from __future__ import annotations

import random

import pytest
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as RustTokenizer

from dyn.core.frontend.detokenizer import IncrementalDetokenizer
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.model.info import TINY_MODEL_DIR

TEXT = (
    "def main():\n    print('héllo wörld')  # 数据结构与算法\n"
    "emoji 🎉🚀 family 👩‍👩‍👧 flag 🇯🇵 日本語のテキスト — ☕ ok\n"
)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_dir(TINY_MODEL_DIR)


def _chunks(ids: list[int], rng: random.Random, most: int) -> list[list[int]]:
    out, i = [], 0
    while i < len(ids):
        n = rng.randint(1, most)
        out.append(ids[i : i + n])
        i += n
    return out


def _stream(detok: IncrementalDetokenizer, chunks: list[list[int]]) -> list[str]:
    return [detok.push(c) for c in chunks] + [detok.finish()]


@pytest.mark.parametrize("skip", [True, False])
def test_random_sequences_equal_full_decode(tok: Tokenizer, skip: bool) -> None:
    rng = random.Random(1234)
    special = sorted(tok.special_token_ids)
    for _ in range(400):
        ids = [
            rng.choice(special) if rng.random() < 0.05 else rng.randrange(tok.vocab_size)
            for _ in range(rng.randint(0, 48))
        ]
        prompt = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(0, 10))]
        for most in (1, 5, 24):  # 24: most pushes decode in one call (``_bulk``)
            detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
            assert "".join(_stream(detok, _chunks(ids, rng, most))) == tok.decode(ids, skip), ids
            assert not detok.stopped and detok.stop_reason is None


def test_unicode_text_one_token_at_a_time_and_in_chunks(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert len(ids) > len(TEXT) // 2  # many characters span several byte tokens
    rng = random.Random(7)
    for most in (1, 2, 3, 8, len(ids)):
        for _ in range(5):
            pieces = _stream(IncrementalDetokenizer(tok), _chunks(ids, rng, most))
            assert "".join(pieces) == TEXT
            assert not any("\ufffd" in p for p in pieces)


def test_prompt_tail_primes_the_window(tok: Tokenizer) -> None:
    prompt = tok.encode("<|start_header_id|>assistant<|end_header_id|>\n\n", add_special_tokens=False)
    ids = tok.encode(TEXT, add_special_tokens=False)
    long_prompt = tok.encode(TEXT * 20, add_special_tokens=False)
    cut_prompt = tok.encode("🎉", add_special_tokens=False)[:2]  # the prompt ends inside a character
    for p in (prompt, long_prompt, cut_prompt, None, []):
        assert "".join(_stream(IncrementalDetokenizer(tok, p), [[i] for i in ids])) == TEXT
        assert "".join(_stream(IncrementalDetokenizer(tok, p), [ids[:9], ids[9:]])) == TEXT


def test_partial_character_is_held_until_complete(tok: Tokenizer) -> None:
    ids = tok.encode("🎉", add_special_tokens=False)
    assert len(ids) > 1
    detok = IncrementalDetokenizer(tok)
    assert [detok.push([i]) for i in ids] == [""] * (len(ids) - 1) + ["🎉"]
    assert detok.finish() == ""

    detok = IncrementalDetokenizer(tok)
    assert detok.push(tok.encode("ok ", False) + ids[:1]) == "ok "
    assert detok.finish() == "\ufffd"  # the stream ended inside the character: shown as decoded
    assert detok.push(ids[1:]) == "" and detok.finish() == ""  # nothing after finish


def test_complete_characters_go_out_at_once(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT * 3, add_special_tokens=False)
    rng = random.Random(3)
    runs = [(most, _chunks(ids, rng, most)) for most in (2, 3, 5, 16)]
    runs.append((12, [ids[i : i + 12] for i in range(0, len(ids), 12)]))  # each push in one decode
    for most, chunks in runs:
        detok, pushed, shown = IncrementalDetokenizer(tok), [], ""
        for chunk in chunks:
            pushed += chunk
            shown += detok.push(chunk)
            assert shown == tok.decode(pushed).removesuffix("\ufffd")
            assert len(detok._ids) <= 2 * most + 8  # the window never grows with the stream


def test_endless_invalid_bytes_do_not_grow_the_window(tok: Tokenizer) -> None:
    lone = tok.encode("é", add_special_tokens=False)[1]  # a continuation byte on its own: always invalid
    detok = IncrementalDetokenizer(tok)
    out = "".join(detok.push([lone]) for _ in range(1000))
    assert out.count("\ufffd") >= 1000 - 64 and len(detok._ids) < 64
    # the window restarts cleanly: what follows decodes as itself, and nothing is shown twice
    rest = (
        "".join(detok.push([i]) for i in tok.encode(" then text", add_special_tokens=False)) + detok.finish()
    )
    assert (out + rest).endswith("\ufffd then text") and (out + rest).count("\ufffd") == 1000


def _expected(text: str, stops: list[str], include: bool) -> tuple[str, str | None]:
    """Reference: cut at the stop string that completes first (ties: the one starting first)."""
    found = [(text.find(s) + len(s), text.find(s), s) for s in stops if s in text]
    if not found:
        return text, None
    end, start, stop = min(found)
    return text[:end] if include else text[:start], stop


@pytest.mark.parametrize("include", [False, True])
def test_stop_strings_on_random_chunking(tok: Tokenizer, include: bool) -> None:
    rng = random.Random(99)
    ids = tok.encode(TEXT, add_special_tokens=False)
    stop_sets = [
        ["wörld"],
        ["数据", "main"],
        ["🎉🚀"],
        ["ok\n"],
        ["\n"],
        ["never", "日本語", "  #"],
        ["(", "def"],
        ["not there"],
        ["print('h", "héllo"],
        ["é", "e"],
    ]
    for stops in stop_sets:
        expected, reason = _expected(TEXT, stops, include)
        for most in (1, 1, 3, 7, len(ids)):
            detok = IncrementalDetokenizer(tok, stop=stops, include_stop_str_in_output=include)
            shown = ""
            for chunk in _chunks(ids, rng, most):
                shown += detok.push(chunk)
                assert expected.startswith(shown), (stops, shown)  # never anything past the cut
            shown += detok.finish()
            assert (shown, detok.stop_reason, detok.stopped) == (expected, reason, reason is not None), stops


def test_stop_string_basics(tok: Tokenizer) -> None:
    ids = tok.encode("Hello world. STOP and more", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, stop=["STOP"])
    assert "".join(detok.push([i]) for i in ids) == "Hello world. "
    assert detok.stopped and detok.stop_reason == "STOP"
    assert detok.push(ids) == "" and detok.finish() == ""

    detok = IncrementalDetokenizer(tok, stop=["STOP"], include_stop_str_in_output=True)
    assert detok.push(ids) == "Hello world. STOP"


def test_possible_stop_prefix_is_held_then_released(tok: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tok, stop=["</answer>", "\n\nUser"])
    assert detok.push(tok.encode("yes </ans", False)) == "yes "  # "</ans" could begin "</answer>"
    assert detok.push(tok.encode("wer> no", False)) == ""  # stopped
    assert detok.stop_reason == "</answer>"

    detok = IncrementalDetokenizer(tok, stop=["</answer>"])
    assert detok.push(tok.encode("a </ans", False)) == "a "
    assert detok.push(tok.encode("i", False)) == "</ansi"  # no longer a possible stop
    assert detok.push(tok.encode("x </answer", False)) == "x "
    assert detok.finish() == "</answer"  # the stream ended before the stop string did
    assert not detok.stopped

    detok = IncrementalDetokenizer(tok, stop=["abcdef"])
    assert detok.push(tok.encode("123456789abcde", False)) == "123456789"  # at most len - 1 held
    assert detok.push(tok.encode("abcdef", False)) == "abcde"  # the old tail, then a match


def test_stop_in_special_token_text(tok: Tokenizer) -> None:
    ids = tok.encode("answer<|eot_id|>next", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, skip_special_tokens=False, stop=["<|eot_id|>"])
    assert detok.push(ids) == "answer" and detok.stopped
    detok = IncrementalDetokenizer(tok, skip_special_tokens=True, stop=["<|eot_id|>"])
    assert detok.push(ids) + detok.finish() == "answernext" and not detok.stopped


def _wordpiece() -> Tokenizer:
    """A BERT-like tokenizer: its decoder puts a space between tokens, special ones included."""
    rust = RustTokenizer(
        models.WordPiece({"[UNK]": 0, "hello": 1, "world": 2, "##s": 3, "a": 4}, unk_token="[UNK]")
    )
    rust.pre_tokenizer = pre_tokenizers.Whitespace()
    rust.decoder = decoders.WordPiece()
    rust.add_special_tokens([AddedToken("[CLS]", special=True), AddedToken("[SEP]", special=True)])
    rust.add_tokens([AddedToken("<extra>", special=False)])
    return Tokenizer(rust)


def test_spaces_between_special_tokens() -> None:
    tok = _wordpiece()
    ids = tok.encode("[CLS] hello worlds [SEP][SEP] <extra> a", add_special_tokens=False)
    joined = "[CLS] hello worlds [SEP] [SEP] <extra> a"
    assert tok.decode(ids, False) == joined
    for chunk in (1, 3):
        pieces = [ids[i : i + chunk] for i in range(0, len(ids), chunk)]
        with_spaces = IncrementalDetokenizer(tok, skip_special_tokens=False)
        assert "".join(_stream(with_spaces, pieces)) == joined
        # vLLM: an added token right after an added token comes without the decoder's separator
        bare = IncrementalDetokenizer(tok, skip_special_tokens=False, spaces_between_special_tokens=False)
        assert "".join(_stream(bare, pieces)) == "[CLS] hello worlds [SEP][SEP]<extra> a"
        # the flag only matters when special tokens are shown
        skipped = IncrementalDetokenizer(tok, skip_special_tokens=True, spaces_between_special_tokens=False)
        assert "".join(_stream(skipped, pieces)) == tok.decode(ids) == "hello worlds <extra> a"


def test_spaces_flag_is_moot_for_byte_level(tok: Tokenizer) -> None:
    ids = tok.encode("<|start_header_id|><|end_header_id|>hi<|eot_id|><|eot_id|>", add_special_tokens=False)
    for spaces in (True, False):
        detok = IncrementalDetokenizer(tok, skip_special_tokens=False, spaces_between_special_tokens=spaces)
        assert "".join(_stream(detok, [[i] for i in ids])) == tok.decode(ids, False)
