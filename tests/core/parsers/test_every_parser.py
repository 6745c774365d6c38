"""Every registered parser, tool-call and reasoning, on random model output: texts made of the
parser's own markers and of fragments that calls and reasoning are built from, each parsed whole
and in random pieces. The streaming contract (``dyn.core.parsers.tool``, ``.reasoning``) says the
joined events are the same however the text is split, and no text may make a parser raise: a
model writes what it writes, and one malformed answer must not fail its request. Seeded, so a
failure names the text that broke it and comes back on every run.
"""

from __future__ import annotations

import inspect
import random
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.tool import TOOL_PARSERS, Tool
from tests.core.parsers.conftest import Parsed, join
from tests.core.parsers.response_templates import QWEN3, tokenizer

TEXTS_PER_PARSER = 40
TOOLS = [
    Tool(
        "get_weather",
        {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "o": {"type": "object"}},
        },
    )
]
FRAGMENTS = (
    "get_weather", ' name="get_weather"', '{"name": "get_weather", "arguments": {"city": "P"}}',
    '{"city": "Paris", "days": 3}', "{", "}", '"', "\n", " ", "city", "3", "true", "[1,", "\\n", "<",
    ">", "</", "=", ":", ",", "é", "\u200b", "<think>", "</think>", "<tool_call>", "</tool_call>",
    " to=self", " to=get_weather", "<|message|>", "function", "call:", "<escape>", "```json",
)  # fmt: skip
_QUOTED_MARKER = re.compile(r"""["'](<[^"'\s]{1,40}>?)["']""")


def _vocabulary(cls: type) -> list[str]:
    """The markers the parser's module spells (string literals that open a tag), and the fragments."""
    source = inspect.getsource(sys.modules[cls.__module__])
    return sorted(set(_QUOTED_MARKER.findall(source))) + list(FRAGMENTS)


def _texts(cls: type, rng: random.Random) -> list[tuple[str, list[str]]]:
    """(text, the text in random pieces) pairs."""
    words = _vocabulary(cls)
    out = []
    for _ in range(TEXTS_PER_PARSER):
        text = "".join(rng.choice(words) for _ in range(rng.randint(1, 40)))
        cuts = (
            sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 12))))
            if len(text) > 1
            else []
        )
        out.append((text, [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]))
    return out


def _run(make: Callable[[], Any], pieces: list[str]) -> Parsed:
    parser = make()
    events: list[Any] = []
    for piece in pieces:
        events += parser.feed(piece)
    return join(events + parser.finish())


@pytest.fixture(scope="module")
def model_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A served model's tokenizer with a response_template (``hf`` reads it; others ignore it)."""
    return tokenizer(Path(tmp_path_factory.mktemp("model")), QWEN3)


@pytest.mark.parametrize("name", TOOL_PARSERS.names())
def test_tool_parser_on_random_output(name: str, model_tokenizer: Any) -> None:
    cls = TOOL_PARSERS.get(name)
    rng = random.Random(f"tool {name}")
    for text, pieces in _texts(cls, rng):
        extra: dict[str, Any] = {}
        if cls.emits_reasoning:
            extra["prompt_text"] = rng.choice(["", "<think>", "<|im_start|>assistant\n"])
        if cls.takes_tokenizer:
            extra["tokenizer"] = model_tokenizer

        def make(extra: dict[str, Any] = extra) -> Any:
            return cls(TOOLS, **extra)

        whole = _run(make, [text])
        assert _run(make, pieces) == whole, f"{name}: {pieces!r} differs from the whole text"


@pytest.mark.parametrize("name", REASONING_PARSERS.names())
def test_reasoning_parser_on_random_output(name: str, model_tokenizer: Any) -> None:
    cls = REASONING_PARSERS.get(name)
    rng = random.Random(f"reasoning {name}")
    extra = {"tokenizer": model_tokenizer} if cls.takes_tokenizer else {}
    for text, pieces in _texts(cls, rng):
        prompt = rng.choice([None, "", "<think>", "x</think>", "<|im_start|>assistant\n<think>\n"])
        kwargs = rng.choice([{}, {"enable_thinking": False}, {"reasoning_effort": "low"}])

        def make(prompt: str | None = prompt, kwargs: dict[str, Any] = kwargs) -> Any:
            return cls(prompt, kwargs, **extra)

        whole = _run(make, [text])
        assert _run(make, pieces) == whole, f"{name}: {pieces!r} differs from the whole text"
