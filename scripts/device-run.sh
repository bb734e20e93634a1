#!/usr/bin/env bash
# The GPU sequence for device-tool calls (one mode per call fits its 10-minute limit). The device
# machine has no dev packages, so everything is built on the dev machine and travels in .devcarry/
# (scripts/device-pack.sh fills it):
#   .devcarry/bin.tar.xz  kiln, test and bench executables   .devcarry/lib   non-system shared libs
#   .devcarry/shared  copies of ../shared/models and ../shared/bench
# Usage (on the device): scripts/device-run.sh MODE   Logs go to $OUT (else /tmp/out). MODE:
#   tests  every GPU test (ctest label `gpu`): backend-ops parity (dense and quantized), every model's greedy
#          tokens (float and quantized), engine graphs/allocations, device sampling
#   micro  the machine's ceilings and the GEMV micro-benchmark (one decode step's projections)
#   prep   `kiln synth` llama-3-8b and qwen2.5-7b (bf16) and `kiln convert -q --q-bits 4 --q-group-size 64`
#          of llama-3-8b into $KILN_BENCH_MODELS (default /tmp/kiln-bench-models; kept while the machine is,
#          which is ~30 s after a call: most calls start a fresh one)
#   prepq  the same without qwen2.5-7b (all that q4perf needs)
#   perf   on those folders: prefill at 2048 and decode at batch 1-128 (bf16), 1-8 (4-bit), with graph and
#          allocation counts; per-op profiles; the CUDA-graph PyTorch peer for both shapes in the same run
#   q4perf on those folders: the 4-bit model (prefill 2048, decode batch 1/4/8) beside bf16 batch 1, and
#          the 4-bit per-op profile (a shorter perf for quantized-kernel work)
#   trace  prepq, then a kernel timeline of batch-1 decode (4-bit and bf16 llama-3-8b) under CUDA graphs:
#          bench/kernel_trace.cpp preloaded into model_bench, bench/kernel_timeline.py's summary of one step
#          (each kernel's exposed time); the traces come back as $OUT/trace_*.csv.xz
#   ab     a change's A/B: bench/model_bench of this build against the copy device-pack.sh carried as
#          model_bench_prev (PREV=path), alternating ROUNDS times (default 5) on a `kiln synth --q-bits 4`
#          llama-3-8b (batch-1 decode: the decoder stack), then both with the separate ops at batches 1/2/4
#   abtests  tests + ab (one call: a GPU change is measured and verified together)
#            AB_PLANS="MODEL=PLAN ..." picks the models and plans (default: llama-3-8b-q4s=1:128:257);
#            MODEL is llama-3-8b (bf16) or llama-3-8b-q4s (4-bit g64), both `kiln synth`
#   first  tests + micro + prep (one call);  second  perf (the next call, on the still-warm machine)
#   spec   tests, then speculative decoding (bench/spec_bench) on `kiln synth` llama-3-8b bf16: the verify
#          cost of n = 1..8 at batch 1/8/64, speed against acceptance (a replay draft paying a llama-1b
#          draft's cost), self-drafting (acceptance 1), prompt lookup on a repetitive prompt
#   kvtier tests, then the prefix cache's SSD tier (bench/kv_tier_bench) on `kiln synth` llama-3-8b bf16: TTFT of
#          2k/8k/32k-token prompts cold, RAM hit, SSD hit after a restart (page cache dropped where allowed),
#          decode with the tier on vs off
#   kvquant  tests, then the quantized KV cache (cuda_ops_test/cuda_kv_files_test hold its parity tests):
#          bench/cuda_attn_bench (decode at 4k/32k, batch 1/8: bf16 vs --kv-bits 8/4 caches), then model_bench
#          decode on `kiln synth` llama-3-8b bf16 at 4k and 32k contexts with --kv-bits 0/8/4 (graphs on)
#   evalperf  kiln evaluate's loglikelihood throughput on `kiln synth` llama-3-8b bf16: hellaswag (--limit 200,
#          800 requests, 4 endings per context) prefix-grouped at --batch-size 16 against the naive loop
#          (--batch-size 1 --no-prefix-grouping); the progress bar's final requests/s
#   grammar  tests, then structured output's decode cost: model_bench on `kiln synth` llama-3-8b bf16 at batch
#          1 and 64 (128-token prompts, 128 decoded) without and with bench/data/decode_schema.json, two
#          alternating rounds (the masks are computed on the host while the forward runs)
#   bench  bench/run-gpu.sh: ceilings, both bf16 shapes, the HF and CUDA-graph PyTorch peers
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
want() { for w in "$@"; do [ "$what" = "$w" ] && return 0; done; return 1; }
if want prep prepq first trace; then  # CPU-bound: in the background while the GPU runs the tests
  mkdir -p "$M"
  shapes="llama-3-8b qwen2.5-7b"
  [ "$what" = prep ] || [ "$what" = first ] || shapes=llama-3-8b
  ( for sh in $shapes; do
      [ -f "$M/$sh/config.json" ] || kl "$X/bin/kiln" synth --shape $sh --out "$M/$sh" --dtype bf16 --force
    done && el "synth done" &&
    kl "$X/bin/kiln" convert --hf-path "$M/llama-3-8b" --mlx-path "$M/llama-3-8b-q4" -q --q-bits 4 \
      --q-group-size 64 --force && el "convert done" ) > "$OUT/prepare.log" 2>&1 &
  prep=$!
fi
AB_PLANS=${AB_PLANS:-llama-3-8b-q4s=1:128:257}
if want ab abtests; then  # the synthetic models, built while the tests run
  mkdir -p "$M"
  ( for mp in $AB_PLANS; do
      mod=${mp%%=*}
      q=(); [ "${mod%-q4s}" != "$mod" ] && q=(--q-bits 4 --q-group-size 64)
      [ -f "$M/$mod/config.json" ] || kl "$X/bin/kiln" synth --shape llama-3-8b --out "$M/$mod" --dtype bf16 "${q[@]}" --force
    done ) > "$OUT/prepare_ab.log" 2>&1 &
  prep_ab=$!
fi
if want kvtier; then  # the model, built while the GPU runs the tests
  mkdir -p "$M"
  ( [ -f "$M/llama-3-8b/config.json" ] || kl "$X/bin/kiln" synth --shape llama-3-8b --out "$M/llama-3-8b" --dtype bf16 --force
  ) > "$OUT/prepare_kvtier.log" 2>&1 &
  prep_kvtier=$!
fi
if want kvquant; then  # the model, built while the GPU runs the attention bench
  mkdir -p "$M"
  ( [ -f "$M/llama-3-8b/config.json" ] || kl "$X/bin/kiln" synth --shape llama-3-8b --out "$M/llama-3-8b" --dtype bf16 --force
  ) > "$OUT/prepare_kvquant.log" 2>&1 &
  prep_kvquant=$!
  el "=== cuda_attn_bench (prefill, then decode by KV cache bits)"
  kl timeout 120 "$X/bin/cuda_attn_bench" | tee "$OUT/attn_bench.txt" || status=1
fi
if want grammar; then  # the model, built while the GPU runs the tests
  mkdir -p "$M"
  ( [ -f "$M/llama-3-8b/config.json" ] || kl "$X/bin/kiln" synth --shape llama-3-8b --out "$M/llama-3-8b" --dtype bf16 --force
  ) > "$OUT/prepare_grammar.log" 2>&1 &
  prep_grammar=$!
fi
if want evalperf; then
  mkdir -p "$M"
  [ -f "$M/llama-3-8b/config.json" ] || kl "$X/bin/kiln" synth --shape llama-3-8b --out "$M/llama-3-8b" --dtype bf16 --force >/dev/null 2>&1
  for mode in "--batch-size 16" "--batch-size 1 --no-prefix-grouping"; do
    el "=== kiln evaluate hellaswag --limit 200 $mode"
    kl timeout 240 "$X/bin/kiln" evaluate --device cuda --model "$M/llama-3-8b" --tasks hellaswag --limit 200 $mode \
      --data-dir "$C/shared/fixtures/eval" --no-evals-db --output-dir /tmp/evalperf 2>&1 >/dev/null | tr '\r' '\n' |
      grep -E "requests" | tail -n 1 | tee -a "$OUT/evalperf.txt" || status=1
  done
fi
if want spec; then  # CPU-bound: the models, built while the GPU runs the tests
  mkdir -p "$M"
  ( for sh in llama-3-8b llama-1b; do
      [ -f "$M/$sh/config.json" ] || kl "$X/bin/kiln" synth --shape $sh --out "$M/$sh" --dtype bf16 --force
    done ) > "$OUT/prepare_spec.log" 2>&1 &
  prep_spec=$!
fi
if want tests first abtests spec kvtier kvquant grammar; then
  for t in cuda_ops_test cuda_qops_test cuda_models_test cuda_quantized_model_test cuda_engine_test \
           cuda_sampling_test cuda_speculative_test cuda_kv_files_test; do
    el "=== $t"
    LD_LIBRARY_PATH=$KILN_LD_PATH timeout 200 "$X/bin/$t" 2>&1 | tee -a "$OUT/tests.log" |
      grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED|Failure|error|Expected|Which is|knife-edge|rel-L2|max error|graph replays|chi2" |
      head -n 40
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
fi
if want micro first; then
  el "=== cuda_ceiling_bench"
  kl timeout 60 "$X/bin/cuda_ceiling_bench" | tee "$OUT/ceilings.json" || status=1
  [ -x "$X/bin/cuda_attn_bench" ] && { el "=== cuda_attn_bench"; kl timeout 90 "$X/bin/cuda_attn_bench" | tee "$OUT/attn_bench.txt"; }
  el "=== cuda_qgemv_bench (one decode step's projections)"
  for b in "16 1" "4 1" "4 8"; do
    set -- $b
    echo "--- bits $1 batch $2"
    kl timeout 90 "$X/bin/cuda_qgemv_bench" --reps 20 --bits $1 --batch $2 > "$OUT/qgemv_$1_$2.txt" 2>&1 || status=1
    grep -v '^{' "$OUT/qgemv_$1_$2.txt" | grep -E "^\| "
  done
fi
if [ -n "${prep:-}" ]; then
  el "waiting for synth + convert"
  wait $prep || { echo "synth/convert failed"; status=1; }
  tr '\r' '\n' < "$OUT/prepare.log" | grep -v "^\s*$" | tail -n 3
fi
if [ -n "${prep_ab:-}" ]; then
  wait $prep_ab || { echo "synth failed"; tail -n 3 "$OUT/prepare_ab.log"; status=1; }
  [ -x "$X/bin/model_bench_prev" ] || { echo "no model_bench_prev (PREV=... scripts/device-pack.sh)"; status=1; }
  # One line per run: decode tok/s per batch (the decoder stacks the run launched), prefill tok/s
  # of the runs with one decoded step. ab BINARY MODEL PLAN [ENV]
  ab() {
    env ${4:-} LD_LIBRARY_PATH=$KILN_LD_PATH timeout 150 "$X/bin/$1" --device cuda --model "$M/$2" \
      --repeat 2 --plan "$3" 2>/dev/null | sed "s|^{|{\"bin\":\"$1\",|" | tee -a "$OUT/ab.jsonl" | python3 -c 'import sys, json
print(" ".join(("p%d %.0f" % (j["prefill_tokens"], j["prefill_tok_s"])) if j["decode_steps"] <= 1 else
               "b%d %.1f (%d stacks)" % (j["batch"], j["decode_tok_s"], j.get("decoder_stacks", -1))
               for j in map(json.loads, (l for l in sys.stdin if l.startswith("{")))))'
  }
  for r in $(seq "${ROUNDS:-5}"); do
    for mp in $AB_PLANS; do
      el "round $r ${mp%%=*}: prev $(ab model_bench_prev ${mp%%=*} ${mp#*=}) | new $(ab model_bench ${mp%%=*} ${mp#*=})"
    done
  done
  if [ -z "${AB_NO_SEPARATE:-}" ]; then
    for b in model_bench_prev model_bench; do
      el "separate ops, $b: $(ab $b llama-3-8b-q4s 1:128:257,2:128:129,4:128:129 KILN_CUDA_FUSED_DECODER=0)"
    done
  fi
fi
if want perf second; then
  : > "$OUT/model_bench.jsonl"
  for mp in "llama-3-8b 1:2048:2,1:128:257,8:128:129,32:128:129,64:128:129,128:128:129" \
            "qwen2.5-7b 1:2048:2,1:128:257,8:128:129,32:128:129,64:128:129,128:128:129" \
            "llama-3-8b-q4 1:2048:2,1:128:257,4:128:129,8:128:129" "llama-3-8b 1:128:257 KILN_CUDA_PDL=0" \
            "llama-3-8b-q4 1:128:257 KILN_CUDA_PDL=0"; do
    set -- $mp
    el "=== model_bench $1 ${3:-}"
    [ -f "$M/$1/config.json" ] || { echo "missing $M/$1 (run prep first)"; status=1; continue; }
    env ${3:-} LD_LIBRARY_PATH=$KILN_LD_PATH timeout 200 "$X/bin/model_bench" --device cuda --model "$M/$1" --repeat 2 \
      --plan "$2" 2>"$OUT/mb_$1.err" | sed "s|^{|{\"env\":\"${3:-}\",|" | tee -a "$OUT/model_bench.jsonl" || status=1
  done
  for p in "llama-3-8b 1:128:33" "llama-3-8b-q4 1:128:33" "llama-3-8b 128:1:33" "llama-3-8b 1:2048:1"; do
    set -- $p
    el "=== profile $1 $2 (graphs off, events around each op)"
    KILN_CUDA_PROFILE=1 kl timeout 90 "$X/bin/model_bench" --device cuda --model "$M/$1" --repeat 1 --plan "$2" \
      > /dev/null 2> "$OUT/profile_$1_${2//:/_}.txt"
    grep -E "%" "$OUT/profile_$1_${2//:/_}.txt" | tail -n 24
  done
  for sh in llama-3-8b qwen2.5-7b; do
    el "=== PyTorch CUDA-graph peer, $sh"
    ( cd "$OUT" && timeout 200 python3 "$KILN_SHARED_DIR/bench/peer_torch_graph.py" $sh > "peer_graph_$sh.log" 2>&1 ) ||
      echo "peer_torch_graph $sh failed"
    grep -E "copy_GBps|bs[0-9]+_tok_s" "$OUT/peer_graph_$sh.log"
  done
fi
if want q4perf; then
  : > "$OUT/model_bench.jsonl"
  for mp in "llama-3-8b-q4 1:2048:2,1:128:257,4:128:129,8:128:129" "llama-3-8b 1:128:257,8:128:129"; do
    set -- $mp
    el "=== model_bench $1"
    [ -f "$M/$1/config.json" ] || { echo "missing $M/$1 (run prep first)"; status=1; continue; }
    kl timeout 200 "$X/bin/model_bench" --device cuda --model "$M/$1" --repeat 2 --plan "$2" 2>"$OUT/mb_$1.err" |
      tee -a "$OUT/model_bench.jsonl" || status=1
  done
  el "=== profile llama-3-8b-q4 1:128:33 (graphs off, events around each op)"
  KILN_CUDA_PROFILE=1 kl timeout 90 "$X/bin/model_bench" --device cuda --model "$M/llama-3-8b-q4" --repeat 1 \
    --plan 1:128:33 > /dev/null 2> "$OUT/profile_q4.txt"
  grep -E "%" "$OUT/profile_q4.txt" | tail -n 24
fi
if want trace; then
  for m in llama-3-8b-q4 llama-3-8b; do
    el "=== kernel timeline, $m batch 1"
    KILN_KERNEL_TRACE=$OUT/trace_$m.csv LD_PRELOAD=$X/bin/libkiln_kernel_trace.so kl timeout 100 "$X/bin/model_bench" \
      --device cuda --model "$M/$m" --repeat 1 --plan 1:128:12 > /dev/null 2> "$OUT/trace_$m.err" || status=1
    python3 bench/kernel_timeline.py "$OUT/trace_$m.csv" --first 12 || status=1
    xz -f "$OUT/trace_$m.csv"
  done
fi
if [ -n "${prep_spec:-}" ]; then
  wait $prep_spec || { echo "synth failed"; tail -n 3 "$OUT/prepare_spec.log"; status=1; }
  sb() { el "=== spec_bench $*"; kl timeout 240 "$X/bin/spec_bench" --device cuda --model "$M/llama-3-8b" "$@" 2>&1 |
         grep -v "^kiln warn" | tee -a "$OUT/spec_bench.txt"; }
  sb --draft "$M/llama-1b" --verify-cost 1,8,64 --batch 1,8 --n 3 --oracle 0,0.5,0.7,0.9,1 --max-tokens 128
  sb --draft "$M/llama-3-8b" --batch 1 --n 3 --max-tokens 96
  sb --ngram --repetitive --batch 1,8 --n 1,2,3,4 --max-tokens 128
fi
if [ -n "${prep_kvtier:-}" ]; then
  wait $prep_kvtier || { echo "synth failed"; tail -n 3 "$OUT/prepare_kvtier.log"; status=1; }
  # The disk's own bound: 2 GiB written, the page cache dropped, read back in 16 MiB pieces.
  mkdir -p /tmp/kiln-tier-bench
  dd if=/dev/zero of=/tmp/kiln-tier-bench/dd.bin bs=16M count=128 conv=fsync 2>&1 | tail -n 1 | sed 's/^/disk write: /'
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
  dd if=/tmp/kiln-tier-bench/dd.bin of=/dev/null bs=16M 2>&1 | tail -n 1 | sed 's/^/disk read (cold): /'
  rm -f /tmp/kiln-tier-bench/dd.bin
  for drop in --drop-caches ""; do  # a restart after a reboot (files cold) and after a plain restart
    el "=== kv_tier_bench llama-3-8b ${drop:-(page cache kept)}"
    kl timeout 250 "$X/bin/kv_tier_bench" --device cuda --model "$M/llama-3-8b" --prompt 2048,8192,32000 --decode 128 \
      --dir /tmp/kiln-tier-bench $drop 2>&1 | grep -v "^kiln info" | tr '\r' '\n' | grep -v "uploading weights" |
      tee -a "$OUT/kv_tier_bench.txt" || status=1
  done
fi
if [ -n "${prep_kvquant:-}" ]; then
  wait $prep_kvquant || { echo "synth failed"; tail -n 3 "$OUT/prepare_kvquant.log"; status=1; }
  : > "$OUT/kvquant.jsonl"
  for bits in 0 8 4; do
    el "=== model_bench llama-3-8b --kv-bits $bits (decode at 4k and 32k contexts)"
    kl timeout 150 "$X/bin/model_bench" --device cuda --model "$M/llama-3-8b" --repeat 1 --kv-bits $bits \
      --plan 1:4096:129,8:4096:65,1:32000:65 2>"$OUT/kvquant_$bits.err" | tee -a "$OUT/kvquant.jsonl" || status=1
  done
fi
if [ -n "${prep_grammar:-}" ]; then
  wait $prep_grammar || { echo "synth failed"; tail -n 3 "$OUT/prepare_grammar.log"; status=1; }
  : > "$OUT/grammar.jsonl"
  for round in 1 2; do
    for schema in "" bench/data/decode_schema.json; do
      el "=== model_bench llama-3-8b round $round ${schema:+--json-schema $schema}"
      kl timeout 150 "$X/bin/model_bench" --device cuda --model "$M/llama-3-8b" --repeat 2 --plan 1:128:129,64:128:129 \
        ${schema:+--json-schema $schema} 2>>"$OUT/grammar.err" | tee -a "$OUT/grammar.jsonl" || status=1
    done
  done
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
