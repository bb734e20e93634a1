// Digests the Hub protocol names files by (OpenSSL's): SHA-256 (LFS oids, the etags of LFS files) and
// git's blob SHA-1 (the oids/etags of regular files: sha1("blob <size>\0" + content)); base64 for
// the commit and preupload payloads.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::hub {

// Streaming digest: update() with pieces, hex() once at the end.
class Digest {
 public:
  enum Kind { kSha256, kSha1 };
  explicit Digest(Kind k);
  ~Digest();
  Digest(const Digest&) = delete;
  Digest& operator=(const Digest&) = delete;
  void update(const void* data, size_t n);
  std::string hex();  // lowercase

 private:
  void* ctx_;
};

// The SHA-256 of a file, read in 1 MiB pieces.
std::string sha256_file(const std::string& path, uint64_t* size_out = nullptr);
// git's blob id of a file: sha1("blob <size>\0" + content).
std::string git_blob_sha1_file(const std::string& path);

std::string base64(std::string_view bytes);
// The bytes of a base64 text; throws kiln::Error on malformed input.
std::string base64_decode(std::string_view text);

}  // namespace kiln::hub
