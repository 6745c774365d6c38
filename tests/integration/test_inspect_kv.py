"""``dyn inspect-kv`` as a subprocess against real processes in a known state: two mocker workers,
a kv-mode frontend, a ``dyn indexer`` and a ``dyn router --system-port 0``, all fed by the same
KV events. Each worker is sent its own prefixes (``x-worker-instance-id``), so which worker holds
how many blocks of which request is known; the three views of the index must agree on it."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from dyn.core.indexer.service import READY_PREFIX as INDEXER_READY
from dyn.core.inspect.prompt import prompt_tokens
from dyn.core.router.service import METRICS_PREFIX
from tests.integration.conftest import DynProcess, Stack
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

BLOCK = 16
NAMESPACE = "insp"
MODEL = "dyn-tiny"


def _system(word: str) -> dict:
    return {"role": "system", "content": f"{word} is the codename. " + "Keep answers short. " * 40}


CHAT_A1 = [_system("Alpha"), {"role": "user", "content": "first question"}]
CHAT_A2 = [_system("Alpha"), {"role": "user", "content": "a second, different question"}]
CHAT_B = [_system("Bravo"), {"role": "user", "content": "what now?"}]
TEXT_C = "Charlie writes plain text. " * 30


def _line(proc: DynProcess, prefix: str) -> str | None:
    for line in proc.log().splitlines():
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    if proc.proc.poll() is not None:
        raise AssertionError(f"process exited:\n{proc.log()}")
    return None


class Inspected:
    """The stack, the views' URLs and the files of the requests sent."""

    def __init__(self, stack: Stack, tmp) -> None:
        self.stack = stack
        stack.worker("--block-size", str(BLOCK), count=2)
        stack.start_frontend("--router-mode", "kv")
        self.w1, self.w2 = sorted(stack.wait_instances(2))
        indexer = stack.start("indexer", "--http-port", "0", "--namespace", NAMESPACE)
        router = stack.start("router", "--namespace", NAMESPACE, "--system-port", "0")
        ready = poll_until(lambda: _line(indexer, INDEXER_READY), 60, "dyn indexer to be ready")
        self.indexer = dict(p.split("=", 1) for p in ready.split())["http"]
        metrics = poll_until(lambda: _line(router, METRICS_PREFIX), 60, "the router's system port")
        self.router = metrics.removesuffix("/metrics")
        poll_until(
            lambda: len(httpx.get(self.indexer + "/workers", timeout=5).json()) == 2,
            30,
            "the indexer to follow both workers",
        )
        self.files = {}
        for name, chat in (("a1", CHAT_A1), ("a2", CHAT_A2), ("b", CHAT_B)):
            path = tmp / f"{name}.json"
            path.write_text(json.dumps(chat))
            self.files[name] = str(path)

    def send(self, body: dict, instance_id: int, path: str = "/v1/chat/completions") -> None:
        r = httpx.post(
            self.stack.url + path,
            timeout=30,
            headers={"x-worker-instance-id": str(instance_id)},
            json={"model": MODEL, "max_tokens": 2, **body},
        )
        assert r.status_code == 200, r.text

    def inspect(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [sys.executable, "-m", "dyn.cli", "inspect-kv", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=self.stack.env,
        )
        if check:
            assert result.returncode == 0, result.stderr
        return result

    def snapshot(self, *args: str) -> dict:
        return json.loads(self.inspect(*args, "--json").stdout)


def _blocks(snapshot: dict) -> dict[int, int]:
    return {w["instance_id"]: w["blocks"] for w in snapshot["workers"]}


def _matched(snapshot: dict) -> dict[int, int]:
    return {w["instance_id"]: w["matched_blocks"] for w in snapshot["overlap"]["workers"]}


def _tokens(**source: str) -> int:
    return len(prompt_tokens(None, **source).token_ids)


@pytest.fixture(scope="module")
def inspected(stack_factory, tmp_path_factory):
    """A1 then A2 (sharing A1's system prompt) on worker 1, B and the text C on worker 2."""
    s = Inspected(stack_factory(NAMESPACE), tmp_path_factory.mktemp("chats"))
    s.send({"messages": CHAT_A1}, s.w1)
    full_a1 = _tokens(messages_file=s.files["a1"]) // BLOCK
    # the frontend's router must know A1's blocks before A2 is routed, for a predicted hit
    poll_until(
        lambda: _matched(s.snapshot("--url", s.stack.url, "--messages", s.files["a1"])).get(s.w1) == full_a1,
        20,
        "A1's blocks to reach the frontend's index",
    )
    s.send({"messages": CHAT_A2}, s.w1)
    s.send({"messages": CHAT_B}, s.w2)
    s.send({"prompt": TEXT_C}, s.w2, "/v1/completions")
    expected = {name: _tokens(messages_file=s.files[name]) // BLOCK for name in ("a2", "b")}
    poll_until(
        lambda: (
            _matched(s.snapshot("--url", s.indexer, "--messages", s.files["a2"])).get(s.w1) == expected["a2"]
            and _matched(s.snapshot("--url", s.indexer, "--messages", s.files["b"])).get(s.w2)
            == expected["b"]
        ),
        30,
        "every request's blocks to reach the indexer",
    )
    return s


def test_the_indexer_snapshot_holds_the_known_state(inspected):
    s = inspected
    snap = s.snapshot("--url", s.indexer, "--messages", s.files["a1"])
    assert snap["target"] == s.indexer and snap["model"] == MODEL and snap["block_size"] == BLOCK
    blocks = _blocks(snap)
    assert set(blocks) == {s.w1, s.w2} and min(blocks.values()) > 0
    assert snap["cached_blocks"] == sum(blocks.values())
    for w in snap["workers"]:  # capacity from the workers' discovery records
        assert w["total_blocks"] > 0 and w["occupancy"] == pytest.approx(w["blocks"] / w["total_blocks"])
    tree = snap["tree"]
    # the workers share no prefix (their system prompts differ from the first block on)
    assert tree["nodes"] == tree["entries"] == snap["cached_blocks"]
    assert sum(b["blocks"] for b in tree["depth_histogram"]) == tree["entries"]
    assert tree["max_depth"] == max(w["max_depth"] for w in snap["workers"])
    assert snap["hit_rate"] is None and snap["events"]["applied"] > 0
    overlap = snap["overlap"]
    a1 = _tokens(messages_file=s.files["a1"])
    assert overlap["prompt_tokens"] == a1 and overlap["prompt_blocks"] == a1 // BLOCK
    assert _matched(snap) == {s.w1: a1 // BLOCK, s.w2: 0}
    best = overlap["workers"][0]
    assert best["instance_id"] == s.w1
    assert best["share"] == pytest.approx(best["matched_tokens"] / a1)


def test_a_raw_prompt_matches_the_completion_that_cached_it(inspected):
    s = inspected
    c = _tokens(prompt=TEXT_C)
    snap = poll_until(
        lambda: (
            (snap := s.snapshot("--url", s.indexer, "--prompt", TEXT_C))
            and _matched(snap)[s.w2] == c // BLOCK
            and snap
        ),
        20,
        "the text's blocks to reach the indexer",
    )
    assert _matched(snap)[s.w1] == 0
    table = s.inspect("--url", s.indexer, "--prompt", TEXT_C).stdout
    assert "Cached prefix of the request" in table and str(s.w2) in table


def test_the_router_and_frontend_views_agree_with_the_indexer(inspected):
    s = inspected
    indexed = _blocks(s.snapshot("--url", s.indexer))
    router = poll_until(
        lambda: (snap := s.snapshot("--url", s.router)) and _blocks(snap) == indexed and snap,
        20,
        f"the router's index to match the indexer's {indexed}",
    )
    assert router["target"] == s.router + "/kv"
    assert router["hit_rate"] == {"mean": None, "requests": 0}  # no frontend routes through it
    for w in router["workers"]:  # the capacity comes from the workers' records
        assert w["total_blocks"] > 0 and w["occupancy"] == pytest.approx(w["blocks"] / w["total_blocks"])
    frontend = poll_until(
        lambda: (snap := s.snapshot("--url", s.stack.url)) and _blocks(snap) == indexed and snap,
        20,
        "the frontend's index to match the indexer's",
    )
    assert frontend["hit_rate"]["requests"] == 4 and frontend["hit_rate"]["mean"] > 0


def test_discovery_finds_the_indexer(inspected):
    s = inspected
    assert s.snapshot("--namespace", NAMESPACE)["target"] == s.indexer
    missing = s.inspect("--namespace", NAMESPACE, "--model-name", "nope", check=False)
    assert missing.returncode == 1 and "no live dyn indexer of model 'nope'" in missing.stderr


def test_watch_prints_a_table_and_exits(inspected):
    s = inspected
    result = s.inspect("--url", s.indexer, "--watch", "--duration", "2", "--interval", "0.5")
    assert "Cached blocks per worker" in result.stdout and str(s.w1) in result.stdout
    frames = [
        json.loads(line)
        for line in s.inspect(
            "--url", s.indexer, "--watch", "--json", "--duration", "1.2", "--interval", "0.4"
        ).stdout.splitlines()
        if line.strip()
    ]
    assert len(frames) >= 2 and frames[0]["events"]["per_second"] is None
    assert all(f["events"]["per_second"] is not None for f in frames[1:])  # a rate from the 2nd frame on
