# Shared by the device scripts (source it): pack build outputs into a carried folder here, and
# unpack them plus set the library path on the device machine, which has no Debian dev packages.

# carry_pack DIR BUILD_DIR COMPRESS(yes|no) EXECUTABLE...: DIR/bin (stripped executables, xz-packed
# into DIR/bin.tar.xz when COMPRESS: every kernel's machine code makes them ~15 MB each), DIR/lib
# (shared libraries outside glibc/libstdc++/CUDA/zlib/OpenSSL 3, which Ubuntu 24.04 has in newer
# versions), DIR/shared/models/stories260K. DIR is added to .git/info/exclude.
carry_pack() {
  local dir=$1 build=$2 compress=$3 f
  shift 3
  rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib" "$dir/shared/models"
  local exclude
  exclude=$(git rev-parse --git-path info/exclude)  # (.git is a file in a worktree)
  mkdir -p "$(dirname "$exclude")"
  grep -qx "/$dir/" "$exclude" 2>/dev/null || echo "/$dir/" >> "$exclude"
  for f in "$@"; do strip -o "$dir/bin/$(basename "$f")" "$build/$f"; done
  for f in "$dir"/bin/*; do ldd "$f"; done | awk '/=> \// {print $3}' | sort -u |
    grep -vE '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*|libcuda|libcublas[^/]*|libz|libssl|libcrypto)\.so' |
    while read -r l; do cp -L "$l" "$dir/lib/"; done
  cp -r ../shared/models/stories260K "$dir/shared/models/"
  if [ "$compress" = yes ]; then tar cf - -C "$dir" bin | xz -9e -T2 > "$dir/bin.tar.xz" && rm -rf "$dir/bin"; fi
  du -sh "$dir"
}

# carry_unpack DIR TARGET: unpacks DIR/bin.tar.xz into TARGET/bin (once; python's lzma when there
# is no xz) and sets CARRY_LD_PATH to DIR/lib plus the folder holding cuBLASLt.
carry_unpack() {
  local dir=$1 target=$2
  mkdir -p "$target"
  if [ ! -d "$target/bin" ]; then
    if command -v xz > /dev/null; then xz -dc "$dir/bin.tar.xz" | tar xf - -C "$target"
    else python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" "$dir/bin.tar.xz" | tar xf - -C "$target"; fi
  fi
  carry_cuda_libs "$dir"
}

# carry_cuda_libs DIR: CARRY_LD_PATH = DIR/lib and the folder of libcublasLt.so.13.
carry_cuda_libs() {
  local cublas_dir=/usr/local/cuda/lib64
  [ -e "$cublas_dir/libcublasLt.so.13" ] || cublas_dir=$(dirname "$(find / -name 'libcublasLt.so.13' 2>/dev/null | head -1)")
  CARRY_LD_PATH=$1/lib:$cublas_dir
}
