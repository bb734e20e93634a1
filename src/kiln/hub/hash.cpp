// OpenSSL's EVP digests and base64 behind hash.h.
#include "kiln/hub/hash.h"

#include <openssl/evp.h>

#include <cstdio>
#include <filesystem>
#include <vector>

#include "kiln/base/error.h"

namespace kiln::hub {

Digest::Digest(Kind k) {
  auto* c = EVP_MD_CTX_new();
  EVP_DigestInit_ex(c, k == kSha256 ? EVP_sha256() : EVP_sha1(), nullptr);
  ctx_ = c;
}

Digest::~Digest() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Digest::update(const void* data, size_t n) { EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, n); }

std::string Digest::hex() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), md, &len);
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    out += d[md[i] >> 4];
    out += d[md[i] & 15];
  }
  return out;
}

namespace {
void digest_file(Digest& d, const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("hub", "cannot read {}", path);
  std::vector<char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) d.update(buf.data(), n);
  std::fclose(f);
}
}  // namespace

std::string sha256_file(const std::string& path, uint64_t* size_out) {
  Digest d(Digest::kSha256);
  digest_file(d, path);
  if (size_out) *size_out = std::filesystem::file_size(path);
  return d.hex();
}

std::string git_blob_sha1_file(const std::string& path) {
  Digest d(Digest::kSha1);
  std::string head = "blob " + std::to_string(std::filesystem::file_size(path));
  d.update(head.data(), head.size() + 1);  // with the NUL
  digest_file(d, path);
  return d.hex();
}

std::string base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(n);
  return out;
}

std::string base64_decode(std::string_view text) {
  if (text.size() % 4) fail("hub", "malformed base64 (length {})", text.size());
  std::string out(text.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()), reinterpret_cast<const unsigned char*>(text.data()),
                          static_cast<int>(text.size()));
  if (n < 0) fail("hub", "malformed base64");
  size_t pad = 0;
  for (size_t i = text.size(); i > 0 && text[i - 1] == '='; --i) ++pad;
  out.resize(static_cast<size_t>(n) - pad);  // EVP_DecodeBlock counts the padding as zero bytes
  return out;
}

}  // namespace kiln::hub
