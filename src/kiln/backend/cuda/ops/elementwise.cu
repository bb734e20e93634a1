// Row-wise and elementwise kernels of the CUDA backend: embedding gather, RMSNorm, RoPE, KV
// writes, gated activations, add/scale/softcap, bias, row gather/scatter (MoE), argmax, convert.
// Math is f32 whatever the storage type; each result is rounded once.
#include <cfloat>
#include <cstdlib>
#include <cstring>

#include <type_traits>

#include "kiln/backend/cuda/quant/qx.cuh"
#include "kiln/backend/cuda/ops/row_ops.cuh"

namespace kiln::backend::cuda {

namespace {

constexpr int kThreads = 256;

template <typename TT, typename OT>
__global__ void embedding_kernel(const TT* table, int64_t vocab, int64_t dim, const int32_t* ids, OT* out) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const bool ok = id >= 0 && id < vocab;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x)
    out[t * dim + d] = from_f<OT>(ok ? to_f(table[id * dim + d]) : 0.0f);
}

// One block per row: sum of squares in f32 (block reduction), then the scaled product (row_ops.cuh,
// shared with fused.cu's add_rms_norm). K > 0: the row in registers (row_regs); 0: loops. qx.base
// set (bf16): then y's qx (qx.cuh).
template <typename XT, typename WT, typename YT, int K>
__global__ void __launch_bounds__(kRowThreadsMax)
    rms_norm_kernel(const XT* x, const WT* w, float eps, bool one_plus, int64_t dim, YT* y, QxOut qx) {
  const int64_t r = blockIdx.x;
  const XT* xr = x + r * dim;
  float ss = 0.0f;
  if constexpr (K == 0) {
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) ss = sq_acc(ss, to_f(xr[d]));
    ss = block_sum(ss);
    rms_norm_store(xr, w, ss, eps, one_plus, dim, y + r * dim);
  } else {
    XT v[K];
    WT wv[K];
    load_row(xr, dim, v);
    load_row(w, dim, wv);
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (threadIdx.x + int64_t{k} * blockDim.x < dim) ss = sq_acc(ss, to_f(v[k]));
    ss = block_sum(ss);
    rms_norm_store_regs(v, wv, ss, eps, one_plus, dim, y + r * dim, qx.base ? row_s<YT>() : nullptr);
  }
  if constexpr (std::is_same_v<YT, __nv_bfloat16>) {
    if (qx.base) {
      __syncthreads();  // the row's y, written by every thread of the block
      qx_store_row_gs(K > 0 ? row_s<YT>() : y + r * dim, dim, r, qx);
    }
  }
}

// One block per token; threads over (head, i < half); the pair's math is rope_pair (row_ops.cuh).
template <typename T>
__global__ void rope_kernel(T* x, int64_t heads, int64_t hd, const int32_t* pos, const float* inv_freq, int64_t half,
                            float attn_factor) {
  const int64_t t = blockIdx.x;
  const float p = static_cast<float>(pos[t]);
  for (int64_t item = threadIdx.x; item < heads * half; item += blockDim.x) {
    const int64_t h = item / half, i = item % half;
    T* v = x + (t * heads + h) * hd;
    T lo, hi;
    rope_pair(v, i, half, p, inv_freq, attn_factor, lo, hi);
    v[i] = lo;
    v[i + half] = hi;
  }
}

template <typename T>
__global__ void kv_write_kernel(const T* k, const T* v, int64_t width, const int32_t* slots, int64_t n_slots, T* kc,
                                T* vc) {
  const int64_t t = blockIdx.x;
  const int64_t s = slots[t];
  if (s < 0 || s >= n_slots) return;
  for (int64_t d = threadIdx.x; d < width; d += blockDim.x) {
    kc[s * width + d] = k[t * width + d];
    vc[s * width + d] = v[t * width + d];
  }
}

template <typename T>
__global__ void gated_act_kernel(const T* g, const T* u, int act, int64_t n, T* o) {
  pdl_trigger();
  pdl_wait();  // between two GEMVs launched with launch_pdl
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    o[i] = from_f<T>(act_f(to_f(g[i]), act) * to_f(u[i]));
}

// gated_act_kernel's values over rows of `cols` (a multiple of 32), with their qx: one thread per
// 4-value slot of a row's padded length, as qmatmul.cu's quantize kernel. out may alias gate.
template <int GS>
__global__ void gated_act_qx_kernel(const __nv_bfloat16* g, const __nv_bfloat16* u, int act, int64_t cols, QxOut q,
                                    __nv_bfloat16* o, L2Prefetch pf) {
  if (blockIdx.x >= gridDim.x - pf.blocks) return l2_prefetch(pf, blockIdx.x - (gridDim.x - pf.blocks));
  KILN_STAMP_SCOPE(kStampGatedAct);
  pdl_trigger();
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= q.L.n * q.L.units * 8) return;  // whole warps
  const int64_t tok = (i >> 3) / q.L.units, col = (i % (q.L.units * 8)) * 4;
  pdl_wait();
  float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (col < cols) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t k = tok * cols + col + e;
      const __nv_bfloat16 v = from_f<__nv_bfloat16>(act_f(to_f(g[k]), act) * to_f(u[k]));
      o[k] = v;
      f[e] = to_f(v);
    }
  }
  qx_store4<GS>(f, tok, col, q.L, static_cast<uint32_t*>(q.base),
                reinterpret_cast<float2*>(static_cast<char*>(q.base) + q.L.code_bytes));
}

template <typename T>
__global__ void add_kernel(const T* a, const T* b, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = from_f<T>(to_f(a[i]) + to_f(b[i]));
}

template <typename T>
__global__ void scale_kernel(T* x, int64_t n, float s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    x[i] = from_f<T>(to_f(x[i]) * s);
}

template <typename T>
__global__ void softcap_kernel(T* x, int64_t n, float cap) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    x[i] = from_f<T>(cap * tanhf(to_f(x[i]) / cap));
}

template <typename YT, typename BT>
__global__ void add_bias_kernel(YT* y, int64_t rows, int64_t cols, const BT* bias) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = from_f<YT>(to_f(y[i]) + to_f(bias[i % cols]));
}

// One CUDA block per row; W is the copy unit (16 bytes where rows and pointers allow, else 1).
template <typename W>
__global__ void gather_rows_kernel(const W* x, int64_t row_words, const int32_t* rows, int64_t n_rows, W* out) {
  const int64_t i = blockIdx.x;
  const int64_t r = rows[i];
  const bool ok = r >= 0 && r < n_rows;
  for (int64_t b = threadIdx.x; b < row_words; b += blockDim.x) out[i * row_words + b] = ok ? x[r * row_words + b] : W{};
}

template <typename W>
__global__ void scatter_rows_kernel(const W* src, int64_t row_words, const int32_t* rows, int64_t n_rows, W* dst) {
  const int64_t i = blockIdx.x;
  const int64_t r = rows[i];
  if (r < 0 || r >= n_rows) return;
  for (int64_t b = threadIdx.x; b < row_words; b += blockDim.x) dst[r * row_words + b] = src[i * row_words + b];
}

static bool aligned16(const void* a, const void* b, int64_t row_bytes) {
  return row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0;
}

// Sequential over i (rows repeat) so the sums happen in the CPU's order; parallel over columns.
template <typename T>
__global__ void scatter_add_rows_kernel(const T* src, const int32_t* rows, const float* w, int64_t m, int64_t d,
                                        int64_t n, T* dst) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= d) return;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t r = rows[i];
    if (r < 0 || r >= n) continue;
    dst[r * d + j] = from_f<T>(to_f(dst[r * d + j]) + w[i] * to_f(src[i * d + j]));
  }
}

// (v, i) replaces (best, bi) when it is larger, or equal at a lower index; i < 0: no candidate.
// NaN compares false and never wins.
__device__ __forceinline__ bool argmax_better(float v, int32_t i, float best, int32_t bi) {
  return i >= 0 && (bi < 0 || v > best || (v == best && i < bi));
}

// This block's (max, first index) over xr[lo, hi): per thread over its strided elements in
// increasing order, 8 loads in flight at a time, then a block reduction; thread 0 gets the result.
template <typename T>
__device__ __forceinline__ void block_argmax(const T* xr, int64_t lo, int64_t hi, float& best, int32_t& bi) {
  best = -FLT_MAX;
  bi = -1;
  for (int64_t j0 = lo + threadIdx.x; j0 < hi; j0 += 8 * int64_t{blockDim.x}) {
    float v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int64_t j = j0 + u * int64_t{blockDim.x};
      v[u] = j < hi ? to_f(xr[j]) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int64_t j = j0 + u * int64_t{blockDim.x};
      if (j < hi && (bi < 0 || v[u] > best)) best = v[u], bi = static_cast<int32_t>(j);
    }
  }
  __shared__ float sv[kThreads];
  __shared__ int32_t si[kThreads];
  sv[threadIdx.x] = best;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o && argmax_better(sv[threadIdx.x + o], si[threadIdx.x + o], sv[threadIdx.x], si[threadIdx.x]))
      sv[threadIdx.x] = sv[threadIdx.x + o], si[threadIdx.x] = si[threadIdx.x + o];
    __syncthreads();
  }
  best = sv[0];
  bi = si[0];
}

// grid (rows, splits): block (r, b) takes columns [b chunk, (b + 1) chunk) of row r. One split: the
// row's index goes to ids (0 for an empty row); more: (max, index) to the partials, which
// argmax_final_kernel combines in split order (so the first index on ties is kept, torch.argmax).
template <typename T>
__global__ void argmax_kernel(const T* x, int64_t n, int64_t chunk, int32_t* ids, float* pv, int32_t* pi) {
  const int64_t lo = blockIdx.y * chunk, hi = lo + chunk < n ? lo + chunk : n;
  float best;
  int32_t bi;
  block_argmax(x + blockIdx.x * n, lo, hi, best, bi);
  if (threadIdx.x != 0) return;
  if (gridDim.y == 1) {
    ids[blockIdx.x] = bi < 0 ? 0 : bi;
  } else {
    pv[blockIdx.x * gridDim.y + blockIdx.y] = best;
    pi[blockIdx.x * gridDim.y + blockIdx.y] = bi;
  }
}

// One warp per row over its `splits` partials.
__global__ void argmax_final_kernel(const float* pv, const int32_t* pi, int splits, int32_t* ids) {
  float best = -FLT_MAX;
  int32_t bi = -1;
  for (int b = threadIdx.x; b < splits; b += 32) {
    const float v = pv[blockIdx.x * splits + b];
    const int32_t i = pi[blockIdx.x * splits + b];
    if (argmax_better(v, i, best, bi)) best = v, bi = i;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, o);
    const int32_t i = __shfl_xor_sync(0xffffffffu, bi, o);
    if (argmax_better(v, i, best, bi)) best = v, bi = i;
  }
  if (threadIdx.x == 0) ids[blockIdx.x] = bi < 0 ? 0 : bi;
}

template <typename ST, typename DT>
__global__ void convert_kernel(const ST* s, DT* d, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    d[i] = from_f<DT>(to_f(s[i]));
}

}  // namespace

void launch_embedding(const void* table, Dt tt, int64_t vocab, int64_t dim, const int32_t* ids, int64_t n, void* out,
                      Dt ot, cudaStream_t s) {
  if (n == 0) return;
  dispatch(tt, [&]<typename TT>() {
    dispatch(ot, [&]<typename OT>() {
      embedding_kernel<TT, OT><<<n, row_threads(dim), 0, s>>>(static_cast<const TT*>(table), vocab, dim, ids,
                                                             static_cast<OT*>(out));
    });
  });
  KILN_CUDA_LAUNCH_CHECK("embedding");
}

void launch_rms_norm(const void* x, Dt xt, const void* w, Dt wt, float eps, bool one_plus_w, int64_t rows, int64_t dim,
                     void* y, Dt yt, cudaStream_t s, const QxOut& qx) {
  if (rows == 0) return;
  dispatch(xt, [&]<typename XT>() {
    dispatch(wt, [&]<typename WT>() {
      if (yt != xt) {
        std::fprintf(stderr, "[cuda] rms_norm: y dtype must equal x dtype\n");
        std::abort();
      }
      dispatch_row_regs(dim, [&]<int K>() {
        rms_norm_kernel<XT, WT, XT, K><<<rows, row_threads(dim), row_smem(dim, sizeof(XT), qx.base != nullptr), s>>>(
            static_cast<const XT*>(x), static_cast<const WT*>(w), eps, one_plus_w, dim, static_cast<XT*>(y), qx);
      });
    });
  });
  KILN_CUDA_LAUNCH_CHECK("rms_norm");
}

void launch_rope(void* x, Dt xt, int64_t n, int64_t heads, int64_t head_dim, const int32_t* pos, const float* inv_freq,
                 int64_t half, float attn_factor, cudaStream_t s) {
  if (n == 0 || half == 0) return;
  dispatch(xt, [&]<typename T>() {
    rope_kernel<T><<<n, row_threads(heads * half), 0, s>>>(static_cast<T*>(x), heads, head_dim, pos, inv_freq, half,
                                                          attn_factor);
  });
  KILN_CUDA_LAUNCH_CHECK("rope");
}

void launch_kv_write(const void* k, const void* v, Dt kt, int64_t n, int64_t width, const int32_t* slots,
                     int64_t n_slots, void* k_cache, void* v_cache, Dt ct, cudaStream_t s) {
  if (n == 0) return;
  dispatch(kt, [&]<typename T>() {
    kv_write_kernel<T><<<n, row_threads(width), 0, s>>>(static_cast<const T*>(k), static_cast<const T*>(v), width, slots,
                                                       n_slots, static_cast<T*>(k_cache), static_cast<T*>(v_cache));
  });
  KILN_CUDA_LAUNCH_CHECK("kv_write");
}

void launch_gated_act(const void* gate, const void* up, int act, int64_t n, void* out, Dt t, cudaStream_t s,
                      int64_t cols, const QxOut& qx, const L2Prefetch& pf) {
  if (n == 0) return;
  if (qx.base) {
    const auto* g = static_cast<const __nv_bfloat16*>(gate);
    const auto* u = static_cast<const __nv_bfloat16*>(up);
    auto* o = static_cast<__nv_bfloat16*>(out);
    const unsigned grid = grid_for(qx.L.n * qx.L.units * 8, kThreads) + pf.blocks;
    switch (qx.group_size) {
      case 32: launch_pdl(gated_act_qx_kernel<32>, grid, kThreads, 0, s, g, u, act, cols, qx, o, pf); break;
      case 64: launch_pdl(gated_act_qx_kernel<64>, grid, kThreads, 0, s, g, u, act, cols, qx, o, pf); break;
      default: launch_pdl(gated_act_qx_kernel<128>, grid, kThreads, 0, s, g, u, act, cols, qx, o, pf); break;
    }
    KILN_CUDA_LAUNCH_CHECK("gated_act");
    return;
  }
  dispatch(t, [&]<typename T>() {
    launch_pdl(gated_act_kernel<T>, grid_for(n, kThreads), kThreads, 0, s, static_cast<const T*>(gate),
               static_cast<const T*>(up), act, n, static_cast<T*>(out));
  });
  KILN_CUDA_LAUNCH_CHECK("gated_act");
}

void launch_add(const void* a, const void* b, void* y, int64_t n, Dt t, cudaStream_t s) {
  if (n == 0) return;
  dispatch(t, [&]<typename T>() {
    add_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<const T*>(a), static_cast<const T*>(b),
                                                             static_cast<T*>(y), n);
  });
  KILN_CUDA_LAUNCH_CHECK("add");
}

void launch_scale(void* x, int64_t n, float sc, Dt t, cudaStream_t s) {
  if (n == 0) return;
  dispatch(t, [&]<typename T>() { scale_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<T*>(x), n, sc); });
  KILN_CUDA_LAUNCH_CHECK("scale");
}

void launch_softcap(void* x, int64_t n, float cap, Dt t, cudaStream_t s) {
  if (n == 0) return;
  dispatch(t, [&]<typename T>() { softcap_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<T*>(x), n, cap); });
  KILN_CUDA_LAUNCH_CHECK("softcap");
}

void launch_add_bias(void* y, Dt yt, int64_t rows, int64_t cols, const void* bias, Dt bt, cudaStream_t s) {
  if (rows * cols == 0) return;
  dispatch(yt, [&]<typename YT>() {
    dispatch(bt, [&]<typename BT>() {
      add_bias_kernel<YT, BT><<<grid_for(rows * cols, kThreads), kThreads, 0, s>>>(static_cast<YT*>(y), rows, cols,
                                                                                   static_cast<const BT*>(bias));
    });
  });
  KILN_CUDA_LAUNCH_CHECK("add_bias");
}

void launch_gather_rows(const void* x, int64_t row_bytes, const int32_t* rows, int64_t n_out, int64_t n_rows, void* out,
                        cudaStream_t s) {
  if (n_out == 0) return;
  if (aligned16(x, out, row_bytes))
    gather_rows_kernel<<<n_out, 128, 0, s>>>(static_cast<const int4*>(x), row_bytes / 16, rows, n_rows, static_cast<int4*>(out));
  else
    gather_rows_kernel<<<n_out, 128, 0, s>>>(static_cast<const char*>(x), row_bytes, rows, n_rows, static_cast<char*>(out));
  KILN_CUDA_LAUNCH_CHECK("gather_rows");
}

void launch_scatter_rows(const void* src, int64_t row_bytes, const int32_t* rows, int64_t n_src, int64_t n_rows, void* dst,
                         cudaStream_t s) {
  if (n_src == 0) return;
  if (aligned16(src, dst, row_bytes))
    scatter_rows_kernel<<<n_src, 128, 0, s>>>(static_cast<const int4*>(src), row_bytes / 16, rows, n_rows, static_cast<int4*>(dst));
  else
    scatter_rows_kernel<<<n_src, 128, 0, s>>>(static_cast<const char*>(src), row_bytes, rows, n_rows, static_cast<char*>(dst));
  KILN_CUDA_LAUNCH_CHECK("scatter_rows");
}

void launch_scatter_add_rows(const void* src, const int32_t* rows, const float* weights, int64_t m, int64_t d,
                             int64_t n, void* dst, Dt t, cudaStream_t s) {
  if (m == 0 || d == 0) return;
  dispatch(t, [&]<typename T>() {
    scatter_add_rows_kernel<T><<<grid_for(d, 128), 128, 0, s>>>(static_cast<const T*>(src), rows, weights, m, d, n,
                                                                static_cast<T*>(dst));
  });
  KILN_CUDA_LAUNCH_CHECK("scatter_add_rows");
}

int argmax_splits(int64_t rows, int64_t n) {
  if (rows >= 64) return 1;  // enough blocks already
  const int64_t b = n / 4096;  // at least 4096 columns (16 per thread) per block
  return static_cast<int>(b < 1 ? 1 : b > 64 ? 64 : b);
}

void launch_argmax_rows(const void* x, Dt t, int64_t rows, int64_t n, int32_t* ids, void* scratch, cudaStream_t s) {
  if (rows == 0) return;
  const int splits = argmax_splits(rows, n);
  const int64_t chunk = (n + splits - 1) / splits;
  auto* pv = static_cast<float*>(scratch);
  auto* pi = reinterpret_cast<int32_t*>(pv + rows * splits);
  dispatch(t, [&]<typename T>() {
    argmax_kernel<T><<<dim3(static_cast<unsigned>(rows), static_cast<unsigned>(splits)), kThreads, 0, s>>>(
        static_cast<const T*>(x), n, chunk, ids, pv, pi);
  });
  if (splits > 1) argmax_final_kernel<<<static_cast<unsigned>(rows), 32, 0, s>>>(pv, pi, splits, ids);
  KILN_CUDA_LAUNCH_CHECK("argmax_rows");
}

void launch_convert(const void* src, Dt st, void* dst, Dt dt, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  dispatch(st, [&]<typename ST>() {
    dispatch(dt, [&]<typename DT>() {
      convert_kernel<ST, DT><<<grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<const ST*>(src),
                                                                        static_cast<DT*>(dst), n);
    });
  });
  KILN_CUDA_LAUNCH_CHECK("convert");
}

}  // namespace kiln::backend::cuda
