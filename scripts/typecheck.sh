#!/usr/bin/env bash
# Type-checks the packages dyn.cli, dyn.core and dyn.plugins with mypy and the repository's
# [tool.mypy] configuration (which also says which optional engine packages it does not look for).
# The source tree maps dyn.core -> core/ (pyproject's package-dir), which mypy cannot follow, so the
# check runs in a temporary tree dyn/{core,cli,plugins} of symlinks (dyn is a namespace package).
# Errors name the repository's paths (core/x.py); the exit status is mypy's. mypy's cache lives in
# that temporary tree and goes with it: a cache kept between runs once reported a module added since
# as missing (the stub core/kv/_radix.pyi), and a fresh check takes about 16 s here.
# Extra arguments go to mypy (e.g. --no-incremental). Run it with the Python environment dyn is
# installed in.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tree="$(mktemp -d)"
cache="$tree/.mypy_cache"
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
