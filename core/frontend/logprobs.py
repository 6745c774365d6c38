"""Logprobs in OpenAI's shapes, from the engine's ``TokenLogprobs`` (``dyn.core.messages``).

- Chat (``logprobs: true``, ``top_logprobs: k``): ``{"content": [{"token", "logprob", "bytes",
  "top_logprobs": [{"token", "logprob", "bytes"}, ...]}, ...]}``, k entries in each top list.
- Completions (``logprobs: k``): ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``,
  each top entry a ``{token: logprob}`` map of the k most likely tokens plus the chosen one.
- ``prompt_logprobs`` (vLLM's): per prompt token ``None`` (the first) or ``{token_id:
  {"logprob", "rank", "decoded_token"}}`` with the prompt token and the top k.

Token strings are each id decoded on its own (special tokens kept), as vLLM shows them; ``bytes``
are the token's exact bytes for byte-level BPE vocabularies, else the UTF-8 of that string.
With ``as_ids`` (vLLM's ``--return-tokens-as-token-ids``) every token string of ``logprobs`` is
``token_id:N`` instead, so a token that is not valid text on its own is still identified; its
``bytes`` and the completions ``text_offset`` stay those of the token's text. ``prompt_logprobs``
keep their ``decoded_token`` text (as in vLLM).
Logprobs below -9999 (or -inf) are sent as -9999.0, as vLLM does, since JSON has no infinity.
Streamed chunks carry the logprobs of the tokens that arrived with them, with ``text_offset``
continuing across chunks. A whole response's logprobs (``encode_whole``, ``prompt_logprobs_json``)
are encoded a slice of ``SLICE_ENTRIES`` entries at a time, yielding to the event loop between
slices: ``n`` x ``max_tokens`` x ``top_logprobs`` entries may take a second to encode, and other
requests must not wait that long.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import anyio.lowlevel
import orjson

from dyn.core.frontend.tokenizer import Tokenizer
from dyn.core.messages import TokenLogprobs

_FLOOR = -9999.0
SLICE_ENTRIES = 4096
"""Logprob entries encoded between two yields to the event loop (about 6 ms of work)."""


_COLUMNS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
"""A completion's logprobs fields, in order."""
T = TypeVar("T")


async def _sliced(count: int, entries_each: int, encode: Callable[[int, int], T]) -> list[T]:
    """``encode(start, stop)`` over ``range(count)`` in slices of about ``SLICE_ENTRIES`` entries
    (``entries_each`` per item), yielding to the event loop between two slices."""
    step = max(1, SLICE_ENTRIES // max(1, entries_each))
    parts = []
    for start in range(0, count, step):
        if start:
            await anyio.lowlevel.checkpoint()
        parts.append(encode(start, min(count, start + step)))
    return parts


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable character table that byte-level BPE vocabularies use."""
    keep = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(keep, map(chr, chars)))


_BYTE_OF_CHAR = {c: b for b, c in _bytes_to_unicode().items()}


class TokenTexts:
    """Each token's text and bytes, decoded once per id (shared by every request of a model)."""

    __slots__ = ("_tokenizer", "_text", "_bytes", "_byte_level")

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._text: dict[int, str] = {}
        self._bytes: dict[int, list[int]] = {}
        decoder = getattr(tokenizer.backend, "decoder", None)
        self._byte_level = type(decoder).__name__ == "ByteLevel"

    def text(self, token_id: int) -> str:
        text = self._text.get(token_id)
        if text is None:
            text = self._text[token_id] = self._tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def bytes(self, token_id: int) -> list[int]:
        found = self._bytes.get(token_id)
        if found is None:
            found = None
            if self._byte_level and token_id not in self._tokenizer.added_tokens:
                piece = self._tokenizer.id_to_token(token_id)
                if piece is not None and all(c in _BYTE_OF_CHAR for c in piece):
                    found = [_BYTE_OF_CHAR[c] for c in piece]
            if found is None:
                found = list(self.text(token_id).encode("utf-8"))
            self._bytes[token_id] = found
        return found


def token_id_label(token_id: int) -> str:
    """A token as vLLM names it with ``--return-tokens-as-token-ids``."""
    return f"token_id:{token_id}"


def _lp(value: float) -> float:
    return value if value > _FLOOR else _FLOOR


class ChatLogprobs:
    """``choices[i].logprobs`` of a chat response, a chunk at a time or whole."""

    __slots__ = ("_texts", "_top", "_label")

    def __init__(self, texts: TokenTexts, top: int, *, as_ids: bool = False) -> None:
        self._texts = texts
        self._top = top
        self._label = token_id_label if as_ids else texts.text

    def entries(self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprobs]) -> list[dict]:
        texts, top, label = self._texts, self._top, self._label
        out = []
        for token_id, lp in zip(token_ids, logprobs):
            out.append(
                {
                    "token": label(token_id),
                    "logprob": _lp(lp.logprob),
                    "bytes": texts.bytes(token_id),
                    "top_logprobs": [
                        {"token": label(t), "logprob": _lp(v), "bytes": texts.bytes(t)}
                        for t, v in zip(lp.top_ids[:top], lp.top_logprobs[:top])
                    ],
                }
            )
        return out

    @staticmethod
    def encode(entries: list[dict]) -> bytes:
        return orjson.dumps({"content": entries})

    async def encode_whole(self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprobs]) -> bytes:
        """``encode(entries(token_ids, logprobs))``, a slice at a time (see the module docstring)."""
        parts = await _sliced(
            min(len(token_ids), len(logprobs)),
            self._top + 1,
            lambda a, b: orjson.dumps(self.entries(token_ids[a:b], logprobs[a:b]))[1:-1],
        )
        return b'{"content":[' + b",".join(parts) + b"]}"


class CompletionLogprobs:
    """``choices[i].logprobs`` of a completion; keeps the text offset across chunks."""

    __slots__ = ("_texts", "_top", "_as_ids", "offset")

    def __init__(self, texts: TokenTexts, top: int, offset: int = 0, *, as_ids: bool = False) -> None:
        self._texts = texts
        self._top = top
        self._as_ids = as_ids
        self.offset = offset
        """Where the next token's text starts in the choice's text (after an echoed prompt)."""

    def encode(self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprobs]) -> bytes:
        return orjson.dumps(dict(zip(_COLUMNS, self._columns(token_ids, logprobs))))

    async def encode_whole(self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprobs]) -> bytes:
        """``encode(token_ids, logprobs)``, a slice at a time (see the module docstring)."""
        slices = await _sliced(
            min(len(token_ids), len(logprobs)),
            self._top + 1,
            lambda a, b: [orjson.dumps(c)[1:-1] for c in self._columns(token_ids[a:b], logprobs[a:b])],
        )
        fields = (
            b'"%s":[%s]' % (name.encode(), b",".join(piece[i] for piece in slices))
            for i, name in enumerate(_COLUMNS)
        )
        return b"{" + b",".join(fields) + b"}"

    def _columns(
        self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprobs]
    ) -> tuple[list[str], list[float], list[dict[str, float]], list[int]]:
        texts, top = self._texts, self._top
        label = token_id_label if self._as_ids else texts.text
        tokens, values, tops, offsets = [], [], [], []
        for token_id, lp in zip(token_ids, logprobs):
            text = texts.text(token_id)
            name = label(token_id)
            tokens.append(name)
            values.append(_lp(lp.logprob))
            best = {label(t): _lp(v) for t, v in zip(lp.top_ids[:top], lp.top_logprobs[:top])}
            best.setdefault(name, _lp(lp.logprob))
            tops.append(best)
            offsets.append(self.offset)
            self.offset += len(text)
        return tokens, values, tops, offsets


async def prompt_logprobs_json(
    texts: TokenTexts, prompt_ids: Sequence[int], logprobs: Sequence[TokenLogprobs | None], top: int
) -> bytes:
    """vLLM's ``prompt_logprobs`` list for one prompt, a slice at a time (see the module docstring)."""
    parts = await _sliced(
        min(len(prompt_ids), len(logprobs)),
        top + 1,
        lambda a, b: orjson.dumps(_prompt_entries(texts, prompt_ids[a:b], logprobs[a:b], top))[1:-1],
    )
    return b"[" + b",".join(parts) + b"]"


def _prompt_entries(
    texts: TokenTexts, prompt_ids: Sequence[int], logprobs: Sequence[TokenLogprobs | None], top: int
) -> list[dict | None]:
    out: list[dict | None] = []
    for token_id, lp in zip(prompt_ids, logprobs):
        if lp is None:
            out.append(None)
            continue
        entry = {
            str(token_id): {
                "logprob": _lp(lp.logprob),
                "rank": lp.rank or None,
                "decoded_token": texts.text(token_id),
            }
        }
        for rank, (t, v) in enumerate(zip(lp.top_ids[:top], lp.top_logprobs[:top]), start=1):
            entry.setdefault(str(t), {"logprob": _lp(v), "rank": rank, "decoded_token": texts.text(t)})
        out.append(entry)
    return out
