// Device-side helpers of the CUDA kernels: element loads/stores in f32 for every float dtype,
// the type dispatch of launchers, warp reductions, and the launch-error check.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "kiln/backend/cuda/core/kernels.h"
#include "kiln/backend/cuda/core/options.h"
#include "kiln/backend/cuda/core/probe_hooks.h"

namespace kiln::backend::cuda {

// A failed launch is a programming error (bad grid or resources): abort with the kernel's name.
#define KILN_CUDA_LAUNCH_CHECK(what)                                                                   \
  do {                                                                                                 \
    cudaError_t e_ = cudaGetLastError();                                                               \
    if (e_ != cudaSuccess) {                                                                           \
      std::fprintf(stderr, "[cuda] launch of %s failed: %s\n", what, cudaGetErrorString(e_));          \
      std::abort();                                                                                    \
    }                                                                                                  \
  } while (0)

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }

// Element i of a buffer of runtime dtype t, as f32 (load_s), or stored from f32 with one rounding.
__device__ __forceinline__ float load_s(const void* p, Dt t, int64_t i) {
  switch (t) {
    case Dt::f32: return __ldg(static_cast<const float*>(p) + i);
    case Dt::bf16: return to_f(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return to_f(static_cast<const __half*>(p)[i]);
  }
}
__device__ __forceinline__ void store_s(void* p, Dt t, int64_t i, float v) {
  switch (t) {
    case Dt::f32: static_cast<float*>(p)[i] = v; break;
    case Dt::bf16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    default: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
  }
}

// The gated MLP's activation of g (Activation: 0 silu, 1 gelu_tanh, 2 gelu), in f32.
__device__ __forceinline__ float act_f(float g, int act) {
  if (act == 0) return g / (1.0f + expf(-g));
  if (act == 1) return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
  return 0.5f * g * (1.0f + erff(g * 0.7071067811865476f));
}

// Loads VEC consecutive elements of p (aligned to VEC * sizeof(T)) as floats, with the widest loads.
template <typename T, int VEC>
__device__ __forceinline__ void load_vec(const T* p, float (&v)[VEC]) {
  constexpr int bytes = VEC * static_cast<int>(sizeof(T));
  if constexpr (bytes % 16 == 0) {
#pragma unroll
    for (int c = 0; c < bytes / 16; ++c) {
      uint4 u = __ldg(reinterpret_cast<const uint4*>(p) + c);
      const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int i = 0; i < 16 / static_cast<int>(sizeof(T)); ++i) v[c * (16 / sizeof(T)) + i] = to_f(e[i]);
    }
  } else {
    static_assert(bytes == 8, "load_vec: 8 or 16*k bytes");
    uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[i] = to_f(e[i]);
  }
}

// A 16-byte load of data read once (weights): read-only path, not kept in L1 (so it does not evict x).
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Calls F.template operator()<T>() with T the C++ type of dt.
template <typename F>
void dispatch(Dt dt, F&& f) {
  switch (dt) {
    case Dt::f32: f.template operator()<float>(); break;
    case Dt::bf16: f.template operator()<__nv_bfloat16>(); break;
    case Dt::f16: f.template operator()<__half>(); break;
  }
}

// Programmatic dependent launch (Hopper): a kernel started with launch_pdl may begin while the
// previous kernel of the stream is still finishing, so a decode step's ~300 short kernels overlap
// their launch and DRAM ramp-up with their predecessor's tail. Such a kernel calls pdl_trigger()
// early (the next PDL kernel may then be scheduled) and pdl_wait() before it reads anything an
// earlier kernel wrote and before it writes anything (buffers are reused across ops); only reads of
// weights may come before pdl_wait(). pdl_wait() waits for the previous grid's completion and memory
// flush; without a programmatic dependency (a plain launch, another predecessor) it returns at once.
__device__ __forceinline__ void pdl_wait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  KILN_STAMP(1);  // a probe build's stamp: released (probe_hooks.h)
}
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

// pdl_enabled() (options.h) is false when KILN_CUDA_PDL=0: launch_pdl then launches plainly.

template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  if (!pdl_enabled()) {
    kernel<<<grid, block, smem, s>>>(std::forward<Args>(args)...);
    return;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// Block b of pf.blocks: its share of the 128-byte lines of every range of pf, requested into L2
// (prefetch.global.L2: nothing waits for the lines). 32 KB bulk prefetches (cp.async.bulk.prefetch)
// instead cut H200 decode to a quarter: the issuing blocks stalled the kernel.
__device__ __forceinline__ void l2_prefetch(const L2Prefetch& pf, int64_t b) {
  const int64_t stride = int64_t{pf.blocks} * blockDim.x * 128, first = (b * blockDim.x + threadIdx.x) * 128;
  for (int r = 0; r < pf.n; ++r)
    for (int64_t o = first; o < pf.bytes[r]; o += stride) asm volatile("prefetch.global.L2 [%0];" ::"l"(pf.p[r] + o));
}

inline unsigned grid_for(int64_t n, int threads, int64_t cap = 1 << 20) {
  int64_t g = (n + threads - 1) / threads;
  return static_cast<unsigned>(g < 1 ? 1 : (g > cap ? cap : g));
}

}  // namespace kiln::backend::cuda
