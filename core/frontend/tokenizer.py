"""The frontend's tokenizer: a Hugging Face fast tokenizer (tokenizer.json) driven through the Rust
``tokenizers`` package, plus what tokenizer_config.json says about special tokens and chat templates.

Contract: ``encode`` gives the ids ``transformers.AutoTokenizer`` (5.x) gives for the same directory:
with ``add_special_tokens`` the tokenizer.json post-processor adds what it adds (BOS/EOS), and
tokenizer_config.json's ``add_bos_token``/``add_eos_token`` change nothing, as in transformers. ``decode``
is the Rust decoder with no ``clean_up_tokenization_spaces`` (as vLLM's generated text). transformers
is never imported: it is slow to import and the hot path needs none of it.

Special token strings come from tokenizer_config.json (a string, or a dict with ``content``), and
special_tokens_map.json fills the names it lacks. Chat templates follow transformers' loading:
chat_template.jinja (and additional_chat_templates/*.jinja) replace tokenizer_config.json's
``chat_template``, which is a string or a list of ``{name, template}``; chat_template.json (the legacy
processor file) is the last resort. ``response_template`` is tokenizer_config.json's key of that name
as transformers keeps it: not checked here, so a malformed one never stops the model from loading;
the ``hf`` parsers that read it say what is wrong with it (``dyn.core.parsers.response_template``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import tokenizers

from dyn.core.frontend.encode_thread import ENCODE_THREAD
from dyn.core.frontend.token_cache import MIN_PREFIX_CHARS, PrefixTokenCache, special_token_ids
from dyn.core.model.info import ModelError, ModelInfo, read_model_json, token_content

SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
"""The named special tokens transformers passes to chat templates (its SPECIAL_TOKENS_ATTRIBUTES)."""

DEFAULT_TEMPLATE = "default"


class Tokenizer:
    """Encode, decode and look up tokens of one model; immutable and safe to share between requests."""

    __slots__ = (
        "backend",
        "path",
        "special_tokens_map",
        "chat_templates",
        "response_template",
        "special_token_ids",
        "added_tokens",
        "vocab_size",
        "_encode_fast",
        "_decode",
        "prefix_cache",
    )

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        special_tokens_map: Mapping[str, str] | None = None,
        chat_templates: Mapping[str, str] | None = None,
        path: Path | None = None,
        response_template: Any = None,
    ) -> None:
        self.backend = backend
        """The Rust tokenizer; the incremental detokenizer decodes through it directly."""
        self.path = path
        self.special_tokens_map: dict[str, str] = dict(special_tokens_map or {})
        """Named special tokens (bos_token, eos_token, pad_token, ...) as strings, as transformers has them."""
        self.chat_templates: dict[str, str] = dict(chat_templates or {})
        """Chat templates by name; the model's default one is under "default"."""
        self.response_template: Any = response_template
        """tokenizer_config.json's ``response_template`` as read (a dict when well formed; any
        JSON value the file holds, unchecked), None when it has none: the checkpoint's description
        of the assistant message that the ``hf`` parsers read, and check."""
        added = backend.get_added_tokens_decoder()
        self.added_tokens: dict[int, str] = {i: t.content for i, t in added.items()}
        """Every added token (special or not) by id, as vLLM's detokenizer needs them."""
        self.special_token_ids: frozenset[int] = frozenset(i for i, t in added.items() if t.special)
        """Ids that ``skip_special_tokens`` removes: the added tokens marked special."""
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        # the batch API without offsets is ~20% faster than encode() on one text, same ids
        self._encode_fast = backend.encode_batch_fast
        self._decode = backend.decode
        self.prefix_cache = PrefixTokenCache(
            self._encode_batch, special_token_ids((i, t.content, t.special) for i, t in added.items())
        )
        """Chat prompts' tokens by their prefix up to a special token (``encode_chat``)."""

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load from a local Hugging Face model directory; ModelError says what is missing or broken."""
        directory = Path(path).expanduser()
        if not directory.is_dir():
            raise ModelError(
                f"{path}: not a directory; pass the local model directory that holds tokenizer.json"
            )
        tok_file = directory / "tokenizer.json"
        if not tok_file.is_file():
            raise ModelError(
                f"{path}: no tokenizer.json found; pass a local Hugging Face model directory "
                f"with a fast tokenizer (tokenizer.json)"
            )
        try:
            backend = tokenizers.Tokenizer.from_file(str(tok_file))
        except Exception as e:  # the Rust side raises a bare Exception for any parse error
            raise ModelError(
                f"{path}: tokenizer.json could not be loaded ({e}); fix or replace the file"
            ) from None
        config = read_model_json(str(directory), directory / "tokenizer_config.json", False) or {}
        legacy_map = read_model_json(str(directory), directory / "special_tokens_map.json", False) or {}
        specials: dict[str, str] = {}
        for name in SPECIAL_TOKEN_NAMES:
            content = token_content(config.get(name))
            if content is None:
                content = token_content(legacy_map.get(name))
            if content is not None:
                specials[name] = content
        return cls(
            backend,
            special_tokens_map=specials,
            chat_templates=_chat_templates(directory, config),
            path=directory,
            response_template=config.get("response_template"),
        )

    @classmethod
    def from_model(cls, info: ModelInfo) -> Tokenizer:
        return cls.from_dir(info.tokenizer_dir)

    @property
    def bos_token(self) -> str | None:
        return self.special_tokens_map.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens_map.get("eos_token")

    @property
    def chat_template(self) -> str | None:
        """The default chat template's source, or None when the model has none."""
        return self.chat_templates.get(DEFAULT_TEMPLATE)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special tokens written in the text are recognised, as HF does.
        ``add_special_tokens`` runs the post-processor (e.g. adds BOS); chat prompts pass False."""
        return self._encode_fast([text], add_special_tokens=add_special_tokens)[0].ids

    def encode_pair(self, first: str, second: str) -> list[int]:
        """Token ids of the pair ``(first, second)`` as the tokenizer's post-processor writes a
        pair (special tokens and separators added), as transformers' ``tokenizer(text=first,
        text_pair=second)``."""
        return self.backend.encode(first, second, add_special_tokens=True).ids

    def encode_chat(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """``encode`` of a rendered chat prompt, through the prefix cache when nothing is added
        around it (``dyn.core.frontend.token_cache``): an agent's next turn re-tokenizes only
        what it appended."""
        if add_special_tokens:
            return self.encode(text, True)
        return self.prefix_cache.encode(text)

    async def encode_chat_async(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """``encode_chat`` for the event loop: a text the prefix cache may serve (long enough,
        nothing added around it) here and now, through the cache; any other by ``encode_async``."""
        if not add_special_tokens and self.prefix_cache.enabled and len(text) >= MIN_PREFIX_CHARS:
            return self.prefix_cache.encode(text)
        return await self.encode_async(text, add_special_tokens)

    async def encode_async(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """``encode`` in the process's encode thread, batched with the texts queued meanwhile
        (``dyn.core.frontend.encode_thread``): the event loop serves others until the ids come."""
        encode_batch = self._encode_batch_special if add_special_tokens else self._encode_batch
        return await ENCODE_THREAD.encode(encode_batch, text)

    def _encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._encode_fast(texts, add_special_tokens=False)]

    def _encode_batch_special(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._encode_fast(texts, add_special_tokens=True)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self._decode(
            ids if isinstance(ids, list) else list(ids), skip_special_tokens=skip_special_tokens
        )

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary string of ``token_id`` (byte-level form, e.g. "Ġthe"), None when out of range."""
        return self.backend.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)


def _chat_templates(directory: Path, config: dict[str, Any]) -> dict[str, str]:
    templates: dict[str, str] = {}
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        templates[DEFAULT_TEMPLATE] = jinja.read_text(encoding="utf-8")
    extra = directory / "additional_chat_templates"
    if extra.is_dir():
        for f in sorted(extra.glob("*.jinja")):
            templates[f.name.removesuffix(".jinja")] = f.read_text(encoding="utf-8")
    if templates:
        return templates
    found = config.get("chat_template")
    if found is None:
        found = (read_model_json(str(directory), directory / "chat_template.json", False) or {}).get(
            "chat_template"
        )
    if isinstance(found, str):
        templates[DEFAULT_TEMPLATE] = found
    elif isinstance(found, list):
        for t in found:
            if isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str):
                templates[t["name"]] = t["template"]
    return templates
