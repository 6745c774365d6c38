#!/usr/bin/env bash
# Type-checks the packages dyn.cli, dyn.core and dyn.plugins with mypy and the repository's
# [tool.mypy] configuration (which also says which optional engine packages it does not look for).
# The source tree maps dyn.core -> core/ (pyproject's package-dir), which mypy cannot follow, so the
# check runs in a temporary tree dyn/{core,cli,plugins} of symlinks (dyn is a namespace package).
# Errors name the repository's paths (core/x.py); the exit status is mypy's. mypy's cache goes to
# ${XDG_CACHE_HOME:-~/.cache}/dyn/mypy (DYN_MYPY_CACHE_DIR overrides it), never into the repository.
# Extra arguments go to mypy (e.g. --no-incremental). Run it with the Python environment dyn is
# installed in.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${DYN_MYPY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dyn/mypy}"
mkdir -p "$cache"
tree="$(mktemp -d)"
trap 'rm -rf "$tree"' EXIT

mkdir "$tree/dyn"
for part in core cli plugins; do
    ln -s "$repo/$part" "$tree/dyn/$part"
done

cd "$tree"
status=0
python -m mypy --config-file "$repo/pyproject.toml" --cache-dir "$cache" "$@" -p dyn.cli -p dyn.core -p dyn.plugins \
    | sed -e 's#^dyn/\(core\|cli\|plugins\)/#\1/#' || status=${PIPESTATUS[0]}
exit "$status"
