"""The KV router's flags (seed 001), shared by ``dyn frontend`` and ``dyn router``.

``@router_flags`` adds every flag below to a command and hands the command one validated
``KvRouterConfig`` (argument ``router_config``) instead of twenty loose values, so the same flag
means the same thing in every command and the mapping lives in one place. A bad combination exits
with status 2 and a sentence naming the flag.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any

import typer

from dyn.cli.options import flag

PANEL = "KV router"
JETSTREAM = ("JetStream mode is not built: dyn's routers read KV events straight from the "
             "workers' event plane (the path Dynamo recommends); drop {flag}")


# name -> (annotation, option); the names are KvRouterConfig's fields or handled in _config
_FLAGS: dict[str, tuple[Any, Any]] = {
    "router_kv_overlap_score_credit": (float, flag(
        1.0, "--router-kv-overlap-score-credit", min=0.0, max=1.0, panel=PANEL,
        help="Credit for device-local prefix overlap in the prefill cost, 0 to 1; 0 ignores prefix "
             "caches and creates no indexer.")),
    "router_prefill_load_scale": (float, flag(
        1.0, "--router-prefill-load-scale", min=0.0, panel=PANEL,
        help="Scale of the overlap-adjusted prompt-side load against decode blocks.")),
    "load_aware": (bool, flag(
        False, "--load-aware", panel=PANEL,
        help="Preset: KV routing on load alone (overlap credit 0, no KV events, no KV-reuse "
             "assumption, active-block and prefill-token tracking on); implies --router-mode kv.")),
    "router_temperature": (float, flag(
        0.0, "--router-temperature", min=0.0, panel=PANEL,
        help="Softmax temperature over normalised costs; 0 picks the cheapest worker.")),
    "router_track_prefill_tokens": (bool, flag(
        True, "--router-track-prefill-tokens/--no-router-track-prefill-tokens", panel=PANEL,
        help="Count prompt tokens being prefilled in each worker's load.")),
    "router_prefill_load_model": (str, flag(
        "none", "--router-prefill-load-model", panel=PANEL,
        help="Prompt-side load model: none (static until first token); aic is refused (it needs "
             "NVIDIA's AIConfigurator database).")),
    "router_queue_threshold": (str, flag(
        "16.0", "--router-queue-threshold", panel=PANEL,
        help="Hold requests while every worker's active prefill tokens exceed this fraction of "
             "its max_num_batched_tokens; None disables the queue.")),
    "router_queue_policy": (str, flag(
        "fcfs", "--router-queue-policy", panel=PANEL,
        help="Router queue order: fcfs (tail TTFT), lcfs (experiments), wspt (average TTFT).")),
    "router_queue_limit": (int, flag(
        1024, "--router-queue-limit", min=0, panel=PANEL,
        help="Most engine requests that may wait in the router queue (a request's n choices wait "
             "as one entry but count n); a request arriving at a full queue is answered 503 with "
             "Retry-After at once. 0: no limit (Dynamo's default).")),
    "router_unstarted_booking_secs": (float, flag(
        5.0, "--router-unstarted-booking-secs", min=0.0, panel=PANEL,
        help="Free a routed request's load booking when the frontend has not sent it to its worker "
             "within this many seconds (a frontend that crashed or gave up after routing); 0: "
             "only the 300 s stale expiry. dyn's own flag: Dynamo has no such limit.")),
    "router_kv_events": (bool, flag(
        True, "--router-kv-events/--no-router-kv-events", panel=PANEL,
        help="Follow workers' KV events; without them, predict cache state from routing "
             "decisions with a TTL.")),
    "router_ttl_secs": (float, flag(
        120.0, "--router-ttl-secs", min=0.0, panel=PANEL,
        help="Lifetime of predicted blocks in approximate mode (--no-router-kv-events).")),
    "router_predicted_ttl_secs": (float | None, flag(
        None, "--router-predicted-ttl-secs", min=0.0, panel=PANEL,
        help="Record each decision in a side index with this TTL so sibling requests find the "
             "prefix before the engine reports it (try 5); needs KV events.")),
    "router_event_threads": (int, flag(
        1, "--router-event-threads", min=1, panel=PANEL,
        help="Threads that receive and decode KV events (1, the default: on the event loop; "
             "Dynamo defaults to 4, but Python threads share the GIL and measured slower).")),
    "router_track_active_blocks": (bool, flag(
        True, "--router-track-active-blocks/--no-router-track-active-blocks", panel=PANEL,
        help="Count blocks of requests in flight in each worker's load.")),
    "router_track_output_blocks": (bool, flag(
        False, "--router-track-output-blocks", panel=PANEL,
        help="Experimental: add output blocks as tokens are generated, decaying toward "
             "nvext.agent_hints.osl.")),
    "router_assume_kv_reuse": (bool, flag(
        True, "--router-assume-kv-reuse/--no-router-assume-kv-reuse", panel=PANEL,
        help="Count a prefix block shared by requests on one worker once.")),
    "router_replica_sync": (bool, flag(
        False, "--router-replica-sync", panel=PANEL,
        help="Share routing decisions with the other router replicas of the namespace.")),
    "use_remote_indexer": (bool, flag(
        False, "--use-remote-indexer", panel=PANEL,
        help="Ask a dyn indexer for overlaps (see --indexer-address) instead of indexing here.")),
    "indexer_address": (str | None, flag(
        None, "--indexer-address", panel=PANEL,
        help="ZMQ address of the dyn indexer for --use-remote-indexer (default: found in discovery).")),
    "active_decode_blocks_threshold": (float | None, flag(
        None, "--active-decode-blocks-threshold", min=0.0, panel=PANEL,
        help="Busy when active decode blocks exceed this fraction of the worker's KV blocks.")),
    "active_prefill_tokens_threshold": (int | None, flag(
        None, "--active-prefill-tokens-threshold", min=0, panel=PANEL,
        help="Busy when active prefill tokens exceed this many.")),
    "active_prefill_tokens_threshold_frac": (float | None, flag(
        None, "--active-prefill-tokens-threshold-frac", min=0.0, panel=PANEL,
        help="Busy when active prefill tokens exceed this fraction of max_num_batched_tokens.")),
    "router_kv_overlap_score_weight": (float | None, flag(
        None, "--router-kv-overlap-score-weight", "--kv-overlap-score-weight", hidden=True,
        panel=PANEL, help="Deprecated: use --router-prefill-load-scale.")),
    "router_durable_kv_events": (bool, flag(
        False, "--router-durable-kv-events", hidden=True, panel=PANEL, help="Deprecated; not built.")),
    "router_reset_states": (bool, flag(
        False, "--router-reset-states", hidden=True, panel=PANEL, help="JetStream only; not built.")),
    "router_snapshot_threshold": (int | None, flag(
        None, "--router-snapshot-threshold", hidden=True, panel=PANEL,
        help="JetStream only; not built.")),
}


def _config(values: dict[str, Any]) -> Any:
    from dyn.core.router.config import (
        build_config,
        deprecated_overlap_weight_from_env,
        overlap_refresh_from_env,
        parse_queue_threshold,
    )

    for name, flag_name in (("router_durable_kv_events", "--router-durable-kv-events"),
                            ("router_reset_states", "--router-reset-states"),
                            ("router_snapshot_threshold", "--router-snapshot-threshold")):
        if values[name] not in (None, False):
            raise typer.BadParameter(JETSTREAM.format(flag=flag_name), param_hint=flag_name)
    weight, source = values["router_kv_overlap_score_weight"], "--router-kv-overlap-score-weight"
    if weight is None:
        from_env = deprecated_overlap_weight_from_env(os.environ)
        if from_env is not None:
            weight, source = from_env
    return build_config(
        deprecated_overlap_weight=weight,
        deprecated_weight_source=source,
        load_aware=values["load_aware"],
        overlap_score_credit=values["router_kv_overlap_score_credit"],
        prefill_load_scale=values["router_prefill_load_scale"],
        temperature=values["router_temperature"],
        use_kv_events=values["router_kv_events"],
        ttl_secs=values["router_ttl_secs"],
        predicted_ttl_secs=values["router_predicted_ttl_secs"],
        event_threads=values["router_event_threads"],
        track_active_blocks=values["router_track_active_blocks"],
        assume_kv_reuse=values["router_assume_kv_reuse"],
        track_output_blocks=values["router_track_output_blocks"],
        track_prefill_tokens=values["router_track_prefill_tokens"],
        prefill_load_model=values["router_prefill_load_model"],
        queue_threshold=parse_queue_threshold(values["router_queue_threshold"]),
        queue_policy=values["router_queue_policy"],
        max_queued_requests=values["router_queue_limit"] or None,
        unstarted_booking_secs=values["router_unstarted_booking_secs"] or None,
        overlap_refresh_after_secs=overlap_refresh_from_env(
            os.environ.get("DYN_ROUTER_OVERLAP_REFRESH_AFTER_SECS")),
        replica_sync=values["router_replica_sync"],
        use_remote_indexer=values["use_remote_indexer"],
        indexer_address=values["indexer_address"],
        active_decode_blocks_threshold=values["active_decode_blocks_threshold"],
        active_prefill_tokens_threshold=values["active_prefill_tokens_threshold"],
        active_prefill_tokens_threshold_frac=values["active_prefill_tokens_threshold_frac"],
    )


def router_flags(command: Callable[..., None]) -> Callable[..., None]:
    """Add the router flags to ``command``, which takes ``router_config`` (a validated
    ``KvRouterConfig``) instead."""
    from dyn.core.errors import ConfigError

    signature = inspect.signature(command)
    own = [p for p in signature.parameters.values() if p.name != "router_config"]
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind)
             for name, (kind, option) in _FLAGS.items()]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        values = {name: kwargs.pop(name) for name in _FLAGS}
        try:
            kwargs["router_config"] = _config(values)
        except ConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        command(**kwargs)

    wrapper.__signature__ = signature.replace(parameters=own + added)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {**{p.name: p.annotation for p in own},
                               **{p.name: p.annotation for p in added}}
    return wrapper
