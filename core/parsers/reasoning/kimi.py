"""Moonshot Kimi reasoning: ``◁think▷`` ... ``◁/think▷`` (Kimi-VL-Thinking, Kimi k1.5; Dynamo's and
SGLang's ``kimi``) and the Kimi K2 thinking models' ``<think>`` ... ``</think>`` (vLLM's
``kimi_k2``, Dynamo's ``kimi_k25``).

``kimi`` waits for the model to open a section (as Dynamo's and SGLang's do). ``kimi_k2`` is in
reasoning from the start unless ``thinking`` (or ``enable_thinking``) is false; a tool-call
section (``<|tool_calls_section_begin|>``) written before ``</think>`` ends the reasoning and
starts the content, and whitespace before the end of the section is dropped, as vLLM does.
Dynamo's ``kimi_k25`` is the same reading without the kwargs switch; we follow vLLM.
"""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.think import TaggedReasoningParser


@REASONING_PARSERS.register("kimi")
class KimiReasoningParser(TaggedReasoningParser):
    """``◁think▷`` sections wherever the model opens them; a stray ``◁/think▷`` is dropped."""

    start_tags = ("◁think▷",)
    end_tags = ("◁/think▷",)
    reopens = True
    drops_stray_end = True


@REASONING_PARSERS.register("kimi_k2", "kimi_k25")
class KimiK2ReasoningParser(TaggedReasoningParser):
    """Kimi K2 Thinking / K2.5 (see the module)."""

    needs_special_tokens = True  # <|tool_calls_section_begin|> is a special token
    starts_in_reasoning = True
    thinking_keys = ("thinking", "enable_thinking")
    exits = ("<|tool_calls_section_begin|>",)
    drops_stray_end = True
    trims_reasoning_end = True
