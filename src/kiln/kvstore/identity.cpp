#include "kiln/kvstore/identity.h"

#include <xxhash.h>

#include <algorithm>
#include <string>

namespace kiln::kvstore {

namespace {

class Hasher {
 public:
  Hasher() : st_(XXH3_createState()) { XXH3_64bits_reset(st_); }
  ~Hasher() { XXH3_freeState(st_); }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void bytes(const void* p, size_t n) { XXH3_64bits_update(st_, p, n); }
  void str(const std::string& s) {
    num(s.size());
    bytes(s.data(), s.size());
  }
  void num(uint64_t v) { bytes(&v, sizeof v); }
  uint64_t digest() const { return XXH3_64bits_digest(st_); }

 private:
  XXH3_state_t* st_;
};

}  // namespace

uint64_t model_fingerprint(const model::ModelConfig& config, const io::WeightSet& weights) {
  Hasher h;
  h.str(config.raw.dump());
  for (const std::string& name : weights.names()) {  // sorted
    const Tensor& t = weights.get(name);
    h.str(name);
    h.num(static_cast<uint64_t>(t.dtype));
    for (int64_t d : t.shape) h.num(static_cast<uint64_t>(d));
    h.bytes(t.data, std::min<size_t>(64, t.nbytes()));
  }
  return h.digest();
}

uint64_t tokenizer_fingerprint(const tokenizer::Tokenizer& tok) {
  Hasher h;
  const int32_t n = tok.vocab_size();
  h.num(static_cast<uint64_t>(n));
  for (int32_t id = 0; id < n; ++id) {
    h.str(tok.id_to_token(id));
    h.num(tok.is_special(id) ? 1 : 0);
  }
  h.str(tok.bos_token());
  h.str(tok.eos_token());
  return h.digest();
}

}  // namespace kiln::kvstore
