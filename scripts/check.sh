#!/usr/bin/env bash
# The static checks CI runs before the tests: ruff's lint rules, ruff's formatting (check only; run
# `ruff format .` to apply it) and mypy on dyn.cli, dyn.core and dyn.plugins (scripts/typecheck.sh).
# Configuration: pyproject's [tool.ruff] and [tool.mypy]. Run it with the Python environment dyn is
# installed in; it exits non-zero on the first check that fails, after printing what to fix.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python -m ruff check .
python -m ruff format --check .
scripts/typecheck.sh
