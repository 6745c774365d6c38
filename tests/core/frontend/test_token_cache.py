"""The prefix token cache (``dyn.core.frontend.token_cache``): a multi-turn conversation's prompts
encode to exactly the ids of a whole encoding, turn after turn, on dyn-tiny's byte-level tokenizer
and on a Metaspace tokenizer that marks only the text's first segment; the self-check turns a
disagreeing cache off; entries are bounded."""

from __future__ import annotations

import concurrent.futures
import logging

import tokenizers
from tokenizers import models, pre_tokenizers

from dyn.core.frontend.chat_template import ChatTemplate
from dyn.core.frontend.token_cache import VERIFY, PrefixTokenCache
from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.model.info import load_model_info

WORDS = "the router keeps every agent session near its cached prefix while tools run".split()


def conversation(turns: int) -> list[list[dict]]:
    """The messages an agent sends on each turn: its whole history plus a new user message."""
    history: list[dict] = [{"role": "system", "content": "You are terse. " * 40}]
    sent = []
    for turn in range(turns):
        history.append({"role": "user", "content": " ".join(WORDS[turn % 7 :]) + f" turn {turn}?"})
        sent.append(list(history))
        history.append({"role": "assistant", "content": " ".join(reversed(WORDS)) + f" ({turn})"})
    return sent


def test_every_turn_encodes_as_a_whole_encoding_and_later_turns_hit():
    tokenizer = Tokenizer.from_model(load_model_info(None, None))
    template = ChatTemplate(tokenizer.chat_template)
    for messages in conversation(12):
        text = template.render(messages, special_tokens=tokenizer.special_tokens_map)
        assert tokenizer.encode_chat(text) == tokenizer.encode(text, add_special_tokens=False)
    cache = tokenizer.prefix_cache
    assert cache.enabled and cache.hits >= 10 and len(cache) >= 1
    # with special tokens added around the prompt the cache is not used
    assert tokenizer.encode_chat("x" * 300, add_special_tokens=True) == tokenizer.encode("x" * 300)


def metaspace_first() -> tokenizers.Tokenizer:
    """A word-level tokenizer whose pre-tokenizer prepends "▁" to the first segment only."""
    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2}
    for word in {*WORDS, "?", "turn", "user", "assistant"}:
        vocab["▁" + word] = len(vocab)
        vocab[word] = len(vocab)
    backend = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    backend.add_special_tokens(["<s>", "</s>"])
    return backend


def test_a_tokenizer_that_marks_the_first_segment_agrees_too():
    tokenizer = Tokenizer(metaspace_first())
    history = ""
    for turn in range(VERIFY + 8):
        history += f"<s>user {' '.join(WORDS[turn % 5 :])}</s><s>assistant "
        assert tokenizer.encode_chat(history) == tokenizer.encode(history, add_special_tokens=False)
        history += " ".join(WORDS) + "</s>"
    assert tokenizer.prefix_cache.enabled and tokenizer.prefix_cache.hits > VERIFY


def test_a_cache_that_disagrees_turns_itself_off(caplog):
    # an "encoder" whose output depends on the whole text: no cut is safe
    def encode(texts: list[str]) -> list[list[int]]:
        return [[len(t), t.count("<e>")] for t in texts]

    cache = PrefixTokenCache(encode, {"<e>": 7})
    text = "a" * 1100 + "<e>" + "b" * 10
    with caplog.at_level(logging.WARNING):
        assert cache.encode(text) == encode([text])[0]  # the check caught it
    assert not cache.enabled and len(cache) == 0 and "disagreed" in caplog.text
    assert cache.encode(text + "c") == encode([text + "c"])[0]


def test_entries_are_bounded_and_threads_get_the_right_ids():
    tokenizer = Tokenizer.from_model(load_model_info(None, None))
    cache = PrefixTokenCache(tokenizer._encode_batch, tokenizer.prefix_cache._specials, max_entries=3)
    texts = [
        f"<|start_header_id|>user<|end_header_id|>{'word ' * 250}{i}<|eot_id|>tail {i}" for i in range(40)
    ]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(cache.encode, texts * 3))
    assert got == [tokenizer.encode(t, add_special_tokens=False) for t in texts * 3]
    assert len(cache) <= 3
    small = PrefixTokenCache(tokenizer._encode_batch, tokenizer.prefix_cache._specials, max_chars=4000)
    for text in texts:
        small.encode(text)
    assert small._chars <= 4000
