#!/usr/bin/env bash
# The GPU sequence for device-tool calls (one mode per call fits its 10-minute limit). The device
# machine has no dev packages, so everything is built on the dev machine and travels in .devcarry/
# (scripts/device-pack.sh fills it):
#   .devcarry/bin.tar.xz  kiln, test and bench executables   .devcarry/lib   non-system shared libs
#   .devcarry/shared  copies of ../shared/models and ../shared/bench
# Usage (on the device): scripts/device-run.sh MODE   Logs go to $OUT (else /tmp/out). MODE:
#   tests  every GPU test (ctest label `gpu`): backend-ops parity (dense and quantized; 4-bit both on
#          the tensor-core GEMV and, with KILN_CUDA_QGEMV=ffma, the CUDA-core one), every model's
#          greedy tokens (float and quantized), engine graphs/allocations, device sampling
#   perf   llama-3-8b (`kiln synth` bf16 + `kiln convert -q --q-bits 4 --q-group-size 64`, made in the
#          background): the GEMV micro-benchmark, prefill at 2048 and decode at batch 1-128 (bf16) and
#          1/8 (4-bit) with graph/allocation counts, per-op profiles (batch 1 bf16 and 4-bit, batch 128
#          decode, prefill 2048), and the CUDA-graph PyTorch peer in the same run
#   all    tests, then perf
#   bench  bench/run-gpu.sh: ceilings, both bf16 shapes, the PyTorch peers in the same run
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
kl() { LD_LIBRARY_PATH=$KILN_LD_PATH "$@"; }
what=${1:-tests}
M=${KILN_BENCH_MODELS:-/tmp/kiln-bench-models}
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
status=0
if [ "$what" = perf ] || [ "$what" = all ]; then  # CPU-bound preparation in the background while the GEMV benchmark runs
  mkdir -p "$M"
  ( kl "$X/bin/kiln" synth --shape llama-3-8b --out "$M/llama-3-8b" --dtype bf16 --force &&
    el "synth done" &&
    kl "$X/bin/kiln" convert --hf-path "$M/llama-3-8b" --mlx-path "$M/llama-3-8b-q4" -q --q-bits 4 \
      --q-group-size 64 --force && el "convert done" ) > "$OUT/prepare.log" 2>&1 &
  prep=$!
fi
if [ "$what" = tests ] || [ "$what" = all ]; then
  for t in cuda_ops_test cuda_qops_test "ffma cuda_qops_test" cuda_models_test cuda_quantized_model_test \
           cuda_engine_test cuda_sampling_test; do
    el "=== $t"
    env=""; [ "${t%% *}" = ffma ] && { env="KILN_CUDA_QGEMV=ffma"; t=${t#ffma }; }
    env $env LD_LIBRARY_PATH=$KILN_LD_PATH timeout 200 "$X/bin/$t" 2>&1 | tee -a "$OUT/tests.log" |
      grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED|Failure|error|Expected|Which is|knife-edge|rel-L2|max error|graph replays|chi2" |
      head -n 40
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
fi
if [ "$what" = perf ] || [ "$what" = all ]; then
  el "=== cuda_qgemv_bench (one decode step's projections)"
  for b in "16 1" "4 1" "4 8" "16 128"; do
    set -- $b
    kl timeout 90 "$X/bin/cuda_qgemv_bench" --reps 20 --bits $1 --batch $2 > "$OUT/qgemv_$1_$2.txt" 2>&1 || status=1
    grep -v '^{' "$OUT/qgemv_$1_$2.txt" | grep -E "^\| "
  done
  el "waiting for synth + convert"
  wait $prep || { echo "synth/convert failed"; status=1; }
  tr '\r' '\n' < "$OUT/prepare.log" | grep -v "^\s*$" | tail -n 3
  : > "$OUT/model_bench.jsonl"
  for mp in "llama-3-8b 1:2048:2,1:128:257,8:128:129,32:128:129,64:128:129,128:128:129" \
            "llama-3-8b-q4 1:2048:2,1:128:257,8:128:129"; do
    set -- $mp
    el "=== model_bench $1"
    [ -f "$M/$1/config.json" ] || continue
    kl timeout 200 "$X/bin/model_bench" --device cuda --model "$M/$1" --repeat 2 --plan "$2" 2>"$OUT/mb_$1.err" |
      tee -a "$OUT/model_bench.jsonl" || status=1
  done
  for p in "llama-3-8b 1:128:33" "llama-3-8b-q4 1:128:33" "llama-3-8b 128:1:33" "llama-3-8b 1:2048:1"; do
    set -- $p
    el "=== profile $1 $2 (graphs off, events around each op)"
    KILN_CUDA_PROFILE=1 kl timeout 90 "$X/bin/model_bench" --device cuda --model "$M/$1" --repeat 1 --plan "$2" \
      > /dev/null 2> "$OUT/profile_$1_${2//:/_}.txt"
    grep -E "%" "$OUT/profile_$1_${2//:/_}.txt" | tail -n 24
  done
  el "=== PyTorch CUDA-graph peer, llama-3-8b"
  ( cd "$OUT" && timeout 240 python3 "$KILN_SHARED_DIR/bench/peer_torch_graph.py" llama-3-8b > peer_graph.log 2>&1 ) ||
    echo "peer_torch_graph failed"
  tail -n 12 "$OUT/peer_graph.log"
fi
if [ "$what" = bench ]; then
  # All raw files in /tmp/bench; the ones that matter come back in $OUT (the tool's limit).
  bench/run-gpu.sh "$X/bin" /tmp/bench || status=1
  cat /tmp/bench/*.log > "$OUT/peer_logs.txt" 2>/dev/null
  for f in summary.md kiln.jsonl profile.txt ceilings.json peer_gpu.json peer_torch_graph_llama-3-8b.json \
           peer_torch_graph_qwen2.5-7b.json; do cp "/tmp/bench/$f" "$OUT/" 2>/dev/null; done
fi
el "done (status $status)"
exit $status
