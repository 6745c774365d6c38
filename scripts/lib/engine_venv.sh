# shellcheck shell=bash
# Sourced by provision_vllm_cpu.sh and provision_sglang_cpu.sh. `finish_engine_venv VENV REPO
# [CONTEXT]` points VENV's dyn at REPO (a cached venv may have been built from another checkout)
# and makes VENV/models/dyn-tiny-llama (scripts/make_tiny_llama.py, CONTEXT tokens of context when
# given) unless its stamp says it was made from the same script, dyn-tiny files and context.
# `make_tiny_model VENV REPO NAME SCRIPT [ARG]` makes VENV/models/NAME with scripts/SCRIPT the same
# way (stamped VENV/models/.NAME).
# `build_engine_venv VENV STAMP WANT MODULE ABOUT` keeps VENV when STAMP holds WANT and VENV's python
# imports MODULE; else it rebuilds VENV from nothing (`$DYN_PROVISION_BUILD VENV` when set, else the
# caller's `install_engine VENV`), checks it with the caller's `check_engine VENV` and writes WANT
# to STAMP. ABOUT says what a build installs; progress goes to stderr through the caller's `say`.
finish_engine_venv() {
  local venv=$1 repo=$2 context=${3:-}
  "$venv/bin/pip" install -qq --disable-pip-version-check --no-deps -e "$repo" >&2
  make_tiny_model "$venv" "$repo" dyn-tiny-llama make_tiny_llama.py "$context"
}

make_tiny_model() {
  local venv=$1 repo=$2 name=$3 script=$4 arg=${5:-}
  local stamp="$venv/models/.$name" want
  # make_tiny_llama.py's Llama is in every tiny model
  want=$(cat "$repo/scripts/$script" "$repo/scripts/make_tiny_llama.py" "$repo"/core/model/dyn-tiny/*.json \
    | sha256sum | cut -c1-16)
  want=$want${arg:+-$arg}
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    # shellcheck disable=SC2086 # an empty ARG is no argument
    "$venv/bin/python" "$repo/scripts/$script" "$venv/models/$name" $arg >&2
    echo "$want" > "$stamp"
  fi
}

build_engine_venv() {
  local venv=$1 stamp=$2 want=$3 module=$4 about=$5
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$venv/bin/python" -c "import $module" 2>/dev/null; then
    say "cached venv $venv"
    return
  fi
  say "building $venv ($about)"
  rm -rf "$venv"
  if [ -n "${DYN_PROVISION_BUILD:-}" ]; then
    $DYN_PROVISION_BUILD "$venv" >&2
  else
    install_engine "$venv"
  fi
  check_engine "$venv"
  echo "$want" > "$stamp"
}
