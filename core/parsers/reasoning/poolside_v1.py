"""Poolside Laguna reasoning (vLLM's ``poolside_v1``): DeepSeek-V3's ``<think>`` sections, the
prompt read only from the current assistant turn on.

Format (Laguna's chat template): the generation prompt ends with ``<assistant><think>`` when the
request sets ``enable_thinking`` and with ``<assistant></think>`` when it does not, so the model
writes its reasoning, ``</think>``, then the answer (or calls, ``poolside_v1`` tool parser):

    The user wants the weather in Paris, so I will call get_weather.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>

It is vLLM's ``deepseek_v3`` reading (``think.DeepSeekV3ReasoningParser``: reasoning up to
``</think>`` when thinking is on, all content when it is off), except where the prompt says the
output starts: only tags after the prompt's last ``<assistant>`` count, so a ``</think>`` in an
earlier turn, a tool description or a few-shot example does not end the section before the output
starts. The last ``<think>`` or ``</think>`` of that turn decides (the section is open, or closed:
the output is content); without either, ``enable_thinking`` (or ``thinking``) does.
"""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.think import DeepSeekV3ReasoningParser

ASSISTANT = "<assistant>"


@REASONING_PARSERS.register("poolside_v1")
class PoolsideV1ReasoningParser(DeepSeekV3ReasoningParser):
    def opened_by_prompt(self, prompt: str) -> bool | None:
        turn = prompt[prompt.rfind(ASSISTANT) + len(ASSISTANT) :] if ASSISTANT in prompt else prompt
        opened = max(turn.rfind(tag) for tag in self.start_tags)
        closed = max(turn.rfind(tag) for tag in self.end_tags)
        if opened == closed:  # neither
            return None
        return opened > closed
