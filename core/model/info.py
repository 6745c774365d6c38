"""Model metadata read straight from a local Hugging Face-style directory, without transformers.

Workers need only token ids (vocab size, BOS/EOS, special tokens) and the context length; they never
tokenize, so this module parses the JSON files itself and stays cheap to import.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

TINY_MODEL_NAME = "dyn-tiny"
TINY_MODEL_DIR: Path = Path(__file__).resolve().parent / TINY_MODEL_NAME
TINY_MODEL_TOOL_CALL_PARSER = "hermes"
"""The tool-call format of dyn-tiny's chat template (Hermes / Qwen style): what a worker serving
it advertises unless told otherwise."""

DEFAULT_CONTEXT_LENGTH = 8192
"""Used when neither config.json nor tokenizer_config.json states a usable context length: a
conservative guess for a model that states none (the embedded dyn-tiny states 131072)."""

_CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
_SANE_MAX = 1 << 24  # transformers uses int(1e30) as "unset" for model_max_length


class ModelError(ValueError):
    """A model directory a user pointed at is unusable; the message says what is wrong and how to fix it."""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the serving layer needs to know about a model, without loading a tokenizer.

    `eos_token_ids` is the tokenizer's EOS first, then every further id from config.json and
    generation_config.json (each an int or a list), without duplicates. `special_token_ids` is sorted.
    """

    path: Path
    name: str
    vocab_size: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    context_length: int
    special_token_ids: tuple[int, ...]
    tokenizer_path: Path | None = None
    """Where the tokenizer files are when not in ``path`` (vLLM's ``--tokenizer``)."""

    @property
    def tokenizer_dir(self) -> Path:
        """The directory holding tokenizer.json, tokenizer_config.json and the chat template."""
        return self.tokenizer_path or self.path


class _AddedToken(msgspec.Struct):
    id: int
    content: str
    special: bool = False


class _TokModel(msgspec.Struct):
    vocab: dict[str, int] | list[Any] | None = None


class _TokenizerJson(msgspec.Struct):
    added_tokens: list[_AddedToken] = []
    model: _TokModel | None = None


def _where(model_path: str | Path | None, path: Path) -> str:
    return f"--model-path {model_path if model_path is not None else path}"


def read_model_json(where: str, path: Path, required: bool) -> dict[str, Any] | None:
    """A model directory's JSON object file; None when absent and not ``required``; else ModelError
    saying what to fix (``where`` names the directory in the message)."""
    if not path.is_file():
        if required:
            raise ModelError(
                f"{where}: no {path.name} found; pass a local Hugging Face model directory "
                f"(it needs tokenizer.json and tokenizer_config.json)"
            )
        return None
    try:
        obj = msgspec.json.decode(path.read_bytes())
    except msgspec.DecodeError as e:
        raise ModelError(f"{where}: {path.name} is not valid JSON ({e}); fix or replace the file") from None
    if not isinstance(obj, dict):
        raise ModelError(f"{where}: {path.name} must hold a JSON object; fix or replace the file")
    return obj


def _read_tokenizer_json(where: str, path: Path) -> _TokenizerJson:
    if not path.is_file():
        raise ModelError(
            f"{where}: no tokenizer.json found; pass a local Hugging Face model directory "
            f"with a fast tokenizer (tokenizer.json)"
        )
    try:
        return msgspec.json.decode(path.read_bytes(), type=_TokenizerJson)
    except msgspec.ValidationError as e:
        raise ModelError(
            f"{where}: tokenizer.json is not a Hugging Face tokenizers file ({e}); fix or replace the file"
        ) from None
    except msgspec.DecodeError as e:
        raise ModelError(
            f"{where}: tokenizer.json is not valid JSON ({e}); fix or replace the file"
        ) from None


def _ids(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


@dataclass(frozen=True, slots=True)
class ProcessorFiles:
    """A multimodal model's JSON files: ``config.json``, ``processor_config.json`` and
    ``preprocessor_config.json`` (each ``{}`` when absent), the processor files read from the
    tokenizer's directory first, then the model's."""

    config: dict[str, Any]
    processor: dict[str, Any]
    preprocessor: dict[str, Any]


def read_processor_files(info: ModelInfo) -> ProcessorFiles:
    """``info``'s ``ProcessorFiles`` (``ModelError`` for a file that is not a JSON object)."""
    where = str(info.path)
    config = read_model_json(where, info.path / "config.json", required=False) or {}
    processor: dict[str, Any] = {}
    preprocessor: dict[str, Any] = {}
    for directory in dict.fromkeys((info.tokenizer_dir, info.path)):
        processor = processor or read_model_json(where, directory / "processor_config.json", False) or {}
        preprocessor = (
            preprocessor or read_model_json(where, directory / "preprocessor_config.json", False) or {}
        )
    return ProcessorFiles(config, processor, preprocessor)


def token_content(value: Any) -> str | None:
    """A special token as a string, whether the config writes it as a string or as {"content": ...}."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _has_chat_template(directory: Path, tok_config: dict[str, Any]) -> bool:
    tmpl = tok_config.get("chat_template")
    if isinstance(tmpl, str) and tmpl.strip():
        return True
    if isinstance(tmpl, list) and any(isinstance(t, dict) and t.get("template") for t in tmpl):
        return True
    if (directory / "chat_template.jinja").is_file():
        return True
    if (directory / "chat_template.json").is_file():
        return True
    return False


def _context_length(config: dict[str, Any], tok_config: dict[str, Any]) -> int:
    sources = [config]
    if isinstance(config.get("text_config"), dict):
        sources.append(config["text_config"])
    found = [
        v
        for src in sources
        for k in _CONTEXT_KEYS
        if isinstance(v := src.get(k), int) and not isinstance(v, bool) and 0 < v
    ]
    length = min(found) if found else None
    mml = tok_config.get("model_max_length")
    if isinstance(mml, int) and not isinstance(mml, bool) and 0 < mml < _SANE_MAX:
        length = mml if length is None else min(length, mml)
    return length if length is not None else DEFAULT_CONTEXT_LENGTH


def load_model_info(
    model_path: str | Path | None = None,
    model_name: str | None = None,
    tokenizer_path: str | Path | None = None,
) -> ModelInfo:
    """Read a local Hugging Face-style model directory (None: the embedded dyn-tiny), its
    tokenizer files from ``tokenizer_path`` when that is given (vLLM's ``--tokenizer``: a
    directory with tokenizer.json, tokenizer_config.json and the chat template).

    Needs tokenizer.json and tokenizer_config.json with a chat template (in tokenizer_config.json, or
    a chat_template.jinja / chat_template.json beside it); config.json and generation_config.json are
    optional. `model_name` defaults to the directory's name. vocab_size is the largest of config.json's
    vocab_size and the highest token id in tokenizer.json plus one. context_length is the smallest of
    config.json's position limits and a sane tokenizer_config model_max_length, else
    ``DEFAULT_CONTEXT_LENGTH``.
    Raises ModelError for anything the user must fix.
    """
    directory = TINY_MODEL_DIR if model_path is None else Path(model_path).expanduser()
    where = _where(model_path, directory)
    if not directory.exists():
        raise ModelError(
            f"{where}: no such directory; pass a local Hugging Face model directory "
            f"(models are never downloaded)"
        )
    if not directory.is_dir():
        raise ModelError(f"{where}: not a directory; pass the directory that holds tokenizer.json")
    directory = directory.resolve()
    tok_dir, tok_where = directory, where
    if tokenizer_path is not None:
        tok_dir = Path(tokenizer_path).expanduser()
        tok_where = f"--tokenizer {tokenizer_path}"
        if not tok_dir.is_dir():
            raise ModelError(
                f"{tok_where}: not a directory; pass the local directory that holds tokenizer.json "
                "(tokenizers are never downloaded)"
            )
        tok_dir = tok_dir.resolve()

    tok = _read_tokenizer_json(tok_where, tok_dir / "tokenizer.json")
    tok_config = read_model_json(tok_where, tok_dir / "tokenizer_config.json", required=True) or {}
    config = read_model_json(where, directory / "config.json", required=False) or {}
    gen_config = read_model_json(where, directory / "generation_config.json", required=False) or {}
    if not _has_chat_template(tok_dir, tok_config):
        raise ModelError(
            f"{tok_where}: no chat template found (tokenizer_config.json has no chat_template and "
            f"there is no chat_template.jinja); use a chat/instruct model or add a template"
        )

    token_ids: dict[str, int] = {}
    vocab = tok.model.vocab if tok.model is not None else None
    top = -1
    if isinstance(vocab, dict):
        token_ids.update(vocab)
        top = max(vocab.values(), default=-1)
    elif isinstance(vocab, list):
        top = len(vocab) - 1
        token_ids.update(
            {v[0]: i for i, v in enumerate(vocab) if isinstance(v, list) and v and isinstance(v[0], str)}
        )
    for t in tok.added_tokens:
        token_ids[t.content] = t.id
        top = max(top, t.id)
    cfg_vocab = config.get("vocab_size")
    if not isinstance(cfg_vocab, int) or isinstance(cfg_vocab, bool):
        cfg_vocab = 0
    vocab_size = max(top + 1, cfg_vocab)
    if vocab_size <= 0:
        raise ModelError(f"{where}: tokenizer.json has no vocabulary; fix or replace the file")

    def token_id(key: str) -> int | None:
        content = token_content(tok_config.get(key))
        return token_ids.get(content) if content is not None else None

    bos = token_id("bos_token")
    if bos is None:
        bos = next(iter(_ids(gen_config.get("bos_token_id")) + _ids(config.get("bos_token_id"))), None)

    eos: list[int] = []
    tok_eos = token_id("eos_token")
    for i in (
        ([tok_eos] if tok_eos is not None else [])
        + _ids(config.get("eos_token_id"))
        + _ids(gen_config.get("eos_token_id"))
    ):
        if i not in eos:
            eos.append(i)

    return ModelInfo(
        path=directory,
        name=model_name or (TINY_MODEL_NAME if model_path is None else directory.name),
        vocab_size=vocab_size,
        bos_token_id=bos,
        eos_token_ids=tuple(eos),
        context_length=_context_length(config, tok_config),
        special_token_ids=tuple(sorted({t.id for t in tok.added_tokens if t.special})),
        tokenizer_path=None if tok_dir == directory else tok_dir,
    )
