"""``item_reference`` input items: ``{"type": "item_reference", "id": ...}`` stands for an item of
a stored response, sent back by its id instead of whole.

An id this server gave names its response: an output item's is ``<kind>_<response>_<n>`` (the
response's ``n``-th output item) and an input item's, as ``input_items`` lists it,
``<kind>_<response>_in<n>``. So a reference is read from that one response's stored conversation,
with no index of every item kept. A reference to an id this server did not give, or to a response
the store no longer holds, is a 400 naming the item: there is nothing to send in its place. Each
response's conversation is decoded once per request.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dyn.core.frontend.apis.responses.store import ResponseStore
from dyn.core.protocol.errors import ApiError, bad_request

_ITEMS = msgspec.json.Decoder(list[Any])


def with_references_resolved(items: list[Any], store: ResponseStore) -> list[Any]:
    """``items`` with each ``item_reference`` replaced by the stored item it names."""
    if not any(isinstance(item, dict) and item.get("type") == "item_reference" for item in items):
        return items
    conversations: dict[str, tuple[list[Any], tuple[int, int]] | None] = {}
    resolved = []
    for i, item in enumerate(items):
        if isinstance(item, dict) and item.get("type") == "item_reference":
            item = _referenced(item.get("id"), f"input[{i}]", store, conversations)
        resolved.append(item)
    return resolved


def _referenced(
    item_id: object,
    where: str,
    store: ResponseStore,
    conversations: dict[str, tuple[list[Any], tuple[int, int]] | None],
) -> Any:
    if not isinstance(item_id, str):
        raise bad_request(f"{where}.id must be the id of an item (a string)", param=f"{where}.id")
    kind, _, rest = item_id.partition("_")
    middle, _, place = rest.rpartition("_")
    is_input = place.startswith("in")
    index = place.removeprefix("in")
    response_id = "resp_" + middle
    if not (kind and middle and index.isascii() and index.isdigit() and len(index) <= 9):
        raise _unknown(item_id, where, "this server gave no item that id")
    if response_id not in conversations:
        stored = store.get(response_id)
        conversations[response_id] = (
            (_ITEMS.decode(stored.conversation), stored.inputs) if stored is not None else None
        )
    found = conversations[response_id]
    if found is None:
        raise _unknown(item_id, where, f"its response {response_id[:256]} is not stored (any more)")
    conversation, (start, end) = found
    at = (start if is_input else end) + int(index)
    if at >= (end if is_input else len(conversation)) or not isinstance(conversation[at], dict):
        raise _unknown(item_id, where, f"response {response_id[:256]} has no such item")
    return conversation[at]


def _unknown(item_id: str, where: str, why: str) -> ApiError:
    return bad_request(
        f"{where}: item_reference {item_id[:256]!r} cannot be resolved: {why}; send the item itself",
        param=f"{where}.id",
    )
