"""Fixtures of the SGLang plugin's tests: the fake ``sglang`` package, installed per test."""

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "dyn_tests_fake_sglang", Path(__file__).with_name("fake_sglang.py")
)
fake_sglang = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = fake_sglang
_spec.loader.exec_module(fake_sglang)


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def fake(monkeypatch):
    """The fake SGLang, importable as ``sglang`` during the test; returns its ``Control``."""
    return fake_sglang.install(monkeypatch)
