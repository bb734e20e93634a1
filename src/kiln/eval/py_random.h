// CPython's random.Random, as far as lm-evaluation-harness's few-shot sampler uses it: the
// Mersenne Twister seeded as random.seed(int) (init_by_array over the seed's 32-bit words) and
// random.sample's index choices (_randbelow by getrandbits with rejection; the pool or set method
// by the sizes CPython picks). lm-eval's default sampler draws each doc's few-shot examples with
// random.Random(1234).sample(fewshot_docs, n), the generator shared across the docs in order.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln::eval {

class PyRandom {
 public:
  explicit PyRandom(uint32_t seed);
  uint32_t next_u32();                     // genrand_uint32
  uint32_t getrandbits(int k);             // k in [0, 32]
  uint64_t randbelow(uint64_t n);          // [0, n), n >= 1 (n < 2^32)
  // random.sample(range(n), k): k distinct indices in CPython's order.
  std::vector<std::size_t> sample(std::size_t n, std::size_t k);

 private:
  uint32_t mt_[624];
  int i_ = 624;
};

}  // namespace kiln::eval
