#!/usr/bin/env bash
# One sitting: every ratio against NVIDIA Dynamo 1.6.1 that docs/benchmarks.md states, measured
# back to back on one machine with nothing else running (issue 37 item 7). About 25 minutes.
#
#   ../shared/anchor/install.sh          # once: Dynamo 1.6.1's venv in /tmp/dyn-anchor
#   tests/perf/sitting.sh OUT_DIR        # each benchmark's output in OUT_DIR/<name>.txt
#
# The frontend against Dynamo and the floor (item 6), the agent APIs against chat and against
# Dynamo's Responses API (issue 32), the offline replay of a 4-worker and a 1,000-worker trace
# (item 3), and the prefix index at 10M blocks over 1,000 workers beside Dynamo's tree (item 2).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: tests/perf/sitting.sh OUT_DIR}
mkdir -p "$out"
python=${PYTHON:-python}

run() {
  local name=$1
  shift
  echo "== $name: $*  ($(date -u +%H:%M:%S))" | tee "$out/$name.txt"
  "$python" "$@" 2>&1 | tee -a "$out/$name.txt"
}

run frontend tests/perf/bench_vs_anchor.py --rounds 2 --requests 3000 --concurrency 32 128 \
  --rate 400 600 --floor --router-mode kv --port 18777
run agent_apis tests/perf/bench_agent_apis.py --rounds 2 --requests 2000 --concurrency 32 128 --port 18731
run replay_4 tests/perf/replay_vs_anchor.py --requests 2000 --duration 600 --num-workers 4 \
  --router-mode kv --rounds 5
run replay_1000 tests/perf/replay_vs_anchor.py --requests 100000 --duration 120 --num-workers 1000 \
  --router-mode kv --rounds 2
run indexer tests/perf/bench_indexer.py --workers 1000 --blocks 10000000 --queries 2000 --trees c
echo "== done ($(date -u +%H:%M:%S))"
