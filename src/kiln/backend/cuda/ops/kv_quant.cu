// The quantized KV write (launch_kv_write_quant, kernels.h): a thread per (row, group) of the step's
// K and V rows, the CPU's quantize_kv_row arithmetic (kv_quant_rule.h) for its group.
#include <algorithm>
#include <cfloat>

#include "kiln/backend/cuda/core/common.cuh"
#include "kiln/backend/kv_quant_rule.h"

namespace kiln::backend::cuda {

namespace {

// grid (token), threads over 2 x width / group (K's groups, then V's).
template <typename T>
__global__ void kv_write_quant_kernel(const T* k, const T* v, int64_t width, const int32_t* slots, int64_t n_slots,
                                      KvQuantPlanes kc, KvQuantPlanes vc, int bits, int group) {
  const int64_t t = blockIdx.x, s = slots[t];
  if (s < 0 || s >= n_slots) return;
  const int64_t n_groups = width / group;
  for (int64_t item = threadIdx.x; item < 2 * n_groups; item += blockDim.x) {
    const bool is_v = item >= n_groups;
    const int64_t g = is_v ? item - n_groups : item;
    const T* x = (is_v ? v : k) + t * width + g * group;
    const KvQuantPlanes& c = is_v ? vc : kc;
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int j = 0; j < group; ++j) {
      const float w = to_f(x[j]);
      lo = fminf(lo, w), hi = fmaxf(hi, w);
    }
    float scale, bias;
    kv_group_params(lo, hi, bits, &scale, &bias);
    const __half sh = __float2half_rn(scale), bh = __float2half_rn(bias);
    static_cast<__half*>(c.scales)[s * n_groups + g] = sh;
    static_cast<__half*>(c.biases)[s * n_groups + g] = bh;
    scale = __half2float(sh), bias = __half2float(bh);
    // codes of the group: bytes [(s * width + g * group) * bits / 8, + group * bits / 8)
    uint8_t* out = static_cast<uint8_t*>(c.codes) + (s * width + g * group) * bits / 8;
    if (bits == 8) {
      for (int j = 0; j < group; ++j) out[j] = static_cast<uint8_t>(kv_code(to_f(x[j]), scale, bias, 8));
    } else {
      for (int j = 0; j < group; j += 2)
        out[j / 2] = static_cast<uint8_t>(kv_code(to_f(x[j]), scale, bias, 4) |
                                          (kv_code(to_f(x[j + 1]), scale, bias, 4) << 4));
    }
  }
}

}  // namespace

void launch_kv_write_quant(const void* k, const void* v, Dt kt, int64_t n, int64_t width, const int32_t* slots,
                           int64_t n_slots, const KvQuantPlanes& kc, const KvQuantPlanes& vc, int bits, int group,
                           cudaStream_t s) {
  if (n == 0) return;
  const int64_t items = 2 * width / group;
  const int threads = static_cast<int>(std::min<int64_t>(256, (items + 31) / 32 * 32));
  dispatch(kt, [&]<typename T>() {
    kv_write_quant_kernel<T><<<n, threads, 0, s>>>(static_cast<const T*>(k), static_cast<const T*>(v), width, slots,
                                                   n_slots, kc, vc, bits, group);
  });
  KILN_CUDA_LAUNCH_CHECK("kv_write (quantized)");
}

}  // namespace kiln::backend::cuda
