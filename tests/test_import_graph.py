"""Dependencies point down (issue 17, item 8): the import graph of the source tree, read with ``ast``.

Every ``import`` and ``from ... import`` counts, wherever it stands: at the top, inside a
function, under ``if TYPE_CHECKING``. Relative imports are resolved against the module's package.

- ``dyn.core.kv`` (the index, its ingestion and its views) imports no server above it: neither the
  router nor the frontend nor the indexer service; the router's worker pool reaches the ingestor
  through ``dyn.core.kv.membership``. The ``/kv/`` views a frontend and ``dyn router`` serve come
  from ``dyn.core.kv.views`` too: the frontend imports nothing of the indexer, the router only its
  client (``--use-remote-indexer``), never its service.
- No plugin imports the bench: the offline replay (``dyn.core.bench.replay``) drives a plugin's
  simulator through ``dyn.core.simulator``, never the other way round.
- The core imports no plugin and no command line; plugins import no command line.
- The router carries no HTTP type: ``dyn.core.router`` imports nothing of ``dyn.core.protocol``
  (the OpenAI and Anthropic wire shapes) or the frontend; the frontend turns them into router
  messages (``RouteRequest``, ``RouteSession``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"dyn.core": ROOT / "core", "dyn.plugins": ROOT / "plugins", "dyn.cli": ROOT / "cli"}

FORBIDDEN: list[tuple[str, tuple[str, ...]]] = [
    ("dyn.core.kv", ("dyn.core.router", "dyn.core.frontend", "dyn.core.indexer")),
    ("dyn.core.frontend", ("dyn.core.indexer",)),
    ("dyn.core.router", ("dyn.core.indexer.service", "dyn.core.protocol", "dyn.core.frontend")),
    ("dyn.plugins", ("dyn.core.bench",)),
    ("dyn.core", ("dyn.plugins", "dyn.cli")),
    ("dyn.plugins", ("dyn.cli",)),
]


def modules() -> Iterator[tuple[str, Path]]:
    """Every module of the source tree, by dotted name."""
    for package, root in PACKAGES.items():
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join([package, *parts]), path


def imported(module: str, source: str, *, is_package: bool = False) -> set[str]:
    """The dotted names ``module`` imports (for ``from a import b``: ``a`` and ``a.b``)."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            names.add(origin)
            names.update(f"{origin}.{alias.name}" for alias in node.names)
    return names


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def violations(module: str, names: set[str]) -> list[str]:
    """Each forbidden import of ``module``, as ``module -> name``."""
    found = []
    for importer, banned in FORBIDDEN:
        if within(module, importer):
            found += [f"{module} -> {name}" for name in sorted(names) if any(within(name, b) for b in banned)]
    return found


def test_the_tree_has_the_modules_the_rules_speak_of():
    names = {name for name, _ in modules()}
    for needed in (
        "dyn.core.kv.ingest",
        "dyn.core.kv.views",
        "dyn.core.kv.membership",
        "dyn.core.bench.replay",
        "dyn.core.simulator",
        "dyn.plugins.mocker.simulator",
        "dyn.core.router.pool",
    ):
        assert needed in names


def test_dependencies_point_down():
    found = []
    for name, path in modules():
        found += violations(name, imported(name, path.read_text(), is_package=path.name == "__init__.py"))
    assert found == [], "imports against the layering:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("module", "source", "bad"),
    [
        (
            "dyn.core.kv.ingest",
            (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from dyn.core.router.pool import WorkerPool\n"
            ),
            "dyn.core.router.pool",
        ),
        ("dyn.core.kv.views", "def f():\n    import dyn.core.frontend.server\n", "dyn.core.frontend.server"),
        ("dyn.core.kv.views", "from ..indexer import service\n", "dyn.core.indexer"),
        ("dyn.plugins.mocker.simulator", "from dyn.core import bench\n", "dyn.core.bench"),
        (
            "dyn.core.bench.replay",
            "from dyn.plugins.mocker.scheduler import Scheduler\n",
            "dyn.plugins.mocker.scheduler",
        ),
    ],
)
def test_the_check_sees_imports_wherever_they_stand(module, source, bad):
    assert f"{module} -> {bad}" in violations(module, imported(module, source))


def test_allowed_imports_pass():
    source = "from dyn.core.kv.indexer import RadixIndexer\nfrom . import hashing\nimport msgspec\n"
    assert violations("dyn.core.kv.views", imported("dyn.core.kv.views", source)) == []
    assert (
        violations(
            "dyn.core.bench.replay",
            imported("dyn.core.bench.replay", "from dyn.core.router.kv import KvRouter\n"),
        )
        == []
    )
