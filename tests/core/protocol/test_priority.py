"""Priority has one meaning for clients and is converted once to each engine's convention."""

from __future__ import annotations

import pytest

from dyn.core.protocol.openai import AgentHints, CacheControl, ChatCompletionRequest, NvExt
from dyn.core.protocol.priority import engine_priority, request_priority


def chat(priority=0, hint=None) -> ChatCompletionRequest:
    nvext = NvExt(agent_hints=AgentHints(priority=hint)) if hint is not None else None
    return ChatCompletionRequest(messages=[], priority=priority, nvext=nvext)


def test_the_agent_hint_wins_and_vllm_priority_is_turned_around():
    assert request_priority(chat()) is None
    assert request_priority(chat(hint=5)) == 5
    assert request_priority(chat(priority=3, hint=-2)) == -2
    assert request_priority(chat(priority=3)) == -3  # vLLM: smaller is more important


def test_each_engine_gets_its_own_convention():
    assert engine_priority(None, "lower_first") is None
    assert engine_priority(10, "higher_first") == 10
    assert engine_priority(10, "lower_first") == -10
    # the more important request sorts first in both conventions
    important, casual = 10, 1
    assert engine_priority(important, "lower_first") < engine_priority(casual, "lower_first")
    assert engine_priority(important, "higher_first") > engine_priority(casual, "higher_first")


@pytest.mark.parametrize(
    "ttl, seconds",
    [
        (None, 300),
        ("5m", 300),
        ("1h", 3600),
        ("600", 600),
        (42, 300),
        ("99999", 3600),
        (1800, 1800),
    ],
)
def test_cache_ttl_is_parsed_and_clamped(ttl, seconds):
    assert CacheControl(ttl=ttl).ttl_seconds() == seconds


@pytest.mark.parametrize("ttl", ["forever", "\u00b2", "-5"])  # "²" is a digit to str.isdigit, not to int
def test_an_unparsable_cache_ttl_says_what_to_send(ttl):
    with pytest.raises(ValueError, match='"5m" or "1h"'):
        CacheControl(ttl=ttl).ttl_seconds()
