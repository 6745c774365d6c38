"""A server's address as a user types it after ``--url``.

Two forms name the same server: its root, ``http://HOST:PORT``, and the OpenAI ``base_url`` form
``http://HOST:PORT/v1`` that ``dyn serve`` prints and the ``openai`` client takes; either may end in
a slash. ``server_root`` turns both into the root that clients append their routes to
(``/v1/models``, ``/kv/workers``), so no command asks for ``/v1/v1/models``.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from dyn.core.errors import ConfigError

OPENAI_PREFIX = "/v1"
EXAMPLES = "like http://127.0.0.1:8000 or http://127.0.0.1:8000/v1"


def server_root(url: str, flag: str = "--url") -> str:
    """The root URL of the server ``url`` names: scheme, host, port and any path before a final
    ``/v1`` (a reverse proxy's prefix), without a trailing slash.

    ``ConfigError`` with one sentence naming ``flag`` when ``url`` is not an http(s) URL with a
    host, has a bad port, or carries a query or fragment (routes are appended to it)."""
    text = url.strip()
    parts = urlsplit(text)
    if parts.scheme.lower() not in ("http", "https") or not text.lower().startswith(("http://", "https://")):
        raise ConfigError(
            f"{flag} {url!r} is not an HTTP URL: it must start with http:// or https://, {EXAMPLES}"
        )
    if not parts.hostname:
        raise ConfigError(f"{flag} {url!r} names no host; give one, {EXAMPLES}")
    try:
        parts.port  # noqa: B018  (urlsplit checks the port only when it is read)
    except ValueError:
        raise ConfigError(
            f"{flag} {url!r} has a bad port; give a port number up to 65535, {EXAMPLES}"
        ) from None
    if parts.query or parts.fragment or text.endswith(("?", "#")):
        raise ConfigError(
            f"{flag} {url!r} carries a query or fragment; give the server's address only, {EXAMPLES}"
        )
    path = parts.path.rstrip("/")
    if path.endswith(OPENAI_PREFIX):
        path = path[: -len(OPENAI_PREFIX)].rstrip("/")
    return f"{parts.scheme.lower()}://{parts.netloc}{path}"
