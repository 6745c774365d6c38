"""``--replies FILE``: scripted answers, so an agent's whole tool loop can run against the mocker.

The file holds JSON lines ``{"match": REGEX, "text": RAW_MODEL_OUTPUT}`` (blank lines are
skipped). For each request the first entry whose ``match`` is found (``re.search``) in the text of
the conversation's last user message or tool result (``conversation.LastMessage``: system and
developer messages after it, such as the reminders coding agents add, are skipped) is the answer:
``text`` is what the model writes, special tokens and tool-call markup included, tokenized with the
model's tokenizer and streamed as the engine's output, then EOS.

Bounds: the file is at most ``MAX_FILE_BYTES``, with at most ``MAX_REPLIES`` entries of regexes of
at most ``MAX_PATTERN_CHARS`` characters; every request tries the regexes in order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import msgspec

MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_REPLIES = 1000
MAX_PATTERN_CHARS = 4096


class _Line(msgspec.Struct, forbid_unknown_fields=True):
    match: str
    text: str


@dataclass(frozen=True, slots=True)
class Reply:
    pattern: re.Pattern[str]
    text: str


@dataclass(frozen=True, slots=True)
class Replies:
    """The entries of a replies file, in file order."""

    entries: tuple[Reply, ...]

    @classmethod
    def load(cls, path: str | Path) -> Replies:
        """Read and check the file; ``ValueError`` is one sentence naming the file and the line."""
        where = f"--replies {path}"
        file = Path(path).expanduser()
        try:
            size = file.stat().st_size
            if size > MAX_FILE_BYTES:
                raise ValueError(f"{where}: the file is {size} bytes; at most {MAX_FILE_BYTES} are accepted")
            text = file.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ValueError(f"{where}: no such file") from None
        except IsADirectoryError:
            raise ValueError(f"{where}: is a directory, not a JSON lines file") from None
        except UnicodeDecodeError:
            raise ValueError(f"{where}: the file is not UTF-8 text") from None
        except OSError as exc:
            raise ValueError(f"{where}: cannot be read ({exc.strerror})") from None
        entries = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                item = msgspec.json.decode(line, type=_Line)
            except msgspec.DecodeError as exc:
                raise ValueError(
                    f'{where} line {number}: expected {{"match": REGEX, "text": TEXT}} ({exc})'
                ) from None
            if len(item.match) > MAX_PATTERN_CHARS:
                raise ValueError(
                    f"{where} line {number}: the regex has {len(item.match)} characters; "
                    f"at most {MAX_PATTERN_CHARS} are accepted"
                )
            try:
                pattern = re.compile(item.match)
            except re.error as exc:
                raise ValueError(f"{where} line {number}: bad regex {item.match!r} ({exc})") from None
            entries.append(Reply(pattern, item.text))
            if len(entries) > MAX_REPLIES:
                raise ValueError(
                    f"{where} line {number}: more than {MAX_REPLIES} replies; keep at most {MAX_REPLIES}"
                )
        return cls(tuple(entries))

    def answer(self, last_message: str) -> str | None:
        """The text of the first entry that matches ``last_message`` (the conversation's last user
        message or tool result, ``LastMessage.text``), or ``None``."""
        for reply in self.entries:
            if reply.pattern.search(last_message):
                return reply.text
        return None
