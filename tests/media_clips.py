"""Real video clips for the tests, written with OpenCV (the ``video`` extra, in the test extra too):
``clip`` makes one in any container dyn's frontend recognises."""

from __future__ import annotations

import tempfile
from pathlib import Path

CODECS = {"mp4": "mp4v", "mov": "mp4v", "avi": "MJPG", "mkv": "MJPG", "webm": "VP80"}
"""The codec each container is written with (ones the opencv-python-headless wheel's FFmpeg writes)."""


def clip(
    frames: int = 10, fps: float = 8.0, size: tuple[int, int] = (64, 48), container: str = "mp4"
) -> bytes:
    """A ``container`` clip of ``frames`` frames at ``fps``, ``size`` (width, height) pixels, each
    frame one grey level (the n-th ``20 * n`` modulo 256)."""
    import cv2
    import numpy as np

    width, height = size
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / f"clip.{container}"
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*CODECS[container]), fps, (width, height))
        assert writer.isOpened(), f"OpenCV cannot write {container}"
        for n in range(frames):
            writer.write(np.full((height, width, 3), 20 * n % 256, np.uint8))
        writer.release()
        return path.read_bytes()
