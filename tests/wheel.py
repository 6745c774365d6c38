"""Build dyn's wheel from a chosen part of the repository, as pip builds it from a source tree that
holds only those files (the packaging and Dockerfile tests)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def wheel_from(names: Iterable[str], tmp_path: Path) -> Path:
    """The wheel ``pip wheel`` builds from a copy of the repository's top-level ``names`` (files
    or folders, without ``__pycache__``); fails the test with pip's output if it cannot."""
    source = tmp_path / "src"
    source.mkdir()
    for name in names:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, source / name)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["--wheel-dir", str(tmp_path / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (tmp_path / "dist").glob("dyn-*.whl")
    return wheel
