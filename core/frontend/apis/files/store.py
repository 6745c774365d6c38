"""``FileStore``: uploaded files, kept in memory and bounded (``BoundedStore``).

Each file is its bytes and what was said of them at upload: its name, its media type (the part's
``Content-Type``, else guessed from the name) and OpenAI's ``purpose``. The store holds at most
``max_count`` files and ``max_bytes`` of them, each for ``ttl_s`` seconds from its upload; the
least recently used goes first when a bound is reached. One frontend process holds its own: a
frontend that restarts forgets them, and the processes of ``--num-http-workers`` or frontends
behind one load balancer do not share them (a file uploaded to one is a 404 on another).
"""

from __future__ import annotations

import itertools
import re
import secrets
import time
from typing import NamedTuple

from dyn.core.frontend.bounded_store import BoundedStore
from dyn.core.protocol.errors import ApiError, bad_request

MEDIA_TYPE = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]{0,63}/[a-z0-9][a-z0-9!#$&^_.+-]{0,127}")
"""A media type as a file's ``Content-Type`` is served back (lower case, no parameters)."""
_UPLOADS = itertools.count()
"""Every upload's ``seq``."""


class StoredFile(NamedTuple):
    id: str
    filename: str
    mime_type: str
    purpose: str
    data: bytes
    created_at: int
    """Wall-clock seconds of the upload."""
    expires: float
    """The store's clock."""
    expires_at: int
    """Wall-clock seconds when it expires."""
    seq: int
    """Its place in the order of uploads (many share a second)."""

    @property
    def size(self) -> int:
        return len(self.data)


class FileStore(BoundedStore[StoredFile]):
    """Uploaded files by id (see the module docstring); ``clock`` is monotonic seconds."""

    def uploads(self) -> list[StoredFile]:
        """The live files, oldest upload first."""
        return sorted(self, key=lambda f: f.seq)

    def add(self, prefix: str, filename: str, mime_type: str, purpose: str, data: bytes) -> StoredFile | None:
        """Keep an upload under a new id (``prefix`` then 24 random hex digits: OpenAI's ids begin
        ``file-``, Anthropic's ``file_``); None when it alone exceeds ``max_bytes``. A
        ``mime_type`` that is not one (``type/subtype``, as ``MEDIA_TYPE`` reads it) is
        ``application/octet-stream``."""
        if not MEDIA_TYPE.fullmatch(mime_type):
            mime_type = "application/octet-stream"
        now = time.time()
        entry = StoredFile(
            f"{prefix}{secrets.token_hex(12)}",
            filename,
            mime_type,
            purpose,
            data,
            int(now),
            self.clock() + self.ttl_s,
            int(now + self.ttl_s),
            next(_UPLOADS),
        )
        return entry if self.keep(entry.id, entry) else None


def stored_file(store: FileStore, file_id: str, param: str) -> StoredFile:
    """The stored file ``file_id``; a 404 naming ``param`` when the store does not hold it."""
    stored = store.get(file_id)
    if stored is None:
        raise ApiError(
            404,
            f"{param}: no file {file_id[:256]!r} here: it was never uploaded to this frontend, was "
            "deleted, or expired or was evicted from its file store",
            param=param,
        )
    return stored


MAX_FILES_PER_REQUEST = 10
"""Most files one request may name by id (documents and images together), as it may name at most
``MAX_DOCUMENT_URLS`` documents by URL: a stored file is read (a PDF parsed, an image loaded) each
time it is named."""


class FileReads:
    """The uploaded files one request reads by id, bounded: at most ``MAX_FILES_PER_REQUEST`` of
    them and ``max_bytes`` (``--max-request-media-bytes``) together, a 400 naming the part past
    either."""

    def __init__(self, store: FileStore, max_bytes: int) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self.count = 0
        self.bytes = 0

    def take(self, file_id: str, param: str) -> StoredFile:
        stored = stored_file(self.store, file_id, param)
        self.count += 1
        self.bytes += stored.size
        if self.count > MAX_FILES_PER_REQUEST:
            raise bad_request(
                f"{param}: a request reads at most {MAX_FILES_PER_REQUEST} uploaded files by id", param=param
            )
        if self.bytes > self.max_bytes:
            raise bad_request(
                f"{param}: the files this request names by id add up to more than {self.max_bytes} bytes "
                "(--max-request-media-bytes)",
                param=param,
            )
        return stored
