"""The mocker with a vision-language model: it takes ``GenerateRequest.media`` (its features say
``media``), caches the blocks an image's placeholder tokens fall in under the image's hash (a
repeated image is a cache hit, another image at the same token ids is not, from its first block
on, as vLLM's prefix cache behaves) and publishes them with vLLM's ``extra_keys``; a text-only
model and placeholders outside the prompt are refused."""

from __future__ import annotations

import hashlib

import anyio
import pytest

from dyn.core.engine import FEATURE_MEDIA, EngineError
from dyn.core.kv.events import BlockStored
from dyn.core.messages import Finish, GenerateRequest, MediaItem, SamplingParams, StopConditions
from dyn.core.model import load_model_info
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.engine import MockerEngine
from tests.media_models import IMAGE_TOKEN_ID, make_vision_model

pytestmark = pytest.mark.anyio
BS = 4


def image(data: bytes, offset: int, length: int = 4) -> MediaItem:
    return MediaItem("image", data, "image/png", hashlib.sha256(data).hexdigest(), offset, length)


PROMPT = [5, 6, 7, 8, 9, 10] + [IMAGE_TOKEN_ID] * 4 + list(range(20, 34))  # image in blocks 1 and 2


async def run(engine: MockerEngine, requests: list[GenerateRequest]) -> list[Finish | EngineError]:
    """Each request's ``Finish``, or the ``EngineError`` it was refused with."""
    finishes: list[Finish | EngineError] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(engine.run)
            for request in requests:
                try:
                    async for item in engine.generate(request):
                        if isinstance(item, Finish):
                            finishes.append(item)
                except EngineError as exc:
                    finishes.append(exc)
            tg.cancel_scope.cancel()
    return finishes


def request(rid: str, media: list[MediaItem]) -> GenerateRequest:
    return GenerateRequest(
        rid, PROMPT, SamplingParams(seed=1), StopConditions(max_tokens=2, ignore_eos=True), media=media
    )


async def test_images_are_cached_by_their_hash_and_published_with_extra_keys(tmp_path):
    events: list = []
    model = load_model_info(make_vision_model(tmp_path / "vlm"))
    cfg = MockerConfig(block_size=BS, num_gpu_blocks=64, speedup_ratio=1000)
    engine = MockerEngine(cfg, model, lambda evs, dp: events.append(evs))
    assert FEATURE_MEDIA in engine.info.features
    cat, dog = image(b"cat", 6), image(b"dog", 6)
    first, again, other = await run(engine, [request("a", [cat]), request("b", [cat]), request("c", [dog])])
    assert first.usage.cached_tokens == 0
    assert again.usage.cached_tokens == 20  # every full block but the last token's
    assert other.usage.cached_tokens == BS  # block 0 only: blocks 1 and 2 hold the other image
    stored = [e for evs in events for e in evs if isinstance(e, BlockStored)]
    keys = [k for e in stored for k in (e.extra_keys or [None] * len(e.block_hashes))]
    assert ((cat.mm_hash, 6),) in keys and ((dog.mm_hash, 6),) in keys
    by_block = stored[0].extra_keys
    assert by_block[0] is None and by_block[1] == by_block[2] == ((cat.mm_hash, 6),) and by_block[3] is None


async def test_media_a_model_cannot_take_or_cannot_place_is_refused(tmp_path):
    text_only = MockerEngine(MockerConfig(block_size=BS, speedup_ratio=1000), load_model_info(None, None))
    assert FEATURE_MEDIA not in text_only.info.features
    (refused,) = await run(text_only, [request("a", [image(b"cat", 6)])])
    assert isinstance(refused, EngineError) and "takes no images" in str(refused)
    vision = MockerEngine(
        MockerConfig(block_size=BS, speedup_ratio=1000), load_model_info(make_vision_model(tmp_path / "v"))
    )
    (refused,) = await run(vision, [request("b", [image(b"cat", 22)])])
    assert isinstance(refused, EngineError) and "outside the 24-token prompt" in str(refused)
