#!/usr/bin/env bash
# Fills .devcarry/ (ignored by git) for scripts/device-run.sh: the executables of a CUDA build
# (default build-cuda, configured with -DKILN_CUDA=ON), the non-system shared libraries they need
# (the device machine lacks the Debian dev packages), the shared models and bench peers.
# Usage: scripts/device-pack.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build-cuda}
C=.devcarry
rm -rf "$C" && mkdir -p "$C/bin" "$C/lib" "$C/shared"
grep -qx '/.devcarry/' .git/info/exclude 2>/dev/null || echo '/.devcarry/' >> .git/info/exclude
for f in "$B/kiln" "$B/tests/cuda_ops_test" "$B/tests/cuda_models_test" "$B/tests/cuda_engine_test" "$B/tests/cuda_sampling_test" \
         "$B/bench/model_bench" "$B/bench/cuda_ceiling_bench"; do
  strip -o "$C/bin/$(basename "$f")" "$f"
done
# Libraries outside glibc/libstdc++/CUDA/zlib/OpenSSL 3 (which Ubuntu 24.04 has in newer versions).
for f in "$C"/bin/*; do ldd "$f"; done | awk '/=> \// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*|libcuda|libcublas[^/]*|libz|libssl|libcrypto)\.so' |
  while read -r l; do cp -L "$l" "$C/lib/"; done
cp -r ../shared/models "$C/shared/models"
cp -r ../shared/bench "$C/shared/bench"
du -sh "$C"/*
