"""Plane keys (CurveZMQ) and binding rules of ``dyn.core.transport.sockets``, over real sockets
on loopback. Key files are in ZeroMQ's certificate format as pyzmq's ``zmq.auth`` reads them."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import zmq
import zmq.auth

from dyn.core.errors import ConfigError
from dyn.core.kv.subscriber import KvEventSubscriber
from dyn.core.messages import (
    Finish,
    TokenChunk,
    WorkerEndpoints,
    WorkerRecord,
)
from dyn.core.transport import sockets
from dyn.core.transport.request_plane import RequestServer
from dyn.core.transport.sockets import (
    PlaneKeyError,
    bind,
    bind_random,
    configure,
    is_loopback,
    load_plane_keys,
    plain,
    sync_context,
    use_plane_keys,
    write_plane_keys,
)
from tests.core.transport.conftest import served_once


def reaches(server: zmq.Socket, client: zmq.Socket, timeout_ms: int = 1500) -> bool:
    """Whether a message the client sends arrives at the server within the timeout (a DEALER
    whose handshake failed has no peer to queue it for)."""
    try:
        client.send(b"hello", zmq.NOBLOCK)
    except zmq.Again:
        return False
    return bool(server.poll(timeout_ms)) and server.recv_multipart()[-1] == b"hello"


def test_written_keys_are_private_and_never_overwritten(tmp_path):
    path = write_plane_keys(tmp_path / "a" / "keys")
    assert os.stat(path).st_mode & 0o777 == 0o700
    files = sorted(p.name for p in path.iterdir())
    assert files == ["client.key", "client.key_secret", "server.key", "server.key_secret"]
    assert all(os.stat(path / f).st_mode & 0o777 == 0o600 for f in files)
    loaded = load_plane_keys(path)
    assert loaded.server_secret is not None and len(loaded.client_secret) == 40
    assert zmq.auth.load_certificate(path / "server.key")[0] == loaded.server_public
    with pytest.raises(PlaneKeyError, match="already holds keys"):
        write_plane_keys(path)


def test_key_directories_others_could_read_or_that_are_incomplete_are_refused(tmp_path):
    path = write_plane_keys(tmp_path / "keys")
    path.chmod(0o750)
    with pytest.raises(PlaneKeyError, match=r"open to other users \(mode 750\).*chmod 700"):
        load_plane_keys(path)
    path.chmod(0o700)
    (path / "client.key_secret").chmod(0o640)
    with pytest.raises(PlaneKeyError, match="client.key_secret is readable by other users.*chmod 600"):
        load_plane_keys(path)
    (path / "client.key_secret").unlink()
    with pytest.raises(PlaneKeyError, match="cannot read the CurveZMQ key .*client.key_secret"):
        load_plane_keys(path)
    with pytest.raises(PlaneKeyError, match="does not exist"):
        load_plane_keys(tmp_path / "missing")
    other = write_plane_keys(tmp_path / "other")
    os.replace(other / "server.key", path / "server.key")
    with pytest.raises(PlaneKeyError, match="not one keypair"):
        load_plane_keys(path)
    assert issubclass(PlaneKeyError, ConfigError)  # the CLI prints it and exits 2


def test_without_keys_only_loopback_may_listen():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "*", "10.0.0.1", "eth0", "example.com"))
    socket = configure(sync_context().socket(zmq.ROUTER))
    try:
        for host in ("0.0.0.0", "*", "192.168.1.10"):
            with pytest.raises(PlaneKeyError, match=f"refusing to listen on {host}.*--plane-keys"):
                bind(socket, host, 5555)
        endpoint = bind_random(socket, "127.0.0.1")
        assert endpoint.startswith("tcp://127.0.0.1:")
        assert socket.get(zmq.MECHANISM) == zmq.NULL
    finally:
        socket.close()


def test_with_keys_only_clients_holding_a_listed_key_get_in(keys):
    context = sync_context()
    server = configure(context.socket(zmq.ROUTER))
    endpoint = bind_random(server, "127.0.0.1")
    assert server.get(zmq.MECHANISM) == zmq.CURVE and server.curve_server
    holder = configure(context.socket(zmq.DEALER))
    bare = context.socket(zmq.DEALER)
    stranger = context.socket(zmq.DEALER)
    stranger.curve_publickey, stranger.curve_secretkey = zmq.curve_keypair()
    stranger.curve_serverkey = sockets.plane_keys().server_public
    clients = [holder, bare, stranger]
    try:
        for client in clients:
            client.linger = 0
            client.connect(endpoint)
        assert not reaches(server, bare)
        assert not reaches(server, stranger)
        assert reaches(server, holder)
    finally:
        for s in (*clients, server):
            s.close(linger=0)


def test_a_new_public_key_in_the_directory_admits_its_holder(tmp_path):
    path = write_plane_keys(tmp_path / "keys")
    public, secret = zmq.curve_keypair()
    (path / "laptop.key").write_text(f'curve\n    public-key = "{public.decode()}"\n')
    (path / "laptop.key").chmod(0o600)
    use_plane_keys(path)
    try:
        server = configure(sync_context().socket(zmq.ROUTER))
        endpoint = bind_random(server, "127.0.0.1")
        laptop = sync_context().socket(zmq.DEALER)
        laptop.linger = 0
        laptop.curve_publickey, laptop.curve_secretkey = public, secret
        laptop.curve_serverkey = load_plane_keys(path).server_public
        laptop.connect(endpoint)
        assert reaches(server, laptop)
        laptop.close()
        server.close()
    finally:
        use_plane_keys(None)


def test_plain_undoes_the_client_keys_for_an_engines_own_socket(keys):
    engine_pub = sync_context().socket(zmq.ROUTER)  # bound by the engine itself: no keys
    port = engine_pub.bind_to_random_port("tcp://127.0.0.1")
    client = plain(configure(sync_context().socket(zmq.DEALER)))
    try:
        assert client.get(zmq.MECHANISM) == zmq.NULL
        client.connect(f"tcp://127.0.0.1:{port}")
        assert reaches(engine_pub, client)
    finally:
        client.close()
        engine_pub.close(linger=0)


def test_a_kv_subscriber_is_a_curve_client_whatever_the_record_says(keys):
    endpoints = {"request": "tcp://127.0.0.1:9", "kv_events": "tcp://127.0.0.1:9"}
    for asks_plain in (False, True):
        record = WorkerRecord(
            instance_id=1,
            namespace="n",
            model_name="m",
            engine="vllm",
            endpoints=WorkerEndpoints(**endpoints, kv_events_plain=asks_plain),
            block_size=16,
            total_kv_blocks=10,
            max_num_batched_tokens=64,
        )
        subscriber = KvEventSubscriber(record, lambda ops: None, None)  # type: ignore[arg-type]
        sub = subscriber._socket(zmq.SUB)
        assert sub.get(zmq.MECHANISM) == zmq.CURVE and not sub.curve_server
        sub.close()


def test_only_ipc_and_loopback_endpoints_are_local():
    local = ["ipc:///tmp/x", "tcp://127.0.0.1:5", "tcp://[::1]:5", "tcp://localhost:5"]
    remote = ["tcp://*:5", "tcp://0.0.0.0:5", "tcp://[::]:5", "tcp://10.0.0.5:5", "inproc://x", "udp://1"]
    assert [sockets.is_local_endpoint(e) for e in local + remote] == [True] * 4 + [False] * 6


def test_a_private_endpoint_is_a_unix_socket_only_this_user_can_reach():
    first, second = sockets.private_endpoint("kv-events"), sockets.private_endpoint("kv-events")
    assert first != second and first.startswith("ipc://")
    directory = Path(first.removeprefix("ipc://")).parent
    assert directory == Path(second.removeprefix("ipc://")).parent
    info = directory.stat()
    assert info.st_uid == os.geteuid() and info.st_mode & 0o777 == 0o700
    pub = sync_context().socket(zmq.PUB)
    try:
        pub.bind(first)  # as an engine binds it
    finally:
        pub.close(linger=0)


def test_keys_switched_off_again_leave_plain_sockets(keys):
    use_plane_keys(None)
    socket = configure(sync_context().socket(zmq.DEALER))
    assert socket.get(zmq.MECHANISM) == zmq.NULL and sockets.plane_keys() is None
    socket.close()


def test_a_client_only_key_directory_cannot_listen(tmp_path):
    path = write_plane_keys(tmp_path / "keys")
    (path / "server.key_secret").unlink()
    use_plane_keys(path)
    socket = configure(sync_context().socket(zmq.ROUTER))
    try:
        with pytest.raises(PlaneKeyError, match="no server.key_secret"):
            bind_random(socket, "127.0.0.1")
    finally:
        socket.close()
        use_plane_keys(None)


@pytest.mark.anyio
async def test_the_request_plane_works_through_the_keys(keys):
    server = RequestServer()
    assert await served_once(server) == [TokenChunk, Finish]


def test_a_missing_directory_is_named(tmp_path: Path):
    with pytest.raises(PlaneKeyError, match="make one with 'dyn keys DIR'"):
        use_plane_keys(tmp_path / "nope")
    assert sockets.plane_keys() is None


def test_every_zmq_socket_dyn_makes_goes_through_configure():
    """The keys reach a socket only through ``configure`` (and ``bind``): a socket made any other
    way would stay plain, and with keys fail to connect."""
    root = Path(__file__).resolve().parents[3]
    raw = []
    for package in ("core", "plugins"):
        for path in (root / package).rglob("*.py"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if ".socket(zmq." in line and "configure(" not in line:
                    raw.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert raw == []


def test_every_zmq_socket_dyn_listens_on_is_bound_by_bind():
    """``bind`` makes a listening socket a CurveZMQ server under the keys and refuses addresses
    beyond loopback without them: a socket bound any other way would be a door left open. (Not
    ZMQ: a TCP socket's ``bind((host, port))`` for HTTP, and the router's sticky sessions.)"""
    root = Path(__file__).resolve().parents[3]
    raw = []
    for package in ("core", "plugins", "cli"):
        for path in (root / package).rglob("*.py"):
            if path == root / "core" / "transport" / "sockets.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if "signature(" in line:  # inspect.Signature.bind: arguments, not addresses
                    continue
                if "bind_to_random_port(" in line or re.search(r"(?<!sessions)\.bind\((?!\()", line):
                    raw.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert raw == []


def test_recv_frames_reads_whole_messages_as_recv_multipart_does():
    server = configure(sync_context().socket(zmq.PULL))
    client = configure(sync_context().socket(zmq.PUSH))
    try:
        client.connect(bind_random(server, "127.0.0.1"))
        messages = [[b"one"], [b"a", b"", b"c"], [b"", b""], [b"big", os.urandom(1 << 20), b"end"]]
        for message in messages:
            client.send_multipart(message)
        assert server.poll(5000)
        got = []
        while len(got) < len(messages):
            try:
                got.append(sockets.recv_frames(server))
            except zmq.Again:
                assert server.poll(5000)
        assert got == messages and all(type(f) is bytes for m in got for f in m)
        with pytest.raises(zmq.Again):
            sockets.recv_frames(server)
    finally:
        server.close(linger=0)
        client.close(linger=0)
