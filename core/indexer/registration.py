"""``dyn indexer``'s HTTP API for following workers by hand: ``POST /register`` and
``POST /unregister``, and its peers, as NVIDIA Dynamo's standalone indexer takes them (reference
2.6), on top of the read-only views (``dyn.core.kv.views.IndexerHttpApp``).

- ``POST /register {"instance_id", "endpoint", "dp_rank"?, "replay_endpoint"?, "model_name"?,
  "block_size"?, "tenant_id"?}`` subscribes to ``endpoint`` (an engine's KV-event PUB socket,
  ``replay_endpoint`` its replay ROUTER) as that rank of the instance -> 201 ``{"status": "ok"}``.
  ``model_name`` must be the indexer's model and ``block_size`` its block size when given (the
  first registration of an indexer that knows none sets it); Dynamo requires both, dyn takes
  them from the indexer.
- ``POST /unregister {"instance_id", "dp_rank"?, "model_name"?, "tenant_id"?}`` stops following
  the instance (every rank, or ``dp_rank``) and drops its blocks -> 200 ``{"status": "ok"}``;
  404 when it is not registered.

- ``GET /peers`` -> the peers' URLs; ``POST /register_peer {"url"}`` -> 201 (409 for a URL that
  is not one, or past ``MAX_PEERS``), ``POST /deregister_peer {"url"}`` -> 200, 404 for an unknown
  one (``dyn.core.indexer.peers``: a starting indexer copies a peer's index).

A refusal is 409 with ``{"error": "<what to fix>"}`` (``IndexerService.register`` lists them).
Tenants are not built: one indexer keeps one tree, so a ``tenant_id`` other than ``"default"``
is refused (409 and 404), never silently merged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import msgspec

from dyn.core.indexer.peers import PeerBody
from dyn.core.indexer.workers import StaticWorker
from dyn.core.kv.views import U64_MAX, HttpError, IndexerHttpApp, decode_body

if TYPE_CHECKING:
    from dyn.core.indexer.service import IndexerService

DEFAULT_TENANT = "default"
_TENANTS_NOT_BUILT = "tenants are not built: this indexer keeps one tree, tenant 'default'"

InstanceId = Annotated[int, msgspec.Meta(ge=0)]  # and at most U64_MAX (checked: msgspec bounds stop at int64)
DpRank = Annotated[int, msgspec.Meta(ge=0, le=(1 << 32) - 1)]
Address = Annotated[str, msgspec.Meta(max_length=1024)]
Name = Annotated[str, msgspec.Meta(max_length=1024)]


class RegisterBody(msgspec.Struct):
    instance_id: InstanceId
    endpoint: Address
    dp_rank: DpRank = 0
    replay_endpoint: Address | None = None
    model_name: Name | None = None
    block_size: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)] | None = None
    tenant_id: Name = DEFAULT_TENANT


class UnregisterBody(msgspec.Struct):
    instance_id: InstanceId
    dp_rank: DpRank | None = None
    model_name: Name | None = None
    tenant_id: Name | None = None


class RegisteringHttpApp(IndexerHttpApp):
    """``IndexerHttpApp`` over an ``IndexerService``, with ``/register`` and ``/unregister``."""

    _GET: ClassVar[dict[str, str]] = {**IndexerHttpApp._GET, "/peers": "peers"}
    _POST: ClassVar[dict[str, str]] = {
        **IndexerHttpApp._POST,
        "/register": "register",
        "/unregister": "unregister",
        "/register_peer": "register_peer",
        "/deregister_peer": "deregister_peer",
    }

    def __init__(self, service: IndexerService, *, api_key: str | None = None) -> None:
        super().__init__(service, service.metrics, api_key=api_key)
        self.service = service

    def _answer(self, endpoint: str, body: bytes) -> tuple[int, bytes, bytes]:
        if endpoint == "register":
            reg = _instance_checked(decode_body(body, RegisterBody))
            if reg.tenant_id != DEFAULT_TENANT:
                raise HttpError(409, _TENANTS_NOT_BUILT)
            entry = StaticWorker(reg.instance_id, reg.dp_rank, reg.endpoint, reg.replay_endpoint)
            self.service.register(entry, model_name=reg.model_name, block_size=reg.block_size)
            return 201, _OK, _JSON
        if endpoint == "unregister":
            unreg = _instance_checked(decode_body(body, UnregisterBody))
            if unreg.tenant_id not in (None, DEFAULT_TENANT):
                raise HttpError(404, _TENANTS_NOT_BUILT)
            self.service.unregister(unreg.instance_id, unreg.dp_rank, model_name=unreg.model_name)
            return 200, _OK, _JSON
        peers = self.service.peers
        if endpoint == "peers":
            return 200, msgspec.json.encode(peers.urls()), _JSON
        if endpoint == "register_peer":
            try:
                peers.add(decode_body(body, PeerBody).url)
            except ValueError as exc:
                raise HttpError(409, str(exc)) from None
            return 201, _OK, _JSON
        if endpoint == "deregister_peer":
            if not peers.remove(decode_body(body, PeerBody).url):
                raise HttpError(404, "peer not found")
            return 200, _OK, _JSON
        return super()._answer(endpoint, body)


def _instance_checked(body: RegisterBody | UnregisterBody) -> Any:
    if body.instance_id > U64_MAX:
        raise HttpError(400, f"invalid request body: instance_id {body.instance_id} is over 2**64 - 1")
    return body


_OK = b'{"status":"ok"}'
_JSON = b"application/json"
