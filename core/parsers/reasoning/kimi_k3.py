"""Moonshot Kimi K3 reasoning (vLLM's ``kimi_k3``): XTML channels built from the special tokens
``<|open|>``, ``<|sep|>`` and ``<|close|>``.

The template ends the prompt with ``<|open|>message role="assistant"<|sep|><|open|>think<|sep|>``,
so the model writes its reasoning, ``<|close|>think<|sep|>``, then its answer in a response channel
(``<|open|>response<|sep|>`` ... ``<|close|>response<|sep|>``) and any calls in a tools channel
(``<|open|>tools<|sep|>`` ...), and closes the message (``<|close|>message<|sep|>``).

The output is reasoning from its first character (a think opener the model writes anyway is
dropped) up to the think channel's end, unless ``thinking`` (or ``enable_thinking``) is false:
then it is all content. A response or tools channel opened before the think channel is closed
ends the reasoning there (vLLM reads an output that opens a response channel without any think
marker as content when it has the whole text, and as reasoning when streaming). The response
channel's markers and the message's end are dropped from the content, thinking on or off (vLLM
drops them when no tool parser reads the content; the tools channel stays for one). Each marker
is also read with a space on either side of its name (``<|open|> think <|sep|>``), as vLLM's
parser allows when special tokens are decoded with spaces between them.
"""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.think import TaggedReasoningParser


def _marker(side: str, name: str) -> tuple[str, str]:
    """An XTML marker as the model writes it, and as a decoder that spaces special tokens does."""
    return f"<|{side}|>{name}<|sep|>", f"<|{side}|> {name} <|sep|>"


@REASONING_PARSERS.register("kimi_k3")
class KimiK3ReasoningParser(TaggedReasoningParser):
    """Kimi K3's think channel (see the module)."""

    needs_special_tokens = True  # the XTML markers are special tokens
    start_tags = _marker("open", "think")
    end_tags = _marker("close", "think")
    starts_in_reasoning = True
    exits = _marker("open", "response") + _marker("open", "tools")
    drops = _marker("open", "response") + _marker("close", "response") + _marker("close", "message")

    def thinking(self) -> bool:
        # ``thinking`` when given, else ``enable_thinking`` (vLLM's order)
        kwargs = self.chat_template_kwargs
        value = kwargs.get("thinking")
        return bool(kwargs.get("enable_thinking", True) if value is None else value)
