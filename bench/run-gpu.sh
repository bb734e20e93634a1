#!/usr/bin/env bash
# GPU benchmark of issue 5, one run (one device call): the machine's ceilings (device copy
# bandwidth, bf16 GEMM through kiln's backend), then on `kiln synth` llama-3-8b and qwen2.5-7b
# (bf16): prefill tok/s at 512/2048/8192 tokens, decode tok/s at batch 1/8/32/64/128, a per-op
# profile of decode, and the PyTorch peers (HF transformers; a CUDA-graph decode loop) in the same
# run. Prints the markdown tables of BENCHMARKS.md; raw results go to OUTDIR.
# Usage: bench/run-gpu.sh BIN_DIR OUTDIR   (BIN_DIR holds kiln, model_bench, cuda_ceiling_bench)
set -euo pipefail
# Kiln's executables may need carried shared libraries (KILN_LD_PATH, set by scripts/device-run.sh).
kl() { LD_LIBRARY_PATH=${KILN_LD_PATH:-${LD_LIBRARY_PATH:-}} "$@"; }
BIN=$1
OUT=$2
here=$(cd "$(dirname "$0")/.." && pwd)
PEERS=${KILN_SHARED_DIR:-$here/../shared}/bench
M=${KILN_BENCH_MODELS:-/tmp/kiln-bench-models}
mkdir -p "$M" "$OUT"
t0=$(date +%s)
for s in llama-3-8b qwen2.5-7b; do
  [ -f "$M/$s/config.json" ] || kl "$BIN/kiln" synth --shape "$s" --out "$M/$s" --dtype bf16 --force >/dev/null
done
echo "synth: $(( $(date +%s) - t0 )) s" >&2
kl "$BIN/cuda_ceiling_bench" | tee "$OUT/ceilings.json"
PLAN="1:512:2,1:2048:2,1:8192:2,1:128:257,8:128:129,32:128:129,64:128:129,128:128:129"
: > "$OUT/kiln.jsonl"
for s in llama-3-8b qwen2.5-7b; do
  kl "$BIN/model_bench" --device cuda --model "$M/$s" --repeat 2 --plan "$PLAN" | tee -a "$OUT/kiln.jsonl" || echo "model_bench $s failed" >&2
done
echo "kiln: $(( $(date +%s) - t0 )) s" >&2
# Where one decode step's time goes (graphs off while profiling: each op timed with events).
KILN_CUDA_PROFILE=1 kl "$BIN/model_bench" --device cuda --model "$M/llama-3-8b" --repeat 1 --plan "1:128:65" \
  > "$OUT/profile.jsonl" 2> "$OUT/profile.txt" || true
export PYTHONUNBUFFERED=1
( cd "$OUT" && COMPILE=0 timeout 300 python3 "$PEERS/peer_gpu.py" > peer_gpu.log 2>&1 ) || echo "peer_gpu.py failed" >&2
for s in llama-3-8b qwen2.5-7b; do
  ( cd "$OUT" && timeout 200 python3 "$PEERS/peer_torch_graph.py" "$s" > "peer_graph_$s.log" 2>&1 ) || echo "peer_torch_graph $s failed" >&2
done
echo "total: $(( $(date +%s) - t0 )) s" >&2
python3 "$here/bench/gpu_summary.py" "$OUT" | tee "$OUT/summary.md"
