"""The router-mode registry (``dyn.core.router.modes``), the simple policies' load view, and a
mode a package outside dyn registers under the ``dyn.router_modes`` entry points.

The third-party package is written to a temporary directory with a ``.dist-info`` (what ``pip
install`` leaves; entry-point format: the PyPA entry points specification), so
``importlib.metadata`` finds it like any installed distribution.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import anyio
import orjson
import pytest
from prometheus_client import CollectorRegistry

from dyn.core.bench.report import read_result
from dyn.core.messages import WorkerEndpoints, WorkerRecord
from dyn.core.router import modes
from dyn.core.router.build import build_router
from dyn.core.router.config import KvRouterConfig
from dyn.core.router.policy import RouteRequest
from dyn.core.router.pool import Worker, WorkerPool
from dyn.core.router.simple import DeviceAwareWeightedRouter, LeastLoadedRouter, PowerOfTwoRouter
from tests.memory_discovery import memory_store

pytestmark = pytest.mark.anyio

MODE_SOURCE = '''
"""A routing policy dyn knows nothing about: always the live worker with the highest id."""
from dyn.core.router.modes import RouterMode
from dyn.core.router.simple import SimpleRouter


class HighestRouter(SimpleRouter):
    mode = "highest"

    def choose(self, request, view):
        return max(view.workers, key=lambda w: w.instance_id)


MODE = RouterMode(name="highest", summary="the highest instance id", build=lambda ctx: HighestRouter(ctx.pool))
NOT_A_MODE = 42
'''


class FixedPool:
    """A pool whose membership the test sets: what a ``SimpleRouter`` reads of a ``WorkerPool``."""

    model_name = "m"

    def __init__(self, *ids: int, cpu: tuple[int, ...] = ()) -> None:
        self.members = {
            i: Worker(
                WorkerRecord(
                    instance_id=i,
                    namespace="t",
                    model_name="m",
                    engine="mocker",
                    endpoints=WorkerEndpoints(f"tcp://127.0.0.1:{20000 + i}"),
                    block_size=16,
                    total_kv_blocks=64,
                    max_num_batched_tokens=256,
                    device="cpu" if i in cpu else "cuda",
                ),
                client=None,
            )
            for i in ids
        }

    def workers(self) -> list[Worker]:
        return [self.members[i] for i in sorted(self.members)]

    def get(self, instance_id: int) -> Worker | None:
        return self.members.get(instance_id)

    store = None
    client_factory = None

    def add_listener(self, listener) -> None:
        for worker in self.workers():
            listener(worker, True)


def req(instance_id: int | None = None) -> RouteRequest:
    return RouteRequest(request_id="r", token_ids=[1, 2, 3], instance_id=instance_id)


@pytest.fixture
def site(tmp_path: Path, monkeypatch) -> Path:
    """The ``highest_mode`` package installed in a directory on ``sys.path`` (and PYTHONPATH)."""
    root = tmp_path / "site"
    dist = root / "highest_mode-0.1.dist-info"
    dist.mkdir(parents=True)
    (root / "highest_mode.py").write_text(textwrap.dedent(MODE_SOURCE))
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: highest-mode\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[dyn.router_modes]\nhighest = highest_mode:MODE\nbroken = highest_mode:NOT_A_MODE\n"
        "kv = highest_mode:MODE\n"
    )
    monkeypatch.syspath_prepend(str(root))
    modes._registered.cache_clear()
    modes.router_mode.cache_clear()
    yield root
    modes._registered.cache_clear()
    modes.router_mode.cache_clear()


async def test_least_loaded_takes_the_idlest_worker_and_frees_on_finish():
    pool = FixedPool(1, 2, 3)
    router = LeastLoadedRouter(pool)
    first = [await router.route(req()) for _ in range(3)]
    assert [r.worker.instance_id for r in first] == [1, 2, 3]  # an idle pool is used in turn
    extra = await router.route(req(2))  # a named worker is counted too
    first[0].finished()
    first[0].finished()  # once only
    assert (await router.route(req())).worker.instance_id == 1
    first[2].finished()
    assert (await router.route(req())).worker.instance_id == 3
    extra.finished()
    first[1].finished()
    assert (await router.route(req())).worker.instance_id == 2


async def test_power_of_two_picks_the_less_loaded_of_two_drawn_workers():
    """Loads 0, 1, 2, 3 on four workers: the worker of rank r (0 the least loaded) wins when it is
    drawn with a busier one, with probability (3 - r) / 6; the busiest never wins."""
    pool = FixedPool(1, 2, 3, 4)
    router = PowerOfTwoRouter(pool, random.Random(7))
    for iid, load in ((2, 1), (3, 2), (4, 3)):
        for _ in range(load):
            await router.route(req(iid))
    wins = {1: 0, 2: 0, 3: 0, 4: 0}
    draws = 6000
    for _ in range(draws):
        route = await router.route(req())
        wins[route.worker.instance_id] += 1
        route.finished()  # the loads stay as set
    assert wins[4] == 0
    for iid, share in ((1, 3 / 6), (2, 2 / 6), (3, 1 / 6)):
        assert abs(wins[iid] / draws - share) < 0.03, wins
    assert (await PowerOfTwoRouter(FixedPool(5)).route(req())).worker.instance_id == 5


async def test_device_aware_weighted_gives_the_cpu_group_its_capability_share():
    """One accelerator worker counts for ``ratio`` CPU workers: with two accelerators and two CPU
    workers at ratio 4, of 100 requests that stay in flight the CPU group gets one for every four
    the accelerators get (20 of 100), each group spread least-loaded."""
    pool = FixedPool(1, 2, 3, 4, cpu=(3, 4))
    router = DeviceAwareWeightedRouter(pool, ratio=4)
    chosen = Counter([(await router.route(req())).worker.instance_id for _ in range(100)])
    assert chosen[3] + chosen[4] == 20 and abs(chosen[3] - chosen[4]) <= 1 and abs(chosen[1] - chosen[2]) <= 1
    only_cpu = DeviceAwareWeightedRouter(FixedPool(5, 6, cpu=(5, 6)))
    assert Counter([(await only_cpu.route(req())).worker.instance_id for _ in range(10)]) == {5: 5, 6: 5}


def test_device_aware_weighted_reads_its_ratio_from_the_environment(tmp_path, monkeypatch):
    pool = WorkerPool(memory_store(tmp_path, "t"), "m")
    assert build_router("device-aware-weighted", pool, KvRouterConfig(), CollectorRegistry()).ratio == 8
    monkeypatch.setenv("DYN_ENCODER_CUDA_TO_CPU_RATIO", "3")
    assert build_router("device-aware-weighted", pool, KvRouterConfig(), CollectorRegistry()).ratio == 3
    monkeypatch.setenv("DYN_ENCODER_CUDA_TO_CPU_RATIO", "0")
    with pytest.raises(ValueError, match="DYN_ENCODER_CUDA_TO_CPU_RATIO='0': give a whole number"):
        build_router("device-aware-weighted", pool, KvRouterConfig(), CollectorRegistry())


async def test_a_departed_worker_leaves_no_count_behind():
    pool = FixedPool(1, 2)
    router = LeastLoadedRouter(pool)
    route = await router.route(req(2))
    del pool.members[2]
    route.finished()
    assert router._active == {}


def test_every_builtin_mode_builds_and_is_in_the_help(tmp_path):
    pool = WorkerPool(memory_store(tmp_path, "t"), "m")
    for name in modes.mode_names():
        router = build_router(name, pool, KvRouterConfig(), CollectorRegistry())
        assert router.mode == name
        assert f"{name} (" in modes.modes_help()
    assert "direct" not in modes.mode_names(offline=True)
    assert "direct (" not in modes.modes_help(offline=True)


async def test_a_registered_mode_routes_and_a_bad_one_says_why(site):
    assert modes.mode_names()[-2:] == ["highest", "broken"]  # a built-in name is not overridden
    assert modes.router_mode("kv") is modes.BUILTIN_MODES["kv"]
    router = build_router("highest", FixedPool(1, 5, 3), KvRouterConfig(), CollectorRegistry())  # type: ignore[arg-type]
    assert (await router.route(req())).worker.instance_id == 5
    assert (await router.route(req(1))).worker.instance_id == 1
    with pytest.raises(ValueError, match="highest_mode:NOT_A_MODE is a int, not a"):
        modes.router_mode("broken")
    with pytest.raises(ValueError, match="choose one of kv, .*, direct, highest, broken"):
        modes.router_mode("nope")


def test_offline_replay_routes_with_a_registered_mode(site, tmp_path):
    rows = [{"timestamp": t, "input_length": 64, "output_length": 2, "hash_ids": [t]} for t in range(4)]
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dyn.cli",
            "bench",
            "replay",
            "--offline",
            str(trace),
            "--num-workers",
            "3",
            "--router-mode",
            "highest",
            "-o",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    saved = read_result(out)
    assert saved.config["router_mode"] == "highest"
    assert {r.worker for r in saved.requests} == {"2"}  # replay workers are 0..N-1


async def test_direct_mode_refuses_an_untargeted_request_even_with_no_workers():
    router = build_router("direct", FixedPool(), KvRouterConfig(), CollectorRegistry())  # type: ignore[arg-type]
    with pytest.raises(Exception, match="needs a target worker"):
        await router.route(req())
    with anyio.fail_after(1), pytest.raises(Exception, match="live instances: none"):
        await router.route(req(4))


SCORED_SOURCE = '''
"""A third-party KV policy: the rank with the fewest requests, then the most of the prompt cached."""
from dyn.core.router.scoring import Policy, policy_mode


class FewestThenCached(Policy):
    def score(self, view):
        return view.requests * 1e9 - view.cached_tokens


MODE = policy_mode("fewest-cached", "fewest requests, then most cached", lambda config: FewestThenCached())
'''


async def test_a_scored_policy_from_a_package_routes_over_the_kv_routers_view(tmp_path, monkeypatch):
    """A policy as a scorer over ``RankView`` (the default picker: the lowest), registered by entry
    point: it sees each rank's cached tokens and booked requests as the KV router keeps them."""
    root = tmp_path / "site"
    dist = root / "fewest_mode-0.1.dist-info"
    dist.mkdir(parents=True)
    (root / "fewest_mode.py").write_text(SCORED_SOURCE)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fewest-mode\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[dyn.router_modes]\nfewest-cached = fewest_mode:MODE\n")
    monkeypatch.syspath_prepend(str(root))
    modes._registered.cache_clear()
    modes.router_mode.cache_clear()
    try:
        mode = modes.router_mode("fewest-cached")
    finally:
        modes._registered.cache_clear()
        modes.router_mode.cache_clear()
    from dyn.core.kv.hashing import block_hashes, sequence_hashes
    from dyn.core.router.metrics import RouterMetrics
    from tests.core.router.doubles import FakeIngestor

    context = modes.RouterContext(
        pool=FixedPool(1, 2, 3), metrics=RouterMetrics(CollectorRegistry()), ingest=FakeIngestor
    )
    router = mode.build(context)
    tokens = list(range(64))
    local = block_hashes(tokens, 16)
    router.indexer.store((2, 0), None, sequence_hashes(local), local)  # worker 2 holds the prompt
    prompt = RouteRequest(request_id="a", token_ids=tokens)
    first = await router.route(prompt)
    assert (first.worker.instance_id, first.decision.cached_tokens) == (2, 64)
    second = await router.route(RouteRequest(request_id="b", token_ids=tokens))
    assert second.worker.instance_id != 2  # a busier rank loses to an idle one, cache or not
    first.finished()
    assert (await router.route(RouteRequest(request_id="c", token_ids=tokens))).worker.instance_id == 2
