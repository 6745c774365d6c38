"""Where ``dyn inspect-kv`` reads: the KV index views of a ``dyn indexer``, a frontend or a
``dyn router`` (``dyn.core.kv.views``), over HTTP.

- ``open_target(url)`` probes ``URL/workers`` (a ``dyn indexer``, views at the root), then
  ``URL/kv/workers`` (a frontend in kv mode, or a ``dyn router``'s ``--system-port``). A URL that
  already ends in ``/kv`` is taken as given.
- ``find_indexer_url(...)`` finds the most recently started live ``dyn indexer`` of a model in
  discovery (its record's ``endpoints.metrics`` is its HTTP base URL).

``KvTarget`` reads ``/workers``, ``/dump``, ``/metrics`` and ``POST /query`` under the views' base
URL. Everything a user can get wrong (nothing listening, a server without the views, an error
answer) raises ``TargetError`` with a sentence saying what to pass instead.
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import msgspec

from dyn.core.inspect.snapshot import Dump, WorkerEntry
from dyn.core.protocol.errors import error_message

TIMEOUT_S = 30.0
"""For an answer (a large index's dump takes a while); connecting gets ``CONNECT_TIMEOUT_S``."""
CONNECT_TIMEOUT_S = 5.0
KV_PREFIX = "/kv"
TARGETS_HINT = (
    "--url takes the http= address of a dyn indexer, the URL of a frontend with "
    "--router-mode kv, or the --system-port URL of a dyn router"
)


class TargetError(RuntimeError):
    """The target cannot be read; the message says what to check or pass instead."""


class KvTarget:
    """The index views at ``base`` (``http://HOST:PORT`` or ``http://HOST:PORT/kv``)."""

    def __init__(self, base: str, client: httpx.Client) -> None:
        self.base = base.rstrip("/")
        self.client = client

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> KvTarget:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def workers(self) -> list[WorkerEntry]:
        return self._decode("/workers", self._get("/workers"), list[WorkerEntry])

    def dump(self) -> tuple[str | None, Dump]:
        """The indexed model's name and its dump (an empty dump when the index names none)."""
        models = self._decode("/dump", self._get("/dump"), dict[str, Dump])
        if not models:
            return None, Dump(None, [])
        name = next(iter(models))
        return name, models[name]

    def metrics(self) -> str:
        return self._get("/metrics").text

    def query(self, token_ids: list[int]) -> dict[str, Any]:
        """The ``/query`` answer for a prompt (matched tokens per instance and rank)."""
        response = self._send("POST", "/query", json={"token_ids": token_ids})
        return self._decode("/query", response, dict[str, Any])

    # ----------------------------------------------------------------- plumbing

    def _get(self, path: str) -> httpx.Response:
        return self._send("GET", path)

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        url = self.base + path
        try:
            response = self.client.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            raise TargetError(f"cannot reach {url}: {_reason(exc)}; is the target still running?") from None
        if response.status_code != 200:
            raise TargetError(
                f"{method} {url} answered {response.status_code}: {error_message(response.content)}"
            )
        return response

    @staticmethod
    def _decode(path: str, response: httpx.Response, kind: Any) -> Any:
        try:
            return msgspec.json.decode(response.content, type=kind)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise TargetError(
                f"{response.url} did not answer like the KV index views' {path} ({exc}). {TARGETS_HINT}"
            ) from None


def open_target(
    url: str, *, timeout_s: float = TIMEOUT_S, client: httpx.Client | None = None, api_key: str | None = None
) -> KvTarget:
    """The views at ``url``: at its root (a ``dyn indexer``) or under ``/kv`` (frontend, router).
    The target owns ``client`` (default: a new one with ``timeout_s``, sending ``api_key`` as a
    bearer token when given) and closes it."""
    if not url.startswith(("http://", "https://")):
        raise TargetError(f"--url {url!r} is not an HTTP URL like http://127.0.0.1:8090; {TARGETS_HINT}")
    root = url.rstrip("/")
    if client is None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        client = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S), headers=headers)
    try:
        bases = [root] if root.endswith(KV_PREFIX) else [root, root + KV_PREFIX]
        for base in bases:
            try:
                response = client.get(base + "/workers")
            except httpx.HTTPError as exc:
                raise TargetError(
                    f"cannot reach {url} ({_reason(exc)}); check that it is running. {TARGETS_HINT}"
                ) from None
            if response.status_code == 200 and _is_list(response):
                return KvTarget(base, client)
        # the last probe (under /kv) says most: a frontend or router without an index says why
        raise TargetError(
            f"{url} serves no KV index views: {base}/workers answered "
            f"{response.status_code} ({error_message(response.content)}). {TARGETS_HINT}"
        )
    except BaseException:
        client.close()
        raise


def find_indexer_url(
    namespace: str,
    backend: str,
    discovery_dir: str | None,
    model_name: str | None,
    etcd_endpoints: str | None = None,
) -> str:
    """The HTTP URL of the newest live ``dyn indexer`` of ``model_name`` (None: any model) in
    ``namespace``; ``TargetError`` saying what to pass when there is none."""
    from dyn.core.discovery.backends import open_store
    from dyn.core.errors import ConfigError
    from dyn.core.indexer.client import indexers_store, serves_model

    try:
        store = indexers_store(open_store(backend, namespace, discovery_dir, etcd_endpoints=etcd_endpoints))
    except ConfigError:  # an unsafe discovery directory: the user's to fix
        raise
    except ValueError as exc:
        raise TargetError(str(exc)) from None

    async def newest() -> Any:
        try:
            records = [r for r in await store.list() if serves_model(r, model_name) and r.endpoints.metrics]
        finally:
            await store.aclose()
        return max(records, key=lambda r: (r.started_at, r.instance_id), default=None)

    record = anyio.run(newest)
    if record is None:
        which = f"model {model_name!r}" if model_name else "any model"
        where = f" under {discovery_dir}" if discovery_dir else ""
        raise TargetError(
            f"no live dyn indexer of {which} in namespace {namespace!r}{where}: start one with "
            f"'dyn indexer --namespace {namespace}', pass the --namespace, --discovery-dir or "
            f"--model-name it runs with, or pass --url. {TARGETS_HINT}"
        )
    return record.endpoints.metrics


def _is_list(response: httpx.Response) -> bool:
    try:
        return isinstance(response.json(), list)
    except ValueError:
        return False


def _reason(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"nothing answered: {exc}"
    if isinstance(exc, httpx.TimeoutException):
        return "no answer in time"
    return str(exc) or type(exc).__name__
