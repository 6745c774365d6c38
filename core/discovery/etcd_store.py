"""The etcd discovery backend: worker records as etcd keys, each bound to an etcd lease.

Layout: ``/dyn/{namespace}/instances/{instance_id:x}`` holds the ``WorkerRecord`` as JSON. One
prefix per namespace means one range read lists a namespace and one prefix watch follows it; the
trailing ``/`` keeps ``a`` and ``a.routers`` apart. Dynamo's runtime keys its instances the same
way (a root segment, then namespace/component/endpoint, then the instance id in hex: under
``v1/instances/`` in its runtime, documented as ``/services/{ns}/{component}/{endpoint}/{id:x}``
in its discovery-plane design doc); dyn has no component/endpoint level (a worker
serves one request socket), and its root ``/dyn/`` keeps dyn's keys away from a Dynamo deployment
sharing the cluster. Dynamo binds all the keys of a process to one lease; here each record has a
lease of its own, because the store's contract gives each record its own ttl.

- ``put``: grants a lease of ``ceil(ttl_s)`` seconds (etcd counts whole seconds and raises a
  shorter ttl to its minimum, 2 s by default), puts the key on it, then revokes the lease of the
  record it replaced. ``keepalive``: reads the key and renews its lease (``LeaseExpired`` when the
  key or the lease is gone). ``delete``: in one transaction, removes the key and writes
  ``/dyn/{namespace}/deregistered/{id:x}`` on the record's lease, then revokes that lease (which
  removes the marker): a watcher that sees the removal in the same revision as the marker reports
  ``"deregistered"``; a removal without it (the lease expired: the owner died) ``"expired"``.
- ``list``: one range read. ``watch``: lists, yields the records, then follows etcd's watch
  from the list's revision + 1 (no polling). When the stream breaks (etcd restarted, a network
  error) it watches again, with back-off, from the last revision it reported + 1, so what
  happened meanwhile comes with its reasons. When that history is gone (compacted, or an etcd
  that came back without its data: its revision went back) it lists again, yields the difference
  from what it had reported (records gone meanwhile as ``WorkerRemoved(reason="expired")``: who
  removed them cannot be known any more) and watches on; nothing is lost or reported twice.
- etcd unreachable: ``open_store`` checks that etcd answers (synchronously, before a command's
  event loop starts) and raises ``EtcdUnavailable``, a ``ConfigError`` naming the endpoints and
  the flag, which the commands print as one line. Later, a call raises it too (the lease
  heartbeat logs and retries), and a running watcher never raises for it: it logs once and
  reconnects.

Expiry is etcd's (its clock, its lease timer): ``clock`` only times the lease heartbeat.
"""

from __future__ import annotations

import builtins
import logging
import math
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Any, Literal

import anyio
import httpx
import msgspec

from dyn.core.discovery.etcd_gateway import (
    CODE_NOT_FOUND,
    EtcdError,
    EtcdGateway,
    EtcdUnavailable,
    WatchCompacted,
    b64,
    prefix_end,
    unb64,
)
from dyn.core.discovery.store import (
    SYSTEM_CLOCK,
    Clock,
    DiscoveryEvent,
    DiscoveryStore,
    LeaseExpired,
    WorkerAdded,
    WorkerRemoved,
    validate_namespace,
)
from dyn.core.messages import WorkerRecord

log = logging.getLogger(__name__)

KEY_ROOT = "/dyn/"
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 2.0

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(WorkerRecord)


class EtcdDiscoveryStore(DiscoveryStore):
    """Worker records of ``namespace`` in the etcd cluster at ``endpoints``; see the module docstring.

    ``gateway``: share another store's connection (the services' stores of ``for_namespace``);
    such a store leaves closing it to its owner.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str] | None,
        namespace: str,
        *,
        gateway: EtcdGateway | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.namespace = validate_namespace(namespace)
        self._owns_gateway = gateway is None
        self.gateway = gateway if gateway is not None else EtcdGateway(endpoints)
        self.endpoints = self.gateway.endpoints
        self.clock = clock
        self.prefix = f"{KEY_ROOT}{namespace}/instances/"
        self.marker_prefix = f"{KEY_ROOT}{namespace}/deregistered/"

    def for_namespace(self, namespace: str) -> EtcdDiscoveryStore:
        """A store of ``namespace`` on this store's connection (closing it stays this store's)."""
        return EtcdDiscoveryStore(self.endpoints, namespace, gateway=self.gateway, clock=self.clock)

    def key_of(self, instance_id: int) -> str:
        """The key that holds the record of ``instance_id``."""
        return f"{self.prefix}{instance_id:x}"

    async def put(self, record: WorkerRecord, ttl_s: float) -> None:
        ttl_s = self.checked_ttl(record, ttl_s)
        granted = await self.gateway.call("lease/grant", {"TTL": max(1, math.ceil(ttl_s))})
        lease = granted["ID"]
        answer = await self.gateway.call(
            "kv/put",
            {
                "key": b64(self.key_of(record.instance_id)),
                "value": b64(_encoder.encode(record)),
                "lease": lease,
                "prev_kv": True,
            },
        )
        previous = answer.get("prev_kv", {}).get("lease")
        if previous and previous != lease:
            await self._revoke(previous)

    async def keepalive(self, instance_id: int) -> None:
        kv = await self._get(instance_id)
        if kv is None or not kv.get("lease"):
            raise LeaseExpired(f"no discovery record for instance {instance_id}")
        answer = await self.gateway.call("lease/keepalive", {"ID": kv["lease"]})
        if int(answer.get("result", answer).get("TTL", 0)) <= 0:
            raise LeaseExpired(f"the discovery record of instance {instance_id} expired")

    async def delete(self, instance_id: int) -> None:
        key = b64(self.key_of(instance_id))
        marker = b64(f"{self.marker_prefix}{instance_id:x}")
        for _ in range(3):
            kv = await self._get(instance_id)
            if kv is None:
                return
            lease = kv.get("lease")
            remove: dict[str, Any] = {"request_delete_range": {"key": key}}
            success = [{"request_put": {"key": marker, "value": "", "lease": lease}}, remove]
            try:
                answer = await self.gateway.call(
                    "kv/txn",
                    {
                        "compare": [
                            {
                                "key": key,
                                "target": "MOD",
                                "result": "EQUAL",
                                "mod_revision": kv["mod_revision"],
                            }
                        ],
                        "success": success if lease else [remove],
                    },
                )
            except EtcdError as exc:
                if exc.code != CODE_NOT_FOUND:  # the lease expired meanwhile: look again
                    raise
                continue
            if answer.get("succeeded"):
                if lease:
                    await self._revoke(lease)
                return
        await self.gateway.call("kv/deleterange", {"key": key})

    async def list(self) -> list[WorkerRecord]:
        records, _ = await self._list()
        return [records[instance_id] for instance_id in sorted(records)]

    async def watch(self) -> AsyncGenerator[DiscoveryEvent, None]:
        known: dict[int, WorkerRecord] = {}
        retry_s = RETRY_FIRST_S
        lost: str | None = None
        revision: int | None = None  # every change up to it was reported; None: list (again)
        while True:
            try:
                current, listed = await self._list()
            except (EtcdUnavailable, EtcdError) as exc:
                lost = self._lost(lost, str(exc))
                await anyio.sleep(retry_s)
                retry_s = min(retry_s * 2, RETRY_MAX_S)
                continue
            if lost is not None:
                log.info("etcd is back; following namespace %r again", self.namespace)
                lost = None
            if revision is None or listed < revision:
                # the first listing, a compacted history, or an etcd that came back without its
                # data (its revision went back): report the difference from what was reported
                for instance_id in sorted(known.keys() - current.keys()):
                    del known[instance_id]
                    yield WorkerRemoved(instance_id=instance_id, reason="expired")
                for instance_id in sorted(current):
                    if known.get(instance_id) != current[instance_id]:
                        known[instance_id] = current[instance_id]
                        yield WorkerAdded(record=current[instance_id])
                revision = listed
            # else: etcd kept its history (a restart, a lost connection); watching on from the last
            # revision reported replays what happened meanwhile, deregistrations told from expiries
            stream = self.gateway.watch(
                {
                    "key": b64(f"{KEY_ROOT}{self.namespace}/"),
                    "range_end": prefix_end(f"{KEY_ROOT}{self.namespace}/"),
                    "start_revision": str(revision + 1),
                }
            )
            try:
                async with aclosing(stream):  # the HTTP stream closes with us, not at garbage collection
                    async for response in stream:
                        retry_s = RETRY_FIRST_S
                        events = response.get("events", [])
                        for event in self._events(events, known):
                            yield event
                        for event in events:
                            revision = max(revision, int(event["kv"].get("mod_revision", 0)))
                reason = "etcd closed the watch"
            except WatchCompacted:
                log.info("etcd compacted past the watch of namespace %r; listing again", self.namespace)
                revision = None
                continue
            except (EtcdUnavailable, EtcdError, httpx.TransportError, ValueError) as exc:
                reason = str(exc) or type(exc).__name__
            lost = self._lost(lost, reason)
            await anyio.sleep(retry_s)
            retry_s = min(retry_s * 2, RETRY_MAX_S)

    async def aclose(self) -> None:
        if self._owns_gateway:
            await self.gateway.aclose()

    # ------------------------------------------------------------------ internals

    def _lost(self, lost: str | None, reason: str) -> str:
        if lost is None:
            log.warning("lost the etcd watch of namespace %r (%s); reconnecting", self.namespace, reason)
        return reason

    def _events(
        self, events: Sequence[dict[str, Any]], known: dict[int, WorkerRecord]
    ) -> Sequence[DiscoveryEvent]:
        """The discovery events of one watch response (one or more revisions)."""
        deregistered = set()
        for event in events:
            key = unb64(event["kv"].get("key")).decode()
            if event.get("type", "PUT") == "PUT" and key.startswith(self.marker_prefix):
                deregistered.add(key[len(self.marker_prefix) :])
        out: builtins.list[DiscoveryEvent] = []
        for event in events:
            kv = event["kv"]
            key = unb64(kv.get("key")).decode()
            if not key.startswith(self.prefix):
                continue
            name = key[len(self.prefix) :]
            try:
                instance_id = int(name, 16)
            except ValueError:
                continue
            if event.get("type", "PUT") == "PUT":
                record = self._decode(key, kv)
                if record is not None and known.get(instance_id) != record:
                    known[instance_id] = record
                    out.append(WorkerAdded(record=record))
            elif known.pop(instance_id, None) is not None:
                reason: Literal["deregistered", "expired"] = (
                    "deregistered" if name in deregistered else "expired"
                )
                out.append(WorkerRemoved(instance_id=instance_id, reason=reason))
        return out

    async def _list(self) -> tuple[dict[int, WorkerRecord], int]:
        """The live records by instance id, and the revision they were read at."""
        answer = await self.gateway.call(
            "kv/range", {"key": b64(self.prefix), "range_end": prefix_end(self.prefix)}
        )
        records: dict[int, WorkerRecord] = {}
        for kv in answer.get("kvs", []):
            key = unb64(kv.get("key")).decode()
            record = self._decode(key, kv)
            if record is not None:
                records[record.instance_id] = record
        return records, int(answer["header"]["revision"])

    def _decode(self, key: str, kv: dict[str, Any]) -> WorkerRecord | None:
        """The record a key holds, or None if it is not a valid record for that key (warned)."""
        try:
            record = _decoder.decode(unb64(kv.get("value")))
            if self.key_of(record.instance_id) != key:
                raise ValueError(f"it holds instance {record.instance_id}")
        except ValueError as exc:  # msgspec.DecodeError is a ValueError
            log.warning("skipping unreadable discovery record %s in etcd: %s", key, exc)
            return None
        return record

    async def _get(self, instance_id: int) -> dict[str, Any] | None:
        answer = await self.gateway.call("kv/range", {"key": b64(self.key_of(instance_id))})
        kvs: Sequence[dict[str, Any]] = answer.get("kvs", ())
        return kvs[0] if kvs else None

    async def _revoke(self, lease: str) -> None:
        try:
            await self.gateway.call("lease/revoke", {"ID": lease})
        except EtcdError as exc:
            if exc.code != CODE_NOT_FOUND:
                raise
