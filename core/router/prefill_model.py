"""Predicted prefill durations for ``--router-prefill-load-model ais`` (or ``aic``, its older
name), and decode step durations for the mocker's ``--timing-model aic``: AIConfigurator's
estimates, tabulated once per setup and read by interpolation.

AIConfigurator (``aiconfigurator-core``, ``pip install 'dyn[aic]'``: NVIDIA's performance
database and estimator) predicts how long one engine of an ``AicSetup`` (backend, GPU system,
model, parallelism) takes to prefill ``new`` uncached prompt tokens after ``prefix`` cached ones.
The KV router books that duration with each admitted request, and the oldest active prefill of
each worker decays over it (``dyn.core.router.load``). The router never asks AIConfigurator per
request:

- ``PrefillTable``: milliseconds on a grid of (new, prefix) token counts, ``PER_OCTAVE`` points
  per doubling from 1 to the model's context (and 0 for the prefix); bilinear between grid
  points, linear beyond the last ones. A lookup is two bisections over some 60 points.
- ``PrefillDurations``: one setup's table for the router. ``start`` reads it from the disk cache
  (``$XDG_CACHE_HOME/dyn/aic/``, ``~/.cache/dyn/aic/`` without it; one JSON file per setup,
  grid and AIConfigurator version, written atomically; a file that does not read back as a table
  is rebuilt) or builds it in a daemon thread; until then ``expected_secs`` is None and the
  router books prompts as ``none`` does. ``shared_durations``: one per setup per process (the
  routers of a disaggregated model share it).
- ``DecodeDurations``: the same for one decode step (one new token for each of ``batch``
  requests whose KV holds ``context`` tokens on average): a (batch x context) table, batch
  ``PER_OCTAVE`` points per doubling from 1 to ``MAX_DECODE_BATCH``, context from 1 to the
  model's; its own cache file beside the prefill table's, its own background build.
  ``shared_decode_durations``: one per setup per process. The router never reads it; the
  mocker times passes with both (``dyn.plugins.mocker.aic_timing``).
- ``check_setup``: what a start checks: the extra is installed and, unless the tables asked
  about are cached, AIConfigurator knows the system, backend, version and model, and a MoE
  model's parallelism adds up; each ``ConfigError`` names the flag and what AIConfigurator
  accepts. A setup that passes can still fail to build (the database lacks a table the model
  needs): the build logs the error once and ``error`` keeps it; the router then stays as with
  ``none``, a mocker does not start.
"""

from __future__ import annotations

import abc
import bisect
import contextlib
import difflib
import functools
import hashlib
import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata, util
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self

import orjson

from dyn.core.errors import ConfigError

if TYPE_CHECKING:
    from dyn.core.router.config import AicFields

log = logging.getLogger("dyn.router")

AIC_DISTRIBUTION = "aiconfigurator-core"
AIC_PACKAGE = "aiconfigurator_core"
INSTALL_HINT = "pip install 'dyn[aic]'"
PER_OCTAVE = 4
"""Grid points per doubling of the token counts. Measured on Qwen/Qwen3-32B (h200_sxm, vllm)
against AIConfigurator itself at 400 random (new, prefix) points: 1 per octave errs 1.0 %
(median) and 13 % (worst), 4 per octave 0.13 % and 11 % (the worst where AIConfigurator's own
curve steps, at 1024 tokens), 8 no better than 4 at the worst."""
MAX_GRID_TOKENS = 1 << 20
"""The grid stops here whatever the model's context; beyond, the last segment extrapolates."""
MAX_DECODE_BATCH = 4096
"""The decode table's batch axis ends here (vLLM's largest default --max-num-seqs is 1024);
beyond, the last segment extrapolates."""
ROUTER_USE = ("--router-prefill-load-model aic", "--router-prefill-load-model none")
"""What needs AIConfigurator in a router, and what to use without it (``require_aiconfigurator``)."""
TABLE_FORMAT = 1


@dataclass(frozen=True, kw_only=True)
class AicSetup:
    """What AIConfigurator models: the ``--aic-*`` flags. ``backend_version`` None: the backend's
    current version on ``system``; the MoE sizes None: their defaults (``check_setup``)."""

    backend: str
    system: str
    model_path: str
    backend_version: str | None = None
    tp_size: int = 1
    moe_tp_size: int | None = None
    moe_ep_size: int | None = None
    attention_dp_size: int | None = None

    @classmethod
    def from_config(cls, config: AicFields) -> AicSetup:
        """The setup of a config's ``--aic-*`` values (validated: the names are set): a router's
        whose ``uses_aic``, a mocker's whose timing model is ``aic``."""
        return cls(
            backend=config.aic_backend or "",
            system=config.aic_system or "",
            model_path=config.aic_model_path or "",
            backend_version=config.aic_backend_version,
            tp_size=config.aic_tp_size,
            moe_tp_size=config.aic_moe_tp_size,
            moe_ep_size=config.aic_moe_ep_size,
            attention_dp_size=config.aic_attention_dp_size,
        )

    def describe(self) -> str:
        version = self.backend_version or "current"
        return f"{self.model_path} on {self.system} {self.backend} {version}, tp {self.tp_size}"


# ---------------------------------------------------------------------------------------- table


def token_grid(limit: int, per_octave: int = PER_OCTAVE) -> list[int]:
    """1, then ``per_octave`` token counts per doubling (rounded, each once) up to ``limit``,
    which is the last; every power of two below ``limit`` is one of them."""
    if limit < 2 or per_octave < 1:
        raise ValueError(
            f"a token grid needs a limit of at least 2 and a density of at least 1, got {limit}, {per_octave}"
        )
    steps = math.ceil(per_octave * math.log2(limit))
    points = {min(limit, round(2 ** (i / per_octave))) for i in range(steps + 1)}
    points.add(limit)
    return sorted(points)


class LatencyTable:
    """Milliseconds ``ms[i][j]`` at ``rows[i]`` x ``cols[j]``; ``predict_ms`` interpolates. Both
    axes are whole numbers rising strictly, with 2 points at least, from ``LEAST`` or more; the
    values are finite and >= 0 (``ValueError`` otherwise). A subclass names its axes (``AXES``,
    also its JSON keys) and what it times (``KIND``, also its cache file's)."""

    KIND: ClassVar[str] = "latency"
    AXES: ClassVar[tuple[str, str]] = ("rows", "cols")
    LEAST: ClassVar[tuple[int, int]] = (0, 0)
    __slots__ = ("cols", "ms", "rows")

    def __init__(self, rows: Sequence[int], cols: Sequence[int], ms: Sequence[Sequence[float]]) -> None:
        self.rows = [int(n) for n in rows]
        self.cols = [int(p) for p in cols]
        self.ms = [[float(v) for v in row] for row in ms]
        self._check_axis(self.rows, 0, rows)
        self._check_axis(self.cols, 1, cols)
        if len(self.ms) != len(self.rows) or any(len(row) != len(self.cols) for row in self.ms):
            raise ValueError(
                f"a {self.KIND} table of {len(self.rows)} x {len(self.cols)} points has other values"
            )
        if not all(math.isfinite(v) and v >= 0 for row in self.ms for v in row):
            raise ValueError(f"a {self.KIND} table holds a negative or non-finite duration")

    @classmethod
    def build(cls, ms_at: Callable[[int, int], float], rows: Sequence[int], cols: Sequence[int]) -> Self:
        """The table of ``ms_at(row, col)`` at every grid point."""
        return cls(rows, cols, [[ms_at(r, c) for c in cols] for r in rows])

    def predict_ms(self, row: float, col: float) -> float:
        """Milliseconds at (``row``, ``col``): bilinear between grid points, the nearest segment's
        slope beyond them, never below 0."""
        i, s = _segment(self.rows, row)
        j, t = _segment(self.cols, col)
        below, above = self.ms[i], self.ms[i + 1]
        lo = below[j] + (below[j + 1] - below[j]) * t
        hi = above[j] + (above[j + 1] - above[j]) * t
        return max(lo + (hi - lo) * s, 0.0)

    @property
    def points(self) -> int:
        return len(self.rows) * len(self.cols)

    def to_json(self) -> dict[str, Any]:
        rows, cols = self.AXES
        return {rows: self.rows, cols: self.cols, "ms": self.ms}

    @classmethod
    def from_json(cls, data: Any) -> Self:
        """The table ``to_json`` wrote; ``ValueError`` for anything else."""
        if not isinstance(data, dict):
            raise ValueError(f"a {cls.KIND} table is a JSON object")
        rows, cols = cls.AXES
        try:
            return cls(data[rows], data[cols], data["ms"])
        except (KeyError, TypeError, OverflowError) as exc:
            raise ValueError(f"not a {cls.KIND} table: {exc!r}") from None

    def _check_axis(self, points: list[int], axis: int, given: Sequence[Any]) -> None:
        name, least = self.AXES[axis], self.LEAST[axis]
        if len(points) < 2 or points[0] < least or any(b <= a for a, b in zip(points, points[1:])):
            raise ValueError(
                f"a {self.KIND} table's {name} axis must rise from {least} or more, with 2 points at least"
            )
        if any(isinstance(g, bool) or g != int(g) for g in given):
            raise ValueError(f"a {self.KIND} table's {name} axis holds a value that is not a whole number")


class PrefillTable(LatencyTable):
    """Prefill milliseconds ``ms[i][j]`` for ``new[i]`` uncached tokens after ``prefix[j]``
    cached ones (``new`` from 1, ``prefix`` from 0); ``predict_ms(new_tokens, prefix_tokens)``."""

    KIND = "prefill"
    AXES = ("new", "prefix")
    LEAST = (1, 0)
    __slots__ = ()

    @property
    def new(self) -> list[int]:
        return self.rows

    @property
    def prefix(self) -> list[int]:
        return self.cols


class DecodeTable(LatencyTable):
    """Milliseconds of one decode step ``ms[i][j]`` for ``batch[i]`` requests whose KV holds
    ``context[j]`` tokens each (both from 1); ``predict_ms(batch, context)``."""

    KIND = "decode"
    AXES = ("batch", "context")
    LEAST = (1, 1)
    __slots__ = ()

    @property
    def batch(self) -> list[int]:
        return self.rows

    @property
    def context(self) -> list[int]:
        return self.cols


def _segment(points: list[int], x: float) -> tuple[int, float]:
    """The grid segment ``points[i]..points[i + 1]`` for ``x`` (the first or last one outside the
    grid) and where ``x`` lies along it (0 to 1 inside, beyond that outside)."""
    i = min(max(bisect.bisect_right(points, x) - 1, 0), len(points) - 2)
    return i, (x - points[i]) / (points[i + 1] - points[i])


# ---------------------------------------------------------------------------------------- estimator


class Estimator(Protocol):
    """One setup's prefill latency: ``prefill_ms(new, prefix)`` for one request;
    ``context_length``: the model's context, where the table's grid ends."""

    context_length: int

    def prefill_ms(self, new_tokens: int, prefix_tokens: int) -> float: ...


class DecodeEstimator(Protocol):
    """One setup's decode step latency: ``decode_step_ms(batch, context)``, one token for each
    of ``batch`` requests holding ``context`` tokens of KV; ``context_length`` as above."""

    context_length: int

    def decode_step_ms(self, batch: int, context: int) -> float: ...


@dataclass(frozen=True)
class _Resolved:
    """A checked setup: the parallelism AIConfigurator is given and the model's context."""

    version: str
    tp_size: int
    attention_dp_size: int
    moe_tp_size: int | None
    moe_ep_size: int | None
    context_length: int


class AicEstimator:
    """AIConfigurator's compiled engine for ``setup`` (checked first, ``ConfigError``). The
    compilation takes about a second; each estimate some 10 to 40 us after the first."""

    def __init__(self, setup: AicSetup) -> None:
        resolved = _resolve(setup)
        from aiconfigurator_core.sdk.engine import EngineHandle

        self.context_length = resolved.context_length
        with quiet_aiconfigurator():
            self._engine = EngineHandle.compile(
                setup.model_path,
                setup.system,
                setup.backend,
                backend_version=resolved.version,
                tp_size=resolved.tp_size,
                attention_dp_size=resolved.attention_dp_size,
                moe_tp_size=resolved.moe_tp_size,
                moe_ep_size=resolved.moe_ep_size,
            )

    def prefill_ms(self, new_tokens: int, prefix_tokens: int) -> float:
        # the engine takes the whole prompt and the cached part of it, one request per batch
        return float(self._engine.predict_prefill_latency(1, new_tokens + prefix_tokens, prefix_tokens))

    def decode_step_ms(self, batch: int, context: int) -> float:
        # one step of a generation that starts at ``context`` tokens and outputs 2 (the fewest
        # the engine takes): the step's batch is ``batch`` decode tokens
        return float(self._engine.decode_step_latency(batch, context, 2))


@contextlib.contextmanager
def quiet_aiconfigurator() -> Iterator[None]:
    """AIConfigurator's logs at ERROR only meanwhile: it reports every model config and database
    it loads, and warns of fallback data for models other than the one asked about."""
    logger = logging.getLogger(AIC_PACKAGE)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


# ---------------------------------------------------------------------------------------- checks


def check_setup(
    setup: AicSetup,
    *,
    directory: Path | None = None,
    tables: Sequence[type[LatencyTable]] = (PrefillTable,),
    use: tuple[str, str] = ROUTER_USE,
) -> None:
    """Raise ``ConfigError`` unless the ``tables`` of ``setup`` can be built: AIConfigurator is
    installed (else the error says that ``use[0]`` needs it, or to use ``use[1]``) and, unless
    every one of them is cached in ``directory`` (default ``cache_dir()``), knows its system,
    backend, version and model, and a MoE model's sizes satisfy
    ``tp * attention_dp == moe_tp * moe_ep``."""
    require_aiconfigurator(*use)
    where = directory or cache_dir()
    if all(_read_cached(setup, where, PER_OCTAVE, table=t, quiet=True) is not None for t in tables):
        return
    _resolve(setup)


def require_aiconfigurator(needed_by: str = ROUTER_USE[0], instead: str = ROUTER_USE[1]) -> None:
    """``ConfigError`` naming the extra to install when AIConfigurator is not importable: what
    ``needed_by`` (a flag and its value) needs, or ``instead`` (the flag to use without it)."""
    if util.find_spec(AIC_PACKAGE) is None:
        raise ConfigError(
            f"{needed_by} needs NVIDIA's AIConfigurator ({AIC_DISTRIBUTION}): {INSTALL_HINT}, or use {instead}"
        )


@functools.cache
def _resolve(setup: AicSetup) -> _Resolved:
    """``setup`` checked against AIConfigurator and completed (see ``check_setup``)."""
    require_aiconfigurator()
    with quiet_aiconfigurator():
        version = _resolve_version(setup)
        model = _model_config(setup.model_path)
        return _parallelism(setup, version, model)


@functools.cache
def _supported() -> dict[str, dict[str, list[str]]]:
    from aiconfigurator_core.sdk import perf_database

    return {system: dict(backends) for system, backends in perf_database.get_supported_databases().items()}


def _resolve_version(setup: AicSetup) -> str:
    """The literal database version of ``setup``: ``ConfigError`` for a system, backend or
    version AIConfigurator has no performance data of, naming those it has."""
    from aiconfigurator_core.sdk import perf_database

    supported = _supported()
    backends = supported.get(setup.system)
    if backends is None:
        raise ConfigError(
            f"--aic-system {setup.system!r}: AIConfigurator has performance data for "
            f"{', '.join(sorted(supported))}"
        )
    versions = backends.get(setup.backend)
    if versions is None:
        raise ConfigError(
            f"--aic-backend {setup.backend!r}: AIConfigurator models {', '.join(sorted(backends))} "
            f"on {setup.system}"
        )
    try:
        return str(
            perf_database.resolve_query_version(
                setup.system, setup.backend, setup.backend_version or "current"
            )
        )
    except ValueError:
        raise ConfigError(
            f"--aic-backend-version {setup.backend_version!r}: AIConfigurator has {setup.backend} "
            f"{', '.join(versions)} on {setup.system} (or omit the flag for its current one)"
        ) from None


def _model_config(model_path: str) -> dict[str, Any]:
    """AIConfigurator's reading of the model's config: from a local directory's config.json, or
    the config it ships for a known Hugging Face name (never downloaded here)."""
    from aiconfigurator_core.sdk.common import DefaultHFModels
    from aiconfigurator_core.sdk.utils import get_model_config_from_model_path

    if os.path.isdir(model_path):
        if not os.path.isfile(os.path.join(model_path, "config.json")):
            raise ConfigError(f"--aic-model-path {model_path}: the directory has no config.json")
    elif model_path not in DefaultHFModels:
        known = sorted(DefaultHFModels)
        close = difflib.get_close_matches(model_path, known, n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(close)}?" if close else f"such as {', '.join(known[:3])}"
        raise ConfigError(
            f"--aic-model-path {model_path!r} is neither a local directory with a config.json "
            f"nor one of the {len(known)} models AIConfigurator ships configs of ({hint}); for "
            "another model, pass the directory of its config.json"
        )
    try:
        return dict(get_model_config_from_model_path(model_path))
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise ConfigError(f"--aic-model-path {model_path}: AIConfigurator cannot read it: {exc}") from None


def _parallelism(setup: AicSetup, version: str, model: dict[str, Any]) -> _Resolved:
    """The sizes AIConfigurator is given: a MoE model's defaults (moe_tp = tp, moe_ep 1,
    attention_dp 1) and the width check; a dense model ignores the MoE sizes (with a warning)."""
    from aiconfigurator_core.sdk.models.helpers import check_is_moe

    context = int(model.get("context") or 0)
    tp = setup.tp_size
    if not check_is_moe(setup.model_path):
        if (setup.moe_tp_size, setup.moe_ep_size, setup.attention_dp_size) != (None, None, None):
            log.warning(
                "%s is not a MoE model: --aic-moe-tp-size, --aic-moe-ep-size and "
                "--aic-attention-dp-size are ignored",
                setup.model_path,
            )
        return _Resolved(version, tp, 1, None, None, context)
    moe_tp = setup.moe_tp_size or tp
    moe_ep = setup.moe_ep_size or 1
    adp = setup.attention_dp_size or 1
    if tp * adp != moe_tp * moe_ep:
        raise ConfigError(
            f"{setup.model_path} is a MoE model: --aic-tp-size {tp} x --aic-attention-dp-size "
            f"{adp} must equal --aic-moe-tp-size {moe_tp} x --aic-moe-ep-size {moe_ep} (for "
            f"tensor parallelism only: --aic-moe-tp-size {tp} --aic-moe-ep-size 1 "
            "--aic-attention-dp-size 1)"
        )
    return _Resolved(version, tp, adp, moe_tp, moe_ep, context)


# ---------------------------------------------------------------------------------------- disk cache


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/dyn/aic``, or ``~/.cache/dyn/aic`` without it."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dyn" / "aic"


def cache_path(
    setup: AicSetup, directory: Path, per_octave: int = PER_OCTAVE, kind: str = PrefillTable.KIND
) -> Path:
    """The file of ``setup``'s table of ``kind`` (a ``LatencyTable.KIND``): named by a digest of
    everything the table depends on (what it times, the setup, the grid, the file format,
    AIConfigurator's version and, for a model directory, its config files)."""
    identity = {
        "format": TABLE_FORMAT,
        "per_octave": per_octave,
        "aiconfigurator": _aic_version(),
        "model_files": _model_digest(setup.model_path),
        **asdict(setup),
    }
    if kind != PrefillTable.KIND:  # the prefill table's name predates the others
        identity["table"] = kind
    digest = hashlib.sha256(orjson.dumps(identity, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return directory / f"{digest[:32]}.json"


def _aic_version() -> str:
    try:
        return metadata.version(AIC_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "none"


def _model_digest(model_path: str) -> str:
    """A digest of a model directory's config files ('' for a name): an edited config.json
    changes the table."""
    if not os.path.isdir(model_path):
        return ""
    digest = hashlib.sha256()
    for name in ("config.json", "hf_quant_config.json"):
        with contextlib.suppress(OSError):
            digest.update(name.encode() + Path(model_path, name).read_bytes())
    return digest.hexdigest()


def _read_cached(
    setup: AicSetup,
    directory: Path,
    per_octave: int,
    *,
    table: type[LatencyTable] = PrefillTable,
    quiet: bool = False,
) -> Any:
    """The cached ``table`` (its type) of ``setup``, or None: none cached, or (with a warning
    unless ``quiet``) a file that does not read back as one, which the next build replaces."""
    path = cache_path(setup, directory, per_octave, table.KIND)
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, orjson.JSONDecodeError) as exc:
        if not quiet:
            log.warning("ignoring the AIC %s table cache %s (%s); rebuilding it", table.KIND, path, exc)
        return None
    try:
        if data.get("format") != TABLE_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, not {TABLE_FORMAT}")
        return table.from_json(data.get("table"))
    except (ValueError, AttributeError) as exc:
        if not quiet:
            log.warning("ignoring the AIC %s table cache %s (%s); rebuilding it", table.KIND, path, exc)
        return None


def _write_cached(setup: AicSetup, directory: Path, per_octave: int, table: LatencyTable) -> Path:
    """Write ``table`` as ``setup``'s cache file of its kind: whole or not at all (a temporary
    file in the same directory, renamed over it). ``OSError`` when the directory is not writable."""
    path = cache_path(setup, directory, per_octave, table.KIND)
    directory.mkdir(parents=True, exist_ok=True)
    payload = orjson.dumps(
        {
            "format": TABLE_FORMAT,
            "setup": asdict(setup),
            "aiconfigurator": _aic_version(),
            "table": table.to_json(),
        }
    )
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


# ---------------------------------------------------------------------------------------- the tables in use


class _AicTable(abc.ABC):
    """One setup's table of ``TABLE`` (see the module docstring), built once.

    ``estimator`` makes what the table is built from (AIConfigurator's ``AicEstimator`` by
    default; tests give their own); ``directory`` is the disk cache (default ``cache_dir()``,
    read when this is made). ``ready`` is set once the table is there (and cached, when it was
    built) or its build failed (``error``). A subclass says how to tabulate (``_tabulate``) and
    what its users do without a table (``WITHOUT``, logged with a failure)."""

    TABLE: ClassVar[type[LatencyTable]] = LatencyTable
    WITHOUT: ClassVar[str] = ""

    def __init__(
        self,
        setup: AicSetup,
        *,
        estimator: Callable[[AicSetup], Any] = AicEstimator,
        directory: Path | None = None,
        per_octave: int = PER_OCTAVE,
    ) -> None:
        self.setup = setup
        self.directory = directory or cache_dir()
        self.per_octave = per_octave
        self.error: str | None = None
        self.ready = threading.Event()
        self._estimator = estimator
        self._table: Any = None
        self._started = False

    @property
    def kind(self) -> str:
        return self.TABLE.KIND

    def start(self) -> Self:
        """Take the cached table now if there is one, else build it in a daemon thread (once;
        later calls do nothing). Returns self."""
        if self._started:
            return self
        self._started = True
        cached = _read_cached(self.setup, self.directory, self.per_octave, table=self.TABLE)
        if cached is not None:
            self._table = cached
            self.ready.set()
            log.info("AIC %s table of %s read from the cache", self.kind, self.setup.describe())
            return self
        threading.Thread(target=self.build, name=f"dyn-aic-{self.kind}-table", daemon=True).start()
        return self

    def wait(self, timeout: float | None = None) -> Any:
        """The table once ready (None: not within ``timeout`` seconds, or its build failed)."""
        self.ready.wait(timeout)
        return self._table

    def build(self) -> None:
        """Build the table (what the thread of ``start`` runs), cache it, set ``ready``. A
        failure is logged once and kept in ``error``."""
        started = time.perf_counter()
        try:
            table = self._compute()
        except Exception as exc:  # AIConfigurator's errors are its own classes: report any
            self.error = f"the AIC {self.kind} table of {self.setup.describe()} could not be built: {exc}"
            log.error("%s%s", self.error, f"; {self.WITHOUT}" if self.WITHOUT else "")
            self.ready.set()
            return
        self._table = table  # its users predict from here on
        log.info(
            "AIC %s table of %s: %d points in %.2f s",
            self.kind,
            self.setup.describe(),
            table.points,
            time.perf_counter() - started,
        )
        try:
            _write_cached(self.setup, self.directory, self.per_octave, table)
        except OSError as exc:
            log.warning(
                "cannot cache the AIC %s table in %s (%s); it is rebuilt at each start",
                self.kind,
                self.directory,
                exc,
            )
        self.ready.set()

    def _compute(self) -> LatencyTable:
        estimator = self._estimator(self.setup)
        limit = min(max(int(estimator.context_length), 2), MAX_GRID_TOKENS)
        with quiet_aiconfigurator():
            return self._tabulate(estimator, token_grid(limit, self.per_octave))

    @abc.abstractmethod
    def _tabulate(self, estimator: Any, tokens: list[int]) -> LatencyTable:
        """The table from ``estimator``, ``tokens`` being the grid up to the model's context."""


class PrefillDurations(_AicTable):
    """One setup's predicted prefill durations, for the router (see the module docstring) and
    the mocker; its estimator is an ``Estimator``."""

    TABLE = PrefillTable
    WITHOUT = "prompt load does not decay (as with --router-prefill-load-model none)"

    @property
    def table(self) -> PrefillTable | None:
        return self._table

    def expected_secs(self, new_tokens: int, prefix_tokens: int) -> float | None:
        """Seconds one engine takes to prefill ``new_tokens`` after ``prefix_tokens`` cached ones;
        None with no new tokens or no table (yet)."""
        table = self._table
        if table is None or new_tokens <= 0:
            return None
        return table.predict_ms(new_tokens, max(prefix_tokens, 0)) / 1000.0

    def _tabulate(self, estimator: Estimator, tokens: list[int]) -> PrefillTable:
        return PrefillTable.build(estimator.prefill_ms, tokens, [0, *tokens])


class DecodeDurations(_AicTable):
    """One setup's predicted decode step durations, for the mocker (see the module docstring);
    its estimator is a ``DecodeEstimator``."""

    TABLE = DecodeTable

    @property
    def table(self) -> DecodeTable | None:
        return self._table

    def step_secs(self, batch: int, context: float) -> float | None:
        """Seconds one engine takes for one decode step of ``batch`` requests whose KV holds
        ``context`` tokens on average; None with no request or no table (yet)."""
        table = self._table
        if table is None or batch <= 0:
            return None
        return table.predict_ms(batch, max(context, 1.0)) / 1000.0

    def _tabulate(self, estimator: DecodeEstimator, tokens: list[int]) -> DecodeTable:
        return DecodeTable.build(
            estimator.decode_step_ms, token_grid(MAX_DECODE_BATCH, self.per_octave), tokens
        )


_SHARED: dict[AicSetup, PrefillDurations] = {}
_SHARED_DECODE: dict[AicSetup, DecodeDurations] = {}
_SHARED_LOCK = threading.Lock()


def shared_durations(setup: AicSetup) -> PrefillDurations:
    """This process's ``PrefillDurations`` of ``setup``, started on first use."""
    with _SHARED_LOCK:
        durations = _SHARED.get(setup)
        if durations is None:
            durations = _SHARED[setup] = PrefillDurations(setup).start()
    return durations


def shared_decode_durations(setup: AicSetup) -> DecodeDurations:
    """This process's ``DecodeDurations`` of ``setup``, started on first use."""
    with _SHARED_LOCK:
        durations = _SHARED_DECODE.get(setup)
        if durations is None:
            durations = _SHARED_DECODE[setup] = DecodeDurations(setup).start()
    return durations
