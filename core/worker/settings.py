"""Settings every worker has, whatever its engine."""

from __future__ import annotations

import msgspec

from dyn.core.config import DiscoveryConfig
from dyn.core.messages import DisaggregationMode


class WorkerSettings(msgspec.Struct, kw_only=True, frozen=True):
    """Where a worker lives and how it registers (``discovery``: the store it registers in).

    ``host`` is the loopback or interface address (or wildcard) every socket binds to; peers are
    told the process's advertised address (``dyn.core.transport.sockets.advertised_host``).
    ``lease_ttl_s``: how long discovery keeps the record without a heartbeat (the heartbeat runs
    every third of it). ``drain_timeout_s``: on shutdown, how long in-flight requests may run on
    after the worker has left discovery before they are cut off with an error.
    """

    discovery: DiscoveryConfig = msgspec.field(default_factory=DiscoveryConfig)
    host: str = "127.0.0.1"
    lease_ttl_s: float = 5.0
    drain_timeout_s: float = 10.0
    metrics_interval_s: float = 0.1
    tool_call_parser: str | None = None
    """How the served model writes tool calls (``--dyn-tool-call-parser``), advertised in discovery."""
    reasoning_parser: str | None = None
    """How the served model writes reasoning (``--dyn-reasoning-parser``), advertised in discovery."""
    system_port: int | None = None
    """Where the worker serves its HTTP status API (``--system-port``; 0 picks a free port;
    ``None``: none), ``dyn.core.worker.system``."""
    disaggregation_mode: DisaggregationMode = "agg"
    """The worker's role (``--disaggregation-mode``), advertised in discovery; an engine serves it
    only if its plugin says so (``EnginePlugin.disaggregation``)."""


def model_parsers(
    tool_call_parser: str | None, reasoning_parser: str | None, model_path: str | None
) -> tuple[str | None, str | None]:
    """The parsers a worker advertises: the ones given (checked against the registries;
    ``ValueError`` names the known ones); for the embedded dyn-tiny (``model_path`` None) the
    tool-call parser defaults to the format its chat template writes."""
    from dyn.core.model.info import TINY_MODEL_TOOL_CALL_PARSER
    from dyn.core.parsers.reasoning import REASONING_PARSERS
    from dyn.core.parsers.registry import ParserUnavailable, UnknownParserError
    from dyn.core.parsers.tool import TOOL_PARSERS

    if model_path is None:
        tool_call_parser = tool_call_parser or TINY_MODEL_TOOL_CALL_PARSER
    for flag, registry, name in (
        ("--dyn-tool-call-parser", TOOL_PARSERS, tool_call_parser),
        ("--dyn-reasoning-parser", REASONING_PARSERS, reasoning_parser),
    ):
        try:
            if name:
                registry.usable(name)
        except (UnknownParserError, ParserUnavailable) as exc:
            raise ValueError(f"{flag}: {exc}") from None
    return tool_call_parser or None, reasoning_parser or None
