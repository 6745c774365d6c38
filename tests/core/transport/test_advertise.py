"""Bind address vs advertised address (``dyn.core.transport.sockets``): what ``bind`` returns, what
``--advertise-host`` accepts, and how the engines' own endpoints are advertised, over real sockets.
No model output is involved."""

from __future__ import annotations

import logging
import socket as pysocket

import pytest
import zmq

from dyn.core.messages import Finish, TokenChunk
from dyn.core.transport import sockets
from dyn.core.transport.request_plane import RequestServer
from dyn.core.transport.sockets import (
    AdvertiseHostError,
    advertised_endpoint,
    advertised_host,
    bind_random,
    configure,
    ephemeral_ports,
    free_ports,
    is_wildcard,
    primary_address,
    sync_context,
    tcp_endpoint,
    use_advertise_host,
)
from tests.core.transport.conftest import served_once


@pytest.fixture
def advertise():
    """``use_advertise_host`` for the test, switched off after."""
    try:
        yield use_advertise_host
    finally:
        use_advertise_host(None)


def bound_port(socket: zmq.Socket) -> int:
    return int(socket.last_endpoint.decode().rpartition(":")[2])


def test_the_bind_host_is_advertised_unless_another_is_given(advertise):
    socket = configure(sync_context().socket(zmq.PUB))
    try:
        endpoint = bind_random(socket, "127.0.0.1")
        assert endpoint == f"tcp://127.0.0.1:{bound_port(socket)}"
        assert advertise("node-7.example.com") == "node-7.example.com"
        endpoint = bind_random(socket, "127.0.0.1")
        assert socket.last_endpoint.decode().startswith("tcp://127.0.0.1:")  # bound where asked
        assert endpoint == f"tcp://node-7.example.com:{bound_port(socket)}"
        assert advertise("[::1]") == "::1"
        assert bind_random(socket, "127.0.0.1") == f"tcp://[::1]:{bound_port(socket)}"
    finally:
        socket.close()


def test_a_wildcard_bind_advertises_an_address_of_this_host(keys):
    socket = configure(sync_context().socket(zmq.ROUTER))
    try:
        endpoint = bind_random(socket, "0.0.0.0")
        assert socket.last_endpoint.decode().startswith("tcp://0.0.0.0:")
        host = endpoint.removeprefix("tcp://").rpartition(":")[0]
        assert host == advertised_host("0.0.0.0") == primary_address()
        assert not is_wildcard(host)
        with pysocket.socket() as probe:  # an address of one of this host's interfaces
            probe.bind((host, 0))
    finally:
        socket.close()


def test_advertise_host_refuses_what_peers_cannot_connect_to(advertise):
    for bad in ("0.0.0.0", "::", "[::]", "*", "", "tcp://10.0.0.1", "10.0.0.1:5555", "a b", "-x.example"):
        with pytest.raises(AdvertiseHostError, match="--advertise-host"):
            advertise(bad)
    assert advertised_host("127.0.0.1") == "127.0.0.1"  # a refused value leaves the default
    assert advertise(" 10.0.0.5 ") == "10.0.0.5"


def test_an_ipv6_bind_is_bracketed_and_reachable():
    server = configure(sync_context().socket(zmq.PULL))
    client = configure(sync_context().socket(zmq.PUSH))
    try:
        endpoint = bind_random(server, "::1")
        assert endpoint == f"tcp://[::1]:{bound_port(server)}"
        client.connect(endpoint)
        client.send(b"hello")
        assert server.poll(3000) and server.recv() == b"hello"
    finally:
        client.close()
        server.close()


@pytest.mark.anyio
async def test_a_request_plane_on_every_interface_is_served_at_its_advertised_endpoint(keys):
    server = RequestServer("0.0.0.0")
    assert server.endpoint.startswith(f"tcp://{primary_address()}:")
    assert await served_once(server) == [TokenChunk, Finish]


@pytest.mark.parametrize(
    ("endpoint", "bind_host", "advertise_host", "expected"),
    [
        ("tcp://*:5557", "0.0.0.0", "10.0.0.5", "tcp://10.0.0.5:5557"),
        ("tcp://0.0.0.0:5557", "0.0.0.0", "node.example", "tcp://node.example:5557"),
        ("tcp://[::]:5557", "::", "fd00::5", "tcp://[fd00::5]:5557"),
        ("tcp://10.0.0.9:5557", "10.0.0.9", "203.0.113.7", "tcp://203.0.113.7:5557"),
        ("tcp://10.0.0.8:5557", "10.0.0.9", "203.0.113.7", "tcp://10.0.0.8:5557"),
        ("ipc:///tmp/kv", "0.0.0.0", "10.0.0.5", "ipc:///tmp/kv"),
        ("tcp://127.0.0.1:4001", "127.0.0.1", None, "tcp://127.0.0.1:4001"),
    ],
)
def test_an_engines_own_endpoint_is_advertised_like_dyns(
    advertise, endpoint, bind_host, advertise_host, expected
):
    advertise(advertise_host)
    assert advertised_endpoint(endpoint, bind_host) == expected


def test_helpers():
    assert tcp_endpoint("::1", 5) == "tcp://[::1]:5" == tcp_endpoint("[::1]", 5)
    assert tcp_endpoint("10.0.0.1", 5) == "tcp://10.0.0.1:5"
    assert all(is_wildcard(h) for h in ("0.0.0.0", "::", "[::]", "*"))
    assert not any(is_wildcard(h) for h in ("127.0.0.1", "::1", "10.0.0.1", "example.com"))
    first, second = free_ports("127.0.0.1", 2)
    assert first != second
    with pysocket.socket() as taken:
        taken.bind(("127.0.0.1", first))


def test_free_ports_come_from_below_the_ephemeral_range_so_no_port_0_bind_takes_them(tmp_path, monkeypatch):
    """An engine binds the ports dyn picked moments later, while it binds its own sockets at
    port 0: those come from the ephemeral range, so dyn's never do (a real vLLM worker failed
    with an address in use when they could)."""
    ephemeral = ephemeral_ports()
    assert ephemeral.start > sockets.STATIC_PORTS_FROM
    for port in free_ports("127.0.0.1", 2) + free_ports("0.0.0.0", 2):
        assert sockets.STATIC_PORTS_FROM <= port < ephemeral.start

    range_file = tmp_path / "ip_local_port_range"
    monkeypatch.setattr(sockets, "EPHEMERAL_RANGE_FILE", range_file)
    with pysocket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy_port = busy.getsockname()[1]
        monkeypatch.setattr(sockets, "STATIC_PORTS_FROM", busy_port)
        range_file.write_text(f"{busy_port + 4}\t65000\n")
        for _ in range(20):  # a port in use is never handed out
            assert free_ports("127.0.0.1", 1) != [busy_port]
        range_file.write_text(f"{busy_port + 1}\t65000\n")
        (port,) = free_ports("127.0.0.1", 1)  # no room below the range: the kernel picks
        assert port != busy_port

    range_file.write_text("garbage")
    assert ephemeral_ports() == range(49152, 65536)


def test_no_route_falls_back_to_loopback_with_a_warning(monkeypatch, caplog):
    """The probe's ``connect`` fails as it does on a host without a default route (the netns
    test sees the real thing)."""

    class NoRoute(pysocket.socket):
        def connect(self, address):
            raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(sockets._socket, "socket", NoRoute)
    with caplog.at_level(logging.WARNING, logger=sockets.__name__):
        assert primary_address.__wrapped__() == "127.0.0.1"
    assert "--advertise-host" in caplog.text and "Network is unreachable" in caplog.text
