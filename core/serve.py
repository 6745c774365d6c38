"""``dyn serve``: run a whole local stack (one frontend, N workers) as children of one supervisor.

Two ideas live here, both engine-agnostic and free of any CLI library:

* ``route_flags`` sends each extra command-line flag to the child command(s) that define it, given
  each command's option specs (flag name -> how many values it takes). A flag nobody defines is a
  ``FlagRoutingError`` that names the flag and the commands searched.
* ``run_stack`` starts the children (stdout and stderr piped, every line prefixed with the child's
  name; with ``log_format="json"`` no prefix: every line the supervisor writes is one JSON object
  whose ``process`` field names the child, see ``relay_json``), waits until the frontend prints
  its listening line and its ``/health`` counts enough worker instances, prints one ready line, and supervises until SIGINT/SIGTERM or a fatal exit. A worker
  that dies once the stack is ready is restarted after a back-off that doubles with each quick
  death (``restart_backoff_s``), and the supervisor says so. Stopping is a drain: every child gets
  SIGTERM (workers leave discovery and finish or hand back their requests, the frontend finishes
  its open responses), then SIGKILL after ``stop_timeout_s``; all are reaped before it returns.
  Children stop even if the supervisor is SIGKILLed: each runs ``follow_parent`` at start
  (``dyn.core.parent``: Linux's PR_SET_PDEATHSIG), told the supervisor's pid in ``PARENT_ENV``.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import httpx
import orjson

from dyn.core.frontend import vllm_flags
from dyn.core.logs import PROCESS_ENV, json_record, status_text
from dyn.core.parent import PARENT_ENV

LISTENING_RE = re.compile(r"dyn frontend listening on (https?://\S+)")
READY_PREFIX = "dyn serve: ready at "
READY_RE = re.compile(re.escape(READY_PREFIX) + r"(https?://\S+)")
_STEADY_S = 60.0
"""A restarted worker that lived this long starts the back-off over."""
SECRET_FLAGS = ("--api-key",)
"""Flags whose values never appear in the supervisor's output (they reach the child in its
environment instead of its argv, so ``ps`` does not show them either)."""
_HEALTH_TIMEOUT_S = 1.0
_READER_JOIN_S = 2.0
_COLOURS = ("36", "33", "35", "32", "34", "31", "96", "93", "95", "92", "94", "91")


# ---------------------------------------------------------------------------------------------
# flag routing


class FlagRoutingError(ValueError):
    """An extra flag that no child command defines, or one that lacks its value."""


def split_flag(arg: str) -> tuple[str, str | None]:
    """``--a=b`` -> ``("--a", "b")``; ``--a`` -> ``("--a", None)``."""
    if arg.startswith("--") and "=" in arg:
        name, _, value = arg.partition("=")
        return name, value
    return arg, None


def route_flags(
    args: Sequence[str], commands: Mapping[str, Mapping[str, int]], *, passthrough: str | None = None
) -> dict[str, list[str]]:
    """Send every flag in ``args`` (with its values) to each command whose specs define it.

    ``commands`` maps a command's display name (``"dyn frontend"``) to its option specs: flag name
    (``"--router-mode"``, ``"--no-enable-prefix-caching"``) -> number of values it takes (0 for a
    boolean flag, ``True``/``False`` work too). ``--flag value``, ``--flag=value`` and value-less
    flags are understood. Returns ``{command: [args...]}`` (every command present, order kept).
    ``passthrough`` names a command that takes flags it does not declare (``dyn worker vllm`` and
    ``dyn worker sglang`` pass them to their engine): a flag no command defines goes there, with the next argument as its
    value unless that one is a flag too (``--flag=value`` is never ambiguous).
    Raises ``FlagRoutingError`` for a flag no command defines (without ``passthrough``), a missing
    value, a value given to a boolean flag, or a stray positional argument.
    """
    routed: dict[str, list[str]] = {name: [] for name in commands}
    searched = " or ".join(commands) or "no command"
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-") or arg == "-":
            raise FlagRoutingError(
                f"unexpected argument {arg!r}: dyn serve passes only flags on to {searched}"
            )
        name, inline = split_flag(arg)
        targets = [cmd for cmd, specs in commands.items() if name in specs]
        if not targets and (refused := vllm_flags.refusal(name, "dyn serve")) is not None:
            raise FlagRoutingError(refused)  # never handed to an engine that would misread it
        if not targets and passthrough is not None:
            takes_value = inline is None and i + 1 < len(args) and not _is_flag(args[i + 1])
            chunk = [arg, args[i + 1]] if takes_value else [arg]
            routed[passthrough].extend(chunk)
            i += len(chunk)
            continue
        if not targets:
            known = sorted({flag for specs in commands.values() for flag in specs})
            close = difflib.get_close_matches(name, known, n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "see their --help"
            raise FlagRoutingError(
                f"no such flag {name}: dyn serve passes extra flags on to {searched}, "
                f"and none of them defines it ({hint})"
            )
        nvalues = max(int(commands[t][name]) for t in targets)
        if inline is not None:
            if nvalues != 1:
                what = "takes no value" if nvalues == 0 else f"takes {nvalues} values"
                raise FlagRoutingError(f"flag {name} {what}; {arg!r} cannot be passed on")
            chunk = [arg]
        else:
            values = list(args[i + 1 : i + 1 + nvalues])
            if len(values) < nvalues:
                raise FlagRoutingError(f"flag {name} needs {nvalues} value(s)")
            chunk = [arg, *values]
        for target in targets:
            routed[target].extend(chunk)
        i += len(chunk)
    return routed


def _is_flag(arg: str) -> bool:
    """``--x`` or ``-x`` is a flag; ``-1`` and ``-0.5`` are values."""
    if not arg.startswith("-") or arg == "-":
        return False
    try:
        float(arg)
    except ValueError:
        return True
    return False


def flag_values(args: Sequence[str], name: str) -> list[str]:
    """Every value given to flag ``name`` in already-routed ``args``, in order."""
    found = []
    for i, arg in enumerate(args):
        flag_name, inline = split_flag(arg)
        if flag_name != name:
            continue
        if inline is not None:
            found.append(inline)
        elif i + 1 < len(args):
            found.append(args[i + 1])
    return found


def flag_value(args: Sequence[str], name: str) -> str | None:
    """The last value given to single-value flag ``name`` in already-routed ``args``, else None."""
    values = flag_values(args, name)
    return values[-1] if values else None


# ---------------------------------------------------------------------------------------------
# lines


def parse_listening_url(line: str) -> str | None:
    """The URL in the frontend's ``dyn frontend listening on http://HOST:PORT`` line (plain or a
    JSON object), else None."""
    m = LISTENING_RE.search(status_text(line))
    return m.group(1).rstrip("/") if m else None


def parse_ready_url(line: str) -> str | None:
    """The URL in ``dyn serve``'s ready line (it ends in ``/v1``; plain or a JSON object), else None."""
    m = READY_RE.search(status_text(line))
    return m.group(1) if m else None


def ready_line(base_url: str, summary: str) -> str:
    return f"{READY_PREFIX}{base_url}/v1" + (f"  ({summary})" if summary else "")


def relay_json(line: str, process: str, stream: str) -> str | None:
    """A child's output ``line`` as one JSON log line naming ``process``; None for a blank line.

    A log record (a JSON object with ``ts``, ``level`` and ``message``) passes as it is when it
    names its process (else gains the field); any other line (a library's print, a C extension's
    message, other JSON) is wrapped: ``logger`` is the ``stream`` it came on, ``level`` info for
    stdout and warning for stderr.
    """
    if not line.strip():
        return None
    if line.startswith("{"):
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            record = None
        if isinstance(record, dict) and {"ts", "level", "message"} <= record.keys():
            if "process" in record:
                return line
            record["process"] = process
            return orjson.dumps(record).decode()
    level = "info" if stream == "stdout" else "warning"
    return json_record(line, level=level, logger=stream, process=process)


def health_tls(frontend_argv: Sequence[str]) -> ssl.SSLContext:
    """How the supervisor talks to its own frontend's ``/health`` when that serves HTTPS: the
    certificate is not checked (the supervisor started that process itself, on a URL it
    printed), and the frontend's own ``--ssl-certfile``/``--ssl-keyfile`` (or their env twins,
    which the child inherits) are offered as the client certificate, which a frontend with
    ``--ssl-cert-reqs 2`` accepts when its ``--ssl-ca-certs`` trusts its own certificate."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    certfile = flag_value(frontend_argv, "--ssl-certfile") or os.environ.get("DYN_SSL_CERTFILE")
    keyfile = flag_value(frontend_argv, "--ssl-keyfile") or os.environ.get("DYN_SSL_KEYFILE")
    if certfile and keyfile:
        with contextlib.suppress(OSError, ssl.SSLError):  # the frontend reports a bad file itself
            context.load_cert_chain(certfile, keyfile)
    return context


def connectable_url(url: str) -> str:
    """A wildcard bind address (0.0.0.0, ::) replaced by the matching loopback address."""
    return url.replace("://0.0.0.0:", "://127.0.0.1:").replace("://[::]:", "://[::1]:")


def describe_exit(code: int) -> str:
    """``"exited with code 2"``, ``"was killed by SIGKILL"`` (Popen's negative return codes)."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


# ---------------------------------------------------------------------------------------------
# children


@dataclass(frozen=True)
class ChildSpec:
    """One child process: its prefix name, full argv, and environment added for it alone."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)


def device_sets(workers: int, per_worker: int, visible: str | None) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` for each of ``workers`` processes, ``per_worker`` GPUs apiece:
    consecutive slices of ``visible`` (the supervisor's own list) or, unset, of 0, 1, 2, ...

    Raises ``ValueError`` when ``visible`` lists fewer GPUs than the workers need.
    """
    if visible is not None and visible.strip():
        pool = [d.strip() for d in visible.split(",") if d.strip()]
        if len(pool) < workers * per_worker:
            raise ValueError(
                f"--gpus-per-worker {per_worker} x --workers {workers} needs "
                f"{workers * per_worker} GPUs, but CUDA_VISIBLE_DEVICES lists {len(pool)}"
            )
    else:
        pool = [str(i) for i in range(workers * per_worker)]
    return [",".join(pool[i * per_worker : (i + 1) * per_worker]) for i in range(workers)]


@dataclass(frozen=True)
class ServeConfig:
    """What ``run_stack`` runs and how long it waits.

    ``instances_per_worker``: worker instances each worker process registers (the frontend's
    ``/health`` must count ``len(workers) * instances_per_worker`` before the stack is ready).
    ``summary`` goes in parentheses after the ready URL. ``env``: added to the supervisor's
    environment for every child (which always gets ``PYTHONUNBUFFERED=1`` and its name in
    ``PROCESS_ENV``). ``log_format``: ``rich`` (prefixed lines) or ``json`` (JSON objects only).
    """

    frontend: ChildSpec
    workers: Sequence[ChildSpec]
    instances_per_worker: int = 1
    startup_timeout_s: float = 60.0
    stop_timeout_s: float = 15.0
    restart_workers: bool = True
    restart_backoff_s: tuple[float, float] = (1.0, 30.0)
    """First and longest wait before restarting a worker that died."""
    summary: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    poll_interval_s: float = 0.1
    log_format: str = "rich"

    def __post_init__(self) -> None:
        if self.log_format not in ("rich", "json"):
            raise ValueError(f"log format must be rich or json, got {self.log_format!r}")
        if not self.workers:
            raise ValueError("a stack needs at least one worker")
        if self.instances_per_worker < 1:
            raise ValueError("instances_per_worker must be at least 1")

    @property
    def expected_instances(self) -> int:
        return len(self.workers) * self.instances_per_worker


def hide_secrets(argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """``argv`` without the ``SECRET_FLAGS`` and their values, and the environment twins that
    carry them instead (``--api-key K`` -> ``DYN_API_KEY=K``)."""
    shown: list[str] = []
    env: dict[str, str] = {}
    i = 0
    while i < len(argv):
        name, inline = split_flag(argv[i])
        if name in SECRET_FLAGS:
            value = inline if inline is not None else (argv[i + 1] if i + 1 < len(argv) else "")
            env["DYN_" + name.lstrip("-").upper().replace("-", "_")] = value
            i += 1 if inline is not None else 2
            continue
        shown.append(argv[i])
        i += 1
    return shown, env


class _Output:
    """Serialises lines from many threads onto one stream; stops quietly on a broken pipe."""

    def __init__(self, stream: IO[str], colour: bool, json: bool = False) -> None:
        self.stream = stream
        self._colour = colour
        self.json = json
        self._lock = threading.Lock()
        self._broken = False

    def prefix(self, name: str, width: int, index: int) -> str:
        if self.json:
            return ""
        text = f"{name:<{width}} | "
        if self._colour:
            return f"\x1b[{_COLOURS[index % len(_COLOURS)]}m{text}\x1b[0m"
        return text

    def write(self, line: str) -> None:
        with self._lock:
            if self._broken:
                return
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                self._broken = True


class _Child:
    """A running child: its process, two pipe readers, and whether its exit was already reported;
    for a worker that died, when it may be restarted and how many quick deaths came before."""

    def __init__(self, spec: ChildSpec, proc: subprocess.Popen[bytes]) -> None:
        self.spec = spec
        self.proc = proc
        self.readers: list[threading.Thread] = []
        self.exit_reported = False
        self.started_at = time.monotonic()
        self.restart_at: float | None = None
        self.quick_deaths = 0

    @property
    def name(self) -> str:
        return self.spec.name

    def start_readers(self, prefix: str, out: _Output, on_stdout_line: Callable[[str], None] | None) -> None:
        for pipe, hook, stream in (
            (self.proc.stdout, on_stdout_line, "stdout"),
            (self.proc.stderr, None, "stderr"),
        ):
            if pipe is None:
                continue
            t = threading.Thread(
                target=self._pump,
                args=(pipe, prefix, out, hook, stream),
                name=f"serve-{self.name}",
                daemon=True,
            )
            t.start()
            self.readers.append(t)

    def _pump(
        self, pipe: IO[bytes], prefix: str, out: _Output, hook: Callable[[str], None] | None, stream: str
    ) -> None:
        with contextlib.suppress(OSError, ValueError):
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip()
                if out.json:
                    relayed = relay_json(line, self.name, stream)
                    if relayed is not None:
                        out.write(relayed)
                else:
                    out.write(prefix + line)
                if hook is not None:
                    hook(line)

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def kill_group(self) -> None:
        """SIGKILL the child's process group (it leads its own), catching grandchildren too."""
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()


# ---------------------------------------------------------------------------------------------
# the supervisor


class StackSupervisor:
    """Starts, watches and stops the children of one ``dyn serve``; see ``run_stack``."""

    def __init__(
        self, config: ServeConfig, out: IO[str], err: IO[str], stop: threading.Event | None = None
    ) -> None:
        self.config = config
        json = config.log_format == "json"
        colour = _isatty(out) and "NO_COLOR" not in os.environ and not json
        self._out = _Output(out, colour, json)
        self._err = _Output(err, False, json) if err is not out else self._out
        self._stop = stop or threading.Event()
        self._wake = threading.Event()
        self._signals: list[int] = []
        self._children: list[_Child] = []
        self._frontend: _Child | None = None
        self._url: str | None = None
        self.ready_url: str | None = None
        self._width = 0
        self._env: dict[str, str] = {}

    # -- signals (main thread only) --

    def on_signal(self, signum: int, _frame: object = None) -> None:
        """Record the signal; the loops notice within ``poll_interval_s``.

        Only a list append: taking a lock here (``Event.set``) could deadlock against the main
        thread, which the handler interrupts, holding that same lock.
        """
        self._signals.append(signum)

    def _stopping(self) -> bool:
        return bool(self._signals) or self._stop.is_set()

    # -- messages --

    def _say(self, text: str, **fields: Any) -> None:
        if self._out.json:
            self._out.write(json_record(text, logger="dyn.serve", process="serve", **fields))
        else:
            self._out.write(f"dyn serve: {text}")

    def _error(self, text: str) -> None:
        if self._err.json:
            self._err.write(json_record(text, level="error", logger="dyn.serve", process="serve"))
        else:
            self._err.write(f"dyn serve: error: {text}")

    # -- lifecycle --

    def run(self) -> int:
        """Run the stack until a signal (exit 0) or a fatal failure (exit 1); always stop the children."""
        try:
            if not self._start_children():
                return 1
            return self._supervise()
        finally:
            self._stop_children()

    def _start_children(self) -> bool:
        specs = [self.config.frontend, *self.config.workers]
        self._width = max(len(s.name) for s in specs)
        env = {**os.environ, **self.config.env, "PYTHONUNBUFFERED": "1", PARENT_ENV: str(os.getpid())}
        if "COLUMNS" not in self.config.env:
            env["COLUMNS"] = _child_columns(self._out.stream, self._width, os.environ.get("COLUMNS"))
        self._env = env
        for index, spec in enumerate(specs):
            child = self._spawn(spec, index)
            if child is None:
                return False
            self._children.append(child)
        self._frontend = self._children[0]
        return True

    def _spawn(self, spec: ChildSpec, index: int) -> _Child | None:
        """Start one child and its log readers; None (said why) if it cannot start."""
        argv, secrets = hide_secrets(spec.argv)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**self._env, **spec.env, PROCESS_ENV: spec.name, **secrets},
                process_group=0,
            )
        except OSError as exc:
            self._error(f"could not start {spec.name} ({_display_argv(argv)}): {exc}")
            return None
        child = _Child(spec, proc)
        self._say(f"started {spec.name} (pid {proc.pid}): {_display_argv(argv)}")
        hook = self._on_frontend_line if index == 0 else None
        child.start_readers(self._out.prefix(spec.name, self._width, index), self._out, hook)
        return child

    def _on_frontend_line(self, line: str) -> None:
        url = parse_listening_url(line)
        if url and self._url is None:
            self._url = connectable_url(url)
            self._wake.set()

    def _supervise(self) -> int:
        cfg = self.config
        deadline = time.monotonic() + cfg.startup_timeout_s
        last_health = "was not asked yet"
        # its health polls are quiet: httpx logs warnings only (dyn.core.logs.QUIET_LIBRARIES)
        with httpx.Client(
            timeout=_HEALTH_TIMEOUT_S, trust_env=False, verify=health_tls(cfg.frontend.argv)
        ) as http:
            while True:
                if self._stopping():
                    if self._signals:
                        name = signal.Signals(self._signals[0]).name
                        self._say(f"{name} received; stopping {self._alive_count()} process(es)")
                    return 0
                status = self._check_exits()
                if status is not None:
                    return status
                self._restart_due()
                if self.ready_url is None:
                    if self._url is not None:
                        count, last_health = self._poll_health(http)
                        if count >= cfg.expected_instances:
                            self.ready_url = f"{self._url}/v1"
                            line = ready_line(self._url, cfg.summary)
                            if self._out.json:
                                line = json_record(
                                    line, logger="dyn.status", process="serve", url=self.ready_url
                                )
                            self._out.write(line)
                            continue
                    if time.monotonic() > deadline:
                        self._error(self._timeout_message(last_health))
                        return 1
                self._wake.wait(cfg.poll_interval_s)
                self._wake.clear()

    def _timeout_message(self, last_health: str) -> str:
        waited = f"the stack was not ready after {self.config.startup_timeout_s:g}s"
        hint = "; raise --startup-timeout if it is just slow"
        if self._url is None:
            return f"{waited}: the frontend never printed its listening line{hint}"
        return (
            f"{waited}: {self._url}/health {last_health}, want "
            f"{self.config.expected_instances} worker instance(s){hint}"
        )

    def _poll_health(self, http: httpx.Client) -> tuple[int, str]:
        try:
            response = http.get(f"{self._url}/health")
            workers = response.json().get("workers", 0)
            if not isinstance(workers, int):
                return 0, f"answered with an unreadable workers field ({workers!r})"
            return workers, f"counts {workers} worker instance(s) (HTTP {response.status_code})"
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            return 0, f"did not answer ({type(exc).__name__}: {exc})"

    def _check_exits(self) -> int | None:
        """Report newly exited children; return an exit status when the stack cannot go on."""
        for child in self._children:
            code = child.proc.poll()
            if code is None or child.exit_reported:
                continue
            child.exit_reported = True
            for reader in child.readers:  # its last words (a traceback, say) before our verdict
                reader.join(_READER_JOIN_S)
            what = f"{child.name} (pid {child.proc.pid}) {describe_exit(code)}"
            if self.ready_url is None:
                self._error(f"{what} before the stack was ready; stopping the others")
                return 1
            if child is self._frontend:
                self._error(f"{what}; stopping the workers")
                return 1
            if self.config.restart_workers:
                self._schedule_restart(child, what)
                continue
            alive = [c for c in self._children[1:] if c.proc.poll() is None]
            if not alive:
                self._error(f"{what}; no worker is left, stopping the frontend")
                return 1
            self._error(f"{what}; serving on with {len(alive)} worker process(es)")
        return None

    def _schedule_restart(self, child: _Child, what: str) -> None:
        first, longest = self.config.restart_backoff_s
        if time.monotonic() - child.started_at >= _STEADY_S:
            child.quick_deaths = 0
        wait = min(longest, first * 2**child.quick_deaths)
        child.quick_deaths += 1
        child.restart_at = time.monotonic() + wait
        self._error(f"{what}; restarting it in {wait:g}s")

    def _restart_due(self) -> None:
        """Restart the workers whose back-off has passed (a fresh process, a new instance id)."""
        now = time.monotonic()
        for index, child in enumerate(self._children):
            if child.restart_at is None or now < child.restart_at:
                continue
            child.restart_at = None
            for pipe in (child.proc.stdout, child.proc.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
            fresh = self._spawn(child.spec, index)
            if fresh is None:  # said why; try again after the next back-off
                self._schedule_restart(child, f"{child.name} could not restart")
                continue
            fresh.quick_deaths = child.quick_deaths
            self._children[index] = fresh

    def _alive_count(self) -> int:
        return sum(c.proc.poll() is None for c in self._children)

    def _stop_children(self) -> None:
        """SIGTERM every child, wait up to ``stop_timeout_s``, SIGKILL the rest, reap them all.

        A second SIGINT/SIGTERM (or any, when no signal started the stop) skips straight to SIGKILL.
        """
        signals_before = min(len(self._signals), 1)
        for child in self._children:
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.config.stop_timeout_s
        while self._alive_count() and time.monotonic() < deadline and len(self._signals) == signals_before:
            time.sleep(0.05)
        hurried = len(self._signals) != signals_before
        for child in self._children:
            if child.proc.poll() is None:
                why = "asked twice" if hurried else f"did not stop within {self.config.stop_timeout_s:g}s"
                self._error(f"{child.name} (pid {child.proc.pid}) {why}; killing it")
                child.kill_group()
        for child in self._children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(5)
            if child.proc.poll() is None:  # cannot happen short of an unkillable process
                self._error(f"{child.name} (pid {child.proc.pid}) survived SIGKILL")
        for child in self._children:
            for reader in child.readers:
                reader.join(_READER_JOIN_S)
            for pipe in (child.proc.stdout, child.proc.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()


def run_stack(
    config: ServeConfig,
    *,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Run the stack in ``config`` until SIGINT/SIGTERM (or ``stop`` is set); return the exit status.

    0 after a requested stop; 1 when a child exits before the stack is ready, the startup timeout
    passes, the frontend exits, or the last worker exits. Signal handlers are installed only when
    called from the main thread, and restored on return.
    """
    supervisor = StackSupervisor(config, out or sys.stdout, err or sys.stderr, stop)
    main = threading.current_thread() is threading.main_thread()
    signals = (signal.SIGINT, signal.SIGTERM) if main else ()
    installed = {sig: signal.signal(sig, supervisor.on_signal) for sig in signals}
    try:
        return supervisor.run()
    finally:
        for sig, previous in installed.items():
            signal.signal(sig, previous)


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _child_columns(stream: IO[str], prefix_width: int, inherited: str | None) -> str:
    """Children's rich logs wrap at ``COLUMNS``: the terminal's width less the prefix, else wide."""
    if _isatty(stream):
        with contextlib.suppress(OSError, ValueError):
            return str(max(40, os.get_terminal_size(stream.fileno()).columns - prefix_width - 3))
    return inherited or "160"


def _display_argv(argv: Sequence[str]) -> str:
    """``python -m dyn.cli frontend ...`` reads better than the interpreter's full path; the
    values of ``SECRET_FLAGS`` are never shown."""
    shown = hide_secrets(argv)[0]
    if shown and shown[0] == sys.executable:
        shown[0] = "python"
    return " ".join(shown)
