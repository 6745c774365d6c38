"""Where SGLang's KV-event publisher binds, and what the worker advertises in discovery.

SGLang publishes KV events itself (``ZmqEventPublisher`` in
``sglang/srt/disaggregation/kv_events.py``, vLLM's wire format) when started with
``--kv-events-config``: a PUB socket on ``endpoint`` and a ROUTER replay socket on
``replay_endpoint`` (always bound), under ``topic``. Whether the PUB binds or connects: SGLang
0.5.23's ``KVEventsConfig.bind`` says so explicitly; without it (older releases, or ``bind``
unset) SGLang binds only wildcard / ``ipc://`` endpoints and *connects* to a concrete host.

So when dyn builds the config it binds on the worker's ``--host`` (loopback by default) with
``"bind": true`` where SGLang has that field, and falls back to ``tcp://*:PORT`` (every interface)
where it does not. Ports are free ports picked here (``--kv-events-endpoint`` overrides the PUB's),
so two workers on one machine never collide. A user's own ``--kv-events-config`` is passed as
given. Endpoints on a wildcard or on ``--host`` are advertised at the worker's advertised address
(``--advertise-host``; default: ``--host``, or this host's primary address for a wildcard). With
``--disable-radix-cache`` and no config of the user's, no events are published (there is no
prefix cache to report).

Under ``--plane-keys`` (``relayed``) the worker host relays the events over CurveZMQ
(``dyn.core.worker.kv_relay``): dyn's config binds both sockets on Unix sockets only this user can
reach (``sockets.private_endpoint``; SGLang binds ``ipc://`` whatever its release), a
``--kv-events-endpoint`` as given, and the plan reports the endpoints as bound, not advertised
(the relay refuses one other hosts could reach).
"""

from __future__ import annotations

import json

import msgspec

from dyn.core.transport.sockets import advertised_endpoint, free_ports, private_endpoint
from dyn.plugins.sglang.config import SglangConfig, parse_kv_events_config, parse_tcp_endpoint

KV_EVENTS_TOPIC = "kv-events"


class KvEventsPlan(msgspec.Struct, frozen=True):
    """``config_json``: the ``--kv-events-config`` dyn passes (``None``: none of dyn's; the user's
    own, if any, travels with the other flags). The rest is what the worker advertises."""

    config_json: str | None
    endpoint: str | None
    replay_endpoint: str | None
    topic: str


def plan_kv_events(
    config: SglangConfig,
    host: str,
    *,
    can_bind_host: bool,
    radix_cache_disabled: bool,
    relayed: bool = False,
) -> KvEventsPlan:
    """The KV-events plan for a worker on ``host``; ``can_bind_host``: SGLang's ``KVEventsConfig``
    has the ``bind`` field; ``relayed``: the host relays the events (``--plane-keys``)."""

    def where(endpoint: str) -> str:
        return endpoint if relayed else advertised(endpoint, host)

    if config.kv_events_config is not None:
        user = parse_kv_events_config(config.kv_events_config)
        topic = str(user.get("topic", ""))
        if user.get("publisher", "null") != "zmq":
            return KvEventsPlan(None, None, None, topic)
        replay = user.get("replay_endpoint")
        return KvEventsPlan(
            None,
            where(str(user.get("endpoint", "tcp://*:5557"))),
            where(str(replay)) if replay else None,
            topic,
        )
    if radix_cache_disabled:
        return KvEventsPlan(None, None, None, KV_EVENTS_TOPIC)
    if relayed and config.kv_events_endpoint is None:
        chosen: dict[str, object] = {
            "publisher": "zmq",
            "topic": KV_EVENTS_TOPIC,
            "endpoint": private_endpoint("kv-events"),
            "replay_endpoint": private_endpoint("kv-replay"),
        }
        if can_bind_host:
            chosen["bind"] = True
        return KvEventsPlan(
            json.dumps(chosen), str(chosen["endpoint"]), str(chosen["replay_endpoint"]), KV_EVENTS_TOPIC
        )
    if config.kv_events_endpoint is not None:
        bind_host, port = parse_tcp_endpoint(config.kv_events_endpoint, "--kv-events-endpoint")
        (replay_port,) = free_ports(bind_host, 1)
    else:
        bind_host = host
        port, replay_port = free_ports(host, 2)
    chosen = {
        "publisher": "zmq",
        "topic": KV_EVENTS_TOPIC,
        "replay_endpoint": tcp(bind_host, replay_port),
    }
    if can_bind_host:
        chosen.update(endpoint=tcp(bind_host, port), bind=True)
    else:
        chosen["endpoint"] = f"tcp://*:{port}"
    return KvEventsPlan(
        json.dumps(chosen),
        where(str(chosen["endpoint"])),
        where(str(chosen["replay_endpoint"])),
        KV_EVENTS_TOPIC,
    )


def tcp(host: str, port: int) -> str:
    """``tcp://host:port``, an IPv6 host in brackets."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def advertised(endpoint: str, host: str) -> str:
    """What a subscriber connects to for ``endpoint`` of a worker on ``host``: a wildcard host,
    or ``host`` itself, becomes the worker's advertised address (``--advertise-host``; see
    ``dyn.core.transport.sockets.advertised_endpoint``)."""
    return advertised_endpoint(endpoint, host)
