"""``dyn serve``: flag routing, its lines, and the supervisor driven with small fake children.

The fakes are ``python -c`` scripts: a frontend that prints the listening line and answers ``/health``
on a free loopback port, and workers that idle until a trigger file appears (then exit with a given
code), optionally ignoring SIGTERM. Every test stops its supervisor and checks no child is left.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from dyn.core.serve import (
    ChildSpec,
    FlagRoutingError,
    ServeConfig,
    connectable_url,
    describe_exit,
    flag_value,
    hide_secrets,
    parse_listening_url,
    parse_ready_url,
    ready_line,
    route_flags,
    run_stack,
)

FRONTEND = "dyn frontend"
WORKER = "dyn worker mocker"
SPECS = {
    FRONTEND: {"--router-mode": 1, "--api-key": 1, "--namespace": 1, "--verbose-routing": 0},
    WORKER: {
        "--block-size": 1,
        "--speedup-ratio": 1,
        "--enable-prefix-caching": 0,
        "--no-enable-prefix-caching": 0,
        "--namespace": 1,
        "--pair": 2,
    },
}


# ---------------------------------------------------------------------------------------------
# flag routing


def test_value_flags_go_to_the_command_that_defines_them():
    routed = route_flags(["--router-mode", "kv", "--block-size", "16", "--speedup-ratio", "-1"], SPECS)
    assert routed == {
        FRONTEND: ["--router-mode", "kv"],
        WORKER: ["--block-size", "16", "--speedup-ratio", "-1"],
    }


def test_equals_form_is_kept_whole():
    routed = route_flags(["--block-size=16", "--router-mode=kv"], SPECS)
    assert routed == {FRONTEND: ["--router-mode=kv"], WORKER: ["--block-size=16"]}


def test_boolean_flags_take_no_value():
    routed = route_flags(["--no-enable-prefix-caching", "--verbose-routing", "--block-size", "8"], SPECS)
    assert routed == {
        FRONTEND: ["--verbose-routing"],
        WORKER: ["--no-enable-prefix-caching", "--block-size", "8"],
    }


def test_a_flag_both_define_goes_to_both():
    routed = route_flags(["--namespace", "ns", "--enable-prefix-caching"], SPECS)
    assert routed == {
        FRONTEND: ["--namespace", "ns"],
        WORKER: ["--namespace", "ns", "--enable-prefix-caching"],
    }


def test_multi_value_flags_and_order_are_kept():
    routed = route_flags(["--pair", "a", "b", "--block-size", "4", "--block-size", "8"], SPECS)
    assert routed[WORKER] == ["--pair", "a", "b", "--block-size", "4", "--block-size", "8"]
    assert routed[FRONTEND] == []


def test_unknown_flag_error_names_the_flag_and_the_commands_searched():
    with pytest.raises(FlagRoutingError) as err:
        route_flags(["--block-size", "8", "--warp-drive", "9"], SPECS)
    message = str(err.value)
    assert "--warp-drive" in message and FRONTEND in message and WORKER in message


def test_a_vllm_api_server_flag_dyn_does_not_take_is_refused_with_why_even_for_a_pass_through():
    """vLLM's engine flags go through to the worker; its API-server flags dyn's frontend does not
    take would reach vLLM's engine parser, so they are refused here, saying what to do instead."""
    for passthrough in (None, WORKER):
        with pytest.raises(FlagRoutingError) as err:
            route_flags(["--middleware", "my.Middleware"], SPECS, passthrough=passthrough)
        assert str(err.value).startswith("vLLM's --middleware is not taken by dyn serve: ")
        assert "proxy" in str(err.value)


def test_undeclared_flags_go_to_the_pass_through_command_with_their_values():
    args = [
        "--swap-space",
        "4",
        "--trust-remote-code",
        "--router-mode",
        "kv",
        "--offset",
        "-1",
        "--quantization=fp8",
        "--block-size",
        "32",
    ]
    routed = route_flags(args, SPECS, passthrough=WORKER)
    assert routed[WORKER] == [
        "--swap-space",
        "4",
        "--trust-remote-code",
        "--offset",
        "-1",
        "--quantization=fp8",
        "--block-size",
        "32",
    ]
    assert routed[FRONTEND] == ["--router-mode", "kv"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--block-size"], "needs 1 value"),
        (["--pair", "a"], "needs 2 value"),
        (["--no-enable-prefix-caching=1"], "takes no value"),
        (["stray"], "unexpected argument 'stray'"),
    ],
)
def test_malformed_pass_through_is_an_error(args, needle):
    with pytest.raises(FlagRoutingError, match=needle):
        route_flags(args, SPECS)


def test_flag_value_finds_the_last_value_in_either_form():
    assert flag_value(["--num-workers", "2", "--x", "1", "--num-workers=3"], "--num-workers") == "3"
    assert flag_value(["--num-workers", "2"], "--num-workers") == "2"
    assert flag_value(["--other", "2"], "--num-workers") is None


# ---------------------------------------------------------------------------------------------
# lines


def test_listening_and_ready_lines():
    assert parse_listening_url("dyn frontend listening on http://127.0.0.1:41234") == "http://127.0.0.1:41234"
    assert parse_listening_url("INFO something else http://x:1") is None
    line = ready_line("http://127.0.0.1:8000", "model dyn-tiny, 2 mocker workers, router round-robin")
    assert line == (
        "dyn serve: ready at http://127.0.0.1:8000/v1  (model dyn-tiny, 2 mocker workers, router round-robin)"
    )
    assert parse_ready_url(line) == "http://127.0.0.1:8000/v1"
    assert parse_ready_url("worker-0 | dyn frontend listening on http://127.0.0.1:1") is None


def test_wildcard_addresses_become_loopback_and_exits_read_well():
    assert connectable_url("http://0.0.0.0:8000") == "http://127.0.0.1:8000"
    assert connectable_url("http://[::]:8000") == "http://[::1]:8000"
    assert connectable_url("http://10.0.0.5:8000") == "http://10.0.0.5:8000"
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-9) == "was killed by SIGKILL"


# ---------------------------------------------------------------------------------------------
# the supervisor, with fake children

FAKE_FRONTEND = r"""
import http.server, json, os, signal, sys, threading, time
from dyn.core.parent import follow_parent
follow_parent()  # as every dyn command does first
instances, trigger = int(sys.argv[1]), sys.argv[2]

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"status": "healthy" if instances else "unhealthy",
                           "workers": instances, "instances": list(range(instances))}).encode()
        self.send_response(200 if instances else 503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
threading.Thread(target=server.serve_forever, daemon=True).start()
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("frontend starting", file=sys.stderr, flush=True)
print(f"dyn frontend listening on http://127.0.0.1:{server.server_port}", flush=True)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    if trigger != "-" and os.path.exists(trigger):
        sys.exit(4)
    time.sleep(0.02)
"""

FAKE_WORKER = r"""
import os, signal, sys, time
from dyn.core.parent import follow_parent
follow_parent()
code, trigger, on_term = int(sys.argv[1]), sys.argv[2], sys.argv[3]
signal.signal(signal.SIGTERM, signal.SIG_IGN if on_term == "ignore" else (lambda *_: sys.exit(0)))
print(f"worker up pid={os.getpid()}", flush=True)
print("worker says hi on stderr", file=sys.stderr, flush=True)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    if trigger != "-" and os.path.exists(trigger):
        sys.exit(code)
    time.sleep(0.02)
"""


def fake_frontend(instances: int, trigger: str | Path = "-") -> ChildSpec:
    return ChildSpec("frontend", [sys.executable, "-c", FAKE_FRONTEND, str(instances), str(trigger)])


def fake_worker(i: int, code: int = 0, trigger: str | Path = "-", on_term: str = "exit") -> ChildSpec:
    return ChildSpec(f"worker-{i}", [sys.executable, "-c", FAKE_WORKER, str(code), str(trigger), on_term])


class LineSink(io.TextIOBase):
    """A text stream that keeps whole lines and lets a test wait for one."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()

    def write(self, s: str) -> int:
        with self._cond:
            self.lines.extend(s.splitlines())
            self._cond.notify_all()
        return len(s)

    def text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def wait_for(self, predicate, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    if predicate(line):
                        return line
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting for a line; got:\n{chr(10).join(self.lines)}")
                self._cond.wait(left)


class Running:
    """``run_stack`` on a thread (so no signal handlers), with its output and exit status."""

    def __init__(self, config: ServeConfig) -> None:
        self.out, self.err = LineSink(), LineSink()
        self.stop = threading.Event()
        self.status: int | None = None
        self.thread = threading.Thread(target=self._run, args=(config,), daemon=True)
        self.thread.start()

    def _run(self, config: ServeConfig) -> None:
        self.status = run_stack(config, out=self.out, err=self.err, stop=self.stop)

    def join(self, timeout: float = 30.0) -> int | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"supervisor still running:\n{self.out.text()}\n{self.err.text()}"
        return self.status

    def pids(self) -> dict[str, int]:
        return {
            line.split()[3]: int(line.split("(pid ")[1].split(")")[0])
            for line in self.out.lines
            if line.startswith("dyn serve: started ")
        }


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def assert_all_gone(pids, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(gone(p) for p in pids):
        time.sleep(0.05)
    assert all(gone(p) for p in pids), f"children left behind: {[p for p in pids if not gone(p)]}"


@pytest.fixture
def stacks():
    """Every ``Running`` a test starts is stopped at teardown, whatever happened."""
    started: list[Running] = []

    def start(config: ServeConfig) -> Running:
        running = Running(config)
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop.set()
        running.thread.join(30)


def config_for(frontend: ChildSpec, workers: list[ChildSpec], **kwargs) -> ServeConfig:
    kwargs.setdefault("startup_timeout_s", 20.0)
    kwargs.setdefault("stop_timeout_s", 5.0)
    return ServeConfig(frontend=frontend, workers=workers, summary="fake stack", **kwargs)


def test_ready_line_prefixed_output_and_clean_stop(stacks):
    run = stacks(config_for(fake_frontend(2), [fake_worker(0), fake_worker(1)]))
    ready = run.out.wait_for(lambda line: parse_ready_url(line) is not None)
    url = parse_ready_url(ready)
    assert ready.endswith("/v1  (fake stack)") and url.startswith("http://127.0.0.1:")
    assert httpx.get(url.removesuffix("/v1") + "/health", timeout=5).json()["instances"] == [0, 1]
    run.out.wait_for(lambda line: line.startswith("worker-1 | worker says hi on stderr"))
    run.out.wait_for(lambda line: line.startswith("worker-0 | worker up pid="))
    run.out.wait_for(lambda line: line == "frontend | frontend starting")
    run.out.wait_for(lambda line: line.startswith("frontend | dyn frontend listening on http://127.0.0.1:"))
    pids = run.pids()
    assert set(pids) == {"frontend", "worker-0", "worker-1"}
    run.stop.set()
    assert run.join() == 0
    assert_all_gone(pids.values())
    assert run.err.lines == []


def test_waits_for_enough_instances_then_gives_up_clearly(stacks):
    run = stacks(config_for(fake_frontend(1), [fake_worker(0), fake_worker(1)], startup_timeout_s=2.0))
    assert run.join() == 1
    error = run.err.text()
    assert "not ready after 2s" in error and "counts 1 worker instance(s)" in error and "want 2" in error
    assert "--startup-timeout" in error
    assert not any(parse_ready_url(line) for line in run.out.lines)
    assert_all_gone(run.pids().values())


def test_instances_per_worker_counts_toward_ready(stacks):
    run = stacks(
        config_for(
            fake_frontend(3), [fake_worker(0), fake_worker(1)], instances_per_worker=2, startup_timeout_s=2.0
        )
    )
    assert run.join() == 1 and "want 4 worker instance(s)" in run.err.text()


def test_child_exiting_before_ready_stops_the_rest(stacks, tmp_path):
    trigger = tmp_path / "now"
    trigger.touch()
    run = stacks(config_for(fake_frontend(0), [fake_worker(0), fake_worker(1, code=3, trigger=trigger)]))
    assert run.join() == 1
    assert "worker-1" in run.err.text() and "exited with code 3 before the stack was ready" in run.err.text()
    assert_all_gone(run.pids().values())


def test_a_child_that_cannot_start_is_reported(stacks):
    run = stacks(config_for(fake_frontend(1), [ChildSpec("worker-0", ["/nonexistent/dyn-no-such-binary"])]))
    assert run.join() == 1
    assert "could not start worker-0" in run.err.text()
    assert_all_gone(run.pids().values())


def test_worker_exit_after_ready_keeps_serving_until_the_last_one_goes(stacks, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    run = stacks(
        config_for(
            fake_frontend(2),
            [fake_worker(0, code=5, trigger=first), fake_worker(1, code=6, trigger=second)],
            restart_workers=False,
        )
    )
    run.out.wait_for(lambda line: parse_ready_url(line) is not None)
    first.touch()
    run.err.wait_for(lambda line: "worker-0" in line and "code 5" in line and "serving on with 1" in line)
    assert run.thread.is_alive()
    second.touch()
    assert run.join() == 1
    assert "no worker is left" in run.err.text()
    assert_all_gone(run.pids().values())


@pytest.mark.long
def test_a_dead_worker_is_restarted_after_a_doubling_back_off(stacks, tmp_path):
    dying = tmp_path / "dying"
    run = stacks(
        config_for(
            fake_frontend(2),
            [fake_worker(0, code=5, trigger=dying), fake_worker(1)],
            restart_backoff_s=(0.2, 0.4),
        )
    )
    run.out.wait_for(lambda line: parse_ready_url(line) is not None)
    first_pid = run.pids()["worker-0"]
    dying.touch()  # every worker-0 started from now on exits at once with code 5
    run.err.wait_for(lambda line: "worker-0" in line and "code 5; restarting it in 0.2s" in line)
    run.err.wait_for(lambda line: "code 5; restarting it in 0.4s" in line)
    dying.unlink()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and sum("restarting it in 0.4s" in line for line in run.err.lines) < 2:
        time.sleep(0.05)  # the back-off stays at its longest while the worker keeps dying
    run.out.wait_for(lambda line: line.startswith("worker-0 | worker up") and f"pid={first_pid}" not in line)
    restarted = run.pids()["worker-0"]
    assert restarted != first_pid and not gone(restarted)
    assert run.thread.is_alive()
    run.stop.set()
    assert run.join() == 0
    assert_all_gone(run.pids().values())


def test_secret_flags_travel_in_the_environment_and_are_never_printed():
    argv, env = hide_secrets(
        ["python", "-m", "dyn.cli", "frontend", "--api-key", "s3cret", "--http-port", "0", "--api-key=other"]
    )
    assert argv == ["python", "-m", "dyn.cli", "frontend", "--http-port", "0"]
    assert env == {"DYN_API_KEY": "other"}  # the last one wins, as on the command line


def test_the_api_key_reaches_the_child_but_not_the_output(stacks):
    probe = ChildSpec(
        "worker-0",
        [
            sys.executable,
            "-c",
            "import os; print('key=' + os.environ['DYN_API_KEY'], "
            "flush=True); "
            + FAKE_WORKER.replace("int(sys.argv[1])", "0")
            .replace("sys.argv[2]", "'-'")
            .replace("sys.argv[3]", "'exit'"),
            "--api-key",
            "s3cret",
        ],
    )
    run = stacks(config_for(fake_frontend(1), [probe]))
    run.out.wait_for(lambda line: line.startswith("worker-0 | key=s3cret"))
    started = next(line for line in run.out.lines if line.startswith("dyn serve: started worker-0"))
    assert "s3cret" not in started and "--api-key" not in started
    run.stop.set()
    assert run.join() == 0


def test_frontend_exit_after_ready_stops_everything(stacks, tmp_path):
    trigger = tmp_path / "frontend-dies"
    run = stacks(config_for(fake_frontend(1, trigger), [fake_worker(0)]))
    run.out.wait_for(lambda line: parse_ready_url(line) is not None)
    trigger.touch()
    assert run.join() == 1
    assert "frontend" in run.err.text() and "exited with code 4; stopping the workers" in run.err.text()
    assert_all_gone(run.pids().values())


def test_a_child_ignoring_sigterm_is_killed_after_the_stop_timeout(stacks):
    run = stacks(config_for(fake_frontend(1), [fake_worker(0, on_term="ignore")], stop_timeout_s=1.0))
    run.out.wait_for(lambda line: parse_ready_url(line) is not None)
    run.out.wait_for(lambda line: line.startswith("worker-0 | worker up"))  # SIGTERM is ignored by now
    started = time.monotonic()
    run.stop.set()
    assert run.join() == 0
    assert time.monotonic() - started < 10
    assert "worker-0" in run.err.text() and "did not stop within 1s; killing it" in run.err.text()
    assert_all_gone(run.pids().values())


# ---------------------------------------------------------------------------------------------
# the supervisor as its own process: real signals

SUPERVISOR = r"""
import json, sys
from dyn.core.serve import ChildSpec, ServeConfig, run_stack
cfg = json.loads(sys.argv[1])
sys.exit(run_stack(ServeConfig(frontend=ChildSpec(*cfg["frontend"]), workers=[ChildSpec(*w) for w in cfg["workers"]],
                               startup_timeout_s=20.0, stop_timeout_s=cfg["stop_timeout_s"], summary="fake")))
"""


class SupervisorProcess:
    def __init__(self, frontend: ChildSpec, workers: list[ChildSpec], stop_timeout_s: float) -> None:
        cfg = {
            "frontend": [frontend.name, list(frontend.argv)],
            "workers": [[w.name, list(w.argv)] for w in workers],
            "stop_timeout_s": stop_timeout_s,
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SUPERVISOR, json.dumps(cfg)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.out = LineSink()
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.out.write(line)

    def pids(self) -> list[int]:
        return [
            int(line.split("(pid ")[1].split(")")[0])
            for line in self.out.lines
            if line.startswith("dyn serve: started ")
        ]

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        for pid in self.pids():
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def supervisor_process():
    started: list[SupervisorProcess] = []

    def start(
        frontend: ChildSpec, workers: list[ChildSpec], stop_timeout_s: float = 5.0
    ) -> SupervisorProcess:
        sp = SupervisorProcess(frontend, workers, stop_timeout_s)
        started.append(sp)
        return sp

    yield start
    for sp in started:
        sp.cleanup()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_every_child_and_exits_0(supervisor_process, sig):
    sp = supervisor_process(fake_frontend(2), [fake_worker(0), fake_worker(1)])
    sp.out.wait_for(lambda line: parse_ready_url(line) is not None)
    pids = sp.pids()
    assert len(pids) == 3 and not any(gone(p) for p in pids)
    sp.proc.send_signal(sig)
    assert sp.proc.wait(20) == 0
    sp.out.wait_for(lambda line: line.startswith(f"dyn serve: {sig.name} received; stopping"))
    assert_all_gone(pids)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_children_die_with_a_sigkilled_supervisor(supervisor_process):
    sp = supervisor_process(fake_frontend(1), [fake_worker(0)])
    sp.out.wait_for(lambda line: parse_ready_url(line) is not None)
    pids = sp.pids()
    sp.proc.kill()
    sp.proc.wait(10)
    assert_all_gone(pids)


def test_a_second_signal_kills_stragglers_at_once(supervisor_process):
    sp = supervisor_process(fake_frontend(1), [fake_worker(0, on_term="ignore")], stop_timeout_s=60.0)
    sp.out.wait_for(lambda line: parse_ready_url(line) is not None)
    sp.out.wait_for(lambda line: line.startswith("worker-0 | worker up"))
    pids = sp.pids()
    sp.proc.send_signal(signal.SIGINT)
    sp.out.wait_for(lambda line: line.startswith("dyn serve: SIGINT received"))
    started = time.monotonic()
    sp.proc.send_signal(signal.SIGINT)
    assert sp.proc.wait(20) == 0
    assert time.monotonic() - started < 10
    sp.out.wait_for(lambda line: "worker-0" in line and "asked twice; killing it" in line)
    assert_all_gone(pids)


def test_device_sets_slice_the_visible_gpus_or_count_from_zero():
    from dyn.core.serve import device_sets

    assert device_sets(3, 1, None) == ["0", "1", "2"]
    assert device_sets(2, 2, "") == ["0,1", "2,3"]
    assert device_sets(2, 1, "3, 5,7") == ["3", "5"]
    with pytest.raises(ValueError, match="needs 4 GPUs"):
        device_sets(2, 2, "0,1,2")
