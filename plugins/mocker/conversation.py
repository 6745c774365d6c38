"""The text of a chat prompt's last user message or tool result, read back from token ids (the
mocker sees no messages).

``LastMessage(tokenizer)`` learns the model's chat template once by rendering probe conversations
(``dyn.core.frontend.chat_template``, as the frontend renders them):

- the generation prompt: what ``add_generation_prompt`` appends after the last message;
- for a message of role user, of role tool (after an assistant tool call), and of the skipped
  roles ``system`` and ``developer`` (when the template renders them after an assistant turn): its
  *head*, the text between the end of the previous message (the assistant turn's closing text) and
  the content, and its *tail*, the text after the content (e.g.
  ``<|im_start|>user\\n<tool_response>\\n`` and ``\\n</tool_response><|im_end|>\\n`` in the
  Hermes/Qwen format).

``text(token_ids)`` decodes the prompt with its special tokens, drops the generation prompt, and
for each role whose tail ends the prompt looks back for the role's head; the latest head found
wins (the longer head on a tie: a Qwen tool result's head contains the user head). When the
winner is a system or developer message (agents such as OpenCode, Claude Code and Codex put one,
a reminder, after the last user message or tool result), that message is cut off and the search
runs again on what precedes it, at most ``MAX_SKIPPED`` times; otherwise the content in between is
the last message: the conversation's last user message or tool result. A prompt in which none is
found (a completion prompt, another template, ``chat_template_kwargs`` that change the rendering,
only system messages, more than ``MAX_SKIPPED`` of them at the end) is returned whole. Each search
is a few ``str.rfind`` over the prompt, so a 128k-token prompt costs milliseconds. Consecutive tool
results that a template renders as one turn come back together.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from dyn.core.frontend.chat_template import ChatTemplateError, compile_template
from dyn.core.frontend.tokenizer import Tokenizer

log = logging.getLogger(__name__)

MAX_SKIPPED = 16
"""Most trailing system / developer messages skipped to reach the last user message or tool result."""
SKIPPED_ROLES = ("system", "developer")
"""Roles whose messages are not what a scripted reply answers."""

_MARK = "\u2063DYN-PROBE-CONTENT\u2063"
_BEFORE = "\u2063DYN-PROBE-EARLIER\u2063"
_PROBE_CALL = {"id": "call_probe", "type": "function", "function": {"name": "probe", "arguments": "{}"}}


@dataclass(frozen=True, slots=True)
class _Frame:
    role: str
    head: str
    tail: str


class LastMessage:
    """Finds the last user message's or tool result's text in prompts rendered with ``tokenizer``'s
    chat template."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.generation_prompt = ""
        self.frames: tuple[_Frame, ...] = ()
        source = tokenizer.chat_template
        if source is None:
            return
        try:
            template = compile_template(source)
        except ChatTemplateError as exc:
            log.warning(
                "the model's chat template does not compile (%s); --replies matches whole prompts", exc
            )
            return

        def render(messages: list[dict], generation_prompt: bool) -> str | None:
            try:
                return template.render(
                    messages,
                    add_generation_prompt=generation_prompt,
                    bos_token=tokenizer.bos_token,
                    eos_token=tokenizer.eos_token,
                )
            except ChatTemplateError:
                return None

        user: list[dict] = [{"role": "user", "content": _BEFORE}]
        with_prompt, without = render(user, True), render(user, False)
        if with_prompt is not None and without is not None and with_prompt.startswith(without):
            self.generation_prompt = with_prompt[len(without) :]
        closing = _after(render([*user, {"role": "assistant", "content": _MARK}], False))
        frames = []
        if closing:
            answered = [*user, {"role": "assistant", "content": _BEFORE}]
            for role, earlier in (
                ("user", answered),
                ("tool", [*user, {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]}]),
                *((skipped, answered) for skipped in SKIPPED_ROLES),
            ):
                text = render(
                    [*earlier, {"role": role, "content": _MARK, "tool_call_id": "call_probe"}], False
                )
                if text is None or text.count(_MARK) != 1:
                    continue
                before, tail = text.split(_MARK)
                start = before.rfind(closing)
                head = before[start + len(closing) :] if start >= 0 else ""
                if head and _BEFORE not in head:
                    frames.append(_Frame(role, head, tail))
        self.frames = tuple(frames)

    def text(self, token_ids: Sequence[int]) -> str:
        """The last user message's or tool result's content (trailing system and developer messages
        skipped), or the whole decoded prompt when it cannot be told apart."""
        prompt = self.tokenizer.decode(token_ids, skip_special_tokens=False)
        return self.find(prompt)

    def find(self, prompt: str) -> str:
        """``text`` on a decoded prompt."""
        gen = self.generation_prompt
        if gen and prompt.endswith(gen):
            prompt = prompt[: len(prompt) - len(gen)]
        end = len(prompt)
        for _ in range(MAX_SKIPPED + 1):
            found = self._last(prompt, end)
            if found is None:
                break
            start, frame = found
            if frame.role not in SKIPPED_ROLES:
                return prompt[start + len(frame.head) : end - len(frame.tail)]
            end = start  # a system or developer message: look before it
        return prompt

    def _last(self, prompt: str, end: int) -> tuple[int, _Frame] | None:
        """Where the message ending ``prompt[:end]`` starts, and its frame; None when no role explains it."""
        best: tuple[int, int, _Frame] | None = None
        for frame in self.frames:
            if not prompt.endswith(frame.tail, 0, end):
                continue
            start = prompt.rfind(frame.head, 0, end - len(frame.tail))
            if start >= 0 and (best is None or (start, len(frame.head)) > best[:2]):
                best = (start, len(frame.head), frame)
        return None if best is None else (best[0], best[2])


def _after(text: str | None) -> str:
    """What a template writes after the probe content (the message's closing), or ""."""
    if text is None or text.count(_MARK) != 1:
        return ""
    return text.split(_MARK)[1]
