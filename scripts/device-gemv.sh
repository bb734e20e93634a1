#!/usr/bin/env bash
# The batch-1 GEMV kernels of gemv_fast.cu / qgemv_fast.cu against the default ones, one device call:
# parity tests with the new kernels selected (KILN_CUDA_GEMV=fast, KILN_CUDA_QGEMV=fast), the GEMV
# micro-benchmark (cuda_qgemv_bench, bf16 and 4-bit g64 at batch 1) old vs new, then llama-3-8b
# (`kiln synth` bf16 + `kiln convert -q --q-bits 4 --q-group-size 64`, prepared in the background)
# batch-1 decode through model_bench, old vs new ("old": KILN_CUDA_GEMV=old, the 4-bit default).
#   scripts/device-gemv.sh pack [BUILD_DIR]   here: fills .devcarry-g (binaries, libraries, stories260K)
#   scripts/device-gemv.sh run                on the device (carry .devcarry-g); logs in $OUT
set -uo pipefail
cd "$(dirname "$0")/.."
C=.devcarry-g
. scripts/device-lib.sh
if [ "${1:-}" = pack ]; then
  set -e
  carry_pack "$C" "${2:-build-gemv}" yes kiln tests/cuda_qops_test tests/cuda_quantized_model_test tests/cuda_ops_test \
    bench/cuda_qgemv_bench bench/model_bench
  exit 0
fi
[ "${1:-}" = run ] || { echo "usage: $0 pack [BUILD_DIR] | run" >&2; exit 2; }
C=$PWD/$C
OUT=${OUT:-/tmp/out}
X=/tmp/kiln-g-carry
mkdir -p "$OUT"
carry_unpack "$C" "$X"
export LD_LIBRARY_PATH=$CARRY_LD_PATH
export KILN_SHARED_DIR=$C/shared
M=/tmp/kiln-g-models
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
status=0
mkdir -p "$M"
( "$X/bin/kiln" synth --shape llama-3-8b --out "$M/bf16" --dtype bf16 --force &&
  echo "synth done $(( $(date +%s) - t0 )) s" &&
  "$X/bin/kiln" convert --hf-path "$M/bf16" --mlx-path "$M/q4" -q --q-bits 4 --q-group-size 64 --force &&
  echo "convert done $(( $(date +%s) - t0 )) s" ) > "$OUT/prepare.log" 2>&1 &
prep=$!
NEW="KILN_CUDA_GEMV=fast KILN_CUDA_QGEMV=fast"
for t in "new cuda_ops_test --gtest_filter=CudaOps.Matmul" "new cuda_qops_test" "new cuda_quantized_model_test" \
         "old cuda_ops_test --gtest_filter=CudaOps.Matmul" "old cuda_qops_test --gtest_filter=*Matmul*"; do
  el "=== $t"
  env="KILN_CUDA_GEMV=old"; [ "${t%% *}" = new ] && env=$NEW
  set -- ${t#* }
  env $env timeout 120 "$X/bin/$1" "${@:2}" 2>&1 | tee -a "$OUT/tests.log" |
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED|Failure|Expected|Which is|rel-L2|max error|knife-edge" | head -n 30
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done
for v in old new; do
  el "=== cuda_qgemv_bench ($v): bf16 and 4-bit, batch 1"
  env="KILN_CUDA_GEMV=old"; [ $v = new ] && env=$NEW
  for b in 16 4; do
    env $env timeout 90 "$X/bin/cuda_qgemv_bench" --reps 20 --bits $b --batch 1 > "$OUT/qgemv_${v}_$b.txt" 2>&1 || status=1
    grep -v '^{' "$OUT/qgemv_${v}_$b.txt" | grep -E "^\| (bf16|4) "
  done
done
el "waiting for synth + convert"
wait $prep || { echo "synth/convert failed"; status=1; }
tr '\r' '\n' < "$OUT/prepare.log" | grep -v "^\s*$" | tail -n 3
for m in bf16 q4; do
  for v in old new; do
    el "=== model_bench $m ($v)"
    env="KILN_CUDA_GEMV=old"; [ $v = new ] && env=$NEW
    env $env timeout 90 "$X/bin/model_bench" --device cuda --model "$M/$m" --repeat 2 --plan "1:128:129" \
      2>"$OUT/mb_${m}_$v.err" | tee "$OUT/mb_${m}_$v.jsonl" || status=1
  done
done
el "done"
exit $status
