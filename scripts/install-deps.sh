#!/usr/bin/env bash
# Installs the Debian packages kiln builds and tests with (idempotent, non-interactive),
# and the npm packages of the server end-to-end tests when a tests/e2e folder exists.
set -euo pipefail
PKGS=(cmake g++ make pkg-config git
      nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libfmt-dev libpcre2-dev libutf8proc-dev
      libopenblas-dev libsqlite3-dev libcurl4-openssl-dev libssl-dev libxxhash-dev libbz2-dev
      libgtest-dev libgmock-dev libbenchmark-dev
      clang libclang-rt-14-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# Node + npm for the server end-to-end tests (any Node >= 18; a Node already installed is kept).
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
here=$(cd "$(dirname "$0")/.." && pwd)
if [ -f "$here/tests/e2e/package.json" ] && [ ! -d "$here/tests/e2e/node_modules" ]; then
  (cd "$here/tests/e2e" && npm ci --no-audit --no-fund 2>/dev/null || npm install --no-audit --no-fund)
fi
echo "install-deps: all packages present"
