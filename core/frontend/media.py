"""Images, audio and video in chat messages: found, counted, fetched and checked once, in the frontend.

``load_media(messages, settings)`` returns every media part of a chat request's messages, in
order of appearance, as ``LoadedMedia`` (the encoded bytes as sent, their format, their SHA-256),
or raises ``ApiError`` 400 naming the part (``messages[1].content[0].image_url``). A broken,
oversized, unreachable or forbidden item is always a 400, never a 500 and never a hang.

Part shapes are vLLM's (``vllm/renderers/chat_utils.py``): ``image_url``, ``audio_url`` and
``video_url`` hold ``{"url": ...}`` or the URL string itself; ``input_audio`` holds
``{"data": <base64>, "format": ...}`` (the format is not trusted: the bytes decide); the
Responses API's ``input_image`` holds ``image_url`` as a string. A part without ``type`` is
recognised by its key, as vLLM does. ``image_pil``, ``*_embeds``, ``prompt_embeds`` and
``uuid``-only references (a ``uuid`` without data) are refused; a ``uuid`` beside data is ignored:
the content hash identifies the item. ``detail`` is ignored, as vLLM ignores it. Other part types
are not media and are left to the chat template.

URLs:
- ``data:<mime>;base64,<data>``: bounded by its length before decoding, decoded strictly.
- ``file://`` URLs and absolute paths: only under ``MediaSettings.allowed_local_media_path``
  (symlinks and ``..`` resolved first), regular files only, size checked before reading.
- ``http(s)://`` (also for documents named by URL: ``fetch_documents``): only from
  ``allowed_media_domains`` when set (checked again at every redirect);
  streamed with the byte bound enforced while reading, within the modality's fetch timeout,
  redirects followed by hand (at most ``max_redirects``, http and https only). gzip and deflate
  bodies are inflated with the same bound; other content encodings are refused. Private and
  loopback addresses are not refused (vLLM does not either): ``--allowed-media-domains`` is the
  guard.

Checks (in a worker thread, at most ``DECODE_THREADS`` at once in the process):
- Images are decoded with Pillow (PNG, JPEG, WebP, GIF, BMP only): the pixel count is checked
  from the header before the pixels are decoded, then the first frame is decoded in full.
- Audio: WAV's RIFF header is parsed here (PCM, float, A-law, mu-law and extensible formats; the
  stdlib ``wave`` module of Python 3.11 reads PCM only) for the clip's frames and rate; MP3, FLAC
  and Ogg are recognised by their magic bytes and, where soundfile is installed (the ``audio``
  extra), decoded here block by block to count their frames (a clip it cannot decode is a 400);
  without it their length stays unknown, and a model that counts tokens by length refuses them.
  The engine decodes the clip again from the bytes as sent.
- Video: the container's magic bytes (MP4/QuickTime ``ftyp``, WebM/Matroska EBML, AVI), then,
  where OpenCV is installed (the ``video`` extra), its frame count, rate and frame size as vLLM's
  OpenCV loader reads them (the header's count, or the frames a seek to the end finds when the
  header claims more); a frame over the pixel bound, a clip OpenCV cannot open or one without
  frames is a 400. The frames are not decoded here: the engine decodes them from the bytes as
  sent. Without OpenCV the clip's shape stays unknown, and a model that counts tokens by it
  refuses the clip.

Counts per modality (``limit_mm_per_prompt``) are checked before anything is loaded; bytes per
item (``max_media_bytes``) and per request (``max_request_media_bytes``) before or while reading.
A request's items load concurrently (``LOADS_AT_ONCE``); the first failure stops the others, and
the error reported is that of the earliest failed part.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import stat
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args
from urllib.parse import unquote, urlsplit

import anyio
import anyio.to_thread

from dyn.core.errors import ConfigError
from dyn.core.messages import MediaItem, MediaModality
from dyn.core.protocol.errors import ApiError, bad_request

if TYPE_CHECKING:
    import httpx

MODALITIES: tuple[MediaModality, ...] = get_args(MediaModality)
DEFAULT_LIMIT_PER_PROMPT = 999
"""vLLM's ``MultiModalConfig.get_limit_per_prompt`` for a modality ``--limit-mm-per-prompt`` omits."""
DEFAULT_FETCH_TIMEOUT_S: Mapping[str, float] = {"image": 5.0, "audio": 10.0, "video": 30.0, "document": 10.0}
"""vLLM's ``VLLM_IMAGE_FETCH_TIMEOUT``, ``VLLM_AUDIO_FETCH_TIMEOUT`` and ``VLLM_VIDEO_FETCH_TIMEOUT``;
a document's (``fetch_documents``) as an audio clip's."""
MAX_DOCUMENT_URLS = 10
"""Most documents one request may name by URL (``fetch_documents``)."""
Fetched = MediaModality | Literal["document"]
"""What an http(s) fetch brings: a media item, or a document read as text."""
DEFAULT_MAX_IMAGE_PIXELS = 178_956_970
"""vLLM's ``VLLM_MAX_IMAGE_PIXELS`` (twice Pillow's ``MAX_IMAGE_PIXELS``, where Pillow refuses)."""
DECODE_THREADS = 4
"""Items checked at once in the process: bounds the memory of decoded images (4 bytes a pixel)."""
LOADS_AT_ONCE = 8
"""Items of one request loaded at once (vLLM's ``VLLM_MEDIA_LOADING_THREAD_COUNT``)."""
_IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
_CHUNK = 64 << 10


@dataclass(frozen=True, slots=True)
class MediaSettings:
    """What the frontend loads, from where, and how much (``--allowed-local-media-path``,
    ``--allowed-media-domains``, ``--limit-mm-per-prompt``, ``--max-media-bytes``,
    ``--max-request-media-bytes``, ``--media-fetch-timeout``, ``--max-image-pixels``).

    Construction checks every value (``ConfigError``); ``allowed_local_media_path`` is stored
    resolved and must be an existing directory, as vLLM requires; domains are stored lowercase."""

    allowed_local_media_path: str | None = None
    """Files are read only under this directory; None: file paths and ``file://`` are refused."""
    allowed_media_domains: tuple[str, ...] = ()
    """Host names http(s) URLs may name (at every redirect); empty: any host."""
    limit_mm_per_prompt: Mapping[str, int] = field(default_factory=dict)
    """Most items of a modality one request may hold; a modality not named: 999 (vLLM's)."""
    max_media_bytes: int = 20 << 20
    """Largest encoded item (OpenAI's documented 20 MB an image)."""
    max_request_media_bytes: int = 50 << 20
    """Most encoded bytes of all of one request's items together (OpenAI's 50 MB a request)."""
    fetch_timeout_s: float | None = None
    """Longest an http(s) fetch may take, redirects and body included; None: vLLM's per modality
    (``DEFAULT_FETCH_TIMEOUT_S``)."""
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    """Most pixels (width x height) of an image, checked before its pixels are decoded; at most
    vLLM's default, which is where Pillow itself refuses (``DecompressionBombError``)."""
    max_redirects: int = 10
    """Most redirects one fetch follows (aiohttp's default, which vLLM uses)."""

    def __post_init__(self) -> None:
        root = self.allowed_local_media_path
        if root is not None:
            resolved = Path(root).expanduser().resolve()
            if not resolved.is_dir():
                what = "does not exist" if not resolved.exists() else "is not a directory"
                raise ConfigError(f"--allowed-local-media-path {root}: {what}; give an existing directory")
            object.__setattr__(self, "allowed_local_media_path", str(resolved))
        domains = tuple(d.strip().lower() for d in self.allowed_media_domains)
        for domain in domains:
            if not domain or "/" in domain or "@" in domain:
                raise ConfigError(
                    f"--allowed-media-domains {domain!r}: give host names (example.com), without a "
                    "scheme or path"
                )
        object.__setattr__(self, "allowed_media_domains", domains)
        for modality, limit in self.limit_mm_per_prompt.items():
            if modality not in MODALITIES:
                raise ConfigError(
                    f"--limit-mm-per-prompt: unknown modality {modality!r}; dyn takes {', '.join(MODALITIES)}"
                )
            if type(limit) is not int or limit < 0:
                raise ConfigError(
                    f"--limit-mm-per-prompt: {modality} must be a count of 0 or more, got {limit!r}"
                )
        for name in ("max_media_bytes", "max_request_media_bytes", "max_image_pixels"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
        if self.max_image_pixels > DEFAULT_MAX_IMAGE_PIXELS:
            raise ConfigError(
                f"--max-image-pixels can be at most {DEFAULT_MAX_IMAGE_PIXELS}, where Pillow refuses to decode"
            )
        if self.max_redirects < 0:
            raise ConfigError("max_redirects must be 0 or more")
        if self.fetch_timeout_s is not None and not self.fetch_timeout_s > 0:
            raise ConfigError("--media-fetch-timeout must be more than 0 seconds")

    def limit(self, modality: MediaModality) -> int:
        """Most items of ``modality`` one request may hold."""
        return self.limit_mm_per_prompt.get(modality, DEFAULT_LIMIT_PER_PROMPT)

    def timeout_s(self, modality: Fetched) -> float:
        """Longest one fetch of a ``modality`` item may take."""
        return self.fetch_timeout_s if self.fetch_timeout_s is not None else DEFAULT_FETCH_TIMEOUT_S[modality]


def parse_limit_mm_per_prompt(text: str) -> dict[str, int]:
    """``--limit-mm-per-prompt`` as vLLM takes it: a JSON object of counts (``{"image": 4}``) or
    of options with a count (``{"video": {"count": 1, "num_frames": 32}}``: the other options
    size vLLM's memory profiling and mean nothing here). ``ConfigError`` for anything else."""
    import json

    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--limit-mm-per-prompt: not JSON ({exc}); give e.g. '{{\"image\": 4}}'") from None
    if not isinstance(parsed, dict):
        raise ConfigError("--limit-mm-per-prompt must be a JSON object, e.g. '{\"image\": 4}'")
    limits: dict[str, int] = {}
    for modality, value in parsed.items():
        count = value.get("count") if isinstance(value, dict) else value
        if type(count) is not int:
            raise ConfigError(
                f"--limit-mm-per-prompt: {modality} must be a count or an object with a count, got {value!r}"
            )
        limits[modality] = count
    return limits


@dataclass(frozen=True, slots=True)
class LoadedMedia:
    """One media part, loaded and checked: ``data`` is the encoded item as the client sent it,
    ``mime`` its format as found in the bytes (not as declared), ``mm_hash`` the SHA-256 hex of
    ``data``. ``message`` and ``part`` index it in the request (``param`` names it for errors);
    ``width`` and ``height`` are an image's or a video's frames'; ``frames`` (samples per
    channel) and ``sample_rate`` an audio clip's; ``frames`` and ``fps`` a video's; each when
    known (None otherwise)."""

    modality: MediaModality
    data: bytes
    mime: str
    mm_hash: str
    message: int
    part: int
    param: str
    width: int | None = None
    height: int | None = None
    frames: int | None = None
    sample_rate: int | None = None
    fps: float | None = None

    def item(self, offset: int, length: int) -> MediaItem:
        """The ``MediaItem`` a worker gets, its placeholder tokens at ``offset`` for ``length``."""
        return MediaItem(self.modality, self.data, self.mime, self.mm_hash, offset, length)


@dataclass(frozen=True, slots=True)
class MediaPart:
    """A media part found in the messages, not loaded yet: a ``url`` or base64 ``data`` (a
    ``document`` only by http(s) URL, for ``fetch_documents``)."""

    modality: Fetched
    message: int
    part: int
    param: str
    url: str | None = None
    data: str | None = None


_URL_PARTS: dict[str, MediaModality] = {
    "image_url": "image",
    "input_image": "image",
    "audio_url": "audio",
    "video_url": "video",
}
_UNSUPPORTED = {
    "image_pil": "PIL images are an input of vLLM's offline API; send the image as an image_url",
    "image_embeds": "precomputed embeddings are not taken by dyn; send the image as an image_url",
    "audio_embeds": "precomputed embeddings are not taken by dyn; send the audio as input_audio or audio_url",
    "video_embeds": "precomputed embeddings are not taken by dyn; send the video as a video_url",
    "prompt_embeds": "prompt embeddings are not taken by dyn; send text or token ids",
}
_KEYS = (
    *("image_url", "image_pil", "image_embeds", "audio_embeds", "video_embeds", "prompt_embeds"),
    *("audio_url", "input_audio", "video_url"),
)
"""The keys vLLM recognises a part without ``type`` by, in its order."""


_MEDIA_TYPES = frozenset({*_URL_PARTS, "input_audio", *_UNSUPPORTED})
_MEDIA_KEYS = frozenset(_KEYS)


def is_media_part(part: Mapping[str, Any]) -> bool:
    """Whether ``media_parts`` would take ``part`` as media (or refuse it as such): its ``type``
    names a media part, or it has none (or a ``uuid``) and holds one of vLLM's media keys. Cheap
    (a set lookup or a key-set test): the prompt-size bound asks it of every object of the
    messages."""
    kind = part.get("type")
    if (kind is None or "uuid" in part) and not _MEDIA_KEYS.isdisjoint(part.keys()):
        return True
    return isinstance(kind, str) and kind in _MEDIA_TYPES


def media_parts(messages: Sequence[Any]) -> list[MediaPart]:
    """Every media part of ``messages`` (as the protocol decodes them), in order; ``ApiError``
    400 for a part vLLM would take as media that has no usable URL or data, or that dyn refuses."""
    found: list[MediaPart] = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            # is_media_part first: most parts are text, and naming one costs more than testing it
            if isinstance(part, Mapping) and is_media_part(part) and (media := _media_part(part, i, j)):
                found.append(media)
    return found


def _kind(part: Mapping[str, Any]) -> Any:
    """The part's type: its ``type``, else (or beside a ``uuid``) the first key vLLM knows."""
    kind = part.get("type")
    if kind is None or part.get("uuid") is not None:
        kind = next((k for k in _KEYS if k in part), kind)
    return kind


def part_modality(part: Mapping[str, Any]) -> MediaModality | None:
    """The modality of a content part ``media_parts`` takes as media, without checking it
    (None: not a media part); what the chat template renders as a placeholder."""
    kind = _kind(part)
    if kind == "input_audio":
        return "audio"
    return _URL_PARTS.get(kind) if isinstance(kind, str) else None


def _media_part(part: Mapping[str, Any], i: int, j: int) -> MediaPart | None:
    where = f"messages[{i}].content[{j}]"
    kind = _kind(part)
    if not isinstance(kind, str):
        return None
    if kind in _UNSUPPORTED:
        raise bad_request(f"{where}: {kind} parts are not supported: {_UNSUPPORTED[kind]}", param=where)
    if kind == "input_audio":
        audio = part.get("input_audio")
        data = audio.get("data") if isinstance(audio, Mapping) else None
        if not isinstance(data, str) or not data:
            raise _no_data(part, f"{where}.input_audio", "must hold base64 'data' (and its 'format')")
        return MediaPart("audio", i, j, f"{where}.input_audio", data=data)
    modality = _URL_PARTS.get(kind)
    if modality is None:
        return None
    key = "image_url" if kind == "input_image" else kind
    value = part.get(key)
    url = value.get("url") if isinstance(value, Mapping) else value
    if not isinstance(url, str) or not url:
        if kind == "input_image" and part.get("file_id") is not None:
            raise bad_request(
                f"{where}.file_id: images by file_id (uploads to /v1/files) are read in the Responses "
                "and Messages APIs; send an image_url here",
                param=f"{where}.file_id",
            )
        raise _no_data(part, f"{where}.{key}", "must hold a URL: a data: URL, an http(s) URL or a file")
    return MediaPart(modality, i, j, f"{where}.{key}", url=url)


def _no_data(part: Mapping[str, Any], param: str, what: str) -> ApiError:
    if part.get("uuid") is not None:
        what = "must carry its data: references by uuid to media of an earlier request are not supported"
    return bad_request(f"{param} {what}", param=param)


def check_counts(parts: Sequence[MediaPart], settings: MediaSettings) -> None:
    """``ApiError`` 400 when ``parts`` hold more items of a modality than ``limit_mm_per_prompt``."""
    for modality in MODALITIES:
        count = sum(1 for p in parts if p.modality == modality)
        limit = settings.limit(modality)
        if count > limit:
            raise bad_request(
                f"At most {limit} {modality}(s) may be provided in one prompt; this request has "
                f"{count}. Send fewer, or start the frontend with a larger --limit-mm-per-prompt",
                param="messages",
            )


async def load_media(
    messages: Sequence[Any], settings: MediaSettings, *, http: httpx.AsyncClient | None = None
) -> list[LoadedMedia]:
    """Every media part of ``messages``, loaded and checked, in order of appearance (see the
    module docstring); ``ApiError`` 400 naming the first part that fails. ``http`` fetches
    http(s) URLs (a client made for this call and closed after it when None)."""
    parts = media_parts(messages)
    check_counts(parts, settings)
    if not parts:
        return []
    budget = _Budget(settings.max_request_media_bytes)
    loaded: list[LoadedMedia | None] = [None] * len(parts)
    failed: dict[int, ApiError] = {}
    room = anyio.Semaphore(LOADS_AT_ONCE)
    own_client = http is None and any(p.url is not None and _is_http(p.url) for p in parts)
    if own_client:
        import httpx  # here: importing it costs every dyn command 50 ms

        http = httpx.AsyncClient(trust_env=True)
    try:
        async with anyio.create_task_group() as tg:

            async def load(k: int, part: MediaPart) -> None:
                try:
                    async with room:
                        loaded[k] = await _load(part, settings, budget, http)
                except ApiError as exc:
                    failed[k] = exc
                    tg.cancel_scope.cancel()

            for k, part in enumerate(parts):
                tg.start_soon(load, k, part)
    finally:
        if own_client and http is not None:
            await http.aclose()
    if failed:
        raise failed[min(failed)]
    return [item for item in loaded if item is not None]


async def fetch_documents(urls: Sequence[tuple[str, str]], settings: MediaSettings) -> list[bytes]:
    """The bodies of a request's documents named by http(s) URL, each ``(url, param)`` (``param``
    names it in a 400), fetched at once under the rules and bounds of a media item's fetch (the
    allowed domains, ``--max-media-bytes`` each, ``--max-request-media-bytes`` together, the fetch
    timeout, redirects); at most ``MAX_DOCUMENT_URLS`` of them. The first failed one's 400 is raised."""
    if len(urls) > MAX_DOCUMENT_URLS:
        raise bad_request(
            f"this request names {len(urls)} documents by URL; at most {MAX_DOCUMENT_URLS} are fetched "
            "for one request: send the others' data",
            param=urls[MAX_DOCUMENT_URLS][1],
        )
    if not urls:
        return []
    import httpx

    budget = _Budget(settings.max_request_media_bytes)
    bodies: list[bytes] = [b""] * len(urls)
    failed: dict[int, ApiError] = {}
    async with httpx.AsyncClient(trust_env=True) as http, anyio.create_task_group() as tg:

        async def fetch(k: int, url: str, param: str) -> None:
            part = MediaPart("document", 0, 0, param, url=url)
            try:
                if not _is_http(url):
                    raise _refused(part, f"{url[:100]!r} is not an http(s) URL")
                bodies[k] = await _fetch(url, part, settings, budget, http)
            except ApiError as exc:
                failed[k] = exc
                tg.cancel_scope.cancel()

        for k, (url, param) in enumerate(urls):
            tg.start_soon(fetch, k, url, param)
    if failed:
        raise failed[min(failed)]
    return bodies


class _Budget:
    """The bytes all of one request's items may take together, shared by its loads."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0

    def take(self, size: int, part: MediaPart) -> None:
        self.used += size
        if self.used > self.total:
            raise _refused(
                part,
                f"the request's media add up to more than {_size(self.total)}; send fewer or smaller "
                "items, or start the frontend with a larger --max-request-media-bytes",
            )


class _Refused(Exception):
    """An item cannot be used; the message says why (raised in worker threads)."""


class _Oversize(Exception):
    """A file is larger than the item's bound."""


def _refused(part: MediaPart, why: str) -> ApiError:
    return bad_request(f"{part.param}: {why}", param=part.param)


def _too_big(part: MediaPart, settings: MediaSettings) -> ApiError:
    return _refused(
        part,
        f"the {part.modality} is larger than {_size(settings.max_media_bytes)}; send a smaller one, or "
        "start the frontend with a larger --max-media-bytes",
    )


def _size(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n} bytes"


async def _load(
    part: MediaPart, settings: MediaSettings, budget: _Budget, http: httpx.AsyncClient | None
) -> LoadedMedia:
    cap = settings.max_media_bytes
    url = part.url
    if part.data is not None:
        data = await _base64(part.data, part, settings, budget)
    elif url is not None and url[:5].lower() == "data:":
        data = await _data_url(url, part, settings, budget)
    elif url is not None and _is_http(url):
        assert http is not None
        data = await _fetch(url, part, settings, budget, http)
    elif url is not None and (url[:5].lower() == "file:" or url.startswith("/")):
        data = await _read_file(url, part, settings, budget)
    else:
        shown = (url or "")[:100]
        raise _refused(part, f"{shown!r} is not a data:, http(s) or file URL")
    if len(data) > cap:
        raise _too_big(part, settings)
    try:
        return await anyio.to_thread.run_sync(
            _checked, part, data, settings.max_image_pixels, limiter=_DECODING
        )
    except _Refused as exc:
        raise _refused(part, str(exc)) from None


_DECODING = anyio.CapacityLimiter(DECODE_THREADS)


def _is_http(url: str) -> bool:
    scheme = url.partition(":")[0].lower()
    return scheme in ("http", "https")


async def _base64(text: str, part: MediaPart, settings: MediaSettings, budget: _Budget) -> bytes:
    """Decode base64 ``text``, refusing it by its length alone when it would decode to more
    than the item's bound."""
    if len(text) > 4 * -(-settings.max_media_bytes // 3):
        raise _too_big(part, settings)
    budget.take(len(text) // 4 * 3 - text[-2:].count("="), part)
    try:
        return await anyio.to_thread.run_sync(_b64decode, text, limiter=_DECODING)
    except _Refused as exc:
        raise _refused(part, str(exc)) from None


def _b64decode(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _Refused(f"the base64 data is not valid ({exc})") from None


async def _data_url(url: str, part: MediaPart, settings: MediaSettings, budget: _Budget) -> bytes:
    """A ``data:`` URL's bytes (RFC 2397); base64 ones only, as vLLM."""
    spec, comma, payload = url[5:].partition(",")
    if not comma:
        raise _refused(part, "the data: URL has no ',' before its data")
    if spec.rpartition(";")[2].strip().lower() != "base64":
        raise _refused(part, "only base64 data: URLs are supported (data:<mime>;base64,<data>)")
    return await _base64(payload, part, settings, budget)


async def _read_file(url: str, part: MediaPart, settings: MediaSettings, budget: _Budget) -> bytes:
    root = settings.allowed_local_media_path
    if root is None:
        raise _refused(
            part,
            "this server reads no local files; send the data in a data: URL, or start the frontend "
            "with --allowed-local-media-path DIR",
        )
    if url[:5].lower() == "file:":
        split = urlsplit(url)
        if split.netloc not in ("", "localhost"):
            raise _refused(
                part, f"file URLs must name a local file (file:///path), not host {split.netloc!r}"
            )
        path = unquote(split.path)
    else:
        path = url
    cap = settings.max_media_bytes
    try:
        data = await anyio.to_thread.run_sync(_read_under, path, Path(root), cap)
    except _Refused as exc:
        raise _refused(part, str(exc)) from None
    except _Oversize:
        raise _too_big(part, settings) from None
    budget.take(len(data), part)
    return data


def _read_under(path: str, root: Path, cap: int) -> bytes:
    """The file at ``path`` if it resolves (symlinks and ``..`` followed) to a regular file under
    ``root`` of at most ``cap`` bytes (``_Oversize`` when larger, found before reading). Whether a
    file exists outside ``root`` is not revealed."""
    if not os.path.isabs(path):
        raise _Refused(f"{path!r} is not an absolute path")
    resolved = Path(path).resolve()
    if root not in resolved.parents:
        raise _Refused(f"{path} is not under --allowed-local-media-path {root}")
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(resolved, flags)
    except OSError as exc:
        raise _Refused(f"{path} cannot be read ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _Refused(f"{path} is not a regular file")
        if info.st_size > cap:
            raise _Oversize
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(cap + 1)
    except OSError as exc:
        raise _Refused(f"{path} cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > cap:  # it grew since fstat
        raise _Oversize
    return data


async def _fetch(
    url: str, part: MediaPart, settings: MediaSettings, budget: _Budget, http: httpx.AsyncClient
) -> bytes:
    import httpx

    timeout = settings.timeout_s(part.modality)
    shown = url if len(url) <= 200 else url[:200] + "..."
    try:
        with anyio.fail_after(timeout):
            return await _follow(httpx.URL(url), part, settings, budget, http, timeout)
    except TimeoutError:
        why = f"no complete answer within {timeout:g} s (--media-fetch-timeout)"
    except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError, OSError) as exc:
        why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    raise _refused(part, f"{shown} could not be fetched: {why}")


async def _follow(
    url: httpx.URL,
    part: MediaPart,
    settings: MediaSettings,
    budget: _Budget,
    http: httpx.AsyncClient,
    timeout: float,
) -> bytes:
    for _ in range(settings.max_redirects + 1):
        if url.scheme not in ("http", "https"):
            raise _refused(part, f"it redirects to a {url.scheme}: URL; only http and https are followed")
        domains = settings.allowed_media_domains
        if domains and url.host not in domains:
            raise _refused(
                part,
                f"{url.host} is not one of the allowed media domains ({', '.join(domains)}; --allowed-media-domains)",
            )
        headers = {"accept-encoding": "identity"}
        async with http.stream("GET", url, headers=headers, follow_redirects=False, timeout=timeout) as resp:
            if resp.is_redirect:
                url = url.join(resp.headers["location"])
                continue
            if not resp.is_success:
                raise _refused(part, f"{url} answered HTTP {resp.status_code}")
            return await _body(resp, part, settings, budget)
    raise _refused(part, f"it redirects more than {settings.max_redirects} times")


async def _body(resp: httpx.Response, part: MediaPart, settings: MediaSettings, budget: _Budget) -> bytes:
    """The response body, refused as soon as it passes the item's bound (``Content-Length``
    first, then the bytes as they arrive, inflated ones counted after inflating)."""
    cap = settings.max_media_bytes
    declared = resp.headers.get("content-length", "")
    encoding = resp.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("identity", ""):
        inflate = None
        if declared.isascii() and declared.isdigit() and int(declared) > cap:
            raise _too_big(part, settings)
    elif encoding in ("gzip", "x-gzip", "deflate"):
        inflate = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib header, told apart
    else:
        raise _refused(part, f"it was sent with Content-Encoding {encoding}; send it unencoded")
    body = bytearray()
    async for chunk in resp.aiter_raw(_CHUNK):
        if inflate is not None:
            try:
                chunk = inflate.decompress(chunk, cap - len(body) + 1)
            except zlib.error as exc:
                raise _refused(part, f"its {encoding} body is broken ({exc})") from None
        body += chunk
        budget.take(len(chunk), part)
        if len(body) > cap:
            raise _too_big(part, settings)
    if inflate is not None and not inflate.eof:
        raise _refused(part, f"its {encoding} body is truncated")
    return bytes(body)


def _checked(part: MediaPart, data: bytes, max_pixels: int) -> LoadedMedia:
    """``data`` checked as ``part.modality`` and hashed (runs in a worker thread)."""
    width = height = frames = rate = fps = None
    modality = part.modality
    assert modality != "document", "documents are fetched by fetch_documents, not loaded as media"
    if modality == "image":
        mime, width, height = _check_image(data, max_pixels)
    elif modality == "audio":
        mime, frames, rate = _check_audio(data)
    else:
        mime, frames, fps, width, height = _check_video(data, max_pixels)
    digest = hashlib.sha256(data).hexdigest()
    return LoadedMedia(
        modality, data, mime, digest, part.message, part.part, part.param, width, height, frames, rate, fps
    )


def _check_image(data: bytes, max_pixels: int) -> tuple[str, int, int]:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data), formats=_IMAGE_FORMATS) as image:
            width, height = image.size
            if width * height > max_pixels:
                raise _Refused(
                    f"the image is {width}x{height}, more than {max_pixels} pixels; send a smaller one "
                    "(or start the frontend with a larger --max-image-pixels)"
                )
            image.load()
            fmt = image.format or "PNG"
    except _Refused:
        raise
    except Image.DecompressionBombError:
        raise _Refused(f"the image has more than {max_pixels} pixels; send a smaller one") from None
    except Exception as exc:  # whatever Pillow raises on untrusted bytes: the image is broken
        raise _Refused(
            f"the image could not be decoded ({type(exc).__name__}: {exc}); send a whole PNG, JPEG, WebP, GIF or BMP image"
        ) from None
    return Image.MIME.get(fmt, f"image/{fmt.lower()}"), width, height


_WAV_FORMATS = {1: "PCM", 3: "float", 6: "A-law", 7: "mu-law", 0xFFFE: "extensible"}


def _check_audio(data: bytes) -> tuple[str, int | None, int | None]:
    """``(mime, frames, sample rate)`` of a clip; the length is None when unknown (see the module
    docstring)."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return ("audio/wav", *_wav_length(data))
    if data[:3] == b"ID3" or (
        len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0 and data[1] & 0x06
    ):
        mime = "audio/mpeg"
    elif data[:4] == b"fLaC":
        mime = "audio/flac"
    elif data[:4] == b"OggS":
        mime = "audio/ogg"
    else:
        raise _Refused("the audio is not WAV, MP3, FLAC or Ogg (by its first bytes); send one of those")
    return (mime, *_decoded_length(data, mime))


_AUDIO_BLOCK = 1 << 16
"""Frames decoded at a time when counting a compressed clip's (bounds the memory it takes)."""


def _decoded_length(data: bytes, mime: str) -> tuple[int | None, int | None]:
    """A compressed clip's frames and rate, counted by decoding it with soundfile (the engine's
    decoder, so the same count); ``(None, None)`` without soundfile."""
    try:
        import soundfile
    except ImportError:
        return None, None
    frames = 0
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as clip:
            rate = clip.samplerate
            while block := len(clip.read(_AUDIO_BLOCK, dtype="float32", always_2d=True)):
                frames += block
    except Exception as exc:  # libsndfile's errors on untrusted bytes: the clip is broken
        raise _Refused(f"the {mime} clip could not be decoded ({type(exc).__name__}: {exc})") from None
    if frames == 0 or rate < 1:
        raise _Refused("the clip holds no audio samples")
    return frames, rate


def _wav_length(data: bytes) -> tuple[int, int]:
    """A RIFF WAVE file's frames and sample rate, or ``_Refused`` when its header is broken. A
    ``data`` chunk longer than the file (a streamed WAV's placeholder size) is read to the end."""
    pos, fmt = 12, None
    while pos + 8 <= len(data):
        chunk, size = data[pos : pos + 4], int.from_bytes(data[pos + 4 : pos + 8], "little")
        body = pos + 8
        if chunk == b"fmt ":
            if size < 16 or body + 16 > len(data):
                raise _Refused("the WAV header is broken: its fmt chunk is truncated")
            fmt = struct.unpack_from("<HHIIHH", data, body)
            tag, channels, rate, _, align, _ = fmt
            if tag not in _WAV_FORMATS:
                raise _Refused(f"the WAV sample format {tag:#x} is not supported (PCM, float, A-law, mu-law)")
            if channels < 1 or rate < 1 or align < 1:
                raise _Refused(
                    f"the WAV header is broken: {channels} channel(s), {rate} Hz, {align}-byte frames"
                )
        elif chunk == b"data":
            if fmt is None:
                raise _Refused("the WAV header is broken: the data chunk comes before the fmt chunk")
            frames = min(size, len(data) - body) // fmt[4]
            if frames == 0:
                raise _Refused("the WAV file holds no audio samples")
            return frames, fmt[2]
        pos = body + size + (size & 1)
    missing = "fmt" if fmt is None else "data"
    raise _Refused(f"the WAV header is broken: it has no {missing} chunk")


def _check_video(
    data: bytes, max_pixels: int
) -> tuple[str, int | None, float | None, int | None, int | None]:
    """``(mime, frames, fps, width, height)`` of a clip; all but the format None without OpenCV
    (see the module docstring)."""
    mime = _video_format(data)
    cv2 = _opencv()
    if cv2 is None:
        return mime, None, None, None, None
    return (mime, *_video_shape(cv2, data, max_pixels))


def _opencv() -> Any:
    """OpenCV, quiet (None when it is not installed): OpenCV's and FFmpeg's own messages about a
    broken clip go to stderr past the frontend's logger, and the refusal already says it."""
    # read by OpenCV's FFmpeg backend when it first opens a clip: AV_LOG_QUIET
    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")
    try:
        import cv2
    except ImportError:
        return None
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
    return cv2


def _video_format(data: bytes) -> str:
    if data[4:8] == b"ftyp":
        return "video/quicktime" if data[8:12] == b"qt  " else "video/mp4"
    if data[:4] == b"\x1a\x45\xdf\xa3":
        return "video/webm" if b"webm" in data[:64] else "video/x-matroska"
    if data[:4] == b"RIFF" and data[8:12] == b"AVI ":
        return "video/x-msvideo"
    raise _Refused("the video is not MP4, QuickTime, WebM, Matroska or AVI (by its first bytes)")


def _video_shape(cv2: Any, data: bytes, max_pixels: int) -> tuple[int, float, int, int]:
    """A clip's frames, rate and frame size as vLLM's OpenCV loader reads them: through the first
    stream-buffered backend OpenCV has (FFmpeg), the header's frame count unless a seek to the end
    finds fewer frames shown."""
    from cv2 import videoio_registry as registry

    backend = next(iter(registry.getStreamBufferedBackends()), None)
    if backend is None:
        raise _Refused("this frontend's OpenCV cannot read videos from memory (it was built without FFmpeg)")
    stream = io.BytesIO(data)  # OpenCV reads it until released, without holding a reference
    try:
        capture = cv2.VideoCapture(stream, backend, [])
    except Exception as exc:  # OpenCV's errors on untrusted bytes: the clip is broken
        raise _Refused(f"the video could not be opened ({type(exc).__name__}: {exc})") from None
    try:
        if not capture.isOpened():
            raise _Refused("the video could not be opened; send a whole MP4, WebM, Matroska or AVI file")
        width = int(capture.get(cv2.CAP_PROP_FRAME_WIDTH))
        height = int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT))
        if width * height > max_pixels:
            raise _Refused(
                f"the video's frames are {width}x{height}, more than {max_pixels} pixels; send a smaller "
                "one (or start the frontend with a larger --max-image-pixels)"
            )
        frames, fps = int(capture.get(cv2.CAP_PROP_FRAME_COUNT)), float(capture.get(cv2.CAP_PROP_FPS))
        if frames > 0 and capture.set(cv2.CAP_PROP_POS_AVI_RATIO, 1.0):
            shown = int(capture.get(cv2.CAP_PROP_POS_FRAMES))
            if not capture.grab() and 0 < shown < frames - 1:
                frames = shown  # the header claims frames the stream does not have
        if frames <= 0 or width <= 0 or height <= 0:
            raise _Refused(f"the video has no frames to read ({frames} frame(s) of {width}x{height})")
        return frames, fps, width, height
    finally:
        capture.release()
        del stream
