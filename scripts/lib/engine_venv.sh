# shellcheck shell=bash
# Sourced by provision_vllm_cpu.sh and provision_sglang_cpu.sh. `finish_engine_venv VENV REPO
# [CONTEXT]` points VENV's dyn at REPO (a cached venv may have been built from another checkout)
# and makes VENV/models/dyn-tiny-llama (scripts/make_tiny_llama.py, CONTEXT tokens of context when
# given) unless its stamp says it was made from the same script, dyn-tiny files and context.
finish_engine_venv() {
  local venv=$1 repo=$2 context=${3:-}
  local stamp="$venv/models/.dyn-tiny-llama" want
  "$venv/bin/pip" install -qq --disable-pip-version-check --no-deps -e "$repo" >&2
  want=$(cat "$repo/scripts/make_tiny_llama.py" "$repo"/core/model/dyn-tiny/*.json | sha256sum | cut -c1-16)
  want=$want${context:+-$context}
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    # shellcheck disable=SC2086 # an empty CONTEXT is no argument
    "$venv/bin/python" "$repo/scripts/make_tiny_llama.py" "$venv/models/dyn-tiny-llama" $context >&2
    echo "$want" > "$stamp"
  fi
}
