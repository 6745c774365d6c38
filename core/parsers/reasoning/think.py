"""Reasoning between a start and an end tag (``<think>`` ... ``</think>``): DeepSeek-R1, Qwen3,
GLM-4.5, Step-3, OLMo 3, Seed-OSS and the formats that follow R1's convention, and the machine
(``TaggedReasoningParser``) the other tag families (``kimi``, ``mistral``, ``granite``,
``answer``, ``minimax``, ``nemotron``, ``deepseek_v4``, ``gemma4``, ``kimi_k3``, ``minimax_m3``)
configure.

Where the output starts:

1. The rendered prompt's tail decides first: a prompt that ends with the end tag (the template
   closed an empty section: thinking off) starts in content, verbatim; one that ends with the
   start tag (the template opened the section: DeepSeek-R1, QwQ, Qwen3 thinking-2507 and
   Qwen3.5, GLM-4.7) starts in reasoning.
2. Else the request's ``chat_template_kwargs`` (``thinking_keys``, e.g. Qwen3's
   ``enable_thinking``): thinking switched off starts in content, verbatim.
3. Else the format's default: ``starts_in_reasoning`` formats (vLLM's reading of DeepSeek-R1,
   Qwen3, GLM-4.5, MiniMax-M2, Kimi K2, Step-3) are in reasoning from the first character, a
   start tag the model writes anyway (after whitespace) being dropped; the others (Dynamo's
   ``basic``, ``kimi``, ``mistral``, ``granite``) are content until a start tag opens a section
   (whitespace before a start tag at the very beginning is dropped).

Reasoning ends at the end tag (dropped, with the whitespace right after it) or at an ``exits``
marker (a tool-call start such as Qwen3.5's ``<tool_call>`` written before closing the section:
it and what follows are content). Reasoning that never ends (``max_tokens``) stays reasoning.
After the section, content is verbatim except that ``drops_stray_end`` formats drop a second
end tag and ``reopens`` formats open another section at a later start tag (GLM's interleaved
thinking, Dynamo's ``basic``). A format may also name a ``section_label`` the model writes right
after opening a section (dropped) and ``drops``, markers dropped from the content wherever they
are; and it may read the prompt its own way (``opened_by_prompt``).

Where vLLM and Dynamo disagree on a name both have, these follow vLLM (Dynamo-only names such as
``basic`` follow Dynamo): vLLM's ``qwen3`` and ``glm45`` start in reasoning unless thinking is
off, while Dynamo's wait for ``<think>`` (Dynamo's ``glm45`` is its ``nemotron_deci``), and
Dynamo's parsers open a new section at every later ``<think>`` where vLLM's (except GLM's) read
it as content. Differences from vLLM: the prompt's tail is read as
text (vLLM looks for the last tag among the prompt's token ids); a closed section in the prompt
(or thinking off) makes the whole output content, where vLLM's unary path would still split at an
end tag the model wrote anyway; a ``<think>`` is dropped only at the start of a section (vLLM's
newest parsers drop it anywhere inside one); the whitespace after the end tag is dropped, as
Dynamo does (vLLM keeps it).
"""

from __future__ import annotations

from typing import ClassVar

from dyn.core.parsers.events import Event, Reasoning
from dyn.core.parsers.reasoning import REASONING_PARSERS, ReasoningParser
from dyn.core.parsers.stream import BufferedParser
from dyn.core.parsers.text import find_first, split_held

_OPEN, _REASONING, _CONTENT = 0, 1, 2
"""Before any section (a start tag may open one), inside one, after one (or thinking off)."""
_NO_ANSWER, _ANSWER_NEXT, _IN_ANSWER = 0, 1, 2


class TaggedReasoningParser(BufferedParser, ReasoningParser):
    """Reasoning between ``start_tags`` and ``end_tags``, as described in the module; the class
    attributes are the format."""

    start_tags: tuple[str, ...] = ("<think>",)
    end_tags: tuple[str, ...] = ("</think>",)
    """The tags, class attributes a parser may set per instance before ``setup`` reads them (tags
    that depend on the request's effort or the checkpoint)."""
    starts_in_reasoning: ClassVar[bool] = False
    """The output is reasoning from its first character unless the prompt or kwargs say not."""
    thinking_keys: ClassVar[tuple[str, ...]] = ()
    """``chat_template_kwargs`` that switch thinking; thinking is on if any given one is true."""
    thinking_default: ClassVar[bool] = True
    """Whether thinking is on when the request sets none of ``thinking_keys``."""
    exits: ClassVar[tuple[str, ...]] = ()
    """Markers that end reasoning without the end tag; they begin the content."""
    reopens: ClassVar[bool] = False
    """A start tag after a section opens another one."""
    drops_stray_end: ClassVar[bool] = False
    """An end tag outside a section is dropped."""
    trims_reasoning_start: ClassVar[bool] = False
    """Whitespace at the start of a reasoning section is dropped."""
    trims_reasoning_end: ClassVar[bool] = False
    """Whitespace right before the end tag (or an exit) is dropped."""
    answer_tags: ClassVar[tuple[str, str] | None] = None
    """Tags that may wrap the content right after the section (``<answer>``, ``</answer>``);
    they are dropped with the whitespace inside them and after the closing one."""
    section_label: ClassVar[str] = ""
    """A name the model writes right after opening a section (Gemma 4's ``thought\\n``): dropped
    there."""
    drops: ClassVar[tuple[str, ...]] = ()
    """Markers dropped from the content wherever they are, thinking on or off (Kimi K3's
    response-channel wrapper)."""

    def setup(self) -> None:
        super().setup()
        opened = self.opened_by_prompt(self.prompt_text or "")
        enabled = True
        if opened is False:
            state, enabled = _CONTENT, False
        elif opened:
            state = _REASONING
        elif not self.thinking():
            state, enabled = _CONTENT, False
        else:
            state = _REASONING if self.starts_in_reasoning and not self.constrained else _OPEN
        self._state = state
        self._at_start = True
        """Nothing emitted yet: leading whitespace and a start tag may still be dropped."""
        self._trim_lead = state == _REASONING and self.trims_reasoning_start
        self._strip = False
        """Drop the whitespace that starts the next content."""
        self._answer = _ANSWER_NEXT if self.answer_tags and state == _CONTENT else _NO_ANSWER
        self._label = bool(self.section_label) and state == _REASONING
        """The section just opened: its label may still follow."""
        markers: tuple[str, ...] = self.drops
        if enabled:
            markers += (self.end_tags if self.drops_stray_end else ()) + (
                self.start_tags if self.reopens else ()
            )
        self._content_markers = markers
        tags = self.start_tags + self.end_tags + self.exits + (self.answer_tags or ()) + self.drops
        self._marker_chars = frozenset(tag[0] for tag in tags)
        """A piece without any of these cannot touch a tag: outside a section it is content as is."""

    def opened_by_prompt(self, prompt: str) -> bool | None:
        """Where the rendered prompt leaves the output: True inside a section (the template opened
        it), False after one (the template closed it: thinking off, the output is content
        verbatim), None when it does not say. Read from the prompt's tail."""
        tail = prompt.rstrip()
        if tail.endswith(self.end_tags):
            return False
        if tail.endswith(self.start_tags):
            return True
        return None

    def thinking(self) -> bool:
        """Whether the request has thinking on (``thinking_keys``, else ``thinking_default``)."""
        kwargs = self.chat_template_kwargs
        given = [kwargs[k] for k in self.thinking_keys if k in kwargs]
        return any(bool(v) for v in given) if given else self.thinking_default

    def feed(self, text: str) -> list[Event]:
        if not text:
            return []
        if (
            self._state != _REASONING
            and not self._buf
            and not self._strip
            and not self._at_start
            and self._answer == _NO_ANSWER
            and (
                (self._state == _CONTENT and not self._content_markers) or self._marker_chars.isdisjoint(text)
            )
        ):
            return [text]
        return super().feed(text)

    def _run(self, final: bool) -> list[Event]:
        events: list[Event] = []
        while True:
            if self._state == _REASONING:
                moved = self._reasoning(events, final)
            elif self._state == _CONTENT:
                moved = self._content(events, final)
            else:
                moved = self._open(events, final)
            if not moved:
                return events

    # Each step reads ``self._buf`` in its state. True: it read a marker (the state may have
    # changed), run again; False: it needs more text (what it cannot decide yet stays buffered).

    def _open(self, events: list[Event], final: bool) -> bool:
        buf = self._buf
        markers = self.start_tags + (self.end_tags if self.drops_stray_end else ()) + self.drops
        hit = find_first(buf, markers)
        if hit is None:
            ready, held = split_held(buf, markers, final)
            if self._at_start and not final and not ready.strip():
                return False
            self._emit_content(events, ready)
            self._buf = held
            return False
        at, marker = hit
        before = buf[:at]
        if not (self._at_start and not before.strip()):
            self._emit_content(events, before)
        self._at_start = False
        self._buf = buf[at + len(marker) :]
        if marker in self.start_tags:
            self._enter_reasoning()
        return True

    def _reasoning(self, events: list[Event], final: bool) -> bool:
        buf = self._buf
        if self._at_start:
            lead = buf.lstrip()
            if not final and (
                not lead or any(len(lead) < len(t) and t.startswith(lead) for t in self.start_tags)
            ):
                return False
            for tag in self.start_tags:
                if lead.startswith(tag):
                    buf = lead[len(tag) :]
                    break
            self._at_start = False
        if self._label:
            label = self.section_label
            if not final and len(buf) < len(label) and label.startswith(buf):
                self._buf = buf
                return False
            if buf.startswith(label):
                buf = buf[len(label) :]
            self._label = False
        if self._trim_lead:
            buf = buf.lstrip()
            if not buf:
                self._buf = ""
                return False
            self._trim_lead = False
        markers = self.end_tags + self.exits
        hit = find_first(buf, markers)
        if hit is None:
            text = split_held(buf, markers, final)[0]
            if self.trims_reasoning_end and not final:
                text = text.rstrip()
            if text:
                events.append(Reasoning(text))
            self._buf = buf[len(text) :]
            return False
        at, marker = hit
        text = buf[:at].rstrip() if self.trims_reasoning_end else buf[:at]
        if text:
            events.append(Reasoning(text))
        self._state = _CONTENT
        if marker in self.end_tags:
            self._buf = buf[at + len(marker) :]
            self._strip = True
            self._answer = _ANSWER_NEXT if self.answer_tags else _NO_ANSWER
        else:
            self._buf = buf[at:]
            self._answer = _NO_ANSWER
        return True

    def _content(self, events: list[Event], final: bool) -> bool:
        buf = self._buf
        if self._strip:
            buf = buf.lstrip()
            if not buf:
                self._buf = ""
                return False
            self._strip = False
        if self._answer == _ANSWER_NEXT:
            assert self.answer_tags is not None
            opening = self.answer_tags[0]
            if buf.startswith(opening):
                self._buf = buf[len(opening) :]
                self._answer, self._strip = _IN_ANSWER, True
                return True
            if not final and opening.startswith(buf):
                self._buf = buf
                return False
            self._answer = _NO_ANSWER
        closing = self.answer_tags[1] if self._answer == _IN_ANSWER and self.answer_tags else None
        markers = self._content_markers + ((closing,) if closing else ())
        hit = find_first(buf, markers) if markers else None
        if hit is None:
            text = split_held(buf, markers, final)[0]
            if closing and not final:
                text = text.rstrip()
            self._emit_content(events, text)
            self._buf = buf[len(text) :]
            return False
        at, marker = hit
        self._emit_content(events, buf[:at].rstrip() if marker == closing else buf[:at])
        self._buf = buf[at + len(marker) :]
        if marker == closing:
            self._answer, self._strip = _NO_ANSWER, True
        elif marker in self.start_tags:
            self._enter_reasoning()
        return True

    def _enter_reasoning(self) -> None:
        self._state = _REASONING
        self._trim_lead = self.trims_reasoning_start
        self._label = bool(self.section_label)

    def _emit_content(self, events: list[Event], text: str) -> None:
        if text:
            events.append(text)
            self._at_start = False


@REASONING_PARSERS.register("basic")
class BasicReasoningParser(TaggedReasoningParser):
    """Dynamo's ``basic``: ``<think>`` sections wherever the model opens them; content before,
    between and after; a stray ``</think>`` is dropped."""

    reopens = True
    drops_stray_end = True


@REASONING_PARSERS.register("deepseek_r1")
class DeepSeekR1ReasoningParser(TaggedReasoningParser):
    """DeepSeek-R1: its template ends the prompt with ``<think>\\n`` and the model writes only
    the end tag; an output without one is all reasoning (vLLM's ``deepseek_r1``, Dynamo's
    force-reasoning ``deepseek_r1``). Also Dynamo's choice for DeepSeek V3.1/V3.2."""

    starts_in_reasoning = True


@REASONING_PARSERS.register("deepseek_v3")
class DeepSeekV3ReasoningParser(DeepSeekR1ReasoningParser):
    """DeepSeek V3.1+ hybrid models (vLLM's ``deepseek_v3``): R1's reading when the request
    sets ``thinking`` (or ``enable_thinking``), else all content."""

    thinking_keys = ("thinking", "enable_thinking")
    thinking_default = False


@REASONING_PARSERS.register("qwen3", "qwen3_thinking", "mimo")
class Qwen3ReasoningParser(TaggedReasoningParser):
    """Qwen3, QwQ, Qwen3.5 (vLLM's ``qwen3``; also its ``mimo``, SGLang's ``qwen3-thinking``):
    reasoning from the start unless ``enable_thinking`` is false, so an output with
    ``</think>`` but no ``<think>`` (the 2507 thinking models and Qwen3.5, whose templates open
    the section) splits there; ``<tool_call>`` inside the section ends it (Qwen3.5 calls tools
    without closing it first); a second ``</think>`` is dropped. The Instruct-2507 models never
    think: as with vLLM, serve them without a reasoning parser, or their answer reads as reasoning."""

    starts_in_reasoning = True
    thinking_keys = ("enable_thinking",)
    exits = ("<tool_call>",)
    drops_stray_end = True


@REASONING_PARSERS.register("glm45", "glm47", "ling3")
class Glm45ReasoningParser(TaggedReasoningParser):
    """GLM-4.5/4.6/4.7, GLM-5 and Ling 3 (vLLM's ``glm45``/``glm47``/``ling3``): reasoning from
    the start unless ``thinking``/``enable_thinking`` is false (GLM-4.5's template then closes an
    empty section in the prompt); ``<tool_call>`` ends a section; a later ``<think>`` (interleaved
    thinking between tool calls) opens another. Dynamo's ``glm45`` instead waits for ``<think>``."""

    starts_in_reasoning = True
    thinking_keys = ("thinking", "enable_thinking")
    exits = ("<tool_call>",)
    reopens = True
    drops_stray_end = True


@REASONING_PARSERS.register("step3")
class Step3ReasoningParser(TaggedReasoningParser):
    """StepFun Step-3 (vLLM's and Dynamo's ``step3``): the model writes only ``</think>``;
    everything before it is reasoning, whitespace before the end tag dropped."""

    starts_in_reasoning = True
    trims_reasoning_end = True


@REASONING_PARSERS.register("step3p5")
class Step3p5ReasoningParser(Step3ReasoningParser):
    """StepFun Step-3.5 and Step-3.7 (vLLM's ``step3p5``): Step-3's reading (the template always
    opens the section with ``<think>\\n``, and thinking cannot be switched off) with Qwen3's
    tool calls: a ``<tool_call>`` written inside the section ends it, a second ``</think>`` is
    dropped. The model writes ``\\n</think>\\n``; both newlines are dropped."""

    exits = ("<tool_call>",)
    drops_stray_end = True


@REASONING_PARSERS.register("olmo3")
class Olmo3ReasoningParser(TaggedReasoningParser):
    """AI2 OLMo 3 Think (vLLM's ``olmo3``): plain-text tags; its template may write the
    ``<think>`` itself, so reasoning runs from the start to ``</think>``."""

    starts_in_reasoning = True


@REASONING_PARSERS.register("seed_oss")
class SeedOssReasoningParser(TaggedReasoningParser):
    """ByteDance Seed-OSS (vLLM's ``seed_oss``): Qwen3's reading with ``<seed:think>`` tags and
    ``<seed:tool_call>`` calls; budget notes (``<seed:cot_budget_reflect>``) stay reasoning."""

    needs_special_tokens = True
    start_tags = ("<seed:think>",)
    end_tags = ("</seed:think>",)
    starts_in_reasoning = True
    thinking_keys = ("enable_thinking",)
    exits = ("<seed:tool_call>",)
    drops_stray_end = True
