"""Hugging Face ``response_template`` metadata read with transformers' own engine: what the ``hf``
tool-call and reasoning parsers (vLLM's ``--tool-call-parser hf`` / ``--reasoning-parser hf``) share.

A checkpoint's tokenizer_config.json may carry ``response_template``, a declarative description of
the assistant message: its fields (``thinking``, ``content``, ``tool_calls``), each a region between
an open and a close anchor (literals or regular expressions; at most one field without an open
anchor takes the text outside the others), with a content parser (``text``, ``json``,
``xml-inline``, ...) and a transform that shapes the parsed value, plus a ``start_anchor`` that marks
where the assistant message starts in the prompt. ``transformers.utils.chat_parsing.ResponseParser``
streams a text through it (events ``region_open``, ``region_chunk``, ``region_close`` with the
parsed value); dyn uses that engine and does not implement the grammar.

``serving_template(tokenizer, kind)`` checks a served model's template once (cached per template):
it must load, name no field but these three and no default but ``role``, keep ``thinking`` and
``content`` plain text (no transform or join, so they stream as they come), give ``tool_calls`` an
open anchor (dyn: a tool field that takes all leftover text reads no call), and have the field the
parser needs. It then makes every field optional and, when no field takes the leftover text and
``content`` is absent, adds an implicit ``content`` field (as vLLM's adapter does). What it refuses
raises ``ParserModelError`` saying what to fix.

``TemplateReader`` reads one choice: the rendered prompt is the engine's prefix (the template's
``start_anchor`` cuts it to the assistant message, so a prompt that opened ``<think>`` starts the
output in reasoning), then the output piece by piece. ``thinking`` chunks become ``Reasoning``,
``content`` chunks content (their anchors are dropped), and a ``tool_calls`` region either
becomes calls when it closes (``calls=True``: each ``{"function": {"name", "arguments"}}`` of its
value, arguments typed by the request's tool schemas) or passes through verbatim, anchors
included (``calls=False``, the reasoning parser: another tool-call parser can still read it).
Text outside every region, where the template has no field for it, is dropped, as the engine does.

Engine hooks: transformers 5.24's ``ResponseParser`` reports neither where a region's anchors are
nor a region whose value does not parse (it raises from ``feed``), and keeps the whole output in
one string it copies at every piece (quadratic). ``_Engine`` subclasses it over four of its
internals (``_accumulate``, ``_open_explicit``, ``_close_current``, ``_reset_to_implicit``; the
state ``_buffer``, ``_pos``, ``_body``, ``_current``): events carry their anchor text, a region
that fails becomes ``region_malformed``, and the text already read is dropped from the buffer
(keeping ``_KEEP`` characters for look-behinds; a ``^``-anchored pattern matches the same, only at
the buffer's start before any output), so the cost per character stays constant. ``require_engine``
(the parsers' ``check``) refuses a transformers without those internals.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
from collections.abc import Mapping, Sequence
from typing import Any

from dyn.core.parsers.events import TOOL_CALL_END, Event, Reasoning, ToolCallArgs, ToolCallStart
from dyn.core.parsers.registry import ParserModelError, ParserUnavailable

THINKING, CONTENT, TOOL_CALLS = "thinking", "content", "tool_calls"
FIELDS = (THINKING, CONTENT, TOOL_CALLS)

_TRIM_AT = 16384
"""Characters read before the engine's buffer is cut (then ``_KEEP`` of them stay)."""
_KEEP = 1024

_HOOKS = {
    "_accumulate": 3,
    "_open_explicit": 4,
    "_close_current": 2,
    "_reset_to_implicit": 1,
}
"""The engine internals ``_Engine`` overrides, with their parameter counts (self included)."""


@functools.cache
def _engine() -> type:
    """The engine class (imports transformers, ~1 s the first time); ``ParserUnavailable`` when
    the installed transformers has no response-template engine dyn can drive."""
    try:
        from transformers.utils.chat_parsing import ResponseParser
    except ImportError as exc:
        raise ParserUnavailable(
            "the hf parsers need transformers' response-template engine "
            f"(transformers.utils.chat_parsing, transformers 5.24 has it): {exc}; upgrade transformers"
        ) from None
    for name, count in _HOOKS.items():
        method = getattr(ResponseParser, name, None)
        if method is None or len(inspect.signature(method).parameters) != count:
            raise ParserUnavailable(
                f"the hf parsers drive transformers' ResponseParser through {name}(), which this "
                "transformers changes (dyn was built against 5.24); install transformers 5.24"
            )
    return _subclass(ResponseParser)


def require_engine() -> None:
    """Raise ``ParserUnavailable`` when the engine cannot run here (the parsers' ``check``)."""
    _engine()


def _subclass(base: Any) -> type:
    class _Engine(base):
        """``ResponseParser`` with anchor texts on its events, ``region_malformed`` for a region
        whose value fails, a list for the open region's body, and a buffer cut as it is read."""

        _buffer: str  # the engine's state this class reads or sets
        _pos: int
        _body: str
        _current: str | None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.base = 0  # characters cut from the buffer's start
            self._parts: list[str] = []
            self._read_to = 0  # where the text read so far ends (buffer position)
            super().__init__(*args, **kwargs)
            self.prefix_end = len(self._buffer)
            """Where the output starts in the (uncut) buffer: after the prompt's kept tail."""

        def feed(self, text: str) -> list[dict]:
            events: list[dict] = super().feed(text)
            if self._pos > _TRIM_AT:
                cut = self._pos - _KEEP
                self._buffer = self._buffer[cut:]
                self._pos -= cut
                self._read_to -= cut
                self.base += cut
            return events

        def _accumulate(self, events: list[dict], text: str) -> None:
            start, n = self.base + self._pos, len(events)
            self._body = ""  # the body is kept in _parts (joined on close), not re-copied
            super()._accumulate(events, text)
            if len(events) > n:
                self._parts.append(text)
                events[-1]["start"] = start
            self._read_to = self._pos + len(text)

        def _open_explicit(self, events: list[dict], field: Any, m: Any) -> None:
            super()._open_explicit(events, field, m)
            self._parts = []
            self._read_to = m.end()
            events[-1]["start"], events[-1]["anchor"] = self.base + m.start(), m.group(0)

        def _close_current(self, events: list[dict]) -> None:
            n, field = len(events), self._current
            anchor_start = self.base + self._read_to
            anchor = self._buffer[self._read_to : self._pos]
            self._body = "".join(self._parts)
            try:
                super()._close_current(events)
            except Exception as error:  # a value the template's parser or transform cannot build
                del events[n:]
                events.append({"type": "region_malformed", "field": field, "error": error})
                self._reset_to_implicit()
            if len(events) > n:
                events[-1]["start"], events[-1]["anchor"] = anchor_start, anchor

        def _reset_to_implicit(self) -> None:
            super()._reset_to_implicit()
            self._parts = []

    return _Engine


# ------------------------------------------------------------------------------- the template


_LOADED: dict[int, tuple[Any, Any]] = {}
"""id of a template dict -> (that dict, its serving form or the reason it is refused)."""


def _serving_form(raw: Any) -> Any:
    """The serving form of ``raw`` (a ``ResponseTemplate``), or a ``str`` saying what is wrong."""
    from transformers.utils.chat_parsing.response_templates import load_response_template

    try:
        loaded = load_response_template(raw)
    except Exception as exc:  # ValueError mostly; a value of the wrong type may raise others
        return str(exc)
    fields = loaded.fields
    if extra := sorted(set(fields) - set(FIELDS)):
        return f"it has fields {extra}, which the OpenAI response has no place for (allowed: {list(FIELDS)})"
    if extra := sorted(set(loaded.defaults) - {"role"}):
        return f"its defaults set {extra}; only 'role' may have a default"
    for name in (THINKING, CONTENT):
        field = fields.get(name)
        if field is not None and (field.content != "text" or field.transform or field.join):
            return f"its {name!r} field is not plain text (content 'text', no transform, no join), so it cannot stream"
    tools = fields.get(TOOL_CALLS)
    if tools is not None and tools.open_re is None:
        return "its 'tool_calls' field has no open anchor (open or open_pattern)"
    spec = copy.deepcopy(raw)
    if CONTENT not in spec["fields"] and all(f.open_re is not None for f in fields.values()):
        spec["fields"][CONTENT] = {}
    for field_spec in spec["fields"].values():
        field_spec["optional"] = True
    return load_response_template(spec)


def serving_template(tokenizer: Any, kind: str) -> Any:
    """The served model's template in its serving form, for the ``kind`` (``tool`` or
    ``reasoning``) parser; ``ParserModelError`` says what to fix."""
    flag, needed = ("--tool-call-parser", TOOL_CALLS) if kind == "tool" else ("--reasoning-parser", THINKING)
    raw = getattr(tokenizer, "response_template", None)
    where = getattr(tokenizer, "path", None)
    config = f"{where}/tokenizer_config.json" if where is not None else "tokenizer_config.json"
    if raw is None:
        raise ParserModelError(
            f"{flag} hf needs a response_template in the model's tokenizer_config.json ({config} "
            "has none): the checkpoint's description of its assistant message (thinking, content, "
            "tool_calls); add one, or pick the parser of the model's format"
        )
    _engine()
    entry = _LOADED.get(id(raw))
    if entry is None or entry[0] is not raw:
        if len(_LOADED) >= 64:
            _LOADED.clear()
        entry = _LOADED[id(raw)] = (raw, _serving_form(raw))
    form = entry[1]
    if isinstance(form, str):
        raise ParserModelError(f"{flag} hf cannot use the response_template of {config}: {form}; fix it")
    if needed not in form.fields:
        raise ParserModelError(
            f"{flag} hf needs a response_template with a {needed!r} field; the one of {config} has "
            f"{sorted(set(form.fields) & set(raw.get('fields', {})))}: add the field, or pick another parser"
        )
    return form


# ------------------------------------------------------------------------------- one choice


def _call_texts(value: Any) -> list[tuple[str, str]] | None:
    """``(name, arguments JSON object text)`` of every call in a ``tool_calls`` region's value,
    or None when any is not ``{"function": {"name": str, "arguments": object}}``."""
    calls = []
    for item in value if isinstance(value, list) else [value]:
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(function, dict):
            return None
        name, arguments = function.get("name"), function.get("arguments")
        if not isinstance(name, str) or not name:
            return None
        try:
            if isinstance(arguments, str):  # JSON text the model wrote: kept verbatim
                if not isinstance(json.loads(arguments), dict):
                    return None
                text = arguments
            elif isinstance(arguments, dict):
                text = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
            else:
                return None
        except ValueError:
            return None
        calls.append((name, text))
    return calls or None


class TemplateReader:
    """One choice read through a serving template (see the module docstring)."""

    __slots__ = ("_engine", "_calls", "_raw", "_fed", "_done")

    def __init__(
        self,
        template: Any,
        prompt_text: str | None,
        tools: Sequence[Any] = (),
        *,
        calls: bool,
    ) -> None:
        specs = [
            {"type": "function", "function": {"name": t.name, "parameters": _plain(t.parameters)}}
            for t in tools
        ]
        self._engine = _engine()(template, prefix=prompt_text or "", tools=specs)
        self._calls = calls
        self._raw: list[str] = []
        """The open tool region's text so far, anchors included (``calls``)."""
        self._fed = False
        self._done = False

    def feed(self, text: str) -> list[Event]:
        if not text or self._done:
            return []
        self._fed = True
        return self._route(self._engine.feed(text))

    def finish(self) -> list[Event]:
        if self._done:
            return []
        self._done = True
        if not self._fed:  # nothing generated: what the engine holds is the prompt's
            return []
        return self._route(self._engine.finalize()[1])

    def _output(self, event: dict, text: str) -> str:
        """``text`` (found at the event's ``start``) less what belongs to the prompt."""
        cut = self._engine.prefix_end - event.get("start", self._engine.prefix_end)
        return text[cut:] if cut > 0 else text

    def _route(self, events: list[dict]) -> list[Event]:
        out: list[Event] = []
        for event in events:
            kind, field = event["type"], event.get("field")
            if field == TOOL_CALLS:
                self._tool_event(event, kind, out)
            elif kind == "region_chunk":
                text = self._output(event, event["text"])
                if text:
                    out.append(Reasoning(text) if field == THINKING else text)
        return out

    def _tool_event(self, event: dict, kind: str, out: list[Event]) -> None:
        if kind == "region_chunk":
            text = self._output(event, event["text"])
        else:
            text = self._output(event, event.get("anchor", ""))
        if not self._calls:
            if text:
                out.append(text)
            return
        self._raw.append(text)
        if kind not in ("region_close", "region_malformed"):
            return
        raw, self._raw = "".join(self._raw), []
        calls = _call_texts(event["value"]) if kind == "region_close" else None
        if calls is None:  # not a call the OpenAI response can carry: the text stays content
            if raw:
                out.append(raw)
            return
        for name, arguments in calls:
            out += (ToolCallStart(name), ToolCallArgs(arguments), TOOL_CALL_END)


def _plain(value: Any) -> Any:
    """``value`` with mappings as dicts and sequences as lists (the engine reads plain JSON)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
