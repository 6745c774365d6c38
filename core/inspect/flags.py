"""``dyn inspect-kv``'s own flags, declared once (``dyn.core.config``): ``InspectFlags``.

Each field is one flag of ``dyn inspect-kv``, named after it, with its default, range, help text
and ``--help`` panel; ``dyn.cli.inspect_kv`` offers them (``dyn.cli.config_flags.flag_table``: the
Typer options, their ``DYN_*`` twins, the ``--config`` keys, the man page and the completions) and
builds the ``InspectSettings`` from the values. The discovery flags are ``DiscoveryConfig``'s. This
module imports nothing heavy: the command line is built from it.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from dyn.core.config import MODEL_PANEL, flag

TARGET_PANEL = "Target"
REQUEST_PANEL = "Request"
OUTPUT_PANEL = "Output"


class InspectFlags(msgspec.Struct, kw_only=True, frozen=True):
    """The values of ``dyn inspect-kv``'s own flags, as given (``dyn.cli.inspect_kv`` turns them
    into an ``InspectSettings``)."""

    url: Annotated[
        str | None,
        flag(
            "--url",
            scope="inspect-kv",
            panel=TARGET_PANEL,
            help="HTTP URL of a dyn indexer (its http= address), of a frontend with "
            "--router-mode kv (http://HOST:PORT, or the /v1 URL dyn serve prints), or of a dyn "
            "router's --system-port (their views are under /kv/, found by probing). Default: the "
            "newest dyn indexer in discovery.",
        ),
    ] = None
    api_key: Annotated[
        str | None,
        flag(
            "--api-key",
            panel=TARGET_PANEL,
            help="The target's --api-key, sent as 'Authorization: Bearer KEY'.",
        ),
    ] = None
    model_name: Annotated[
        str | None,
        flag(
            "--model-name",
            panel=MODEL_PANEL,
            help="Find the dyn indexer of this model in discovery (default: any model).",
        ),
    ] = None
    model_path: Annotated[
        str | None,
        flag(
            "--model-path",
            panel=MODEL_PANEL,
            help="Model directory whose tokenizer and chat template make the "
            "--prompt / --messages tokens (default: the embedded dyn-tiny).",
        ),
    ] = None
    prompt: Annotated[
        str | None,
        flag(
            "--prompt",
            panel=REQUEST_PANEL,
            help="Show each worker's cached share of this text, tokenized raw (no "
            "chat template), as /v1/completions tokenizes it.",
        ),
    ] = None
    messages: Annotated[
        str | None,
        flag(
            "--messages",
            panel=REQUEST_PANEL,
            help="Show each worker's cached share of this chat: a JSON file with a "
            'list of OpenAI messages (or an object with "messages"), '
            "rendered with the model's chat template and generation prompt.",
        ),
    ] = None
    json: Annotated[
        bool,
        flag(
            "--json",
            panel=OUTPUT_PANEL,
            help="Print one JSON object (with --watch: one per refresh, one per "
            "line); the schema is in dyn.core.inspect.snapshot.",
        ),
    ] = False
    watch: Annotated[
        bool,
        flag(
            "--watch",
            panel=OUTPUT_PANEL,
            help="Refresh a live view of per-worker blocks and occupancy and KV events per second.",
        ),
    ] = False
    interval: Annotated[
        Annotated[float, Meta(ge=0.05)],
        flag("--interval", panel=OUTPUT_PANEL, help="Seconds between --watch refreshes."),
    ] = 1.0
    duration: Annotated[
        Annotated[float, Meta(ge=0.0)],
        flag(
            "--duration",
            scope="inspect-kv",
            panel=OUTPUT_PANEL,
            help="Stop --watch after this many seconds (0: at Ctrl-C).",
        ),
    ] = 0.0
