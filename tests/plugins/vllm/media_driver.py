"""What the drivers of the real-vLLM media tests (test_real_vllm_multimodal.py,
test_real_vllm_audio.py, test_real_vllm_image_counts.py, test_real_vllm_written_images.py,
test_real_vllm_gemma3.py, test_real_vllm_video.py) share. Runs on the vLLM venv's Python: each test copies this file beside
its driver (``copy_beside``), which imports it as ``media_driver``. A driver starts ``VllmEngine``
(the worker's engine, no request plane), sends ``GenerateRequest``s as dyn's frontend would
(``run``), and prints what the test checks (``drive``)."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any


def copy_beside(root: Path) -> None:
    """Put this module in ``root``, the directory ``tests.vllm_cpu.run_driver`` runs a driver in."""
    shutil.copy(Path(__file__), root / "media_driver.py")


def replay(endpoint: str) -> list[bytes]:
    """Every batch in vLLM's KV-event replay buffer, as payloads."""
    import zmq

    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    poller, out = zmq.Poller(), []
    poller.register(dealer, zmq.POLLIN)
    while True:
        if not poller.poll(5000):
            raise TimeoutError("vLLM's replay socket did not answer")
        frames = dealer.recv_multipart()
        if int.from_bytes(frames[-2], "big", signed=True) == -1:
            break
        out.append(frames[-1])
    dealer.close()
    return out


def settled_replay(endpoint: str, timeout_s: float = 10) -> list[bytes]:
    """``replay`` once two in a row agree: the publisher thread may still be sending the last."""
    batches, deadline = replay(endpoint), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.3)
        again = replay(endpoint)
        if len(again) == len(batches):
            break
        batches = again
    return batches


def png(color: tuple[int, int, int] = (90, 60, 30), size: tuple[int, int] = (40, 30)) -> bytes:
    """A PNG of one ``color``, ``size`` (width, height) pixels (Pillow is on the vLLM venv)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


def item(
    data: bytes,
    offset: int,
    length: int,
    modality: str = "image",
    mime: str = "image/png",
    source: list[int] | None = None,
) -> Any:
    """A ``MediaItem`` as the frontend makes it: ``mm_hash`` the SHA-256 of ``data``."""
    from dyn.core.messages import MediaItem

    return MediaItem(modality, data, mime, hashlib.sha256(data).hexdigest(), offset, length, source or [])


async def run(engine: Any, rid: str, tokens: list[int], media: list[Any], max_tokens: int) -> dict[str, Any]:
    """One greedy request: ``{"rid", "tokens", "finish": {"reason", "usage": {"prompt_tokens",
    "cached_tokens"}}}``, or ``"error": {"code", "message"}`` when the engine refuses it."""
    from dyn.core.engine import EngineError
    from dyn.core.messages import Finish, GenerateRequest, SamplingParams, StopConditions, TokenChunk

    request = GenerateRequest(
        rid,
        tokens,
        sampling=SamplingParams(temperature=0.0),
        stop=StopConditions(max_tokens=max_tokens, ignore_eos=True),
        media=media,
    )
    out: dict[str, Any] = {"rid": rid, "tokens": []}
    try:
        async for message in engine.generate(request):
            if isinstance(message, TokenChunk):
                out["tokens"] += message.token_ids
            elif isinstance(message, Finish):
                usage = {
                    "prompt_tokens": message.usage.prompt_tokens,
                    "cached_tokens": message.usage.cached_tokens,
                }
                out["finish"] = {"reason": message.reason, "usage": usage}
    except EngineError as exc:
        out["error"] = {"code": exc.code, "message": str(exc)}
    return out


async def drive(model: str, config: Any, requests: Callable[[Any], Awaitable[dict[str, Any]]]) -> None:
    """Start ``VllmEngine`` on ``model`` with ``config`` (a ``VllmConfig``), await
    ``requests(engine)``, and print its results with the engine's ``features`` and every KV-event
    batch vLLM published (``batches``, base64) as one ``RESULT {json}`` line; then stop vLLM."""
    import base64

    import anyio

    from dyn.plugins.vllm.engine import VllmEngine

    engine = VllmEngine(config, model)
    async with anyio.create_task_group() as tg:
        await tg.start(engine.run)
        results = await requests(engine)
        batches = settled_replay(engine.info.kv_replay_endpoint)
        result = {
            "features": engine.info.features,
            "block_size": engine.info.block_size,
            **results,
            "batches": [base64.b64encode(payload).decode() for payload in batches],
        }
        print("RESULT " + json.dumps(result), flush=True)
        tg.cancel_scope.cancel()


# ---------------------------------------------------------------- reading a result, on the test's side


def runs(result: dict) -> dict[str, dict]:
    """The result's requests by their ``rid``."""
    return {run["rid"]: run for run in result["runs"]}


def raw_stored(result: dict) -> list[dict]:
    """vLLM's ``BlockStored`` events as it sent them (maps), without dyn's decoder."""
    import base64

    import msgspec

    events = []
    for payload in result["batches"]:
        events += [
            e for e in msgspec.msgpack.decode(base64.b64decode(payload))[1] if e["type"] == "BlockStored"
        ]
    return events
