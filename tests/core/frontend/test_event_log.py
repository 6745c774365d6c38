"""``EventLog``: a streamed background response's events, kept for readers that follow them from
any sequence number, and trimmed from the oldest when its owner's budget is reached; its
readers counted, and bounded per response by ``BackgroundResponses``."""

from __future__ import annotations

import anyio
import pytest

from dyn.core.frontend.apis.responses.background import MAX_READERS, BackgroundResponses
from dyn.core.frontend.apis.responses.event_log import EventLog
from dyn.core.frontend.apis.responses.store import ResponseStore
from dyn.core.protocol.errors import ApiError

pytestmark = pytest.mark.anyio


def event(seq: int) -> bytes:
    return b'event: e\ndata: {"sequence_number":%d}\n\n' % seq


ANNOTATION = b'event: request_id\n: "r1"\n\n'


async def read(log: EventLog, after: int) -> bytes:
    return b"".join([chunk async for chunk in log.follow(after)])


async def test_entries_are_numbered_events_and_annotations_ride_with_the_next_one():
    grown: list[int] = []
    log = EventLog(lambda _, n: grown.append(n))
    log.write(event(0) + event(1) + ANNOTATION)
    log.write(event(2))
    log.write(b"")
    log.close()
    assert log.entries == [event(0), event(1), ANNOTATION + event(2)]
    assert log.bytes == sum(grown) == sum(map(len, log.entries))
    assert await read(log, -1) == event(0) + event(1) + ANNOTATION + event(2)
    assert await read(log, 1) == ANNOTATION + event(2)
    assert await read(log, 2) == await read(log, 99) == b""


async def test_an_annotation_after_the_last_event_is_kept_at_close():
    log = EventLog()
    log.write(event(0) + ANNOTATION)
    log.close()
    log.write(event(1))  # after close: ignored
    assert log.entries == [event(0) + ANNOTATION]


async def test_readers_follow_a_running_log_until_it_closes():
    log = EventLog()
    log.write(event(0))
    got: dict[str, list[bytes]] = {"a": [], "b": []}

    async def follow(name: str, after: int) -> None:
        async for chunk in log.follow(after):
            got[name].append(chunk)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow, "a", -1)
            tg.start_soon(follow, "b", 0)
            await anyio.sleep(0.01)
            log.write(event(1) + event(2))
            await anyio.sleep(0.01)
            log.write(event(3))
            log.close()
    assert got["a"] == [event(0), event(1) + event(2), event(3)]
    assert got["b"] == [event(1) + event(2), event(3)]


async def test_trim_drops_the_oldest_but_keeps_an_open_logs_last_entry():
    log = EventLog()
    log.write(b"".join(event(i) for i in range(4)))
    size = len(event(0))
    assert log.trim(2 * size) == 2 * size and (log.first, log.end) == (2, 4)
    assert log.trim(0) == size and log.entries == [event(3)]  # open: the last stays
    assert await read(log, 0) == b""  # asks for entries no longer kept: ends at once
    log.close()
    assert await read(log, 2) == event(3)
    assert log.trim(0) == size and log.bytes == 0 and log.first == 4


async def test_readers_are_counted_and_a_response_takes_a_bounded_number():
    background = BackgroundResponses(ResponseStore())
    log = background._new_log("resp_1")
    log.write(event(0))

    async def follow() -> None:
        async for _ in background.events("resp_1", -1):
            pass

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for _ in range(MAX_READERS):
                tg.start_soon(follow)
            await anyio.sleep(0.01)
            assert log.readers == MAX_READERS
            with pytest.raises(ApiError) as full:
                background.events("resp_1", -1)
            assert full.value.status == 429
            log.close()
    assert log.readers == 0
