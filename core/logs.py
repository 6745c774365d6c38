"""Logging for every dyn process: rich text for people, one JSON object per line for machines.

``configure_logging`` installs the one handler (stderr). In JSON mode every line a dyn process
writes is one JSON object (``json_record``): log records, library warnings
(``logging.captureWarnings``), uncaught exceptions in any thread, and the status lines other
programs parse (``status``, on stdout). Every object carries ``ts`` (Unix seconds), ``level``,
``logger``, ``message`` and ``process`` (the process's name in its stack: ``frontend``,
``worker-0``; ``dyn serve`` tells each child its name in ``PROCESS_ENV``), plus the record's
extra fields; a traceback is under ``exc``. ANSI colour codes (uvicorn's ``color_message``) never
reach a JSON line.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from typing import Any

import orjson

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("rich", "json")
PROCESS_ENV = "DYN_PROCESS_NAME"
QUIET_LIBRARIES = ("watchfiles", "httpx")
"""Libraries that log each event they see at INFO (watchfiles: every file change the discovery
store is told of, one per heartbeat; httpx: every request, such as each etcd keepalive): their
warnings and errors only."""
"""The process's name in JSON lines (``dyn serve`` sets it for each child: ``worker-0``)."""

_STD_ATTRS = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's copy of the message with ANSI colours
}
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_format = "rich"
_process = "dyn"
_saved_hooks: tuple[Any, Any] | None = None


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (colours, cursor moves)."""
    return _ANSI.sub("", text) if "\x1b" in text else text


def json_record(
    message: str, *, level: str = "info", logger: str = "dyn", process: str | None = None, **fields: Any
) -> str:
    """One JSON log line (no newline): ``ts``, ``level``, ``logger``, ``message``, ``process``, then
    ``fields``; strings lose their ANSI codes and values JSON cannot hold are written as text."""
    out: dict[str, Any] = {
        "ts": round(time.time(), 6),
        "level": level,
        "logger": logger,
        "message": strip_ansi(message),
        "process": process or _process,
    }
    for key, value in fields.items():
        out[key] = strip_ansi(value) if isinstance(value, str) else value
    return orjson.dumps(out, default=str).decode()


class JsonFormatter(logging.Formatter):
    """A record as ``json_record`` writes it (``ts`` is the record's time); exceptions under ``exc``."""

    def __init__(self, process: str = "dyn") -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": strip_ansi(record.getMessage()),
            "process": self.process,
        }
        for key, value in record.__dict__.items():
            if key not in _STD_ATTRS and not key.startswith("_"):
                out[key] = strip_ansi(value) if isinstance(value, str) else value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(out, default=str).decode()


def configure_logging(level: str = "info", fmt: str = "rich", *, process: str | None = None) -> None:
    """Install one stderr handler on the root logger (replacing earlier ones).

    JSON lines name this process ``$DYN_PROCESS_NAME`` when set (``dyn serve`` names its
    children so), else ``process``, else ``dyn``.
    JSON mode also sends library warnings and uncaught exceptions (main thread and others)
    through the handler. Raises ``ValueError`` for an unknown level or format.
    """
    global _format, _process
    if level not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    _format = fmt
    _process = os.environ.get(PROCESS_ENV) or process or "dyn"
    if fmt == "json":
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter(_process))
    else:
        from rich.console import Console
        from rich.logging import RichHandler

        handler = RichHandler(
            console=Console(stderr=True), show_path=False, rich_tracebacks=True, log_time_format="[%X]"
        )
        handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for noisy in QUIET_LIBRARIES:
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    logging.Formatter.converter = time.gmtime if fmt == "json" else time.localtime
    _route_uncaught(fmt == "json")


def current_setup() -> tuple[str, str]:
    """``(level, format)`` as ``configure_logging`` last set them, for a child process to repeat."""
    level = logging.getLevelName(logging.getLogger().level).lower()
    return (level if level in LOG_LEVELS else "info"), _format


def is_json() -> bool:
    """Whether this process logs JSON (``configure_logging(..., "json")``)."""
    return _format == "json"


def status(message: str, **fields: Any) -> None:
    """Print a status line other programs read (``dyn frontend listening on URL``) on stdout:
    ``message`` itself, or in JSON mode one ``json_record`` holding it and ``fields``.
    ``status_text`` reads either back."""
    line = json_record(message, logger="dyn.status", **fields) if is_json() else message
    print(line, flush=True)


def status_text(line: str) -> str:
    """The message of a status or log line in either format: a JSON object's ``message``, else
    the line itself."""
    if line.startswith("{"):
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            return line
        if isinstance(record, dict) and isinstance(record.get("message"), str):
            return record["message"]
    return line


def _route_uncaught(json_mode: bool) -> None:
    """Warnings and uncaught exceptions through logging in JSON mode; the hooks found before
    (Typer's pretty tracebacks, say) back in rich mode."""
    global _saved_hooks
    logging.captureWarnings(json_mode)
    if json_mode:
        if _saved_hooks is None:
            _saved_hooks = (sys.excepthook, threading.excepthook)
        sys.excepthook = _log_uncaught
        threading.excepthook = _log_thread_uncaught
    elif _saved_hooks is not None:
        sys.excepthook, threading.excepthook = _saved_hooks
        _saved_hooks = None


def _log_uncaught(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, tb)
        return
    logging.getLogger("dyn").critical("uncaught exception: %s", value, exc_info=(kind, value, tb))


def _log_thread_uncaught(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger("dyn").critical(
        "uncaught exception in thread %s: %s",
        name,
        args.exc_value,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),  # type: ignore[arg-type]
    )
