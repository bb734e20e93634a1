#!/usr/bin/env bash
# Fills .devcarry/ (ignored by git) for scripts/device-run.sh: the executables of a CUDA build
# (default build-cuda, configured with -DKILN_CUDA=ON), the non-system shared libraries they need
# (the device machine lacks the Debian dev packages), the shared models and bench peers.
# Usage: [PREV=path/to/model_bench] scripts/device-pack.sh [BUILD_DIR]. With PREV (the baseline binary of
# device-run.sh's A/B modes, carried as model_bench_prev) only what `abtests` runs is packed: all of it
# with a second model_bench is over the device tool's 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/device-lib.sh
build=${1:-build-cuda}
trace=()  # the kernel tracer, where the build found CUPTI
[ -f "$build/bench/libkiln_kernel_trace.so" ] && trace=(bench/libkiln_kernel_trace.so)
tests=(tests/cuda_ops_test tests/cuda_qops_test tests/cuda_models_test tests/cuda_quantized_model_test
       tests/cuda_engine_test tests/cuda_sampling_test tests/cuda_speculative_test tests/cuda_kv_files_test)
if [ -n "${PREV:-}" ]; then
  strip -o "$build/bench/model_bench_prev" "$PREV"
  carry_pack .devcarry "$build" yes kiln "${tests[@]}" bench/model_bench bench/model_bench_prev
else
  carry_pack .devcarry "$build" yes kiln "${tests[@]}" bench/model_bench bench/cuda_ceiling_bench \
    bench/cuda_qgemv_bench bench/cuda_attn_bench bench/spec_bench bench/kv_tier_bench "${trace[@]}"
fi
# Every model (the greedy test runs them all) and the PyTorch peers.
cp -r ../shared/models/. .devcarry/shared/models/
cp -r ../shared/bench .devcarry/shared/bench
mkdir -p .devcarry/shared/fixtures/eval && cp -r ../shared/fixtures/eval/hellaswag .devcarry/shared/fixtures/eval/  # evalperf
du -sh .devcarry/*
