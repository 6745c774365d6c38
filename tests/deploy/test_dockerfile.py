"""deploy/Dockerfile, checked without Docker: what it copies into the image is exactly what its
.dockerignore lets into the build context, and `pip install .` builds dyn from those files alone
(the same offline wheel build as tests/test_packaging.py, from the Dockerfile's list)."""

from __future__ import annotations

import zipfile

from tests.deploy.stacks import DEPLOY, REPO
from tests.wheel import wheel_from

DOCKERFILE = DEPLOY / "Dockerfile"


def copied() -> set[str]:
    """The sources of the Dockerfile's COPY instructions."""
    sources: set[str] = set()
    for line in DOCKERFILE.read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"]:
            sources.update(w.rstrip("/") for w in words[1:-1] if not w.startswith("--"))
    return sources


def test_the_build_context_admits_exactly_what_the_dockerfile_copies():
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    rules = [line.strip() for line in ignore if line.strip() and not line.startswith("#")]
    assert rules[0] == "*", "everything is left out unless named"
    admitted = {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")}
    assert admitted == copied()
    assert all((REPO / source).exists() for source in copied())


def test_the_image_runs_dyn_as_an_unprivileged_user():
    lines = [
        line.split() for line in DOCKERFILE.read_text().splitlines() if line and not line.startswith("#")
    ]
    instructions = [words for words in lines if words and words[0].isupper()]
    assert ["USER", "1000:1000"] in instructions, "the manifests' runAsUser and fsGroup are 1000"
    assert instructions[-2][0] == "ENTRYPOINT" and instructions[-2][1:] == ['["dyn"]']


def test_pip_builds_dyn_from_the_files_the_dockerfile_copies(tmp_path):
    wheel = wheel_from(copied(), tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(archive.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert "dyn = dyn.cli.app:main" in entry_points
    assert any(n.startswith("dyn/core/model/dyn-tiny/") and n.endswith(".json") for n in names)
    assert any(n.startswith("dyn/plugins/mocker/") for n in names)
