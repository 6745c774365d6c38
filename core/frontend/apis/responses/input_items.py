"""``GET /v1/responses/{id}/input_items``: the input items a stored response was made from.

As OpenAI lists them: the request's own ``input`` (not the items of the responses a
``previous_response_id`` continued), each with an ``id``, a page at a time: ``order`` (``desc``,
the default, or ``asc``), ``limit`` (1 to 100, default 20), ``after`` (the id of the item the
page starts after); the body is ``{"object": "list", "data", "first_id", "last_id",
"has_more"}``. An item the client sent without an id gets one from the response's id and its
place (``msg_...``, ``fc_...``, ``fco_...``, ``item_...``), the same on every call; a message's
string content is listed as one ``input_text`` part (``output_text`` for an assistant's), as
OpenAI returns it. ``include`` is accepted and changes nothing.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dyn.core.frontend.apis.responses.query import query_args, whole_number
from dyn.core.frontend.apis.responses.store import StoredResponse
from dyn.core.protocol.errors import bad_request

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}
_ITEMS = msgspec.json.Decoder(list[Any])


def input_items_page(stored: StoredResponse, response_id: str, query: bytes) -> bytes:
    """The page of ``stored``'s input items that ``query`` (the URL's query string) asks for."""
    order, limit, after = _page(query)
    start, end = stored.inputs
    items = [
        _listed(item, response_id, i) for i, item in enumerate(_ITEMS.decode(stored.conversation)[start:end])
    ]
    if order == "desc":
        items.reverse()
    if after is not None:
        at = next((i for i, item in enumerate(items) if item["id"] == after), None)
        if at is None:
            raise bad_request(
                f"after: no input item of {response_id[:256]} has the id {after[:256]!r}", param="after"
            )
        items = items[at + 1 :]
    page = items[:limit]
    return msgspec.json.encode(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }
    )


def _page(query: bytes) -> tuple[str, int, str | None]:
    args = query_args(query)
    order = args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request(f"order must be 'asc' or 'desc', got {order[:64]!r}", param="order")
    limit = whole_number(args.get("limit", str(DEFAULT_LIMIT)), "limit", 1, MAX_LIMIT)
    return order, limit, args.get("after")


def _listed(item: Any, response_id: str, index: int) -> dict[str, Any]:
    """``item`` as the list shows it: with an id, a message's content as parts."""
    listed = dict(item)  # every stored item is an object (the adapter refuses others)
    kind = listed.setdefault("type", "message")
    if kind == "message":
        content = listed.get("content")
        assistant = listed.get("role") == "assistant"
        if isinstance(content, str):
            part = {"type": "output_text", "text": content, "annotations": []} if assistant else None
            listed["content"] = [part or {"type": "input_text", "text": content}]
        if assistant:
            listed.setdefault("status", "completed")
    if not isinstance(listed.get("id"), str):
        prefix = _PREFIXES.get(str(kind), "item")
        listed["id"] = f"{prefix}_{response_id.removeprefix('resp_')}_in{index}"
    return listed
