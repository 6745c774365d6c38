#!/usr/bin/env bash
# Provision a venv that runs dyn's SGLang worker on a CPU-only x86_64 machine, and print its path.
#
#   VENV=$(scripts/provision_sglang_cpu.sh)   # then: $VENV/bin/python -m dyn.cli worker sglang --device cpu ...
#
# Everything comes from PyPI (and the torch wheels on this machine's disk); nothing is compiled:
# - torch==2.14.1 and torchvision==0.29.1, the versions SGLang pins (PyPI's builds link CUDA
#   libraries; they run on the CPU without a GPU);
# - sglang==$SGLANG_VERSION (default 0.5.23) with --no-deps, beside scripts/sglang_cpu/requirements.txt:
#   its dependencies less the CUDA-only kernel packages;
# - scripts/sglang_cpu/sgl_kernel, only where no `sgl_kernel` imports: SGLang's CPU engine imports
#   names from its CPU kernel package at module level but calls them only on its AMX paths, which it
#   turns on only when the compiled ops are registered; PyPI has no CPU build of those kernels (they
#   are built from SGLang's source), so this module lets the imports succeed and SGLang run its
#   torch-native paths (see the module's docstring);
# - dyn itself, editable, from this checkout;
# - $VENV/models/dyn-tiny-llama: the random-weight Llama of scripts/make_tiny_llama.py (hidden 64,
#   2 layers, dyn-tiny's tokenizer) with a 131072-token context, dyn-tiny's, so agents' prompts fit.
#
# The worker runs SGLang's CPU engine with `--device cpu` (dyn sets SGLANG_USE_CPU_ENGINE=1 for it).
# The venv is cached (default ${XDG_CACHE_HOME:-~/.cache}/dyn/sglang-cpu-<version>, or
# $DYN_SGLANG_VENV): a second run only reinstalls dyn from this checkout. Progress goes to stderr;
# stdout is the path. Runs at once share the cache under a lock (scripts/lib/cache_lock.sh).
# DYN_PROVISION_BUILD=CMD runs `CMD <venv>` instead of the install steps (the tests' way to exercise
# the cache and its lock without a download); CMD must leave a venv whose python imports sglang.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
version=${SGLANG_VERSION:-0.5.23}
venv=${DYN_SGLANG_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dyn/sglang-cpu-$version}
python=${PYTHON:-python3}
stamp="$venv/.dyn-sglang-cpu"
context=131072
want="sglang==$version torch==2.14.1 $(cat "$repo"/scripts/sglang_cpu/requirements.txt "$repo"/scripts/sglang_cpu/sgl_kernel/*.py | sha256sum | cut -c1-16)"
say() { echo "provision_sglang_cpu: $*" >&2; }

# shellcheck source=scripts/lib/cache_lock.sh
source "$repo/scripts/lib/cache_lock.sh"
# shellcheck source=scripts/lib/engine_venv.sh
source "$repo/scripts/lib/engine_venv.sh"
hold_cache_lock "$venv"

install_engine() {
  "$python" -m venv "$1"
  local pip=("$1/bin/pip" install -qq --disable-pip-version-check)
  "${pip[@]}" torch==2.14.1 torchvision==0.29.1 >&2
  "${pip[@]}" --no-deps "sglang==$version" >&2
  "${pip[@]}" -r "$repo/scripts/sglang_cpu/requirements.txt" torch==2.14.1 torchvision==0.29.1 >&2
  "${pip[@]}" -e "$repo" torch==2.14.1 >&2
  if ! "$1/bin/python" -c "import sgl_kernel" 2>/dev/null; then
    local site
    site=$("$1/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    cp -r "$repo/scripts/sglang_cpu/sgl_kernel" "$site/"
  fi
}
check_engine() { SGLANG_USE_CPU_ENGINE=1 "$1/bin/python" -c "import sglang, sglang.srt.entrypoints.engine" >&2; }
build_engine_venv "$venv" "$stamp" "$want" sglang "sglang $version; a few minutes and about 8 GB on a cold cache"
# dyn from this checkout; the tiny model, rewritten when its generator or dyn-tiny's files change
finish_engine_venv "$venv" "$repo" "$context"
echo "$venv"
