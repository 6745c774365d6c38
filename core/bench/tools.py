"""Function tools for ``dyn bench --multi-turn --tools N``: what the agents offer and answer.

``function_tools(n, seed)`` makes N OpenAI function tools, deterministic for the seed: distinct
``verb_noun`` names and small JSON-Schema parameters (an object of one to three properties, each a
bounded string, an enum or a bounded integer; one to all of them required; no additional
properties), the shapes agent frameworks send. Strings carry ``maxLength`` so a server that
constrains its calls (the mocker's ``--tool-call-rate``) writes calls of bounded size.

``ToolUse`` is what a conversation of the workload carries: the tools, the most tool rounds a
turn may take, the size of each synthetic tool result and the tools' mean running time
(``tool_pause``, the workload's ``--tool-pause``). ``tool_result`` is that result: a
deterministic text of ``result_tokens`` words (about one token each, as the workload's prompts),
a function of the seed and of where the call sits in the run (conversation, turn, round, call),
never of the call's arguments, so two runs on the same seed send the same results whatever the
server answered.
"""

from __future__ import annotations

import random
from typing import Any

import msgspec

from dyn.core.bench.words import WORDS

VERBS = (
    "search",
    "get",
    "list",
    "create",
    "update",
    "delete",
    "read",
    "run",
    "summarize",
    "fetch",
    "check",
    "schedule",
)
NOUNS = (
    "files",
    "issue",
    "orders",
    "ticket",
    "weather",
    "calendar_event",
    "customer",
    "invoice",
    "logs",
    "pull_request",
    "document",
    "metrics",
)
MAX_TOOLS = len(VERBS) * len(NOUNS)

_PARAMETERS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("query", {"type": "string", "description": "What to look for.", "maxLength": 20}),
    ("path", {"type": "string", "description": "A path in the workspace.", "maxLength": 24}),
    ("name", {"type": "string", "description": "A short name.", "maxLength": 12}),
    ("id", {"type": "string", "description": "The identifier.", "maxLength": 8}),
    ("limit", {"type": "integer", "description": "Most results to return.", "minimum": 1, "maximum": 50}),
    ("page", {"type": "integer", "description": "Page of the results, from 1.", "minimum": 1, "maximum": 20}),
    ("days", {"type": "integer", "description": "How many days back.", "minimum": 0, "maximum": 30}),
    ("status", {"type": "string", "enum": ["open", "closed", "all"]}),
    ("priority", {"type": "string", "enum": ["low", "medium", "high"]}),
    ("format", {"type": "string", "enum": ["json", "text", "markdown"]}),
    ("unit", {"type": "string", "enum": ["celsius", "fahrenheit"]}),
    ("language", {"type": "string", "enum": ["python", "go", "rust", "typescript"]}),
)


class ToolUse(msgspec.Struct, frozen=True, kw_only=True):
    """The tools a conversation offers on every request, and how its agent answers calls:
    at most ``max_rounds`` tool rounds per turn, results of ``result_tokens`` words, each round
    sent after a pause (the tools running) drawn with mean ``pause_s`` (``tool_pause``)."""

    tools: tuple[dict[str, Any], ...]
    max_rounds: int
    result_tokens: int
    seed: int
    pause_s: float = 0.0


def function_tools(n: int, seed: int) -> tuple[dict[str, Any], ...]:
    """``n`` function tools in OpenAI's ``tools`` shape, the same for the same ``seed``."""
    if not 0 <= n <= MAX_TOOLS:
        raise ValueError(f"--tools must be between 0 and {MAX_TOOLS} (got {n})")
    rng = random.Random(f"{seed}:tools")
    names = rng.sample([f"{verb}_{noun}" for verb in VERBS for noun in NOUNS], n)
    tools = []
    for name in names:
        chosen = rng.sample(_PARAMETERS, rng.randint(1, 3))
        required = [chosen[0][0]] + [key for key, _ in chosen[1:] if rng.random() < 0.5]
        verb, noun = name.split("_", 1)
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": f"{verb.capitalize()} {noun.replace('_', ' ')}.",
                    "parameters": {
                        "type": "object",
                        "properties": {key: dict(schema) for key, schema in chosen},
                        "required": required,
                        "additionalProperties": False,
                    },
                },
            }
        )
    return tuple(tools)


def tool_pause(use: ToolUse, conversation: str, turn: int, round_: int) -> float:
    """Seconds the tools of a round take: exponential with mean ``use.pause_s``, by position."""
    if use.pause_s <= 0:
        return 0.0
    return random.Random(f"{use.seed}:pause:{conversation}:{turn}:{round_}").expovariate(1.0 / use.pause_s)


def tool_result(use: ToolUse, conversation: str, turn: int, round_: int, call: int, name: str) -> str:
    """The synthetic result of one call: ``name``'s output as ``use.result_tokens`` words."""
    rng = random.Random(f"{use.seed}:result:{conversation}:{turn}:{round_}:{call}")
    words = " ".join(rng.choice(WORDS) for _ in range(max(use.result_tokens - 1, 0)))
    return f"{name}: {words}" if words else f"{name}:"
