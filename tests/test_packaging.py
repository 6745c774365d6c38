"""The distribution's package list matches the source folders, so normal installs ship everything,
and the wheel carries the man pages."""

import re
import tomllib
import zipfile
from pathlib import Path

from tests.wheel import wheel_from

ROOT = Path(__file__).resolve().parents[1]


def test_every_source_package_is_listed_and_every_listed_package_exists():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = config["package-dir"]
    on_disk = set()
    for name, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            on_disk.add(".".join([name, *rel.parts]))
    assert set(config["packages"]) == on_disk


def test_default_install_does_not_need_torch_or_engines():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {d.split(">")[0].split("=")[0].split("[")[0].strip().lower() for d in deps}
    assert not names & {"torch", "vllm", "sglang"}


def test_the_wheel_installs_every_man_page_under_share_man_man1(tmp_path):
    """``pip install`` of the wheel puts ``man/*.1`` in ``PREFIX/share/man/man1`` (a wheel's
    ``NAME.data/data/`` folder is installed at the prefix, PEP 427)."""
    wheel = wheel_from(("pyproject.toml", "README.md", "cli", "core", "plugins", "man"), tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    pages = {p.name for p in (ROOT / "man").glob("*.1")}
    assert "dyn.1" in pages and "dyn-worker-vllm.1" in pages
    data = {
        n.rpartition("/")[2] for n in names if re.fullmatch(r"dyn-[^/]+\.data/data/share/man/man1/[^/]+", n)
    }
    assert data == pages
