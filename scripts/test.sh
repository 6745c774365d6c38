#!/usr/bin/env bash
# Run the tests: the suite (`python -m pytest -n 2`), then the live-engine tests on vLLM's and
# SGLang's CPU builds. Their venvs (scripts/provision_vllm_cpu.sh, then
# scripts/provision_sglang_cpu.sh; cached under ~/.cache/dyn) are provisioned in the background
# while the suite runs: cold, that is about 4 minutes of downloads and installs the suite would
# otherwise wait for. Exits with the first failing step's status; provisioning still running then
# is stopped (a venv cut short is rebuilt next time: it is stamped only when whole).
#
# With no argument (the README's test command, CI) the live-engine tests are each engine's own
# paths: vLLM's generate worker and `dyn serve --engine vllm`, SGLang's worker and sessions.
# `--all-engines` adds the rest: each engine's priority scheduling, vLLM with the model variants
# (vision, audio, LoRA, pooling, classification), its disaggregated pairs, its workers behind
# plane keys and in another network namespace, and SGLang's SIGTERM drain. They are most of the
# live-engine time (on a 2-core AMD EPYC machine all vLLM files took 10 minutes together, beside a
# 12-minute suite), and CI has 20 minutes for everything.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "") all=0 ;;
  --all-engines) all=1 ;;
  *) echo "usage: scripts/test.sh [--all-engines]" >&2; exit 2 ;;
esac
out=$(mktemp -d)
# in its own process group, so that stopping it stops every process it started
setsid bash -c 'scripts/provision_vllm_cpu.sh > "$1/vllm" && scripts/provision_sglang_cpu.sh > "$1/sglang"' \
  _ "$out" 2> "$out/log" &
provisioning=$!
# `|| true`: under set -e a failed kill (the group already gone) would turn the exit status into 1
trap 'kill -- -"$provisioning" 2>/dev/null || true; rm -rf "$out"' EXIT
python -m pytest -n 2
wait "$provisioning" || { cat "$out/log" >&2; echo "test.sh: provisioning the engine venvs failed" >&2; exit 1; }
cat "$out/log" >&2
vllm=$(cat "$out/vllm")
sglang=$(cat "$out/sglang")
# two test files at a time, the longest first (each file's engines stay in one process). The
# priority tests (marked all_engines) need a queue to form in one engine: with another file's
# engine busy beside it the test process starved until each request ended, so they run alone,
# under --all-engines
DYN_VLLM_VENV=$vllm DYN_SGLANG_VENV=$sglang python -m pytest -n 2 --dist loadfile -m "not all_engines" \
  tests/integration/test_vllm_serve.py \
  tests/integration/test_sglang_serve.py \
  tests/plugins/vllm/test_real_vllm.py \
  tests/cli/test_config_file.py::test_vllms_own_parser_reads_the_file_as_vllm_serve_config_would \
  tests/plugins/vllm/test_flag_table.py \
  tests/core/parsers/test_vllm_plugin_real.py \
  tests/integration/test_vllm_tool_parser_plugin.py \
  tests/plugins/sglang/test_constraints.py
if [ "$all" = 1 ]; then
  DYN_VLLM_VENV=$vllm python -m pytest -m all_engines tests/integration/test_vllm_serve.py
  DYN_SGLANG_VENV=$sglang python -m pytest -m all_engines tests/integration/test_sglang_serve.py
  DYN_VLLM_VENV=$vllm python -m pytest -n 2 --dist loadfile \
    tests/integration/test_vllm_multimodal.py \
    tests/integration/test_vllm_disagg.py \
    tests/plugins/vllm/test_real_vllm_disagg.py \
    tests/integration/test_netns.py \
    tests/integration/test_vllm_classify.py \
    tests/plugins/vllm/test_real_vllm_multimodal.py \
    tests/plugins/vllm/test_real_vllm_image_counts.py \
    tests/plugins/vllm/test_real_vllm_written_images.py \
    tests/plugins/vllm/test_real_vllm_gemma3.py \
    tests/plugins/vllm/test_real_vllm_video.py \
    tests/integration/test_vllm_lora.py \
    tests/plugins/vllm/test_real_vllm_audio.py \
    tests/plugins/vllm/test_real_vllm_lora.py \
    tests/integration/test_vllm_plane_keys.py \
    tests/integration/test_embeddings.py::test_vllm_pooling_worker_embeds_through_the_openai_client
fi
