#!/usr/bin/env bash
# Type-checks the package dyn.core with mypy and the repository's [tool.mypy] configuration.
# The source tree maps dyn.core -> core/ (pyproject's package-dir), which mypy cannot follow, so the
# check runs in a temporary tree dyn/{core,cli,plugins} of symlinks (dyn is a namespace package).
# Errors name the repository's paths (core/x.py); the exit status is mypy's. mypy's cache stays in
# the repository's .mypy_cache (it ignores itself in git). Extra arguments go to mypy (e.g.
# --no-incremental). Run it with the Python environment dyn is installed in.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tree="$(mktemp -d)"
trap 'rm -rf "$tree"' EXIT

mkdir "$tree/dyn"
for part in core cli plugins; do
    ln -s "$repo/$part" "$tree/dyn/$part"
done

cd "$tree"
status=0
python -m mypy --config-file "$repo/pyproject.toml" --cache-dir "$repo/.mypy_cache" "$@" -p dyn.core \
    | sed -e 's#^dyn/\(core\|cli\|plugins\)/#\1/#' || status=${PIPESTATUS[0]}
exit "$status"
