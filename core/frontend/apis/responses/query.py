"""The query strings of the stored-response endpoints: bounded, read once, checked."""

from __future__ import annotations

import re
from urllib.parse import parse_qs

from dyn.core.protocol.errors import bad_request

MAX_QUERY_BYTES = 4096
_WHOLE = re.compile(r"[0-9]{1,18}")


def query_args(query: bytes) -> dict[str, str]:
    """Each parameter's last value; a 400 for a query over ``MAX_QUERY_BYTES``."""
    if len(query) > MAX_QUERY_BYTES:
        raise bad_request(f"the query string is over {MAX_QUERY_BYTES} bytes", param="query")
    return {name: values[-1] for name, values in parse_qs(query.decode("latin-1"), max_num_fields=16).items()}


def whole_number(raw: str, name: str, low: int, high: int) -> int:
    """``raw`` as an integer from ``low`` to ``high`` (ASCII digits only), else a 400 naming ``name``."""
    if _WHOLE.fullmatch(raw) and low <= int(raw) <= high:
        return int(raw)
    raise bad_request(f"{name} must be a whole number from {low} to {high}, got {raw[:64]!r}", param=name)
