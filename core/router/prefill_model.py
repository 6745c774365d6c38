"""Predicted prefill durations for ``--router-prefill-load-model ais`` (or ``aic``, its older
name): AIConfigurator's estimate, tabulated once per setup and read by interpolation.

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
- ``check_setup``: what a start checks: the extra is installed and, unless a table is cached,
  AIConfigurator knows the system, backend, version and model, and a MoE model's parallelism
  adds up; each ``ConfigError`` names the flag and what AIConfigurator accepts. A setup that
  passes can still fail to build (the database lacks a table the model needs): the build logs
  the error once and ``PrefillDurations.error`` keeps it, and the router stays as with ``none``.
"""

from __future__ import annotations

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
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from dyn.core.errors import ConfigError

if TYPE_CHECKING:
    from dyn.core.router.config import KvRouterConfig

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
    def from_config(cls, config: KvRouterConfig) -> AicSetup:
        """The setup of a router config whose ``uses_aic`` (validated: the names are set)."""
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


class PrefillTable:
    """Prefill milliseconds ``ms[i][j]`` for ``new[i]`` uncached tokens after ``prefix[j]``
    cached ones; ``predict_ms`` interpolates. Both axes rise strictly, with 2 points at least;
    ``new`` starts at 1 or more, ``prefix`` at 0 or more; the values are finite and >= 0
    (``ValueError`` otherwise)."""

    __slots__ = ("ms", "new", "prefix")

    def __init__(self, new: Sequence[int], prefix: Sequence[int], ms: Sequence[Sequence[float]]) -> None:
        self.new = [int(n) for n in new]
        self.prefix = [int(p) for p in prefix]
        self.ms = [[float(v) for v in row] for row in ms]
        _check_axis(self.new, "new", 1, new)
        _check_axis(self.prefix, "prefix", 0, prefix)
        if len(self.ms) != len(self.new) or any(len(row) != len(self.prefix) for row in self.ms):
            raise ValueError(
                f"a prefill table of {len(self.new)} x {len(self.prefix)} points has other values"
            )
        if not all(math.isfinite(v) and v >= 0 for row in self.ms for v in row):
            raise ValueError("a prefill table holds a negative or non-finite duration")

    @classmethod
    def build(
        cls, prefill_ms: Callable[[int, int], float], new: Sequence[int], prefix: Sequence[int]
    ) -> PrefillTable:
        """The table of ``prefill_ms(new, prefix)`` at every grid point."""
        return cls(new, prefix, [[prefill_ms(n, p) for p in prefix] for n in new])

    def predict_ms(self, new_tokens: int, prefix_tokens: int) -> float:
        """Milliseconds to prefill ``new_tokens`` after ``prefix_tokens``: bilinear between grid
        points, the nearest segment's slope beyond them, never below 0."""
        i, s = _segment(self.new, new_tokens)
        j, t = _segment(self.prefix, prefix_tokens)
        below, above = self.ms[i], self.ms[i + 1]
        lo = below[j] + (below[j + 1] - below[j]) * t
        hi = above[j] + (above[j + 1] - above[j]) * t
        return max(lo + (hi - lo) * s, 0.0)

    def to_json(self) -> dict[str, Any]:
        return {"new": self.new, "prefix": self.prefix, "ms": self.ms}

    @classmethod
    def from_json(cls, data: Any) -> PrefillTable:
        """The table ``to_json`` wrote; ``ValueError`` for anything else."""
        if not isinstance(data, dict):
            raise ValueError("a prefill table is a JSON object")
        try:
            return cls(data["new"], data["prefix"], data["ms"])
        except (KeyError, TypeError, OverflowError) as exc:
            raise ValueError(f"not a prefill table: {exc!r}") from None


def _check_axis(points: list[int], name: str, least: int, given: Sequence[Any]) -> None:
    if len(points) < 2 or points[0] < least or any(b <= a for a, b in zip(points, points[1:])):
        raise ValueError(
            f"a prefill table's {name} axis must rise from {least} or more, with 2 points at least"
        )
    if any(isinstance(g, bool) or g != int(g) for g in given):
        raise ValueError(f"a prefill table's {name} axis holds a value that is not a whole number")


def _segment(points: list[int], x: int) -> tuple[int, float]:
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


def check_setup(setup: AicSetup, *, directory: Path | None = None) -> None:
    """Raise ``ConfigError`` unless a table of ``setup`` can be built: AIConfigurator is
    installed and, unless a table of ``setup`` is cached in ``directory`` (default
    ``cache_dir()``), knows its system, backend, version and model, and a MoE model's sizes
    satisfy ``tp * attention_dp == moe_tp * moe_ep``."""
    require_aiconfigurator()
    if _read_cached(setup, directory or cache_dir(), PER_OCTAVE, quiet=True) is not None:
        return
    _resolve(setup)


def require_aiconfigurator() -> None:
    """``ConfigError`` naming the extra to install when AIConfigurator is not importable."""
    if util.find_spec(AIC_PACKAGE) is None:
        raise ConfigError(
            f"--router-prefill-load-model aic needs NVIDIA's AIConfigurator ({AIC_DISTRIBUTION}): "
            f"{INSTALL_HINT}, or use --router-prefill-load-model none"
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


def cache_path(setup: AicSetup, directory: Path, per_octave: int = PER_OCTAVE) -> Path:
    """The file of ``setup``'s table: named by a digest of everything the table depends on (the
    setup, the grid, the file format, AIConfigurator's version and, for a model directory, its
    config files)."""
    identity = {
        "format": TABLE_FORMAT,
        "per_octave": per_octave,
        "aiconfigurator": _aic_version(),
        "model_files": _model_digest(setup.model_path),
        **asdict(setup),
    }
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
    setup: AicSetup, directory: Path, per_octave: int, *, quiet: bool = False
) -> PrefillTable | None:
    """The cached table of ``setup``, or None: none cached, or (with a warning unless
    ``quiet``) a file that does not read back as one, which the next build replaces."""
    path = cache_path(setup, directory, per_octave)
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, orjson.JSONDecodeError) as exc:
        if not quiet:
            log.warning("ignoring the AIC prefill table cache %s (%s); rebuilding it", path, exc)
        return None
    try:
        if data.get("format") != TABLE_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, not {TABLE_FORMAT}")
        return PrefillTable.from_json(data.get("table"))
    except (ValueError, AttributeError) as exc:
        if not quiet:
            log.warning("ignoring the AIC prefill table cache %s (%s); rebuilding it", path, exc)
        return None


def _write_cached(setup: AicSetup, directory: Path, per_octave: int, table: PrefillTable) -> Path:
    """Write ``table`` as ``setup``'s cache file: whole or not at all (a temporary file in the
    same directory, renamed over it). ``OSError`` when the directory is not writable."""
    path = cache_path(setup, directory, per_octave)
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


# ---------------------------------------------------------------------------------------- the router's view


class PrefillDurations:
    """One setup's predicted prefill durations for the router (see the module docstring).

    ``estimator`` makes the ``Estimator`` the table is built from (AIConfigurator's by default;
    tests give their own); ``directory`` is the disk cache (default ``cache_dir()``, read when
    this is made). ``ready`` is set once the table is there (and cached, when it was built) or
    its build failed (``error``)."""

    def __init__(
        self,
        setup: AicSetup,
        *,
        estimator: Callable[[AicSetup], Estimator] = AicEstimator,
        directory: Path | None = None,
        per_octave: int = PER_OCTAVE,
    ) -> None:
        self.setup = setup
        self.directory = directory or cache_dir()
        self.per_octave = per_octave
        self.error: str | None = None
        self.ready = threading.Event()
        self._estimator = estimator
        self._table: PrefillTable | None = None
        self._started = False

    @property
    def table(self) -> PrefillTable | None:
        return self._table

    def start(self) -> PrefillDurations:
        """Take the cached table now if there is one, else build it in a daemon thread (once;
        later calls do nothing). Returns self."""
        if self._started:
            return self
        self._started = True
        cached = _read_cached(self.setup, self.directory, self.per_octave)
        if cached is not None:
            self._table = cached
            self.ready.set()
            log.info("AIC prefill table of %s read from the cache", self.setup.describe())
            return self
        threading.Thread(target=self.build, name="dyn-aic-prefill-table", daemon=True).start()
        return self

    def wait(self, timeout: float | None = None) -> PrefillTable | None:
        """The table once ready (None: not within ``timeout`` seconds, or its build failed)."""
        self.ready.wait(timeout)
        return self._table

    def expected_secs(self, new_tokens: int, prefix_tokens: int) -> float | None:
        """Seconds one engine takes to prefill ``new_tokens`` after ``prefix_tokens`` cached ones;
        None with no new tokens or no table (yet)."""
        table = self._table
        if table is None or new_tokens <= 0:
            return None
        return table.predict_ms(new_tokens, max(prefix_tokens, 0)) / 1000.0

    def build(self) -> None:
        """Build the table (what the thread of ``start`` runs), cache it, set ``ready``. A
        failure is logged once and kept in ``error``."""
        started = time.perf_counter()
        try:
            table = self._compute()
        except Exception as exc:  # AIConfigurator's errors are its own classes: report any
            self.error = f"the AIC prefill table of {self.setup.describe()} could not be built: {exc}"
            log.error("%s; prompt load does not decay (as with --router-prefill-load-model none)", self.error)
            self.ready.set()
            return
        self._table = table  # the router predicts from here on
        log.info(
            "AIC prefill table of %s: %d points in %.2f s",
            self.setup.describe(),
            len(table.new) * len(table.prefix),
            time.perf_counter() - started,
        )
        try:
            _write_cached(self.setup, self.directory, self.per_octave, table)
        except OSError as exc:
            log.warning(
                "cannot cache the AIC prefill table in %s (%s); it is rebuilt at each start",
                self.directory,
                exc,
            )
        self.ready.set()

    def _compute(self) -> PrefillTable:
        estimator = self._estimator(self.setup)
        limit = min(max(int(estimator.context_length), 2), MAX_GRID_TOKENS)
        grid = token_grid(limit, self.per_octave)
        with quiet_aiconfigurator():
            return PrefillTable.build(estimator.prefill_ms, grid, [0, *grid])


_SHARED: dict[AicSetup, PrefillDurations] = {}
_SHARED_LOCK = threading.Lock()


def shared_durations(setup: AicSetup) -> PrefillDurations:
    """This process's ``PrefillDurations`` of ``setup``, started on first use."""
    with _SHARED_LOCK:
        durations = _SHARED.get(setup)
        if durations is None:
            durations = _SHARED[setup] = PrefillDurations(setup).start()
    return durations
