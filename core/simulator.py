"""The contract of an engine simulator: what offline tools (``dyn bench replay --offline``) drive.

A simulator stands in for an engine's scheduler and KV cache in virtual time: nothing sleeps,
nothing listens on a socket. The caller owns the clock and the order of events; the simulator
only says what each forward pass did and how long it took. ``dyn.core.bench.replay`` drives one
``SimEngine`` per simulated worker; the mocker (``dyn.plugins.mocker.simulator``) is the one
implementation today. The contract is structural: an implementation imports nothing from here
but the names it annotates with.

- ``Simulator``: the engine's configuration, what a discovery record would advertise of it
  (``block_size``, ``total_kv_blocks``, ``max_num_batched_tokens``), ``prepare()`` to get ready
  what its passes are timed with (it may block; ``ConfigError`` when it cannot), and
  ``engine()`` to build one simulated worker reading the caller's clock.
- ``SimEngine.add`` queues a request that generates exactly ``max_tokens`` tokens (EOS is
  ignored, as trace replay wants) unless the context or the KV cache leaves less room; it raises
  ``ValueError`` for a prompt the engine refuses (empty, longer than the KV cache, a duplicate id).
- ``SimEngine.step`` runs one pass over the queued work and returns a ``SimPass``; a pass with
  ``batch_size == 0`` and nothing preempted ran nothing (all waiting requests are blocked), and
  ``duration_ms`` of any pass already includes the simulator's own speedup.
- Disaggregated serving: ``add(..., remote=True)`` queues a decode request whose prompt's KV
  arrives from a prefill worker (the simulator models the transfer, in the caller's time);
  ``wake_at`` says when such a transfer lands while nothing else runs, so the caller steps the
  engine then (None: nothing is in transfer).
- Quiet passes, optional (``SkipsQuietPasses``): ``quiet_passes()`` counts the next passes that
  would only give each running request one more token, all taking the same time (no KV event, no
  request starting or ending); the caller dates them on its clock without calling ``step`` and
  later ``skip_quiet(n)`` brings the engine's state past the ``n`` it dated. Adding a request ends
  the count. An engine without them is stepped pass by pass.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol

from dyn.core.kv.events import KvEvent


class SimFinish(Protocol):
    """A request that ended in a pass, with its token counts."""

    @property
    def request_id(self) -> Hashable: ...

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens found in the prefix cache when the request was admitted."""

    @property
    def completion_tokens(self) -> int: ...


class SimPass(Protocol):
    """What one pass did: ``tokens`` are ``(request_id, token_id)`` in emission order,
    ``started`` the requests scheduled for the first time, ``events`` the pass's KV events in
    order, ``duration_ms`` the simulated time the pass took."""

    @property
    def duration_ms(self) -> float: ...

    @property
    def tokens(self) -> Sequence[tuple[Hashable, int]]: ...

    @property
    def finished(self) -> Sequence[SimFinish]: ...

    @property
    def started(self) -> Sequence[Hashable]: ...

    @property
    def preempted(self) -> Sequence[Hashable]: ...

    @property
    def events(self) -> list[KvEvent]: ...

    @property
    def batch_size(self) -> int: ...


class SimEngine(Protocol):
    """One simulated worker's engine (see the module docstring)."""

    def add(
        self, request_id: str, token_ids: list[int], max_tokens: int, seed: int, *, remote: bool = False
    ) -> None: ...

    @property
    def wake_at(self) -> float | None:
        """When the next KV transfer lands on the caller's clock (None: none is in flight)."""

    def step(self) -> SimPass: ...

    def abort(self, request_id: str) -> bool:
        """Drop a request and free its KV blocks; False if it is not here."""

    @property
    def has_work(self) -> bool:
        """Whether any request is queued or running."""


class SkipsQuietPasses(Protocol):
    """The optional quiet-pass calls of a ``SimEngine`` (see the module docstring)."""

    def quiet_passes(self) -> tuple[int, float]:
        """How many of the next passes are quiet and the duration of each in ms; (0, 0.0): the
        next one is not."""

    def skip_quiet(self, passes: int) -> list[Hashable]:
        """Run ``passes`` counted quiet passes at once; the ids of the requests that each got
        ``passes`` more tokens."""


class Simulator(Protocol):
    """An engine's configuration, able to build simulated workers.

    ``name`` keys ``describe()`` in a replay's saved results; ``validate`` raises ``ValueError``
    with a sentence naming the flag to fix."""

    @property
    def name(self) -> str: ...

    @property
    def block_size(self) -> int: ...

    @property
    def total_kv_blocks(self) -> int: ...

    @property
    def max_num_batched_tokens(self) -> int: ...

    def validate(self) -> Any: ...

    def describe(self) -> Mapping[str, Any]:
        """The configuration as plain JSON values, for the results file."""

    def prepare(self) -> None:
        """Get ready what passes are timed with (a table to read or build), blocking until it
        is; ``ConfigError`` when it cannot be. Called before the first ``engine()``."""

    def engine(self, clock: Callable[[], float], *, vocab_size: int, context_length: int) -> SimEngine: ...
