"""Issue 16's probes of the ZMQ planes, the KV-event plane and the discovery root, against real
``dyn`` processes:

- 200k malformed frames sent to a worker's request ROUTER: it answers each one, logs a handful of
  rate-limited lines, keeps its discovery record fresh the whole time, and serves requests during
  and after the flood (the probe saw one warning per frame, a starved heartbeat, the worker gone);
- forged KV events under a forged worker record advertising 16,384 blocks claim 219,000: the
  router's index (``/kv/workers``) holds no more than the advertised capacity and the rejects are
  counted per worker and reason in ``/metrics``; an event of 10M hashes is refused undecoded;
- a pre-created 0777 discovery root (``--discovery-dir``, or the default ``/tmp/dyn-$UID``) and a
  root owned by another user are refused with one line and status 2 by every command;
- CurveZMQ (``dyn keys``, ``--plane-keys``): a keyed worker and frontend serve a request and the KV
  router follows the worker's events; a client without keys or with an unknown key cannot get a
  request in; a key directory others may read is refused; without keys, binding beyond loopback
  is refused; an ``--advertise-host`` peers cannot connect to (a wildcard, an endpoint) is refused
  by every command that binds, and ``dyn serve`` passes ``--host``/``--advertise-host`` to its
  workers.

The KV events use vLLM's wire format (``[topic, seq, msgpack [ts, events, dp_rank]]`` with
``BlockStored`` tagged arrays: vLLM's ``vllm/distributed/kv_events.py``, read back by its
``examples/online_serving/kv_events_subscriber.py``; dyn.core.kv.events documents it); no model
output is involved. The request frames are dyn's own ``[kind, msgpack payload]``
(dyn.core.transport.codec).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import httpx
import msgspec
import zmq
import zmq.auth
from prometheus_client.parser import text_string_to_metric_families

from dyn.core.discovery.file_store import FileDiscoveryStore
from dyn.core.kv.events import BlockStored, KvEventBatch, encode_event_batch, encode_seq
from dyn.core.messages import (
    ErrorReply,
    Finish,
    GenerateRequest,
    ReplyBatch,
    StopConditions,
    WorkerEndpoints,
    WorkerRecord,
)
from dyn.core.transport.codec import decode_reply, encode

FLOOD = 200_000
ADVERTISED_BLOCKS = 16_384
CLAIMED_BLOCKS = 219_000
BLOCKS_PER_EVENT = 1_000
BLOCK_SIZE = 16


def records(discovery: Path, namespace: str) -> dict[int, tuple[Path, dict]]:
    """The worker records in a discovery root, by instance id, with their files."""
    out = {}
    for path in (discovery / namespace / "instances").glob("*.json"):
        try:
            out[int(path.stem)] = (path, json.loads(path.read_bytes())["record"])
        except (OSError, ValueError):
            pass
    return out


def request_frames(request_id: str) -> list[bytes]:
    return encode(
        GenerateRequest(request_id, [1, 2, 3, 4], stop=StopConditions(max_tokens=3, ignore_eos=True))
    )


def ask(endpoint: str, frames: list[bytes], timeout_s: float, keys: tuple | None = None) -> list:
    """Send ``frames`` from a fresh DEALER (CurveZMQ client with ``keys`` = (public, secret,
    server public)) and return the replies that came back within ``timeout_s``, up to a Finish."""
    context = zmq.Context.instance()
    dealer = context.socket(zmq.DEALER)
    dealer.linger = 0
    if keys is not None:
        dealer.curve_publickey, dealer.curve_secretkey, dealer.curve_serverkey = keys
    dealer.connect(endpoint)
    try:
        dealer.send_multipart(frames)
        replies: list = []
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not dealer.poll(int(left * 1000) + 1):
                break
            reply = decode_reply(dealer.recv_multipart())
            batch = (
                [*reply.chunks, *reply.finishes, *reply.errors] if isinstance(reply, ReplyBatch) else [reply]
            )
            replies.extend(batch)
            if any(isinstance(r, Finish | ErrorReply) for r in batch):
                break
        return replies
    finally:
        dealer.close()


def metric(url: str, name: str, labels: dict[str, str]) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


# --------------------------------------------------------------------------- malformed frames


MALFORMED = [
    [b"G", b"\xc1"],  # 0xc1 is never valid msgpack
    [b"X", b"\x90"],  # an unknown kind
    [b"G"],  # one frame instead of two
    [b"G", msgspec.msgpack.encode({"request_id": 7})],  # not a GenerateRequest
    [b"\x00" * 64, b"\xff" * 64, b"garbage"],
]


class RecordWatch(threading.Thread):
    """Polls a record file: how stale it got at worst, and how often it was refreshed."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.worst_age = 0.0
        self.refreshes = 0
        self.missing = 0
        self.stop = threading.Event()

    def run(self) -> None:
        last = None
        while not self.stop.wait(0.05):
            try:
                mtime = self.path.stat().st_mtime
            except FileNotFoundError:
                self.missing += 1
                continue
            self.worst_age = max(self.worst_age, time.time() - mtime)
            if last is not None and mtime != last:
                self.refreshes += 1
            last = mtime


def test_a_flood_of_malformed_frames_costs_log_lines_not_the_heartbeat(stack_factory):
    stack = stack_factory("flood")
    worker = stack.worker(count=1)
    url = stack.start_frontend()
    (instance,) = stack.wait_instances(1)
    path, record = records(stack.root / "discovery", "flood")[instance]
    endpoint = record["endpoints"]["request"]
    watch = RecordWatch(path)
    watch.start()

    flooder = zmq.Context.instance().socket(zmq.DEALER)
    flooder.linger = 0
    flooder.sndhwm = flooder.rcvhwm = 0
    flooder.connect(endpoint)
    answered = 0
    started = time.monotonic()
    try:
        for i in range(FLOOD):
            flooder.send_multipart(MALFORMED[i % len(MALFORMED)])
        # served during the flood: the frontend's connection is not starved by the flooder's
        during = httpx.post(
            url + "/v1/completions",
            json={"model": "dyn-tiny", "prompt": "during", "max_tokens": 4},
            timeout=30,
        )
        assert during.status_code == 200, during.text
        deadline = time.monotonic() + 120
        while answered < FLOOD and time.monotonic() < deadline:
            if flooder.poll(1000):
                reply = decode_reply(flooder.recv_multipart())
                answered += len(reply.errors) if isinstance(reply, ReplyBatch) else 1
        elapsed = time.monotonic() - started
    finally:
        flooder.close()
        watch.stop.set()
        watch.join(5)
    assert answered == FLOOD, f"{answered} of {FLOOD} malformed frames answered"
    ttl = json.loads(path.read_bytes())["ttl_s"]
    assert watch.missing == 0 and watch.worst_age < ttl, (watch.worst_age, ttl, watch.missing)
    if elapsed > ttl:
        assert watch.refreshes >= 1
    assert stack.instances() == [instance]
    after = httpx.post(
        url + "/v1/completions",
        json={"model": "dyn-tiny", "prompt": "after the flood", "max_tokens": 4, "ignore_eos": True},
        timeout=30,
    )
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 4
    lines = [line for line in worker.log().splitlines() if "rejected" in line]
    assert lines and "malformed request frame" in lines[0]
    assert len(lines) <= 2 + elapsed / 5, lines  # one line per 5 s, not one per frame
    counted = sum(int(line.split("rejected ")[1].split()[0]) for line in lines[1:])
    assert counted < FLOOD  # the first line, then counts (the rest waits for the next rejection)


# --------------------------------------------------------------------------- forged KV events


class ForgedWorker:
    """A worker record in discovery whose KV-event PUB is ours; its request ROUTER never answers."""

    def __init__(self, discovery: Path, namespace: str) -> None:
        context = zmq.Context.instance()
        self.pub = context.socket(zmq.PUB)
        self.pub.linger = 0
        self.pub.sndhwm = 0
        port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.router = context.socket(zmq.ROUTER)
        self.router.linger = 0
        request_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.instance_id = 4_242_424_242
        self.record = WorkerRecord(
            instance_id=self.instance_id,
            namespace=namespace,
            model_name="dyn-tiny",
            engine="mocker",
            endpoints=WorkerEndpoints(
                request=f"tcp://127.0.0.1:{request_port}", kv_events=f"tcp://127.0.0.1:{port}"
            ),
            block_size=BLOCK_SIZE,
            total_kv_blocks=ADVERTISED_BLOCKS,
            max_num_batched_tokens=8192,
            context_length=8192,
        )
        anyio.run(FileDiscoveryStore(discovery, namespace).put, self.record, 600.0)
        self.seq = 0
        self.next_hash = 1

    def publish(self, events: list, dp_rank: int = 0) -> None:
        self.publish_payload(encode_event_batch(KvEventBatch(time.time(), events, dp_rank)))

    def publish_payload(self, payload: bytes) -> None:
        self.pub.send_multipart([b"kv-events", encode_seq(self.seq), payload])
        self.seq += 1

    def stored(self, blocks: int, parent: int | None, block_size: int = BLOCK_SIZE) -> BlockStored:
        hashes = list(range(self.next_hash, self.next_hash + blocks))
        self.next_hash += blocks
        tokens = [h % 30_000 for h in hashes for _ in range(block_size)]  # distinct blocks
        return BlockStored(hashes, parent, tokens, block_size)

    def close(self) -> None:
        self.pub.close()
        self.router.close()


def kv_blocks(url: str, instance_id: int) -> tuple[int, int | None]:
    for entry in httpx.get(url + "/kv/workers", timeout=10).json():
        if entry["instance_id"] == instance_id and entry["dp_rank"] == 0:
            return entry["blocks"], entry.get("total_blocks")
    return 0, None


def dumped_hashes(url: str) -> set[int]:
    """Every block hash the frontend's KV index holds (``/kv/dump``)."""
    return {
        event["block_hash"]
        for model in httpx.get(url + "/kv/dump", timeout=10).json().values()
        for event in model["events"]
    }


def test_forged_kv_events_cannot_claim_more_than_the_advertised_capacity(stack_factory, wait_for):
    stack = stack_factory("forged")
    url = stack.start_frontend("--router-mode", "kv")
    forged = ForgedWorker(stack.root / "discovery", "forged")
    try:

        def subscribed():  # PUB/SUB joins late: publish until the router has seen one event
            forged.publish([forged.stored(1, None)])
            return kv_blocks(url, forged.instance_id)[0] > 0

        wait_for(subscribed, 60, "the router to follow the forged worker's KV events")
        # events arrive in order: once a last marker is in the index, every earlier one was applied
        marker = forged.stored(1, None)
        forged.publish([marker])
        wait_for(lambda: marker.block_hashes[0] in dumped_hashes(url), 30, "the marker event in the index")
        held, capacity = kv_blocks(url, forged.instance_id)
        assert capacity == ADVERTISED_BLOCKS
        labels = {"worker_id": str(forged.instance_id)}
        name = "dynamo_component_kv_events_rejected_by_worker_total"

        parent = None
        for _ in range(CLAIMED_BLOCKS // BLOCKS_PER_EVENT):
            event = forged.stored(BLOCKS_PER_EVENT, parent)
            parent = event.block_hashes[-1]
            forged.publish([event])
        limit = ADVERTISED_BLOCKS + max(64, ADVERTISED_BLOCKS // 32)  # capacity plus the slack
        accepted = (limit - held) // BLOCKS_PER_EVENT
        refused = CLAIMED_BLOCKS // BLOCKS_PER_EVENT - accepted
        wait_for(
            lambda: metric(url, name, {**labels, "reason": "over_capacity"}) == refused,
            60,
            f"{refused} over-capacity events counted",
        )
        blocks, _ = kv_blocks(url, forged.instance_id)
        assert blocks == held + accepted * BLOCKS_PER_EVENT <= ADVERTISED_BLOCKS
        assert (
            metric(url, "dynamo_component_kv_events_rejected_total", {"reason": "over_capacity"}) == refused
        )

        # a rank the record does not have, a block size it does not advertise
        forged.publish([forged.stored(1, None)], dp_rank=3)
        forged.publish([forged.stored(2, None, block_size=BLOCK_SIZE * 2)])
        wait_for(
            lambda: metric(url, name, {**labels, "reason": "unknown_dp_rank"}) == 1,
            30,
            "the unknown dp rank counted",
        )
        wait_for(
            lambda: metric(url, name, {**labels, "reason": "block_size_mismatch"}) == 2,
            30,
            "the mismatched blocks counted",
        )

        # one event of 10M hashes (90 MB): refused by size, never decoded
        hashes = (b"\xcf" + (1 << 63).to_bytes(8, "big")) * 10_000_000
        payload = (
            b"\x93\xcb"
            + msgspec.msgpack.encode(1.0)[1:]
            + b"\x91\x95\xabBlockStored"
            + b"\xdd"
            + (10_000_000).to_bytes(4, "big")
            + hashes
            + b"\xc0\x90\x10\x00"
        )
        sent = time.monotonic()
        forged.publish_payload(payload)
        wait_for(
            lambda: metric(url, name, {**labels, "reason": "too_large"}) == 1,
            60,
            "the 10M-hash event refused",
        )
        live = httpx.get(url + "/live", timeout=10)
        assert live.status_code == 200
        assert time.monotonic() - sent < 30
        assert kv_blocks(url, forged.instance_id)[0] == blocks
        frontend_log = stack.frontend.log()
        assert frontend_log.count(f"KV-event message of worker {forged.instance_id}") <= 3
    finally:
        forged.close()


# --------------------------------------------------------------------------- discovery root


def dyn(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dyn.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
    )


def assert_refused(result: subprocess.CompletedProcess, *words: str, one_line: bool = True) -> None:
    """Status 2 with a message holding ``words``: one ``error:`` line, or (a bad flag value,
    which Typer reports in a box) any message without a traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if one_line:
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    text = " ".join(result.stderr.replace("│", " ").split())
    for word in words:
        assert word in text, text


def test_a_discovery_root_others_can_write_is_refused_by_every_command(tmp_path):
    open_root = tmp_path / "open"
    open_root.mkdir()
    open_root.chmod(0o777)
    env = {"DYN_DISCOVERY_DIR": ""}
    for command in (
        ["worker", "mocker"],
        ["frontend", "--http-port", "0"],
        ["router"],
        ["indexer", "--http-port", "0"],
        ["inspect-kv"],
        ["serve", "--http-port", "0"],
    ):
        result = dyn(*command, "--discovery-dir", str(open_root), env=env)
        assert_refused(result, str(open_root), "writable by other users", "chmod 700", "--discovery-dir")
    assert list(open_root.iterdir()) == []  # nothing was registered in it

    # the default root, /tmp/dyn-$UID, pre-created by someone else's hand with mode 777
    temp = tmp_path / "tmp"
    temp.mkdir()
    default = temp / f"dyn-{os.getuid()}"
    default.mkdir()
    default.chmod(0o777)
    env = {"DYN_DISCOVERY_DIR": "", "XDG_RUNTIME_DIR": "", "TMPDIR": str(temp)}
    assert_refused(dyn("worker", "mocker", env=env), str(default), "writable by other users")
    default.chmod(0o700)  # fixed as the message says: the worker starts
    worker = subprocess.Popen(
        [sys.executable, "-m", "dyn.cli", "worker", "mocker"],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not list(default.glob("default/instances/*.json")) and time.monotonic() < deadline:
            assert worker.poll() is None, worker.stdout.read().decode()
            time.sleep(0.1)
        assert list(default.glob("default/instances/*.json"))
    finally:
        os.killpg(worker.pid, 9)
        worker.wait(10)


def test_a_discovery_root_owned_by_another_user_is_refused(tmp_path):
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o755)
        os.chown(theirs, 65534, 65534)
    else:
        theirs = Path("/")  # root's
    result = dyn("worker", "mocker", "--discovery-dir", str(theirs), env={"DYN_DISCOVERY_DIR": ""})
    assert_refused(result, "belongs to user id", "not to you", "--discovery-dir")


# --------------------------------------------------------------------------- CurveZMQ


def test_curve_planes_admit_only_holders_of_the_keys(stack_factory, tmp_path, wait_for):
    keys = tmp_path / "keys"
    made = dyn("keys", str(keys))
    assert made.returncode == 0, made.stderr
    assert (os.stat(keys).st_mode & 0o777) == 0o700
    assert sorted(p.name for p in keys.iterdir()) == [
        "client.key",
        "client.key_secret",
        "server.key",
        "server.key_secret",
    ]
    assert all(os.stat(p).st_mode & 0o777 == 0o600 for p in keys.iterdir())
    assert dyn("keys", str(keys)).returncode == 2  # never overwrites

    stack = stack_factory("curve").up(
        "--router-mode", "kv", "--plane-keys", str(keys), workers=1, worker_args=("--plane-keys", str(keys))
    )
    url = stack.url
    (instance,) = stack.instances()
    answer = httpx.post(
        url + "/v1/completions",
        json={
            "model": "dyn-tiny",
            "prompt": "a prompt long enough to fill a few KV blocks " * 20,
            "max_tokens": 4,
            "ignore_eos": True,
        },
        timeout=30,
    )
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
    # the KV router follows the worker's events over the keyed PUB/SUB
    wait_for(lambda: kv_blocks(url, instance)[0] > 0, 30, "the router to index the worker's blocks")

    endpoint = records(stack.root / "discovery", "curve")[instance][1]["endpoints"]["request"]
    server_public, _ = zmq.auth.load_certificate(keys / "server.key")
    client_public, client_secret = zmq.auth.load_certificate(keys / "client.key_secret")
    stranger_public, stranger_secret = zmq.curve_keypair()
    assert ask(endpoint, request_frames("plain"), 2.0) == []
    assert (
        ask(endpoint, request_frames("stranger"), 2.0, (stranger_public, stranger_secret, server_public))
        == []
    )
    replies = ask(endpoint, request_frames("holder"), 30.0, (client_public, client_secret, server_public))
    assert replies and isinstance(replies[-1], Finish) and replies[-1].usage.completion_tokens == 3, replies

    keys.chmod(0o755)
    assert_refused(
        dyn("worker", "mocker", "--plane-keys", str(keys), "--discovery-dir", str(tmp_path / "d")),
        "--plane-keys",
        "open to other users",
        "chmod 700",
        one_line=False,
    )


def test_binding_beyond_loopback_needs_plane_keys(tmp_path):
    result = dyn("worker", "mocker", "--host", "0.0.0.0", "--discovery-dir", str(tmp_path / "d"))
    assert_refused(result, "0.0.0.0", "--plane-keys", "dyn keys")
    result = dyn("router", "--host", "10.1.2.3", "--discovery-dir", str(tmp_path / "d"))
    assert_refused(result, "10.1.2.3", "--plane-keys")


def test_an_advertised_host_peers_cannot_connect_to_is_refused_by_every_command(tmp_path):
    discovery = ("--discovery-dir", str(tmp_path / "d"))
    for command in (("worker", "mocker"), ("router",), ("indexer",)):
        result = dyn(*command, "--advertise-host", "0.0.0.0", *discovery)
        assert_refused(
            result, "--advertise-host", "0.0.0.0", "not an address peers can connect to", one_line=False
        )
    result = dyn("worker", "mocker", *discovery, env={"DYN_ADVERTISE_HOST": "tcp://10.0.0.1:5555"})
    assert_refused(result, "not a host name or IP address", "DYN_ADVERTISE_HOST", one_line=False)


def test_dyn_serve_passes_the_advertised_host_to_its_workers():
    import typer.main

    from dyn.cli.app import app
    from dyn.cli.serve import option_specs
    from dyn.core.serve import route_flags

    commands = typer.main.get_command(app).commands
    specs = {
        "dyn frontend": option_specs(commands["frontend"]),
        "dyn worker mocker": option_specs(commands["worker"].commands["mocker"]),
    }
    routed = route_flags(["--host", "0.0.0.0", "--advertise-host", "10.0.0.5"], specs)
    assert routed["dyn worker mocker"] == ["--host", "0.0.0.0", "--advertise-host", "10.0.0.5"]
