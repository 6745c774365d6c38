"""The distribution's package list matches the source folders, so normal installs ship everything,
and the wheel carries the man pages."""

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

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
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for folder in ("cli", "core", "plugins", "man"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["--wheel-dir", str(tmp_path / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (tmp_path / "dist").glob("dyn-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    pages = {p.name for p in (ROOT / "man").glob("*.1")}
    assert "dyn.1" in pages and "dyn-worker-vllm.1" in pages
    data = {
        n.rpartition("/")[2] for n in names if re.fullmatch(r"dyn-[^/]+\.data/data/share/man/man1/[^/]+", n)
    }
    assert data == pages
