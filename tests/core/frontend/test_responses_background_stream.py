"""Streamed background responses (``background`` and ``stream`` both true) in process over fake
workers: answered with their events, generated whether or not the client stays, and read again
with ``GET /v1/responses/{id}?stream=true&starting_after=N`` through the ``openai`` SDK
(``responses.retrieve(..., stream=True)``), every event parsed with its own types."""

from __future__ import annotations

import json

import anyio
import pytest

from tests.core.frontend.conftest import asgi_call
from tests.core.frontend.fake_workers import endless, held, reply
from tests.core.frontend.test_responses_api import EVENTS, sdk
from tests.waiting import wait_until

pytestmark = pytest.mark.anyio

BODY = {"model": "dyn-tiny", "input": "Weather?", "background": True, "stream": True}


def events_of(messages: list[dict]) -> list[dict]:
    """The SSE events an ``asgi_call`` received, as JSON."""
    text = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body").decode()
    return [json.loads(block.split("\ndata: ", 1)[1]) for block in text.split("\n\n") if block]


async def started_then_left(fe, messages: int) -> list[dict]:
    """POST a streamed background response and leave after ``messages`` ASGI messages (the head
    is one); the events seen."""
    sent = await asgi_call(
        fe.app, "POST", "/v1/responses", json.dumps(BODY).encode(), leave_after=lambda s: len(s) >= messages
    )
    return events_of(sent)


async def test_a_streamed_background_response_is_read_again_from_any_event(make_frontend):
    async with make_frontend(workers=1, script=reply("It is sunny.")) as fe:
        client = sdk(fe)
        first = [e async for e in await client.responses.create(**BODY)]
        response_id = first[0].response.id
        again = [e async for e in await client.responses.retrieve(response_id, stream=True)]
        rest = [e async for e in await client.responses.retrieve(response_id, stream=True, starting_after=3)]
        done = await client.responses.retrieve(response_id)
    assert [e.sequence_number for e in first] == list(range(len(first)))
    assert first[0].type == "response.created" and first[0].response.background
    assert first[-1].type == "response.completed" and first[-1].response.output_text == "It is sunny."
    assert [e.model_dump() for e in again] == [e.model_dump() for e in first]
    assert [e.sequence_number for e in rest] == list(range(4, len(first)))
    assert done.status == "completed" and done.output_text == "It is sunny."
    assert fe.app.inflight == 0 and not fe.fleet.cancelled


async def test_a_client_that_leaves_does_not_stop_it_and_picks_up_where_it_left(make_frontend):
    release = anyio.Event()
    async with make_frontend(workers=1, script=held(release, reply("It is sunny."))) as fe:
        with anyio.fail_after(10):
            seen = await started_then_left(fe, 2)
        assert [e["type"] for e in seen] == ["response.created", "response.in_progress"]
        release.set()
        response_id = seen[0]["response"]["id"]
        rest = [
            e
            async for e in await sdk(fe).responses.retrieve(
                response_id, stream=True, starting_after=seen[-1]["sequence_number"]
            )
        ]
    assert rest[0].sequence_number == 2 and rest[-1].type == "response.completed"
    assert "".join(e.delta for e in rest if e.type == "response.output_text.delta") == "It is sunny."
    assert not fe.fleet.cancelled


async def test_a_cancelled_one_ends_its_readers(make_frontend):
    async with make_frontend(workers=1, script=endless()) as fe:
        client = sdk(fe)
        with anyio.fail_after(10):
            seen = await started_then_left(fe, 3)
            response_id = seen[0]["response"]["id"]
            cancelled = await client.responses.cancel(response_id)
            replay = [e async for e in await client.responses.retrieve(response_id, stream=True)]
    assert cancelled.status == "cancelled"
    assert replay[0].type == "response.created" and replay[-1].type == "response.output_text.delta"
    assert fe.app.inflight == 0 and fe.fleet.cancelled


async def test_the_kept_events_are_bounded_by_the_store_budget(make_frontend):
    budget = 4096
    async with make_frontend(
        workers=1, script=endless(0.001), responses_store_max_bytes=budget, responses_store_max_entries=2
    ) as fe:
        background = fe.app.background_responses
        with anyio.fail_after(10):
            seen = await started_then_left(fe, 2)
            response_id = seen[0]["response"]["id"]
            kept = background._logs[response_id]
            await wait_until(lambda: kept.first > 10, 10, "the oldest events to be dropped")
            assert background.log_bytes <= budget and kept.bytes == background.log_bytes
            await sdk(fe).responses.cancel(response_id)
            too_early = await fe.client.get(f"/v1/responses/{response_id}?stream=true&starting_after=0")
            at_first = await fe.client.get(
                f"/v1/responses/{response_id}?stream=true&starting_after={kept.first - 1}"
            )
    assert too_early.status_code == 400 and too_early.json()["error"]["param"] == "starting_after"
    assert f"starting_after >= {kept.first - 1}" in too_early.json()["error"]["message"]
    assert at_first.status_code == 200
    assert [
        EVENTS.validate_json(block.split("\ndata: ", 1)[1]).sequence_number
        for block in at_first.text.split("\n\n")
        if block
    ][0] == kept.first


async def test_ended_ones_make_room_for_new_ones(make_frontend):
    async with make_frontend(workers=1, script=reply("Hi."), responses_store_max_entries=1) as fe:
        client = sdk(fe)
        first = [e async for e in await client.responses.create(**BODY)]
        [e async for e in await client.responses.create(**BODY)]
        gone = await fe.client.get(f"/v1/responses/{first[0].response.id}?stream=true")
    # the store kept one response, the newer: the older is a 404 there before its events are asked
    assert gone.status_code == 404
    assert len(fe.app.background_responses._logs) == 1


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("stream=maybe", "stream"),
        ("stream=true&starting_after=x", "starting_after"),
        ("stream=true&starting_after=-5", "starting_after"),
        ("stream=true&starting_after=%C2%B2", "starting_after"),  # a digit to str.isdigit, not to int
        ("stream=true&starting_after=" + "9" * 40, "starting_after"),
        ("stream=true", "stream"),  # a response that was not streamed in the background
        ("x=" + "y" * 5000, "query"),
    ],
)
async def test_a_bad_resume_is_a_400_naming_its_parameter(make_frontend, query, param):
    async with make_frontend(workers=1, script=reply("Hi.")) as fe:
        plain = await sdk(fe).responses.create(model="dyn-tiny", input="x")
        r = await fe.client.get(f"/v1/responses/{plain.id}?{query}")
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


async def test_input_items_limit_takes_ascii_digits_only(make_frontend):
    async with make_frontend(workers=1, script=reply("Hi.")) as fe:
        plain = await sdk(fe).responses.create(model="dyn-tiny", input="x")
        r = await fe.client.get(f"/v1/responses/{plain.id}/input_items?limit=%C2%B2")
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit"


async def test_deleting_one_forgets_its_events(make_frontend):
    async with make_frontend(workers=1, script=reply("Hi.")) as fe:
        client = sdk(fe)
        first = [e async for e in await client.responses.create(**BODY)]
        await client.responses.delete(first[0].response.id)
    assert not fe.app.background_responses._logs and fe.app.background_responses.log_bytes == 0
