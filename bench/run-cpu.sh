#!/usr/bin/env bash
# CPU benchmark of issue 2, one run: this machine's memory bandwidth, then prefill and decode
# tok/s on the embedded stories260K and on a `kiln synth` llama-100m (bf16), with the
# decode rate as a fraction of the bandwidth bound (bytes read per token / bandwidth).
# Usage: bench/run-cpu.sh [BUILD_DIR]   (default build). Prints a markdown table.
set -euo pipefail
B=${1:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
models="$B/bench-models"
mkdir -p "$models"
[ -f "$models/llama-100m/config.json" ] || "$B/kiln" synth --shape llama-100m --out "$models/llama-100m" --dtype bf16 --force

bw=$("$B/bench/cpu_ops_bench" --bandwidth | sed -n 's/^memory read bandwidth.*: *\([0-9.]*\) GB\/s/\1/p')
echo "memory read bandwidth: ${bw} GB/s" >&2
s=$("$B/bench/model_bench" --prefill 256 --decode 128 --repeat 3)
l=$("$B/bench/model_bench" --model "$models/llama-100m" --prefill 512 --decode 32 --repeat 2)
python3 - "$bw" "$s" "$l" <<'PY'
import json, sys
bw = float(sys.argv[1]) * 1e9
print("| model | prefill tok/s | decode tok/s | bytes/token | bound tok/s | decode / bound |")
print("|---|---|---|---|---|---|")
for line in sys.argv[2:]:
    j = json.loads(line)
    bound = bw / j["bytes_per_decode_step"]
    name = j["model"].split("/")[-1]
    print(f"| {name} (prefill {j['prefill_tokens']}) | {j['prefill_tok_s']:.0f} | {j['decode_tok_s']:.1f} | "
          f"{j['bytes_per_decode_step']/1e6:.2f} MB | {bound:.1f} | {j['decode_tok_s']/bound:.0%} |")
PY
