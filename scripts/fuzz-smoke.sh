#!/usr/bin/env bash
# Fuzz smoke run: configures a separate clang build (libFuzzer + ASan + UBSan on the fuzz targets
# and the libraries they link), builds fuzz/*_fuzz.cpp, and runs each target for FUZZ_SECONDS on a
# seed corpus made from the shared/ models and tokenizers. Exits non-zero on any crash.
# Usage: scripts/fuzz-smoke.sh [BUILD_DIR]   (default build-fuzz in the source folder)
# Env: FUZZ_SECONDS (20), FUZZ_JOBS (2), KILN_SHARED_DIR (../shared), FUZZ_SEED_MAX_BYTES (262144).
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$src/build-fuzz}
shared=${KILN_SHARED_DIR:-$src/../shared}
seconds=${FUZZ_SECONDS:-20}
jobs=${FUZZ_JOBS:-2}
seed_max=${FUZZ_SEED_MAX_BYTES:-262144}

for tool in clang clang++ cmake od head; do
  command -v "$tool" >/dev/null || { echo "fuzz-smoke: $tool not found (apt-get install clang cmake)" >&2; exit 2; }
done
[[ -f "$shared/models/stories260K/model.safetensors" ]] || { echo "fuzz-smoke: no models under $shared (set KILN_SHARED_DIR)" >&2; exit 2; }
mkdir -p "$build"
build=$(cd "$build" && pwd)

# 1. Configure and build. The libraries get fuzzer-no-link (coverage) + ASan + UBSan; the targets
#    add -fsanitize=fuzzer themselves (fuzz/CMakeLists.txt). Release with -g: fast and symbolized.
san="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
echo "fuzz-smoke: configuring $build"
if ! CC=clang CXX=clang++ cmake -S "$src" -B "$build" -DKILN_FUZZ=ON -DKILN_CUDA=OFF -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_FLAGS="$san" -DCMAKE_CXX_FLAGS="$san" \
    -DKILN_SHARED_DIR="$shared" >"$build/fuzz-configure.log" 2>&1; then
  tail -n 40 "$build/fuzz-configure.log" >&2
  echo "fuzz-smoke: configure failed (log: $build/fuzz-configure.log)" >&2
  exit 1
fi
echo "fuzz-smoke: building fuzz targets (-j$jobs)"
if ! cmake --build "$build" --target fuzz_targets -j "$jobs" >"$build/fuzz-build.log" 2>&1; then
  grep -E "error|Error" "$build/fuzz-build.log" | head -n 40 >&2 || true
  echo "fuzz-smoke: build failed (log: $build/fuzz-build.log)" >&2
  exit 1
fi
mapfile -t targets < <(grep -v '^$' "$build/fuzz/fuzz_targets.txt" || true)
if [[ ${#targets[@]} -eq 0 ]]; then
  echo "fuzz-smoke: no fuzz targets were built (fuzz/*_fuzz.cpp)" >&2
  exit 1
fi

# 2. Seed corpora, regenerated each run (small files only: each input is parsed whole per run).
seeds="$build/fuzz-seeds"
rm -rf "$seeds"
mkdir -p "$seeds/safetensors_header_fuzz" "$seeds/tokenizer_json_fuzz"
le64() {  # prints n as 8 little-endian bytes
  local n=$1 i
  for i in 0 1 2 3 4 5 6 7; do printf "\\x$(printf %02x $(((n >> (8 * i)) & 255)))"; done
}
for f in "$shared"/models/*/model.safetensors; do
  n=$(od -An -tu8 -N8 "$f" | tr -d ' ')
  (( n > 0 && n < seed_max )) || continue
  head -c $((8 + n)) "$f" >"$seeds/safetensors_header_fuzz/$(basename "$(dirname "$f")").header"  # header, no data
done
# A complete small file of every dtype (31 data bytes, an empty tensor, metadata) and an empty one.
hdr='{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[3],"data_offsets":[8,14]},"c":{"dtype":"F16","shape":[1,1],"data_offsets":[14,16]},"d":{"dtype":"U32","shape":[2],"data_offsets":[16,24]},"e":{"dtype":"I32","shape":[],"data_offsets":[24,28]},"f":{"dtype":"U8","shape":[3],"data_offsets":[28,31]},"g":{"dtype":"U8","shape":[0,4],"data_offsets":[31,31]}}'
{ le64 ${#hdr}; printf '%s' "$hdr"; printf 'abcdefghijklmnopqrstuvwxyz01234'; } >"$seeds/safetensors_header_fuzz/small.safetensors"
{ le64 2; printf '{}'; } >"$seeds/safetensors_header_fuzz/empty.safetensors"
for f in "$shared"/models/*/tokenizer.json "$shared"/fixtures/tokenizers/*/tokenizer.json; do
  [[ -f "$f" ]] || continue
  size=$(stat -c %s "$f")
  (( size <= seed_max )) || continue
  cp "$f" "$seeds/tokenizer_json_fuzz/$(cksum <"$f" | cut -d' ' -f1).json"  # the tiny-* models share one
done

# A prompt cache file of stories260K (float and 8-bit K/V), when a kiln binary is at hand (KILN_BIN, else
# the default build's); without one the target starts from nothing.
kiln_bin=${KILN_BIN:-$src/build/kiln}
mkdir -p "$seeds/prompt_cache_file_fuzz"
if [[ -x "$kiln_bin" ]]; then
  for bits in "" "--kv-bits 8"; do
    "$kiln_bin" cache-prompt --model "$shared/models/stories260K" --prompt "Once upon a time, there was a little girl who" \
      $bits --prompt-cache-file "$seeds/prompt_cache_file_fuzz/stories260K${bits// /}.safetensors" >/dev/null 2>&1 || true
  done
fi

# Grammar sources: a kind byte (0 GBNF, 2 JSON Schema) before the text.
mkdir -p "$seeds/grammar_fuzz"
for f in "$src"/tests/grammar/data/*.gbnf; do
  { printf '\x00'; cat "$f"; } >"$seeds/grammar_fuzz/$(basename "$f")"
done
printf '\x01[a-z]+(\\.[0-9]{1,3})?|x*' >"$seeds/grammar_fuzz/regex"
for f in $(ls "$shared"/fixtures/json_schemas/*.json 2>/dev/null | head -20); do
  { printf '\x02'; python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["schema"]))' "$f"; } \
    >"$seeds/grammar_fuzz/$(basename "$f")" 2>/dev/null || true
done

# 3. Run each target; a crash, leak, timeout or sanitizer report makes libFuzzer exit non-zero.
mkdir -p "$build/fuzz-logs" "$build/fuzz-artifacts"
status=0
for t in "${targets[@]}"; do
  corpus="$build/fuzz-corpus/$t"
  mkdir -p "$corpus" "$seeds/$t"
  log="$build/fuzz-logs/$t.log"
  echo "fuzz-smoke: $t for ${seconds}s ($(ls "$seeds/$t" | wc -l) seeds)"
  if "$build/fuzz/$t" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=4096 -print_final_stats=1 \
      -artifact_prefix="$build/fuzz-artifacts/$t-" "$corpus" "$seeds/$t" >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    echo "fuzz-smoke: $t ok ($runs runs, corpus $(ls "$corpus" | wc -l) inputs)"
  else
    status=1
    tail -n 60 "$log" >&2
    echo "fuzz-smoke: $t FAILED (log: $log; crashing input under $build/fuzz-artifacts/$t-*;" \
         "reproduce with $build/fuzz/$t FILE)" >&2
  fi
done
exit $status
