#!/usr/bin/env bash
# Quantized weights on the GPU (issue 6), one device call: the parity tests (cuda_qops_test,
# cuda_quantized_model_test, and the dense matmul/embedding tests of cuda_ops_test), the GEMV
# micro-benchmark (cuda_qgemv_bench), then llama-3-8b: `kiln synth` (bf16) + `kiln convert -q
# --q-bits 4 --q-group-size 64` on the device machine (16 GB + 4.5 GB of disk; runs in the background
# while the tests and the micro-benchmark use the GPU), batch-1 decode and prefill at 2048 of both
# folders through model_bench, and a per-op profile of the 4-bit decode.
#   scripts/device-quant.sh pack [BUILD_DIR]   here: fills .devcarry-q (binaries, libraries, stories260K)
#   scripts/device-quant.sh run [tests|bench|all]   on the device (carry .devcarry-q); logs in $OUT
set -uo pipefail
cd "$(dirname "$0")/.."
C=.devcarry-q
. scripts/device-lib.sh
if [ "${1:-}" = pack ]; then
  set -e
  carry_pack "$C" "${2:-build-cudaq}" yes kiln tests/cuda_qops_test tests/cuda_quantized_model_test tests/cuda_ops_test \
    bench/cuda_qgemv_bench bench/model_bench
  exit 0
fi
[ "${1:-}" = run ] || { echo "usage: $0 pack [BUILD_DIR] | run [tests|bench|all]" >&2; exit 2; }
what=${2:-all}
C=$PWD/$C
OUT=${OUT:-/tmp/out}
X=/tmp/kiln-q-carry  # the unpacked executables: $X/bin
mkdir -p "$OUT"
carry_unpack "$C" "$X"
export LD_LIBRARY_PATH=$CARRY_LD_PATH
export KILN_SHARED_DIR=$C/shared
M=/tmp/kiln-q-models
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
status=0
if [ "$what" = bench ] || [ "$what" = all ]; then  # CPU-bound preparation in the background
  mkdir -p "$M"
  ( "$X/bin/kiln" synth --shape llama-3-8b --out "$M/bf16" --dtype bf16 --force &&
    echo "synth done $(( $(date +%s) - t0 )) s" &&
    "$X/bin/kiln" convert --hf-path "$M/bf16" --mlx-path "$M/q4" -q --q-bits 4 --q-group-size 64 --force &&
    echo "convert done $(( $(date +%s) - t0 )) s" ) > "$OUT/prepare.log" 2>&1 &
  prep=$!
fi
if [ "$what" = tests ] || [ "$what" = all ]; then
  # 4-bit weights: the tensor-core GEMV by default, the CUDA-core kernel with KILN_CUDA_QGEMV=ffma.
  for t in cuda_qops_test cuda_quantized_model_test "ffma cuda_qops_test" "ffma cuda_quantized_model_test" \
          ; do
    el "=== $t"
    env=""; [ "${t%% *}" = ffma ] && { env="KILN_CUDA_QGEMV=ffma"; t=${t#ffma }; }
    env $env timeout 150 $X/bin/$t 2>&1 | tee -a "$OUT/tests.log" |
      grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED|Failure|error|Expected|Which is|rel-L2|max error|knife-edge|stories260K on CUDA|bits=" | head -n 40
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  el "=== cuda_qgemv_bench"
  timeout 120 "$X/bin/cuda_qgemv_bench" --reps 20 > "$OUT/qgemv.txt" 2>&1 || status=1
  grep -v '^{' "$OUT/qgemv.txt"
  el "waiting for synth + convert"
  wait $prep || { echo "synth/convert failed"; status=1; }
  cat "$OUT/prepare.log" | tr '\r' '\n' | grep -v "^\s*$" | tail -n 4
  du -sh "$M"/* 2>/dev/null
  el "=== model_bench 4-bit g64"
  timeout 150 "$X/bin/model_bench" --device cuda --model "$M/q4" --repeat 2 --plan "1:2048:2,1:128:129,8:128:65" \
    2>"$OUT/q4.err" | tee "$OUT/model_bench.jsonl" || status=1
  el "=== profile 4-bit decode"
  KILN_CUDA_PROFILE=1 timeout 60 "$X/bin/model_bench" --device cuda --model "$M/q4" --repeat 1 --plan "1:128:33" \
    > /dev/null 2> "$OUT/profile.txt"
  grep -E "op|%" "$OUT/profile.txt" | tail -n 20
  el "=== model_bench bf16"
  timeout 120 "$X/bin/model_bench" --device cuda --model "$M/bf16" --repeat 2 --plan "1:128:129" \
    2>"$OUT/bf16.err" | tee -a "$OUT/model_bench.jsonl" || status=1
  el "done"
fi
exit $status
