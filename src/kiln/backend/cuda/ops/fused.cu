// Fused row kernels that cut launches from a decode step (Backend::add_rms_norm, ::rope_kv_write;
// the multi-matrix GEMV is in gemv_fast.cu). Each computes exactly what the separate kernels of
// elementwise.cu compute, through the same device helpers (row_ops.cuh): the fused forms only skip
// the launches and the round trips of the intermediate through global memory.
#include <type_traits>

#include "kiln/backend/cuda/quant/qx.cuh"
#include "kiln/backend/cuda/ops/row_ops.cuh"

namespace kiln::backend::cuda {

namespace {

// One block per row (row_threads(dim) threads, as rms_norm_kernel): x = round(x + delta) stored,
// its square accumulated from the rounded value (what rms_norm would read back), then the norm.
// Every element is read and written by one thread only (d = threadIdx.x strided in both passes),
// so y may alias x or delta. K > 0: the row in registers (row_regs), the weights requested before
// the previous kernel is waited for; 0: loops. qx.base set (bf16): then y's qx (qx.cuh).
template <typename XT, typename WT, int K>
__global__ void __launch_bounds__(kRowThreadsMax)
    add_rms_norm_kernel(XT* x, const XT* delta, const WT* w, float eps, bool one_plus, int64_t dim, XT* y, QxOut qx,
                        L2Prefetch pf) {
  const unsigned rows = gridDim.x - pf.blocks;  // then pf.blocks prefetching blocks
  if (blockIdx.x >= rows) return l2_prefetch(pf, blockIdx.x - rows);
  KILN_STAMP_SCOPE(kStampAddRmsNorm);
  pdl_trigger();
  const int64_t r = blockIdx.x;
  XT* xr = x + r * dim;
  const XT* dr = delta + r * dim;
  float ss = 0.0f;
  if constexpr (K == 0) {
    pdl_wait();  // x and delta come from earlier kernels (launched with launch_pdl)
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      const XT v = from_f<XT>(to_f(xr[d]) + to_f(dr[d]));  // add_kernel's rounding
      xr[d] = v;
      ss = sq_acc(ss, to_f(v));
    }
    ss = block_sum(ss);
    rms_norm_store(static_cast<const XT*>(xr), w, ss, eps, one_plus, dim, y + r * dim);
  } else {
    WT wv[K];
    load_row(w, dim, wv);
    pdl_wait();
    XT v[K], dv[K];
    load_row(static_cast<const XT*>(xr), dim, v);
    load_row(dr, dim, dv);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t d = threadIdx.x + int64_t{k} * blockDim.x;
      if (d >= dim) break;
      v[k] = from_f<XT>(to_f(v[k]) + to_f(dv[k]));
      xr[d] = v[k];
      ss = sq_acc(ss, to_f(v[k]));
    }
    ss = block_sum(ss);
    KILN_STAMP(2);  // a probe build's stamp: the sum of squares known
    rms_norm_store_regs(v, wv, ss, eps, one_plus, dim, y + r * dim, qx.base ? row_s<XT>() : nullptr);
  }
  if constexpr (std::is_same_v<XT, __nv_bfloat16>) {
    if (qx.base) {
      __syncthreads();  // the row's y, written by every thread of the block
      qx_store_row_gs(K > 0 ? row_s<XT>() : y + r * dim, dim, r, qx);
    }
  }
}

// Grid (token, head): blocks y < n_heads rotate that q head's pairs; the others take kv head
// j = y - n_heads: its k pairs (rotated in place and, for a valid slot, stored into the cache row),
// its k dims past the rotary part (copied unrotated) and its v slice (copied). A block per head
// rather than per token: a decode step has one token, and its ~40 heads then spread over as many
// SMs instead of queueing on one. No item reads what another writes.
template <typename T>
__global__ void rope_kv_write_kernel(RopeKvArgs a) {
  KILN_STAMP_SCOPE(kStampRopeKv);
  pdl_trigger();
  pdl_wait();  // q, k, v come from the GEMV before (launched with launch_pdl)
  const int64_t t = blockIdx.x, y = blockIdx.y;
  const int64_t hd = a.head_dim, half = a.half, width = a.n_kv_heads * hd;
  const float p = static_cast<float>(a.pos[t]);
  if (y < a.n_heads) {
    T* h = static_cast<T*>(a.q) + (t * a.n_heads + y) * hd;
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
      T lo, hi;
      rope_pair(h, i, half, p, a.inv_freq, a.attn_factor, lo, hi);
      h[i] = lo;
      h[i + half] = hi;
    }
    return;
  }
  const int64_t off = (y - a.n_heads) * hd;  // this kv head's columns in k, v and the cache rows
  const int64_t s = a.slots[t];
  const bool write = s >= 0 && s < a.n_slots;  // negative: a padding token, nothing cached
  T* k = static_cast<T*>(a.k) + t * width + off;
  const T* v = static_cast<const T*>(a.v) + t * width + off;
  T* kc = write ? static_cast<T*>(a.k_cache) + s * width + off : nullptr;  // used only when write
  T* vc = write ? static_cast<T*>(a.v_cache) + s * width + off : nullptr;
  const int64_t rest = hd - 2 * half;  // k dims past the rotary part
  const int64_t total = half + (write ? rest + hd : 0);
  for (int64_t item = threadIdx.x; item < total; item += blockDim.x) {
    if (item < half) {
      T lo, hi;
      rope_pair(k, item, half, p, a.inv_freq, a.attn_factor, lo, hi);
      k[item] = lo;
      k[item + half] = hi;
      if (write) {
        kc[item] = lo;
        kc[item + half] = hi;
      }
    } else if (item < half + rest) {
      const int64_t d = 2 * half + (item - half);
      kc[d] = k[d];
    } else {
      const int64_t d = item - half - rest;
      vc[d] = v[d];
    }
  }
}

}  // namespace

void launch_add_rms_norm(void* x, const void* delta, Dt xt, const void* w, Dt wt, float eps, bool one_plus_w,
                         int64_t rows, int64_t dim, void* y, cudaStream_t s, const QxOut& qx,
                         const L2Prefetch& pf) {
  if (rows == 0) return;
  dispatch(xt, [&]<typename XT>() {
    dispatch(wt, [&]<typename WT>() {
      dispatch_row_regs(dim, [&]<int K>() {
        launch_pdl(add_rms_norm_kernel<XT, WT, K>, static_cast<unsigned>(rows + pf.blocks), row_threads(dim),
                   row_smem(dim, sizeof(XT), qx.base != nullptr), s,
                   static_cast<XT*>(x), static_cast<const XT*>(delta), static_cast<const WT*>(w), eps, one_plus_w, dim,
                   static_cast<XT*>(y), qx, pf);
      });
    });
  });
  KILN_CUDA_LAUNCH_CHECK("add_rms_norm");
}

void launch_rope_kv_write(const RopeKvArgs& a, Dt t, cudaStream_t s) {
  if (a.n_tokens == 0 || a.n_heads + a.n_kv_heads == 0) return;
  const dim3 grid(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.n_heads + a.n_kv_heads));
  const int threads = a.head_dim > 256 ? 128 : 64;  // about one pair or element per thread
  dispatch(t, [&]<typename T>() { launch_pdl(rope_kv_write_kernel<T>, grid, threads, 0, s, a); });
  KILN_CUDA_LAUNCH_CHECK("rope_kv_write");
}

}  // namespace kiln::backend::cuda
