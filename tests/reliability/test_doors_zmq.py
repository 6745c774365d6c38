"""The ZMQ doors of ``dyn indexer`` and ``dyn router`` and of the KV-event plane, against real
processes (issue 31, item 6):

- under ``--plane-keys`` the indexer's and the router's query ports answer only holders of the
  keys: a client without keys, or with a key not in the directory, gets no answer;
- without ``--plane-keys`` both refuse to listen beyond loopback (``--host 0.0.0.0`` or another
  host's address), with one line naming ``--plane-keys``; on loopback with ``--api-key`` (which
  guards HTTP only) each warns once at start that its ZMQ port answers every local user;
- under ``--plane-keys`` a forged worker record asking for plain KV events
  (``kv_events_plain``), whose plain PUB publishes events, changes nothing in a KV-routing
  frontend's index nor in ``dyn indexer``'s, and is counted in
  ``dynamo_component_kv_events_rejected_total{reason="plain_events"}``.

The queries are dyn's own ``[kind, msgpack payload]`` frames (dyn.core.transport.codec); the KV
events are vLLM's wire format (dyn.core.kv.events).
"""

from __future__ import annotations

import time

import anyio
import httpx
import pytest
import zmq
import zmq.auth

from dyn.core.discovery.file_store import FileDiscoveryStore
from dyn.core.indexer.service import READY_PREFIX as INDEXER_READY
from dyn.core.kv.events import BlockStored, KvEventBatch, encode_event_batch, encode_seq
from dyn.core.messages import (
    OverlapAnswer,
    OverlapQuery,
    RouteQuery,
    RouteRefused,
    WorkerEndpoints,
    WorkerRecord,
)
from dyn.core.router.service import READY_PREFIX as ROUTER_READY
from dyn.core.transport.codec import decode_indexer_message, decode_router_message, encode
from tests.reliability.test_planes import assert_refused, dyn, metric

pytestmark = pytest.mark.integration

KEY = "s3cret-k3y"
WARNING = "answers every local user"


def said(proc) -> str:
    """The process's log as one line (the console wraps long lines)."""
    return " ".join(proc.log().split())


def line_after(proc, prefix: str, wait_for) -> str:
    def found():
        for line in proc.log().splitlines():
            if prefix in line:
                return line.split(prefix, 1)[1].strip()
        assert proc.proc.poll() is None, proc.log()
        return None

    return wait_for(found, 60, f"{prefix!r} in the log")


def indexer_zmq(proc, wait_for) -> str:
    return dict(part.split("=", 1) for part in line_after(proc, INDEXER_READY, wait_for).split())["zmq"]


def answer(endpoint: str, frames: list[bytes], keys: tuple | None, timeout_s: float) -> list[bytes] | None:
    """The first reply to ``frames`` from a fresh DEALER (a CurveZMQ client with ``keys`` =
    (public, secret, server public)), or None after ``timeout_s``."""
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.linger = 0
    if keys is not None:
        dealer.curve_publickey, dealer.curve_secretkey, dealer.curve_serverkey = keys
    try:
        dealer.connect(endpoint)
        dealer.send_multipart(frames)
        return dealer.recv_multipart() if dealer.poll(int(timeout_s * 1000)) else None
    finally:
        dealer.close()


def key_pairs(keys) -> dict[str, tuple | None]:
    """The three clients: no keys, a key the directory does not list, the directory's client key."""
    server_public, _ = zmq.auth.load_certificate(keys / "server.key")
    public, secret = zmq.auth.load_certificate(keys / "client.key_secret")
    stranger_public, stranger_secret = zmq.curve_keypair()
    return {
        "plain": None,
        "stranger": (stranger_public, stranger_secret, server_public),
        "holder": (public, secret, server_public),
    }


@pytest.fixture
def keys(tmp_path):
    made = dyn("keys", str(tmp_path / "keys"))
    assert made.returncode == 0, made.stderr
    return tmp_path / "keys"


def test_under_plane_keys_the_query_ports_answer_only_holders_of_the_keys(dyn_process, keys, wait_for):
    common = ("--plane-keys", str(keys), "--api-key", KEY)
    indexer = dyn_process(
        "indexer", "--namespace", "zdoors", "--http-port", "0", "--block-size", "16", *common
    )
    router = dyn_process("router", "--namespace", "zdoors", "--port", "0", *common)
    endpoints = {
        "indexer": indexer_zmq(indexer, wait_for),
        "router": line_after(router, ROUTER_READY, wait_for),
    }
    queries = {
        "indexer": (
            encode(OverlapQuery(1, token_ids=list(range(64)))),
            decode_indexer_message,
            OverlapAnswer,
        ),
        "router": (encode(RouteQuery(1, "r1", list(range(64)))), decode_router_message, RouteRefused),
    }
    clients = key_pairs(keys)
    for service, (frames, decode, expected) in queries.items():
        for client in ("plain", "stranger"):
            assert answer(endpoints[service], frames, clients[client], 2.0) is None, (service, client)
        reply = answer(endpoints[service], frames, clients["holder"], 30.0)
        assert reply is not None and isinstance(decode(reply), expected), (service, reply)
    for proc in (indexer, router):
        assert WARNING not in said(proc)  # the keys close the port: nothing to warn about


def test_without_plane_keys_the_query_ports_refuse_to_listen_beyond_loopback(tmp_path):
    discovery = ("--discovery-dir", str(tmp_path / "d"))
    for host in ("0.0.0.0", "10.1.2.3"):
        for command in (("indexer", "--http-port", "0"), ("router",)):
            result = dyn(*command, "--host", host, *discovery)
            assert_refused(result, f"refusing to listen on {host}", "--plane-keys", "dyn keys")


def test_with_an_api_key_but_no_plane_keys_each_query_port_is_said_to_be_open_locally(dyn_process, wait_for):
    indexer = dyn_process(
        "indexer", "--namespace", "zopen", "--http-port", "0", "--block-size", "16", "--api-key", KEY
    )
    router = dyn_process("router", "--namespace", "zopen", "--port", "0", "--api-key", KEY)
    endpoints = {indexer: indexer_zmq(indexer, wait_for), router: line_after(router, ROUTER_READY, wait_for)}
    for proc, endpoint in endpoints.items():
        text = said(proc)
        assert text.count(WARNING) == 1, text
        warning = text.split("WARNING", 1)[1].split(" INFO ", 1)[0]
        assert f"the ZMQ query port {endpoint} {WARNING}" in warning and "--plane-keys" in warning, text
        assert KEY not in text
    # the warning says true: the port answers a client with neither key
    reply = answer(endpoints[indexer], encode(OverlapQuery(1, token_ids=list(range(64)))), None, 30.0)
    assert reply is not None and isinstance(decode_indexer_message(reply), OverlapAnswer)


class PlainRecordForger:
    """A worker record asking for plain KV events (``kv_events_plain``), and its plain PUB."""

    def __init__(self, discovery, namespace: str) -> None:
        self.context = zmq.Context()
        self.pub = self.context.socket(zmq.PUB)
        self.pub.linger = 0
        port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.instance_id = 3_131_313_131
        record = WorkerRecord(
            instance_id=self.instance_id,
            namespace=namespace,
            model_name="dyn-tiny",
            engine="vllm",
            endpoints=WorkerEndpoints(
                request="tcp://127.0.0.1:9", kv_events=f"tcp://127.0.0.1:{port}", kv_events_plain=True
            ),
            block_size=16,
            total_kv_blocks=16_384,
            max_num_batched_tokens=8192,
            context_length=8192,
        )
        anyio.run(FileDiscoveryStore(discovery, namespace).put, record, 600.0)
        self.seq = 0

    def publish(self) -> None:
        event = BlockStored([9000 + self.seq], None, [self.seq % 1000] * 16, 16)
        payload = encode_event_batch(KvEventBatch(time.time(), [event], 0))
        self.pub.send_multipart([b"kv-events", encode_seq(self.seq), payload])
        self.seq += 1

    def close(self) -> None:
        self.pub.close()
        self.context.term()


def test_under_plane_keys_a_forged_plain_record_feeds_no_index(stack_factory, keys, wait_for):
    stack = stack_factory("zplain")
    forger = PlainRecordForger(stack.root / "discovery", "zplain")
    try:
        frontend = stack.start_frontend("--router-mode", "kv", "--plane-keys", str(keys))
        indexer = stack.start(
            "indexer",
            "--namespace",
            "zplain",
            "--http-port",
            "0",
            "--block-size",
            "16",
            "--plane-keys",
            str(keys),
        )
        fields = dict(part.split("=", 1) for part in line_after(indexer, INDEXER_READY, wait_for).split())
        bases = {"frontend": frontend, "indexer": fields["http"]}
        refused = {"reason": "plain_events"}
        name = "dynamo_component_kv_events_rejected_total"
        for base in bases.values():
            wait_for(lambda base=base: metric(base, name, refused) == 1, 30, f"the record refused by {base}")
        for _ in range(100):  # what the forger's events would have done had they been followed
            forger.publish()
            time.sleep(0.01)
        time.sleep(1.0)
        for url in (frontend + "/kv/workers", fields["http"] + "/workers"):
            assert [w for w in httpx.get(url, timeout=10).json() if w["blocks"]] == [], url
        for base in bases.values():
            assert metric(base, name, refused) == 1
        for proc in (stack.frontend, indexer):
            text = said(proc)
            assert text.count("asking for unencrypted KV events under --plane-keys") == 1, text
            assert f"worker {forger.instance_id} (vllm, tcp://127.0.0.1:" in text
    finally:
        forger.close()
