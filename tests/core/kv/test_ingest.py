"""KV event ingestion: conversion to indexer operations, metrics, and subscriptions over real ZMQ.

The indexer is a small recording fake with RadixIndexer's writing API and statuses (a store
whose parent this worker does not hold is refused, removing an unknown block is reported), so
out-of-order or duplicated delivery shows up in its call log.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time

import anyio
import anyio.lowlevel
import msgspec
import pytest
import zmq
from prometheus_client import CollectorRegistry

from dyn.core.kv.convert import (
    BatchConverter,
    KvEventMetrics,
    RejectReason,
    TieredIndexers,
    apply_event_batch,
)
from dyn.core.kv.events import (
    REPLAY_END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventBatch,
    StorageTier,
    decode_event_batch,
    decode_known_events,
    encode_event_batch,
    encode_seq,
    tier_of,
)
from dyn.core.kv.hashing import block_hashes, sequence_hashes
from dyn.core.kv.indexer import radix_indexer
from dyn.core.kv.ingest import KvEventIngestor, _LoopInbox
from dyn.core.kv.subscriber import DRAIN_BATCH, KvEventBounds, KvEventSubscriber
from dyn.core.kv.tiers import LowerTierIndexes, TierHits
from dyn.core.messages import WorkerEndpoints, WorkerRecord
from dyn.core.transport.event_plane import KvEventPublisher
from dyn.core.transport.sockets import bind_random, configure, sync_context

BS = 4


class ApplyStatus(enum.StrEnum):
    OK = "ok"
    PARENT_BLOCK_NOT_FOUND = "parent_block_not_found"
    BLOCK_NOT_FOUND = "block_not_found"
    INVALID_BLOCK = "invalid_block"


class RecordingIndexer:
    """Records every call; keeps each worker's set of block hashes to judge parents."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.blocks: dict[tuple[int, int], set[int]] = {}

    def store(self, worker, parent_hash, block_hashes, local_hashes):
        self.calls.append(("store", worker, parent_hash, list(block_hashes), list(local_hashes)))
        held = self.blocks.setdefault(worker, set())
        if parent_hash is not None and parent_hash not in held:
            return ApplyStatus.PARENT_BLOCK_NOT_FOUND
        held.update(block_hashes)
        return ApplyStatus.OK

    def remove(self, worker, block_hashes):
        self.calls.append(("remove", worker, list(block_hashes)))
        held = self.blocks.setdefault(worker, set())
        status = ApplyStatus.OK if all(h in held for h in block_hashes) else ApplyStatus.BLOCK_NOT_FOUND
        held.difference_update(block_hashes)
        return status

    def clear(self, worker):
        self.calls.append(("clear", worker))
        self.blocks[worker] = set()

    def remove_worker(self, instance_id):
        self.calls.append(("remove_worker", instance_id))
        for key in [k for k in self.blocks if k[0] == instance_id]:
            del self.blocks[key]

    def stored_hashes(self) -> list[int]:
        return [h for c in self.calls if c[0] == "store" for h in c[3]]


def applied(registry: CollectorRegistry, status: str, event_type: str) -> float:
    return registry.get_sample_value(
        "dynamo_component_kv_cache_events_applied_total", {"status": status, "event_type": event_type}
    )


def rejected(registry: CollectorRegistry, reason: str) -> float:
    return registry.get_sample_value("dynamo_component_kv_events_rejected_total", {"reason": reason})


def setup(lower=None, dp_rank=0):
    registry = CollectorRegistry()
    metrics = KvEventMetrics(registry)
    device = RecordingIndexer()
    indexers = TieredIndexers(device, metrics, lower)
    return registry, metrics, device, indexers, BatchConverter(7, BS, metrics, dp_rank)


def via_wire(value) -> KvEventBatch:
    batch, unknown = decode_known_events(msgspec.msgpack.encode(value))
    assert unknown == 0
    return batch


# --------------------------------------------------------------------------- conversion


@pytest.mark.parametrize(
    ("medium", "tier"),
    [
        (None, StorageTier.DEVICE),
        ("GPU", StorageTier.DEVICE),
        ("device", StorageTier.DEVICE),
        ("CPU_PINNED", StorageTier.HOST_PINNED),
        ("cpu_tier1", StorageTier.HOST_PINNED),
        ("CPU", StorageTier.HOST_PINNED),  # vLLM's CPU offloading
        ("STORAGE", StorageTier.DISK),  # vLLM's storage offloading
        ("CPU_TIER2", StorageTier.DISK),
        ("Disk", StorageTier.DISK),
        ("NVME", StorageTier.DISK),
        ("EXTERNAL", StorageTier.EXTERNAL),
        ("network", StorageTier.EXTERNAL),
        ("REMOTE", StorageTier.EXTERNAL),
        ("SHARED", StorageTier.EXTERNAL),
        ("TAPE", StorageTier.DEVICE),
    ],
)
def test_medium_maps_to_storage_tier(medium, tier):
    assert tier_of(medium) is tier


def test_vllm_batch_becomes_store_remove_clear_with_recomputed_local_hashes():
    registry, _, device, indexers, converter = setup()
    tokens = list(range(100, 108))
    payload = encode_event_batch(
        KvEventBatch(
            1.0,
            [
                BlockStored([11, 12], None, tokens, BS, None, "GPU", None),
                BlockStored([13], 12, [1, 2, 3, 4], BS),
                BlockRemoved([13]),
                AllBlocksCleared(),
            ],
            None,
        )
    )
    batch, _ = decode_known_events(payload)
    outcomes = apply_event_batch(batch, converter, indexers)
    assert outcomes == ["ok", "ok", "ok", "ok"]
    assert device.calls == [
        ("store", (7, 0), None, [11, 12], block_hashes(tokens, BS)),
        ("store", (7, 0), 12, [13], block_hashes([1, 2, 3, 4], BS)),
        ("remove", (7, 0), [13]),
        ("clear", (7, 0)),
    ]
    assert applied(registry, "ok", "stored") == 2
    assert applied(registry, "ok", "removed") == 1 and applied(registry, "ok", "cleared") == 1


def test_map_form_sglang_short_form_trailing_fields_and_signed_hashes():
    _, _, device, indexers, converter = setup()
    batch = via_wire(
        [
            2.0,
            [
                ["BlockStored", [-1], None, [1, 2, 3, 4], BS, None],  # SGLang: ends at lora_id
                ["BlockStored", [-2], -1, [5, 6, 7, 8], BS, None, "GPU", None, None, None, 0, "full", 0],
                {"type": "BlockRemoved", "block_hashes": [-2], "medium": "GPU", "group_idx": 3},
            ],
            None,
        ]
    )
    assert apply_event_batch(batch, converter, indexers) == ["ok", "ok", "ok"]
    top = 2**64
    assert device.calls == [
        ("store", (7, 0), None, [top - 1], block_hashes([1, 2, 3, 4], BS)),
        ("store", (7, 0), top - 1, [top - 2], block_hashes([5, 6, 7, 8], BS)),
        ("remove", (7, 0), [top - 2]),
    ]


def test_unknown_event_types_are_left_out_and_counted_apart():
    batch, unknown = decode_known_events(
        msgspec.msgpack.encode([1.0, [["KvCacheDefragmented", 1], ["BlockRemoved", [5]]], 0])
    )
    assert unknown == 1 and batch.events == [BlockRemoved([5])]  # a missing medium takes its default


def test_lower_tiers_go_to_their_indexer_or_are_rejected():
    host = RecordingIndexer()
    registry, _, device, indexers, converter = setup(lower={StorageTier.HOST_PINNED: host})
    batch = KvEventBatch(
        1.0,
        [
            BlockStored([1], None, [1, 2, 3, 4], BS, None, "CPU_PINNED"),
            BlockStored([2], None, [1, 2, 3, 4], BS, None, "DISK"),
            BlockRemoved([1], "cpu_tier1"),
        ],
    )
    outcomes = apply_event_batch(batch, converter, indexers)
    assert outcomes == ["ok", RejectReason.TIER_NOT_INDEXED, "ok"]
    assert [c[0] for c in host.calls] == ["store", "remove"] and device.calls == []
    assert rejected(registry, "tier_not_indexed") == 1


def lower_tier_setup(dp_rank: int = 0):
    """A converter for worker 7 into a real device index and real lower-tier indexes."""
    metrics = KvEventMetrics(CollectorRegistry())
    device, tiers = radix_indexer(), LowerTierIndexes()
    indexers = TieredIndexers(device, metrics)
    indexers.add_lower_tiers(tiers.writers())
    return device, tiers, indexers, BatchConverter(7, BS, metrics, dp_rank)


def test_a_vllm_batch_with_cpu_offloaded_blocks_reaches_the_host_tier():
    """vLLM 0.32's offloading connector publishes map-form events with medium "CPU" whose
    parent is the engine's hash of the block before, as for device blocks."""
    device, tiers, indexers, converter = lower_tier_setup()
    tokens = list(range(200, 216))  # 4 blocks
    batch = via_wire(
        [
            1.0,
            [
                {"type": "BlockStored", "block_hashes": [21, 22], "parent_block_hash": None,
                 "token_ids": tokens[:8], "block_size": BS, "lora_id": None, "medium": "GPU"},
                {"type": "BlockStored", "block_hashes": [23, 24], "parent_block_hash": 22,
                 "token_ids": tokens[8:], "block_size": BS, "lora_id": None, "medium": "CPU",
                 "lora_name": None, "group_idx": 0, "kv_cache_spec_kind": "full_attention"},
                {"type": "BlockRemoved", "block_hashes": [24], "medium": "CPU"},
            ],
            None,
        ]
    )  # fmt: skip
    assert apply_event_batch(batch, converter, indexers) == ["ok", "ok", "ok"]
    host = tiers.by_tier[StorageTier.HOST_PINNED]
    assert device.blocks_per_worker() == {(7, 0): 2} and host.blocks_per_worker() == {(7, 0): 1}
    local = block_hashes(tokens, BS)
    assert host.continuation((7, 0), 22, local, 2) == (1, 23)


def test_an_sglang_hicache_batch_reaches_host_disk_and_external_tiers_of_its_rank():
    """SGLang 0.5.23 writes ``[ts, events, attn_dp_rank]`` with map events carrying ``medium``
    (StorageMedium: CPU_PINNED, DISK, EXTERNAL) and its own extra keys (session_id, cache_salt)."""
    device, tiers, indexers, converter = lower_tier_setup()
    tokens = list(range(300, 320))  # 5 blocks

    def stored(hashes, parent, lo, hi, medium):
        return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
                "token_ids": tokens[lo * BS:hi * BS], "block_size": BS, "medium": medium,
                "session_id": "s1"}  # fmt: skip

    batch = via_wire(
        [
            3.0,
            [
                stored([-1, -2], None, 0, 2, "GPU"),
                stored([-3], -2, 2, 3, "CPU_PINNED"),
                stored([-4], -3, 3, 4, "DISK"),
                stored([-5], -4, 4, 5, "EXTERNAL"),
            ],
            1,
        ]
    )
    assert apply_event_batch(batch, converter, indexers) == ["ok"] * 4
    rank = (7, 1)
    assert device.blocks_per_worker() == {rank: 2}
    assert {t: dict(i.blocks_per_worker()) for t, i in tiers.by_tier.items()} == {
        StorageTier.HOST_PINNED: {rank: 1},
        StorageTier.DISK: {rank: 1},
        StorageTier.EXTERNAL: {rank: 1},
    }
    local = block_hashes(tokens, BS)
    seq = sequence_hashes(local)
    assert tiers.hits(device, local, seq, device.find_matches(local, seq)) == {rank: TierHits(1, 2)}


def test_block_size_mismatch_indexes_the_good_leading_blocks_only(caplog):
    registry, _, device, indexers, converter = setup()
    tokens = list(range(10))  # 2 full blocks of 4, then 2 tokens for the third
    with caplog.at_level(logging.WARNING, "dyn.core.kv.convert"):
        outcomes = apply_event_batch(
            KvEventBatch(
                1.0,
                [
                    BlockStored([1, 2, 3], None, tokens, BS),
                    BlockStored([4, 5], None, list(range(16)), 8),  # engine block size 8, router 4
                ],
            ),
            converter,
            indexers,
        )
        for _ in range(5):
            apply_event_batch(KvEventBatch(1.0, [BlockStored([6], None, [1], BS)]), converter, indexers)
    assert outcomes == ["ok", RejectReason.BLOCK_SIZE_MISMATCH]
    assert device.calls == [("store", (7, 0), None, [1, 2], block_hashes(tokens[:8], BS))]
    assert rejected(registry, "block_size_mismatch") == 1 + 2 + 5
    assert len([r for r in caplog.records if "not indexed" in r.message]) == 3


def test_an_offloading_placeholder_is_refused_alone_and_says_how_to_get_tokens(caplog):
    """vLLM's KV offloading sends ``BlockStored`` with block_size 0 and no tokens unless its
    connector is self-describing: that event alone is refused, the batch's others are indexed."""
    registry, _, device, indexers, converter = setup()
    tokens = list(range(4))
    raw = msgspec.msgpack.encode(
        [1.0, [["BlockStored", [9], None, [], 0, None, "CPU"], ["BlockStored", [1], None, tokens, BS, None]]]
    )
    with caplog.at_level(logging.WARNING, "dyn.core.kv.convert"):
        outcomes = apply_event_batch(decode_event_batch(raw), converter, indexers)
    assert outcomes == [RejectReason.BLOCK_SIZE_MISMATCH, "ok"]
    assert device.calls == [("store", (7, 0), None, [1], block_hashes(tokens, BS))]
    assert rejected(registry, "block_size_mismatch") == 1
    assert any("self_describing_kv_events" in r.message for r in caplog.records)


def test_lora_name_changes_local_hashes():
    _, _, device, indexers, converter = setup()
    tokens = [9, 8, 7, 6]
    apply_event_batch(
        KvEventBatch(
            1.0,
            [
                BlockStored([1], None, tokens, BS, None, "GPU", None),
                BlockStored([2], None, tokens, BS, None, "GPU", "my-lora"),
            ],
        ),
        converter,
        indexers,
    )
    plain, lora = device.calls[0][4], device.calls[1][4]
    assert plain == block_hashes(tokens, BS) and lora == block_hashes(tokens, BS, "my-lora")
    assert plain != lora


def test_batch_dp_rank_overrides_the_registered_one():
    _, _, device, indexers, converter = setup(dp_rank=1)
    apply_event_batch(KvEventBatch(1.0, [AllBlocksCleared()], 3), converter, indexers)
    apply_event_batch(KvEventBatch(1.0, [AllBlocksCleared()], None), converter, indexers)
    assert device.calls == [("clear", (7, 3)), ("clear", (7, 1))]


def test_indexer_statuses_are_counted_by_event_type():
    registry, _, _, indexers, converter = setup()
    outcomes = apply_event_batch(
        KvEventBatch(
            1.0,
            [
                BlockStored([2], 99, [1, 2, 3, 4], BS),
                BlockRemoved([42]),
            ],
        ),
        converter,
        indexers,
    )
    assert outcomes == ["parent_block_not_found", "block_not_found"]
    assert applied(registry, "parent_block_not_found", "stored") == 1
    assert applied(registry, "block_not_found", "removed") == 1
    assert applied(registry, "ok", "stored") == 0 and applied(registry, "invalid_block", "cleared") == 0


def test_with_the_real_radix_indexer():
    indexer_module = pytest.importorskip("dyn.core.kv.indexer")
    registry = CollectorRegistry()
    metrics = KvEventMetrics(registry)
    indexer = indexer_module.radix_indexer()
    indexers = TieredIndexers(indexer, metrics)
    converter = BatchConverter(7, BS, metrics)
    prompt = list(range(12))
    outcomes = apply_event_batch(
        KvEventBatch(
            1.0,
            [
                BlockStored([11, 12], None, prompt[:8], BS),
                BlockStored([13], 12, prompt[8:], BS),
                BlockStored([14], 99, [1, 2, 3, 4], BS),
                BlockRemoved([77]),
            ],
        ),
        converter,
        indexers,
    )
    assert outcomes == ["ok", "ok", "parent_block_not_found", "block_not_found"]
    # the router's own hashes of the prompt find the engine's blocks
    assert indexer.find_matches(block_hashes(prompt + [5], BS)) == {(7, 0): 3}
    apply_event_batch(KvEventBatch(1.0, [BlockRemoved([13])]), converter, indexers)
    assert indexer.find_matches(block_hashes(prompt, BS)) == {(7, 0): 2}
    indexers.remove_worker(7)
    assert indexer.find_matches(block_hashes(prompt, BS)) == {}
    assert applied(registry, "ok", "stored") == 2 and applied(registry, "ok", "removed") == 1


# --------------------------------------------------------------------------- subscriptions


def stored(k: int) -> BlockStored:
    """Batch k of a chain: one block whose parent is block k-1."""
    return BlockStored([1000 + k], 1000 + k - 1 if k else None, [k] * BS, BS)


class FakeEngine:
    """A worker's KV event plane whose live stream the test controls.

    A real ``KvEventPublisher`` keeps the replay buffer and serves replay; live frames go out on
    the test's own PUB, so a test can drop a seq, repeat one or send garbage.
    """

    def __init__(
        self,
        instance_id: int = 7,
        *,
        buffer_size: int = 1000,
        replay: bool = True,
        replay_endpoint: str | None = None,
    ) -> None:
        self.publisher = KvEventPublisher(buffer_size=buffer_size)
        self.pub = configure(sync_context().socket(zmq.PUB))
        endpoint = bind_random(self.pub, "127.0.0.1")
        if replay_endpoint is None and replay:
            replay_endpoint = self.publisher.replay_endpoint
        self.record = WorkerRecord(
            instance_id=instance_id,
            namespace="ns",
            model_name="m",
            engine="mocker",
            endpoints=WorkerEndpoints(
                request="tcp://127.0.0.1:9", kv_events=endpoint, kv_replay=replay_endpoint
            ),
            block_size=BS,
            total_kv_blocks=64,
            max_num_batched_tokens=64,
        )

    def publish(self, events: list, *, send: bool = True, dp_rank: int = 0) -> int:
        seq = self.publisher.publish(events, dp_rank)
        if send:
            payload = self.publisher.replay_from(seq)[0][1]
            self.send([b"kv-events", encode_seq(seq), payload])
        return seq

    def send(self, frames: list[bytes]) -> None:
        self.pub.send_multipart(frames)

    def close(self) -> None:
        self.pub.close(linger=0)
        self.publisher.close()


async def until(condition, timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.005)


async def go_live(engine: FakeEngine, indexer: RecordingIndexer, first: int) -> int:
    """Publish chain batches from ``first`` until one reaches the subscriber live (earlier ones
    then arrive through gap replay); returns the next chain index."""
    k = first
    with anyio.fail_after(5):
        while True:
            engine.publish([stored(k)])
            k += 1
            with anyio.move_on_after(0.05):
                await until(lambda k=k: 1000 + k - 1 in indexer.blocks.get((7, 0), set()))
                return k


def engine_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("kv-events-")]


@pytest.fixture(params=[1, 2], ids=["loop", "threads"])
def event_threads(request) -> int:
    return request.param


@pytest.mark.anyio
async def test_catch_up_replays_earlier_events_then_follows_live_without_duplicates(event_threads):
    engine = FakeEngine()
    engine.record.endpoints.kv_events = engine.publisher.endpoint  # the real publisher's PUB
    for k in range(3):
        engine.publisher.publish([stored(k)])
    registry = CollectorRegistry()
    indexer = RecordingIndexer()
    ingestor = KvEventIngestor(indexer, KvEventMetrics(registry), event_threads=event_threads)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.publisher.serve_replay)
            ingestor.add_worker(engine.record)
            await tg.start(ingestor.run)
            await until(lambda: 1002 in indexer.blocks.get((7, 0), set()))
            assert engine_threads() == (["kv-events-0", "kv-events-1"] if event_threads == 2 else [])
            k = 3
            while 1000 + k - 1 not in indexer.blocks[(7, 0)] or k < 6:
                engine.publisher.publish([stored(k)])
                k += 1
                await anyio.sleep(0.01)
            await until(lambda: indexer.stored_hashes() == [1000 + i for i in range(k)])
            tg.cancel_scope.cancel()
    assert applied(registry, "ok", "stored") == k
    assert rejected(registry, "replay_incomplete") == 0
    assert engine_threads() == []
    engine.close()


@pytest.mark.anyio
async def test_a_standalone_subscriber_is_started_once_its_catch_up_is_applied():
    engine = FakeEngine()
    for k in range(3):
        engine.publish([stored(k)], send=False)
    registry, metrics, device, indexers, _ = setup()
    subscriber = KvEventSubscriber(engine.record, indexers.apply, metrics)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.publisher.serve_replay)
            await tg.start(subscriber.run)
            assert device.stored_hashes() == [1000, 1001, 1002] and subscriber.last_seq == 2
            subscriber.cancel()
            tg.cancel_scope.cancel()
    assert applied(registry, "ok", "stored") == 3
    engine.close()


@pytest.mark.anyio
async def test_a_backlog_is_read_many_messages_per_event_loop_turn():
    """A busy process gives the subscriber one turn every few milliseconds: reading one message
    per turn, it fell behind a worker's passes for good (and its queue grew without bound)."""
    engine = FakeEngine()
    registry, metrics, device, indexers, _ = setup()
    subscriber = KvEventSubscriber(engine.record, indexers.apply, metrics)
    backlog = 300
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.publisher.serve_replay)
            await tg.start(subscriber.run)
            first = await go_live(engine, device, 0)
            for k in range(first, first + backlog):
                engine.publish([stored(k)])
            time.sleep(0.5)  # noqa: ASYNC251 - the loop is busy elsewhere; the batches queue up in the SUB
            last = 1000 + first + backlog - 1
            turns = 0
            while last not in device.blocks.get((7, 0), set()):
                await anyio.lowlevel.checkpoint()
                turns += 1
            subscriber.cancel()
            tg.cancel_scope.cancel()
    assert device.stored_hashes() == [1000 + k for k in range(first + backlog)]
    assert turns <= 3 * backlog // DRAIN_BATCH, turns
    engine.close()


@pytest.mark.anyio
async def test_catch_up_reads_vllm_replay_answers_that_carry_the_topic():
    """vLLM 0.32's ``ZmqEventPublisher._service_replay`` answers ``[id, b"", topic, seq, payload]``
    per batch and ``[id, b"", b"", -1, b""]`` at the end."""
    engine = FakeEngine(replay=False)
    router = configure(sync_context().socket(zmq.ROUTER))
    engine.record.endpoints.kv_replay = bind_random(router, "127.0.0.1")
    payloads = [engine.publisher.replay_from(engine.publish([stored(k)], send=False))[0][1] for k in range(3)]

    def serve_one_replay() -> None:
        client, _, start = router.recv_multipart()
        for seq in range(int.from_bytes(start, "big"), len(payloads)):
            router.send_multipart([client, b"", b"kv-events", seq.to_bytes(8, "big"), payloads[seq]])
        router.send_multipart([client, b"", b"", REPLAY_END_SEQ, b""])

    registry, metrics, device, indexers, _ = setup()
    subscriber = KvEventSubscriber(engine.record, indexers.apply, metrics)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, serve_one_replay)
            await tg.start(subscriber.run)
            assert device.stored_hashes() == [1000, 1001, 1002] and subscriber.last_seq == 2
            subscriber.cancel()
            tg.cancel_scope.cancel()
    assert rejected(registry, "bad_frames") == 0
    router.close(linger=0)
    engine.close()


@pytest.mark.anyio
async def test_dropped_seq_is_recovered_through_replay(event_threads):
    engine = FakeEngine()
    registry = CollectorRegistry()
    indexer = RecordingIndexer()
    ingestor = KvEventIngestor(indexer, KvEventMetrics(registry), event_threads=event_threads)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.publisher.serve_replay)
            await tg.start(ingestor.run)
            ingestor.add_worker(engine.record)
            k = await go_live(engine, indexer, 0)
            engine.publish([stored(k)], send=False)  # lost on the live stream
            engine.publish([stored(k + 1)], send=False)
            engine.publish([stored(k + 2)])
            await until(lambda: 1000 + k + 2 in indexer.blocks[(7, 0)])
            engine.publish([stored(k + 3)])
            await until(lambda: 1000 + k + 3 in indexer.blocks[(7, 0)])
            tg.cancel_scope.cancel()
    assert indexer.stored_hashes() == [1000 + i for i in range(k + 4)]
    assert applied(registry, "parent_block_not_found", "stored") == 0
    assert rejected(registry, "replay_incomplete") == 0
    engine.close()


@pytest.mark.anyio
async def test_unrecoverable_gap_is_counted_and_the_stream_goes_on(event_threads):
    engine = FakeEngine(buffer_size=2)
    registry = CollectorRegistry()
    indexer = RecordingIndexer()
    ingestor = KvEventIngestor(indexer, KvEventMetrics(registry), event_threads=event_threads)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.publisher.serve_replay)
            await tg.start(ingestor.run)
            ingestor.add_worker(engine.record)
            k = await go_live(engine, indexer, 0)
            before = rejected(registry, "replay_incomplete")  # catch-up or probing may roll over too
            for i in range(3):  # lost live; the buffer of 2 keeps only the last and the next
                engine.publish([stored(k + i)], send=False)
            engine.publish([BlockStored([5000], None, [1] * BS, BS)])
            await until(lambda: 5000 in indexer.blocks[(7, 0)])
            engine.publish([BlockStored([5001], 5000, [2] * BS, BS)])
            await until(lambda: 5001 in indexer.blocks[(7, 0)])
            tg.cancel_scope.cancel()
    assert rejected(registry, "replay_incomplete") == before + 1
    # replayed what the buffer still had, then went on
    assert indexer.stored_hashes()[-4:] == [1000 + k - 1, 1000 + k + 2, 5000, 5001]
    engine.close()


@pytest.mark.anyio
async def test_gap_without_replay_endpoint_or_with_a_silent_one_is_counted(event_threads):
    silent = configure(sync_context().socket(zmq.ROUTER))  # answers nothing
    silent_endpoint = bind_random(silent, "127.0.0.1")
    engines = [FakeEngine(7, replay=False), FakeEngine(8, replay_endpoint=silent_endpoint)]
    registry = CollectorRegistry()
    indexer = RecordingIndexer()
    ingestor = KvEventIngestor(
        indexer, KvEventMetrics(registry), event_threads=event_threads, replay_timeout=0.05
    )
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(ingestor.run)
            for engine in engines:
                ingestor.add_worker(engine.record)
            await until(lambda: rejected(registry, "replay_incomplete") == 1)  # 8's catch-up
            for iid, engine in zip((7, 8), engines):
                marker = 100 * iid
                with anyio.fail_after(5):  # until one arrives live
                    while (iid, 0) not in indexer.blocks:
                        engine.publish([BlockStored([marker], None, [1] * BS, BS)])
                        await anyio.sleep(0.02)
                base = rejected(registry, "replay_incomplete")
                engine.publish([BlockRemoved([marker])], send=False)
                engine.publish([BlockStored([marker + 1], None, [2] * BS, BS)])
                await until(lambda m=marker, i=iid: m + 1 in indexer.blocks[(i, 0)])
                assert rejected(registry, "replay_incomplete") == base + 1
                assert marker in indexer.blocks[(iid, 0)]  # the remove was lost
            tg.cancel_scope.cancel()
    for engine in engines:
        engine.close()
    silent.close(linger=0)


@pytest.mark.anyio
async def test_garbage_is_counted_and_the_subscription_survives(event_threads):
    engine = FakeEngine()
    registry = CollectorRegistry()
    indexer = RecordingIndexer()
    ingestor = KvEventIngestor(indexer, KvEventMetrics(registry), event_threads=event_threads)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.publisher.serve_replay)
            await tg.start(ingestor.run)
            ingestor.add_worker(engine.record)
            k = await go_live(engine, indexer, 0)
            engine.send([b"kv-events", encode_seq(99)])  # two frames
            engine.send([b"kv-events", b"\x01", b"\x90"])  # short seq frame
            bad = engine.publish([stored(k)], send=False)
            engine.send([b"kv-events", encode_seq(bad), b"\xc1 not msgpack"])  # uses up its seq
            odd = engine.publish([stored(k + 1)], send=False)
            engine.send(
                [
                    b"kv-events",
                    encode_seq(odd),
                    msgspec.msgpack.encode(
                        [1.0, [["FutureEvent", 1, 2], ["BlockStored", [2000], None, [3] * BS, BS]], 0]
                    ),
                ]
            )
            engine.publish([BlockStored([2001], 2000, [4] * BS, BS)])
            await until(lambda: 2001 in indexer.blocks[(7, 0)])
            tg.cancel_scope.cancel()
    assert rejected(registry, "bad_frames") == 2
    assert rejected(registry, "bad_payload") == 1
    assert rejected(registry, "unknown_event") == 1
    assert rejected(registry, "replay_incomplete") == 0
    assert 1000 + k not in indexer.blocks[(7, 0)]  # its payload was garbage on the live stream
    engine.close()


@pytest.mark.anyio
async def test_remove_worker_drops_its_blocks_and_late_hand_overs(event_threads):
    engines = [FakeEngine(7), FakeEngine(8)]
    registry = CollectorRegistry()
    indexer = RecordingIndexer()
    ingestor = KvEventIngestor(indexer, KvEventMetrics(registry), event_threads=event_threads)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for engine in engines:
                tg.start_soon(engine.publisher.serve_replay)
                engine.publisher.publish([BlockStored([engine.record.instance_id], None, [1] * BS, BS)])
            await tg.start(ingestor.run)
            for engine in engines:
                ingestor.add_worker(engine.record)
            await until(lambda: indexer.blocks.get((7, 0)) == {7} and indexer.blocks.get((8, 0)) == {8})
            old = ingestor.subscriber(7)
            ingestor.remove_worker(7)
            assert ingestor.subscriber(7) is None and (7, 0) not in indexer.blocks
            assert ("remove_worker", 7) in indexer.calls
            ops = BatchConverter(7, BS, ingestor.metrics).convert(
                KvEventBatch(1.0, [BlockStored([70], None, [1] * BS, BS)])
            )
            old._deliver(ops)  # a hand-over still in flight when the worker left
            await anyio.sleep(0.02)
            assert (7, 0) not in indexer.blocks
            tg.cancel_scope.cancel()
    for engine in engines:
        engine.close()


def test_a_worker_without_kv_events_is_skipped_and_pool_changes_are_followed(caplog):
    indexer = RecordingIndexer()
    ingestor = KvEventIngestor(indexer, KvEventMetrics(CollectorRegistry()), event_threads=1)
    engine = FakeEngine(7)
    quiet = msgspec.structs.replace(
        engine.record, instance_id=8, endpoints=WorkerEndpoints(request="tcp://127.0.0.1:9")
    )

    class Pool:
        def add_listener(self, listener):
            self.listener = listener

    class Worker:
        def __init__(self, record):
            self.record, self.instance_id = record, record.instance_id

    pool = Pool()
    ingestor.follow(pool)
    with caplog.at_level(logging.INFO, "dyn.core.kv.ingest"):
        pool.listener(Worker(quiet), True)
        pool.listener(Worker(engine.record), True)
    assert ingestor.subscriber(8) is None and ingestor.subscriber(7) is not None
    assert any("publishes no KV events" in r.message for r in caplog.records)
    pool.listener(Worker(engine.record), False)
    assert ingestor.subscriber(7) is None and ("remove_worker", 7) in indexer.calls
    with pytest.raises(ValueError, match="router-event-threads"):
        KvEventIngestor(indexer, KvEventMetrics(CollectorRegistry()), event_threads=0)
    engine.close()


@pytest.mark.anyio
async def test_the_routers_worker_pool_is_a_membership_the_ingestor_follows(tmp_path):
    """``WorkerPool`` satisfies ``dyn.core.kv.membership.Membership`` as it is: no adapter."""
    from dyn.core.router.pool import WorkerPool
    from tests.memory_discovery import memory_store

    indexer = RecordingIndexer()
    ingestor = KvEventIngestor(indexer, KvEventMetrics(CollectorRegistry()), event_threads=1)
    engine = FakeEngine(7)
    store = memory_store(tmp_path, "ns")
    await store.put(engine.record, ttl_s=30)
    pool = WorkerPool(store, "m")
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            ingestor.follow(pool)  # a current worker is followed at once
            assert ingestor.subscriber(7) is not None
            await store.delete(7)
            await until(lambda: ingestor.subscriber(7) is None)
            assert ("remove_worker", 7) in indexer.calls
            tg.cancel_scope.cancel()
    finally:
        engine.close()


class _NeverDrains:
    def call_soon_threadsafe(self, *args):
        pass


def test_inbox_keeps_order_and_close_releases_a_thread_held_by_backpressure(monkeypatch):
    got = []

    async def fill_from_a_thread():
        inbox = _LoopInbox(asyncio.get_running_loop(), lambda sub, ops: got.append(ops))
        monkeypatch.setattr(inbox, "HIGH_WATER", 3)
        await anyio.to_thread.run_sync(lambda: [inbox.put(None, [i]) for i in range(200)])
        await until(lambda: len(got) == 200)

    anyio.run(fill_from_a_thread)
    assert got == [[i] for i in range(200)]

    stuck = _LoopInbox(_NeverDrains(), lambda sub, ops: None)
    monkeypatch.setattr(stuck, "HIGH_WATER", 1)
    putter = threading.Thread(target=lambda: [stuck.put(None, [i]) for i in range(3)])
    putter.start()
    putter.join(0.05)
    assert putter.is_alive()  # held: nothing drains
    stuck.close()
    putter.join(5)
    assert not putter.is_alive()


# --------------------------------------------------------------------------- bounds from the record


def by_worker(registry: CollectorRegistry, worker: int, reason: str) -> float | None:
    return registry.get_sample_value(
        "dynamo_component_kv_events_rejected_by_worker_total", {"worker_id": str(worker), "reason": reason}
    )


def chain(first: int, blocks: int, parent: int | None) -> BlockStored:
    """``blocks`` new blocks with hashes from ``first``, each holding its own tokens."""
    hashes = list(range(first, first + blocks))
    return BlockStored(hashes, parent, [h for h in hashes for _ in range(BS)], BS)


def lower_chain(first: int, blocks: int, parent: int | None, medium: str) -> BlockStored:
    event = chain(first, blocks, parent)
    event.medium = medium
    return event


@pytest.mark.anyio
@pytest.mark.parametrize("capacity", [64, 0], ids=["record-with-capacity", "static-record"])
async def test_each_lower_tier_of_a_rank_is_bounded_whatever_its_record_says(capacity, monkeypatch):
    monkeypatch.setattr("dyn.core.kv.subscriber.LOWER_TIER_BLOCK_LIMIT", 10)
    engine = FakeEngine()
    engine.record = msgspec.structs.replace(engine.record, total_kv_blocks=capacity)
    engine.publish([chain(1, 20, None)], send=False)  # device: bounded by the record alone
    engine.publish([lower_chain(101, 6, 20, "CPU")], send=False)
    engine.publish([lower_chain(201, 6, 106, "CPU")], send=False)  # 12 > 10 host blocks: refused
    engine.publish([lower_chain(301, 8, 106, "DISK")], send=False)  # disk has its own bound
    engine.publish([lower_chain(401, 4, 106, "CPU")], send=False)  # 10: allowed
    registry = CollectorRegistry()
    device, tiers = radix_indexer(), LowerTierIndexes()
    ingestor = KvEventIngestor(device, KvEventMetrics(registry), lower_tiers=tiers.writers())
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.publisher.serve_replay)
            await tg.start(ingestor.run)
            ingestor.add_worker(engine.record)
            host = tiers.by_tier[StorageTier.HOST_PINNED]
            await until(lambda: host.blocks_held((7, 0)) == 10)
            tg.cancel_scope.cancel()
    assert device.blocks_held((7, 0)) == 20
    assert tiers.by_tier[StorageTier.DISK].blocks_held((7, 0)) == 8
    assert by_worker(registry, 7, "over_capacity") == 1
    engine.close()


def test_bounds_follow_the_record():
    engine = FakeEngine()
    bounds = KvEventBounds.of(engine.record)  # 64 blocks of 4 tokens, 1 rank
    assert bounds.dp_size == 1 and bounds.block_limit == 64 + 64
    assert bounds.max_message_bytes == (64 << 10) + 2 * 64 * (96 + 12 * 4)
    big = msgspec.structs.replace(engine.record, total_kv_blocks=16_384, block_size=16, dp_size=2)
    assert KvEventBounds.of(big).block_limit == 16_384 + 512 and KvEventBounds.of(big).dp_size == 2
    static = msgspec.structs.replace(engine.record, total_kv_blocks=0)
    assert KvEventBounds.of(static).block_limit is None and KvEventBounds.of(static).dp_size is None
    engine.close()


@pytest.mark.anyio
async def test_events_beyond_the_records_capacity_ranks_or_size_are_refused_and_counted(
    event_threads, caplog
):
    """Issue 16: forged events claimed 219,000 blocks for a worker advertising 16,384. Here the
    record advertises 64 blocks (limit 128 with the slack) and one rank."""
    engine = FakeEngine()
    ops = [
        [chain(1, 40, None)],
        [chain(41, 40, 40)],
        [chain(81, 40, 80)],  # 120 blocks
        [chain(121, 40, 120)],  # 160 > 128: refused
        [BlockRemoved(list(range(91, 121)))],  # 90 left
        [chain(201, 35, None)],  # 125
        [chain(301, 1, None)],  # dp rank 1: the record has one rank
        [chain(401, 2, None), chain(501, 2, None)],  # 127, then 129 > 128: one of two refused
    ]
    for i, events in enumerate(ops):
        engine.publish(events, send=False, dp_rank=1 if i == 6 else 0)
    registry = CollectorRegistry()
    indexer = radix_indexer()
    ingestor = KvEventIngestor(indexer, KvEventMetrics(registry), event_threads=event_threads)
    with caplog.at_level(logging.WARNING, "dyn.core"), anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.publisher.serve_replay)
            await tg.start(ingestor.run)
            ingestor.add_worker(engine.record)
            await until(
                lambda: indexer.blocks_held((7, 0)) == 127 and by_worker(registry, 7, "unknown_dp_rank") == 1
            )
            assert by_worker(registry, 7, "over_capacity") == 2
            assert rejected(registry, "over_capacity") == 2 and rejected(registry, "unknown_dp_rank") == 1
            assert indexer.blocks_per_worker() == {(7, 0): 127}
            warnings = [r.getMessage() for r in caplog.records if "of worker 7" in r.getMessage()]
            assert len(warnings) == 1 and "past the 128 its record allows" in warnings[0]

            # a message larger than 64 such blocks could fill is refused before decoding
            seq = engine.publisher.next_seq
            limit = ingestor.subscriber(7).bounds.max_message_bytes
            while by_worker(registry, 7, "too_large") is None:  # until the live SUB has joined
                engine.send([b"kv-events", encode_seq(seq), b"\xc1" * (limit + 1)])
                seq += 1
                await anyio.sleep(0.02)
            assert rejected(registry, "bad_payload") == 0
            tg.cancel_scope.cancel()
    ingestor.remove_worker(7)
    assert by_worker(registry, 7, "over_capacity") is None  # its series go with it
    engine.close()
