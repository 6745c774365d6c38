"""Where SGLang's KV-event publisher binds, and what the worker advertises."""

import json

from dyn.plugins.sglang.config import SglangConfig
from dyn.plugins.sglang.kv_events import KvEventsPlan, advertised, plan_kv_events


def test_dyn_binds_the_publisher_on_the_worker_host_at_free_ports():
    plan = plan_kv_events(SglangConfig(), "127.0.0.1", can_bind_host=True, radix_cache_disabled=False)
    chosen = json.loads(plan.config_json)
    assert chosen["publisher"] == "zmq" and chosen["bind"] is True and chosen["topic"] == "kv-events"
    assert (
        chosen["endpoint"].startswith("tcp://127.0.0.1:") and chosen["endpoint"] != chosen["replay_endpoint"]
    )
    assert (plan.endpoint, plan.replay_endpoint, plan.topic) == (
        chosen["endpoint"],
        chosen["replay_endpoint"],
        "kv-events",
    )


def test_without_sglangs_bind_field_the_publisher_binds_the_wildcard():
    plan = plan_kv_events(
        SglangConfig(kv_events_endpoint="tcp://127.0.0.1:5999"),
        "127.0.0.1",
        can_bind_host=False,
        radix_cache_disabled=False,
    )
    chosen = json.loads(plan.config_json)
    assert chosen["endpoint"] == "tcp://*:5999" and "bind" not in chosen
    assert plan.endpoint == "tcp://127.0.0.1:5999"


def test_a_users_config_is_passed_as_given_and_advertised_on_the_host():
    user = SglangConfig(
        kv_events_config=json.dumps(
            {"publisher": "zmq", "endpoint": "tcp://*:6000", "replay_endpoint": "tcp://0.0.0.0:6001"}
        )
    )
    assert plan_kv_events(user, "10.0.0.5", can_bind_host=True, radix_cache_disabled=True) == KvEventsPlan(
        None, "tcp://10.0.0.5:6000", "tcp://10.0.0.5:6001", ""
    )
    off = SglangConfig(kv_events_config='{"publisher": "null"}')
    assert plan_kv_events(off, "127.0.0.1", can_bind_host=True, radix_cache_disabled=False).endpoint is None


def test_no_radix_cache_no_events():
    plan = plan_kv_events(SglangConfig(), "127.0.0.1", can_bind_host=True, radix_cache_disabled=True)
    assert plan.config_json is None and plan.endpoint is None


def test_advertised_endpoints():
    assert advertised("tcp://*:1", "::1") == "tcp://[::1]:1"
    assert advertised("tcp://[::]:1", "127.0.0.1") == "tcp://127.0.0.1:1"
    assert advertised("tcp://127.0.0.9:1", "127.0.0.1") == "tcp://127.0.0.9:1"
    assert advertised("ipc:///tmp/kv", "127.0.0.1") == "ipc:///tmp/kv"


def test_a_worker_on_every_interface_binds_there_and_advertises_its_advertised_host():
    from dyn.core.transport.sockets import use_advertise_host

    use_advertise_host("10.0.0.7")
    try:
        plan = plan_kv_events(SglangConfig(), "0.0.0.0", can_bind_host=True, radix_cache_disabled=False)
    finally:
        use_advertise_host(None)
    chosen = json.loads(plan.config_json)
    assert chosen["endpoint"].startswith("tcp://0.0.0.0:") and chosen["replay_endpoint"].startswith(
        "tcp://0.0.0.0:"
    )
    assert plan.endpoint == "tcp://10.0.0.7:" + chosen["endpoint"].rpartition(":")[2]
    assert plan.replay_endpoint == "tcp://10.0.0.7:" + chosen["replay_endpoint"].rpartition(":")[2]


def test_under_plane_keys_sglang_binds_private_unix_sockets_for_the_worker_to_relay():
    for can_bind_host in (True, False):  # SGLang binds ipc:// endpoints with or without the field
        plan = plan_kv_events(
            SglangConfig(), "0.0.0.0", can_bind_host=can_bind_host, radix_cache_disabled=False, relayed=True
        )
        chosen = json.loads(plan.config_json)
        assert chosen["endpoint"].startswith("ipc://") and chosen["replay_endpoint"].startswith("ipc://")
        assert (plan.endpoint, plan.replay_endpoint) == (chosen["endpoint"], chosen["replay_endpoint"])
        assert chosen.get("bind", False) is can_bind_host
    # a user's endpoints are reported as bound, so the worker's relay can refuse a wildcard
    user = SglangConfig(kv_events_config='{"publisher": "zmq", "endpoint": "tcp://*:6000"}')
    plan = plan_kv_events(user, "127.0.0.1", can_bind_host=True, radix_cache_disabled=False, relayed=True)
    assert plan.endpoint == "tcp://*:6000"
