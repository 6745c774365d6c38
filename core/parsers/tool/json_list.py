"""Calls written as JSON objects in a list: a JSON array (``[{"name": ..., "arguments": {...}},
...]``: Mistral before v11, Granite, Jamba) or objects one after another (``{...}; {...}``: Llama 3;
one object after each ``<function_call>``: Granite-20B-FC).

``CallObject`` reads one call object as it streams; ``JsonCallList`` reads the list, one
``CallObject`` per element, as a ``CallListReader``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import ClassVar

from dyn.core.parsers.events import Event
from dyn.core.parsers.text import JsonScanner
from dyn.core.parsers.tool.call_lists import CallListParser, CallListReader
from dyn.core.parsers.tool.cursor_list import CursorListReader
from dyn.core.parsers.tool.delimited import JsonCallBody

_STRING = r'"(?:[^"\\]|\\.)*"'
_PLAIN_VALUE = rf"(?:{_STRING}|-?\d[\d.eE+-]*|true|false|null)"

_OPEN, _NEXT, _ITEM, _AFTER = 0, 1, 2, 3
"""Before the list's first character; where an element (or the array's end) is due; inside an
element; after an element (a separator or the end is due)."""


class CallObject(JsonCallBody):
    """``JsonCallBody`` that also streams when keys with plain values (string, number, boolean,
    null) come before the name or between the name and the arguments: Llama 3.x writes
    ``{"type": "function", "name": ..., "parameters": {...}}``, and Mistral's objects may carry
    an ``"id"``. Arguments written before the name (Granite 3.1 writes ``{"arguments": {...},
    "name": ...}``) are read once the object is complete. An object without arguments, or whose
    arguments are no object, is no call (vLLM's JSON-list parsers read ``{"name": "Paris"}`` as
    an answer)."""

    def __init__(
        self, name_key: str = "name", args_keys: Sequence[str] = ("arguments", "parameters")
    ) -> None:
        super().__init__(name_key, args_keys)
        reserved = "|".join(re.escape(k) for k in (name_key, *args_keys))
        other = rf'"(?!(?:{reserved})")(?:[^"\\]|\\.)*"\s*:\s*{_PLAIN_VALUE}\s*,\s*'
        keys = "|".join(re.escape(k) for k in args_keys)
        self.head = re.compile(
            rf'\s*\{{\s*(?:{other})*"{re.escape(name_key)}"\s*:\s*({_STRING})\s*,\s*'
            rf'(?:{other})*"(?:{keys})"\s*:\s*'
        )

    def events(
        self, body: str, complete: bool, final: bool = False, name_key: str = "name"
    ) -> list[Event] | None:
        if not self._started and complete and not self._streams(body) and not self._has_arguments(body):
            return None
        return super().events(body, complete, final, name_key)

    def _streams(self, body: str) -> bool:
        match = self.head.match(body)
        return match is not None and body[match.end() : match.end() + 1] == "{"

    def _has_arguments(self, body: str) -> bool:
        """The object has arguments that are an object (or a string holding one)."""
        try:
            obj = json.loads(body)
            args = next(obj[k] for k in self.args_keys if k in obj) if isinstance(obj, dict) else None
            if isinstance(args, str):
                args = json.loads(args)
        except (ValueError, StopIteration):
            return False
        return isinstance(args, dict)


class JsonCallList(CursorListReader):
    """Reads JSON call objects as a list: ``array=True``: ``[{...}, {...}]``; ``array=False``:
    objects separated by ``separator`` or by nothing but whitespace (``separator=None``: a
    single object); ``array=None``: whichever the text starts with. Whitespace may come before
    and between everything.

    Each element streams as ``CallObject`` does. An element that is not a call object ends the
    list after the previous call (or, first, makes the list unreadable); so does anything else
    where a separator is due. A list cut off by the end of the stream ends where it got (a call
    cut off after its name streams as far as it got, without its end).
    """

    def __init__(self, array: bool | None = True, separator: str | None = None) -> None:
        super().__init__()
        self.array = array
        self.separator = separator
        self._phase = _OPEN
        self._item_at = 0
        self._scanner = JsonScanner()
        self._object = CallObject()

    def in_call(self) -> bool:
        return self._phase == _ITEM

    def read_call(self, text: str, final: bool, events: list[Event]) -> bool:
        self._read_item(text, final, events)
        return self._phase != _ITEM

    def read_between(self, text: str, pos: int, final: bool, events: list[Event]) -> bool:
        char = text[pos]
        if self._phase == _OPEN:
            if self.array is None:
                self.array = char == "["
            if self.array and char == "[":
                self._pos = pos + 1
                self._phase = _NEXT
            elif not self.array and char == "{":
                self._begin_item(pos)
            else:
                self.failed = True
        elif self._phase == _NEXT:
            if char == "{":
                self._begin_item(pos)
            elif char == "]" and self.array:
                self.end = pos + 1
            else:
                self._stop()
        elif self.array:
            if char == ",":
                self._pos = pos + 1
                self._phase = _NEXT
            elif char == "]":
                self.end = pos + 1
            else:
                self._stop()
        elif self.separator and text.startswith(self.separator, pos):
            self._pos = pos + len(self.separator)
            self._phase = _NEXT
        elif self.separator and char == "{":
            self._begin_item(pos)
        elif self.separator and self.separator.startswith(text[pos:]) and not final:
            return False
        else:
            self._stop()
        return True

    def _begin_item(self, pos: int) -> None:
        self._item_at = pos
        self._scanner = JsonScanner()
        self._object.reset()
        self._phase = _ITEM

    def _read_item(self, text: str, final: bool, events: list[Event]) -> None:
        item = text[self._item_at :]
        end = self._scanner.scan(item)
        if end < 0:
            got = self._object.events(item, complete=False, final=final)
            if got is None:
                self._stop()
            else:
                events.extend(self.count(got))
                if final:
                    self.end = len(text)
            return
        got = self._object.events(item[:end], complete=True, final=final)
        if got is None:
            self._stop()
            return
        events.extend(self.count(got))
        self._last_end = self._pos = self._item_at + end
        self._phase = _AFTER
        if not self.array and not self.separator:
            self.end = self._last_end


class JsonListParser(CallListParser):
    """A ``CallListParser`` whose every list is JSON call objects (``JsonCallList``), an array or
    not as ``json_array`` says (``None``: whichever the text starts with)."""

    json_array: ClassVar[bool | None] = True

    def reader(self, marker: str) -> CallListReader:
        return JsonCallList(array=self.json_array)
