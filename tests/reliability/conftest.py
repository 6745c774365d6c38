"""The reliability tests start real stacks with the integration tests' fixtures (``dyn_process``,
``stack_factory``, ``stack``), loaded from ``tests/integration/conftest.py``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "dyn_integration_fixtures", Path(__file__).parent.parent / "integration" / "conftest.py"
)
integration = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(integration)

dyn_process = integration.dyn_process
stack_factory = integration.stack_factory
stack = integration.stack
