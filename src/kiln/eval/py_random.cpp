// CPython's _randommodule.c (init_genrand, init_by_array, genrand_uint32) and random.py's
// getrandbits / _randbelow_with_getrandbits / sample (py_random.h).
#include "kiln/eval/py_random.h"

#include <cmath>
#include <set>

#include "kiln/base/error.h"

namespace kiln::eval {

PyRandom::PyRandom(uint32_t seed) {
  constexpr int N = 624;
  mt_[0] = 19650218u;
  for (int i = 1; i < N; ++i) mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + static_cast<uint32_t>(i);
  // init_by_array with key = {seed} (one 32-bit word: seeds below 2^32).
  const uint32_t key[1] = {seed};
  int i = 1, j = 0;
  for (int k = N; k; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key[j] + static_cast<uint32_t>(j);
    ++i;
    ++j;
    if (i >= N) { mt_[0] = mt_[N - 1]; i = 1; }
    if (j >= 1) j = 0;
  }
  for (int k = N - 1; k; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - static_cast<uint32_t>(i);
    ++i;
    if (i >= N) { mt_[0] = mt_[N - 1]; i = 1; }
  }
  mt_[0] = 0x80000000u;
  i_ = N;
}

uint32_t PyRandom::next_u32() {
  constexpr int N = 624, M = 397;
  constexpr uint32_t kUpper = 0x80000000u, kLower = 0x7fffffffu, kA = 0x9908b0dfu;
  if (i_ >= N) {
    for (int k = 0; k < N; ++k) {
      const uint32_t y = (mt_[k] & kUpper) | (mt_[(k + 1) % N] & kLower);
      mt_[k] = mt_[(k + M) % N] ^ (y >> 1) ^ ((y & 1u) ? kA : 0u);
    }
    i_ = 0;
  }
  uint32_t y = mt_[i_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint32_t PyRandom::getrandbits(int k) { return k <= 0 ? 0 : next_u32() >> (32 - k); }

uint64_t PyRandom::randbelow(uint64_t n) {
  if (n == 0 || n >= (1ull << 32)) fail("eval", "randbelow({}) is outside what the few-shot sampler needs", n);
  int k = 0;
  while ((n >> k) != 0) ++k;  // n.bit_length()
  uint64_t r = getrandbits(k);
  while (r >= n) r = getrandbits(k);
  return r;
}

std::vector<size_t> PyRandom::sample(size_t n, size_t k) {
  if (k > n) fail("eval", "cannot sample {} of {} few-shot docs", k, n);
  std::vector<size_t> result(k);
  size_t setsize = 21;
  if (k > 5) setsize += static_cast<size_t>(std::pow(4.0, std::ceil(std::log(static_cast<double>(k) * 3) / std::log(4.0))));
  if (n <= setsize) {
    std::vector<size_t> pool(n);
    for (size_t i = 0; i < n; ++i) pool[i] = i;
    for (size_t i = 0; i < k; ++i) {
      const size_t j = static_cast<size_t>(randbelow(n - i));
      result[i] = pool[j];
      pool[j] = pool[n - i - 1];
    }
  } else {
    std::set<size_t> selected;
    for (size_t i = 0; i < k; ++i) {
      size_t j = static_cast<size_t>(randbelow(n));
      while (selected.count(j)) j = static_cast<size_t>(randbelow(n));
      selected.insert(j);
      result[i] = j;
    }
  }
  return result;
}

}  // namespace kiln::eval
