"""Logging for every dyn process: rich text for people, one JSON object per line for machines."""

from __future__ import annotations

import logging
import sys
import time

import orjson

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("rich", "json")

_STD_ATTRS = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", ...extra}``; exceptions under ``exc``."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STD_ATTRS and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def configure_logging(level: str = "info", fmt: str = "rich", *, process: str | None = None) -> None:
    """Install one stderr handler on the root logger (replacing earlier ones).

    ``process`` names this process in rich output (useful when several share a terminal).
    Raises ``ValueError`` for an unknown level or format.
    """
    if level not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    if fmt == "json":
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
    else:
        from rich.console import Console
        from rich.logging import RichHandler

        handler = RichHandler(
            console=Console(stderr=True), show_path=False, rich_tracebacks=True, log_time_format="[%X]"
        )
        handler.setFormatter(logging.Formatter(f"[{process}] %(message)s" if process else "%(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.Formatter.converter = time.gmtime if fmt == "json" else time.localtime
