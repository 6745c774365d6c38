"""vLLM tool-parser plugins run as dyn tool-call parsers (``--tool-parser-plugin`` on a file
written for vLLM), when vLLM's parser classes are importable in the frontend's environment.

Registration: ``load_plugin`` imports the file; when that imported vLLM's ``ToolParser``,
``register_vllm_parsers`` finds the names vLLM's ``ToolParserManager`` maps to classes the file
defines (its ``register_module`` decorator fills ``lazy_parsers``, ``register_module(module=...)``
fills ``tool_parsers``) and registers a ``VllmToolParser`` subclass under each in
``TOOL_PARSERS``. A name dyn's own parsers take stays dyn's (as for dyn plugins); a warning says
so. Importing vLLM's parser classes imports torch (5 s and 0.5 GB here): only such a plugin pays it.

One adapter per choice, as dyn's contract has it (``dyn.core.parsers.tool``):

- The vLLM parser is built as vLLM's serving builds it, ``cls(tokenizer, tools)`` (or
  ``cls(tokenizer)`` when its ``__init__`` takes no tools, as seed 004's example): the tokenizer
  is vLLM's own loaded from the directory of the served model's tokenizer (cached per directory;
  the first request of a model pays the load), the tools are the request's as vLLM's
  ``ChatCompletionToolsParam``. Its methods get a vLLM ``ChatCompletionRequest`` holding the
  request's tools (names and parameter schemas; no messages) and ``tool_choice: auto``, the only
  choice dyn hands to a tool-call parser (forced calls are read by ``dyn.core.parsers.forced``).
- Every piece fed is cut into its tokens (the frontend's tokenizer, with offsets) and each
  token's text goes to ``extract_tool_calls_streaming`` with the previous and current text and
  ids, as vLLM's serving calls it per engine step. So the parser sees token-sized deltas whether
  the frontend streams or answers whole (a unary response is its whole text fed at once), and
  the streamed and the unary response read alike; ``extract_tool_calls``, which vLLM uses for
  unary responses, is not used (one path, one behaviour). The ids are the re-encoding of the
  text (the output stage sees text): the engine's ids for special tokens kept in the text,
  perhaps merged differently elsewhere.
- A returned ``DeltaMessage`` becomes events: ``content`` a ``str``, ``reasoning`` ``Reasoning``;
  a tool call delta with a new ``index`` ends the open call (``TOOL_CALL_END``) and starts its
  own (``ToolCallStart(name, id)``: the parser's id), ``function.arguments`` is ``ToolCallArgs``.
- ``finish()`` does what vLLM's serving does at the last delta: arguments the parser parsed but
  did not stream (``get_remaining_unstreamed_args``) are sent. The open call then ends when its
  arguments are one complete JSON value; else it was cut off and stays open (a unary response
  returns the text as content, as with dyn's parsers). When no call was started, text the parser
  held back (the start of a marker, a marker without a call) is returned as content.
- A plugin implementing only ``extract_tool_calls`` is fed nothing incrementally: ``finish()``
  reads the whole text with it.
- An exception from the plugin (its constructor, a call to it, a delta dyn cannot express) is
  logged with its traceback (the first per parser; later ones in one line) and stops the parser:
  the text it had not reported and everything after it goes out as content, an open call stays
  incomplete (a unary response returns the whole text as content), and the request goes on.
- ``needs_special_tokens`` is what the plugin's ``adjust_request`` does to ``skip_special_tokens``
  of a request with a tool and ``tool_choice: auto``, asked once at registration (of an instance
  made without ``__init__``: it runs before a tokenizer exists). Nothing else it changes is read.
- ``render`` is refused: the mocker cannot write calls in a format it only knows by its parser.

Where dyn's contract may not hold: dyn's parsers give the same events however the text is split.
Here the parser sees the tokens of each piece, so a split inside a token changes its deltas (the
frontend pushes whole tokens, but a reasoning parser before this one may release text held back
in other cuts); a parser that keeps state across deltas instead of re-reading ``current_text``
may then differ, and one that matches special tokens by id needs them kept in the text
(``adjust_request``). Calls must arrive in order: a delta going
back to an earlier call index, or a call's arguments before its name, stops the parser.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

from dyn.core.parsers.events import TOOL_CALL_END, Event, Reasoning, ToolCallArgs, ToolCallStart
from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall, ToolParser

log = logging.getLogger(__name__)

VLLM_PARSERS = "vllm.tool_parsers.abstract_tool_parser"
"""The vLLM module holding ``ToolParser`` and ``ToolParserManager`` (vLLM 0.32)."""
_CHAT_PROTOCOL = "vllm.entrypoints.openai.chat_completion.protocol"


def imports_vllm_parsers() -> bool:
    """Whether vLLM's parser classes have been imported in this process (by a plugin)."""
    return VLLM_PARSERS in sys.modules


def register_vllm_parsers(module: ModuleType, file: Path) -> list[str]:
    """Register an adapter in ``TOOL_PARSERS`` for each vLLM parser class ``module`` (the plugin
    imported from ``file``) defines and registers with ``ToolParserManager``, under each name
    dyn's own parsers do not take; the names. ``ValueError`` when it defines vLLM parsers but
    registers none, or registers one that implements neither extraction method."""
    base = importlib.import_module(VLLM_PARSERS)
    manager, vllm_parser = base.ToolParserManager, base.ToolParser
    mine = {
        obj.__name__: obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and issubclass(obj, vllm_parser)
        and obj is not vllm_parser
        and obj.__module__ == module.__name__
    }
    names: dict[type, list[str]] = defaultdict(list)
    for name, (module_name, class_name) in manager.lazy_parsers.items():
        if module_name == module.__name__ and class_name in mine:
            names[mine[class_name]].append(name)
    for name, cls in manager.tool_parsers.items():
        if cls.__module__ == module.__name__ and name not in names[cls]:
            names[cls].append(name)
    if mine and not names:
        raise ValueError(
            f"parser plugin {str(file)!r} defines the vLLM tool parser {', '.join(mine)} but registers "
            'none: decorate it with @ToolParserManager.register_module(["NAME"])'
        )
    registered: list[str] = []
    for cls, cls_names in names.items():
        if not _implements(cls, vllm_parser, "extract_tool_calls_streaming") and not _implements(
            cls, vllm_parser, "extract_tool_calls"
        ):
            raise ValueError(
                f"parser plugin {str(file)!r}: {cls.__name__} implements neither "
                "extract_tool_calls_streaming nor extract_tool_calls"
            )
        taken = [n for n in cls_names if TOOL_PARSERS.provides(n)]
        if taken:
            log.warning(
                "parser plugin %s registers %s as %s, which dyn's own tool-call parsers take: dyn's "
                "are used under those names; register the plugin's parser under another name to use it",
                file,
                cls.__name__,
                ", ".join(taken),
            )
        free = [n for n in cls_names if n not in taken]
        if not free:
            continue
        adapter = type(
            f"Vllm{cls.__name__}",
            (VllmToolParser,),
            {
                "plugin": cls,
                "plugin_file": str(file),
                "streams": _implements(cls, vllm_parser, "extract_tool_calls_streaming"),
                "takes_tools": _takes_tools(cls),
                "needs_special_tokens": _keeps_special_tokens(cls, file),
                "__module__": __name__,
                "__doc__": f"vLLM's {cls.__name__} from {file}, run through ``VllmToolParser``.",
            },
        )
        TOOL_PARSERS.register(*free)(adapter)
        registered += free
    return registered


def _implements(cls: type, base: type, method: str) -> bool:
    return getattr(cls, method, None) is not getattr(base, method, None)


def _takes_tools(cls: type) -> bool:
    try:
        inspect.signature(cls).bind(None, None)
    except TypeError:
        return False
    except ValueError:  # no signature to read: vLLM's call, with tools
        return True
    return True


def _probe_request(tools: Sequence[Tool]) -> Any:
    """A vLLM ``ChatCompletionRequest`` with ``tools`` and ``tool_choice: auto`` (no messages;
    without tools, neither)."""
    protocol = importlib.import_module(_CHAT_PROTOCOL)
    specs = [
        {"type": "function", "function": {"name": t.name, "parameters": dict(t.parameters)}} for t in tools
    ]
    if not specs:
        return protocol.ChatCompletionRequest(messages=[])
    return protocol.ChatCompletionRequest(messages=[], tools=specs, tool_choice="auto")


def _keeps_special_tokens(cls: Any, file: Path) -> bool:
    """Whether ``cls.adjust_request`` turns ``skip_special_tokens`` off for a request with tools."""
    request = _probe_request([Tool("probe", {"type": "object", "properties": {}})])
    try:
        adjusted = cls.adjust_request(cls.__new__(cls), request)
    except Exception as exc:
        log.warning(
            "parser plugin %s: %s.adjust_request failed on a probe request (%s: %s), so whether it "
            "reads special tokens is unknown; they are skipped from the text it parses, as vLLM's "
            "default is",
            file,
            cls.__name__,
            type(exc).__name__,
            exc,
        )
        return False
    return getattr(adjusted if adjusted is not None else request, "skip_special_tokens", True) is False


def _vllm_tokenizer(tokenizer: Any) -> Any:
    """vLLM's tokenizer for the directory the frontend's ``tokenizer`` was read from."""
    path = getattr(tokenizer, "path", None)
    if path is None:
        raise ValueError("the frontend's tokenizer has no directory to load vLLM's tokenizer from")
    return importlib.import_module("vllm.tokenizers").cached_get_tokenizer(str(path))


class PluginProtocolError(RuntimeError):
    """The plugin returned a delta dyn's events cannot express."""


class VllmToolParser(ToolParser):
    """A vLLM ``ToolParser`` class (``plugin``) behind dyn's parser contract (module docstring).
    ``register_vllm_parsers`` makes one subclass per plugin class."""

    plugin: ClassVar[Any] = None
    plugin_file: ClassVar[str] = ""
    streams: ClassVar[bool] = True
    """The plugin implements ``extract_tool_calls_streaming`` (else only ``extract_tool_calls``)."""
    takes_tools: ClassVar[bool] = True
    takes_tokenizer = True
    _failures: ClassVar[int] = 0

    def __init__(self, tools: Sequence[Tool] = (), tokenizer: Any = None) -> None:
        super().__init__(tools)
        self._tokenizer = tokenizer
        self._parser: Any = None
        self._request: Any = None
        self._failed = False
        self._text = ""
        self._ids: list[int] = []
        self._said = ""
        """The content reported so far."""
        self._call_started = False
        self._open: int | None = None
        """The plugin's index of the call now open."""
        self._args: list[str] = []
        try:
            if tokenizer is None:
                raise ValueError("no tokenizer was given (the frontend passes the served model's)")
            self._request = _probe_request(tools)
            vllm_tokenizer = _vllm_tokenizer(tokenizer)
            if self.takes_tools:
                self._parser = self.plugin(vllm_tokenizer, self._request.tools)
            else:
                self._parser = self.plugin(vllm_tokenizer)
        except Exception as exc:
            self._fail(exc, "building it")

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        raise NotImplementedError(
            f"the {cls.name} tool-call parser is a vLLM plugin ({cls.plugin_file}): dyn reads its "
            "format through it but cannot write calls in it"
        )

    def feed(self, text: str) -> list[Event]:
        if self._failed:
            return [text] if text else []
        if not self.streams:
            self._text += text
            return []
        events: list[Event] = []
        pieces = self._tokens(text)
        for at, (delta, ids) in enumerate(pieces):
            previous, previous_ids = self._text, self._ids
            current, current_ids = previous + delta, previous_ids + ids
            try:
                message = self._parser.extract_tool_calls_streaming(
                    previous, current, delta, previous_ids, current_ids, ids, self._request
                )
                got = self._events(message)
            except Exception as exc:
                self._fail(exc, "parsing a delta")
                rest = "".join(piece for piece, _ in pieces[at:])
                return _coalesced(events + self._unreported(previous, rest))
            self._text, self._ids = current, current_ids
            events += got
        return _coalesced(events)

    def finish(self) -> list[Event]:
        if self._failed:
            return []
        if not self.streams:
            return self._whole()
        events: list[Event] = []
        if self._open is not None:
            try:
                rest = self._parser.get_remaining_unstreamed_args()
            except Exception as exc:  # a plugin whose state the base class's method cannot read
                log.debug("vLLM plugin parser %s: no remaining arguments (%s)", self.name, exc)
                rest = ""
            if isinstance(rest, str) and rest:
                events.append(ToolCallArgs(rest))
                self._args.append(rest)
            if _complete_json("".join(self._args)):
                events.append(TOOL_CALL_END)
            self._open = None
        elif not self._call_started:
            events += self._unreported(self._text, "")
        return events

    # ------------------------------------------------------------------ internals

    def _tokens(self, text: str) -> list[tuple[str, list[int]]]:
        """``text`` cut into the texts of its tokens with their ids; tokens sharing characters
        (the bytes of one character) travel together."""
        if not text:
            return []
        encoding = self._tokenizer.backend.encode(text, add_special_tokens=False)
        pieces: list[tuple[str, list[int]]] = []
        cut = end = 0
        ids: list[int] = []
        for token, (start, stop) in zip(encoding.ids, encoding.offsets, strict=True):
            if ids and start >= end > cut:
                pieces.append((text[cut:end], ids))
                cut, ids = end, []
            ids.append(token)
            end = max(end, stop)
        pieces.append((text[cut:], ids))
        return pieces

    def _events(self, message: Any) -> list[Event]:
        """The events of one ``DeltaMessage``; ``PluginProtocolError`` (and no change of state)
        for one dyn cannot express."""
        events: list[Event] = []
        if message is None:
            return events
        reasoning = getattr(message, "reasoning", None)
        if reasoning:
            events.append(Reasoning(reasoning))
        content = message.content
        if content:
            events.append(content)
        open_, started = self._open, False
        more: list[str] = []
        for call in message.tool_calls or ():
            function = call.function
            name = getattr(function, "name", None)
            arguments = getattr(function, "arguments", None)
            if call.index != open_:
                if open_ is not None and call.index < open_:
                    raise PluginProtocolError(f"a delta for call {call.index} after call {open_} had started")
                if not name:
                    raise PluginProtocolError(f"call {call.index}'s first delta has no function name")
                if open_ is not None:
                    events.append(TOOL_CALL_END)
                events.append(ToolCallStart(name, call.id))
                open_, started, more = call.index, True, []
            if arguments:
                events.append(ToolCallArgs(arguments))
                more.append(arguments)
        if content:
            self._said += content
        if started:
            self._open, self._args, self._call_started = open_, more, True
        else:
            self._args += more
        return events

    def _unreported(self, seen: str, rest: str) -> list[Event]:
        """As content: what of ``seen`` the parser held back (when no call started and the content
        it reported begins ``seen``), then ``rest``."""
        held = ""
        if not self._call_started and seen.startswith(self._said):
            held = seen[len(self._said) :]
        text = held + rest
        return [text] if text else []

    def _whole(self) -> list[Event]:
        """``finish()`` of a plugin without streaming: ``extract_tool_calls`` on the whole text."""
        text, self._text = self._text, ""
        try:
            info = self._parser.extract_tool_calls(text, self._request)
            events: list[Event] = []
            if not info.tools_called:
                return [text] if text else []
            if info.content:
                events.append(info.content)
            for call in info.tool_calls:
                events += [ToolCallStart(call.function.name, call.id), ToolCallArgs(call.function.arguments)]
                events.append(TOOL_CALL_END)
            return events
        except Exception as exc:
            self._fail(exc, "reading the whole text")
            return [text] if text else []

    def _fail(self, exc: Exception, doing: str) -> None:
        self._failed = True
        cls = type(self)
        first = cls._failures == 0
        cls._failures += 1
        log.error(
            "vLLM tool-parser plugin %s (%s, from %s) failed %s: %s: %s; this choice's text from "
            "here on is returned as content%s",
            self.name,
            getattr(self.plugin, "__name__", "?"),
            self.plugin_file,
            doing,
            type(exc).__name__,
            exc,
            "" if first else f" ({cls._failures} failures so far)",
            exc_info=exc if first else None,
        )


def _coalesced(events: list[Event]) -> list[Event]:
    """``events`` with runs of content and of argument pieces joined (one per token otherwise)."""
    out: list[Event] = []
    for event in events:
        last = out[-1] if out else None
        if type(event) is str and type(last) is str:
            out[-1] = last + event
        elif isinstance(event, ToolCallArgs) and isinstance(last, ToolCallArgs):
            out[-1] = ToolCallArgs(last.text + event.text)
        else:
            out.append(event)
    return out


def _complete_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
