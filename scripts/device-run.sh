#!/usr/bin/env bash
# The whole GPU sequence for one device-tool call: machine facts, the GPU tests (ctest label
# `gpu`: backend-ops parity, every model's greedy tokens, engine graphs/allocations), then the GPU
# benchmark (bench/run-gpu.sh). The device machine has no dev packages, so everything is built on
# the dev machine and travels in .devcarry/ (scripts/device-pack.sh fills it):
#   .devcarry/bin.tar.xz  kiln, test and bench executables   .devcarry/lib   non-system shared libs
#   .devcarry/shared  copies of ../shared/models and ../shared/bench
# Usage (on the device): scripts/device-run.sh [tests|smoke|bench|all]   Logs go to $OUT (else /tmp/out).
set -uo pipefail
cd "$(dirname "$0")/.."
C=$PWD/.devcarry
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# Only kiln's executables see the carried libraries (python3 of the peers keeps the system ones).
. scripts/device-lib.sh
X=/tmp/kiln-carry  # the executables, unpacked from $C/bin.tar.xz: $X/bin
carry_unpack "$C" "$X"
export KILN_LD_PATH=$CARRY_LD_PATH
export KILN_SHARED_DIR=$C/shared
what=${1:-all}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
status=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  for t in cuda_ops_test cuda_models_test cuda_engine_test cuda_sampling_test; do
    echo "=== $t"
    LD_LIBRARY_PATH=$KILN_LD_PATH "$X/bin/$t" 2>&1 | tee -a "$OUT/tests.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED|Failure|error|knife-edge|prompt logits|greedy tokens|graph replays|rel-L2|max error|chi2" | head -n 60
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
fi
if [ "$what" = smoke ]; then  # the bench executables on the embedded model: quick, no synth
  LD_LIBRARY_PATH=$KILN_LD_PATH "$X/bin/cuda_ceiling_bench" || status=1
  LD_LIBRARY_PATH=$KILN_LD_PATH "$X/bin/model_bench" --device cuda --repeat 2 --plan "1:16:65,8:16:33,64:8:17" || status=1
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  # All raw files in /tmp/bench; the 8 that matter come back in $OUT (the tool's limit).
  bench/run-gpu.sh "$X/bin" /tmp/bench || status=1
  cat /tmp/bench/*.log > "$OUT/peer_logs.txt" 2>/dev/null
  for f in summary.md kiln.jsonl profile.txt ceilings.json peer_gpu.json peer_torch_graph_llama-3-8b.json \
           peer_torch_graph_qwen2.5-7b.json; do cp "/tmp/bench/$f" "$OUT/" 2>/dev/null; done
fi
exit $status
