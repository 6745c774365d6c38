"""Settings every worker has, whatever its engine."""

from __future__ import annotations

import msgspec


class WorkerSettings(msgspec.Struct, kw_only=True, frozen=True):
    """Where a worker lives and how it registers.

    ``host`` is the loopback or interface address every socket binds to and advertises.
    ``lease_ttl_s``: how long discovery keeps the record without a heartbeat (the heartbeat runs
    every third of it). ``drain_timeout_s``: on shutdown, how long in-flight requests may run on
    after the worker has left discovery before they are cut off with an error.
    """

    namespace: str = "default"
    discovery_backend: str = "file"
    discovery_dir: str | None = None
    host: str = "127.0.0.1"
    lease_ttl_s: float = 5.0
    drain_timeout_s: float = 10.0
    metrics_interval_s: float = 0.1
