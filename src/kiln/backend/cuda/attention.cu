// Paged attention kernels (semantics: Backend::attention in backend.h).
// decode: grid (token, kv head, split). A block scores its split's keys for every query head of
//   the GQA group (K/V rows read once per group), softmaxes them locally and writes either the
//   output (one split) or (m, l, acc[head_dim]) partials that a combine kernel merges: split-K
//   flash decoding, so a long context or a batch of one still fills the GPU.
// prefill: grid (64-token tile, head). FA2-style: each of 4 warps owns 16 query rows, Q in
//   registers, K and Vᵀ tiles of 64 keys in shared memory, S = QKᵀ and O += PV on mma.sync
//   m16n8k16 bf16 tensor cores with an online softmax in f32. A tile whose rows belong to several
//   sequences runs one pass per sequence (rows of other sequences are masked in that pass).
#include <cfloat>
#include <cmath>

#include "kiln/backend/cuda/common.cuh"

namespace kiln::backend::cuda {

namespace {

constexpr int kDecodeThreads = 128;
constexpr int kMaxGroup = 16;    // n_heads / n_kv_heads handled by one decode block
constexpr int kMaxHeadDim = 256;

__device__ __forceinline__ int64_t cache_row(const AttnArgs& a, int seq, int64_t j) {
  const int32_t blk = a.block_tables[int64_t{seq} * a.max_blocks + j / a.block_size];
  return (int64_t{blk} * a.block_size + j % a.block_size) * (int64_t{a.n_kv_heads} * a.head_dim);
}

__device__ __forceinline__ float cap_score(float s, float cap) { return cap > 0.0f ? cap * tanhf(s / cap) : s; }

// Dynamic shared memory: q_s [group][hd] f32, p_s [group][kps] f32, row_s [kps] int64.
__global__ void __launch_bounds__(kDecodeThreads) attn_decode_kernel(AttnArgs a, int n_splits, int kps, float* partials) {
  extern __shared__ float smem[];
  const int t = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int hd = a.head_dim, group = a.n_heads / a.n_kv_heads;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = kDecodeThreads / 32;
  float* q_s = smem;
  float* p_s = q_s + group * hd;
  const int row_off = group * hd + group * kps;  // in floats; rounded up to 8-byte alignment
  int64_t* row_s = reinterpret_cast<int64_t*>(smem + row_off + (row_off & 1));

  const int seq = a.token_seq[t];
  const int64_t pos = a.token_pos[t];
  const int64_t lo = a.window > 0 ? max(int64_t{0}, pos - a.window + 1) : 0;
  const int64_t j0 = lo + int64_t{split} * kps;
  const int64_t j1 = min(pos, j0 + kps - 1);  // inclusive
  const int nk = j0 <= j1 ? static_cast<int>(j1 - j0 + 1) : 0;
  const int64_t q_width = int64_t{a.n_heads} * hd;

  if (nk == 0) {  // an empty split (the context is shorter than the grid allows for)
    if (n_splits > 1)
      for (int i = threadIdx.x; i < group; i += blockDim.x) {
        float* pp = partials + ((int64_t{t} * a.n_heads + kvh * group + i) * n_splits + split) * (hd + 2);
        pp[0] = -INFINITY;
        pp[1] = 0.0f;
      }
    return;
  }

  const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(a.q) + int64_t{t} * q_width + int64_t{kvh} * group * hd;
  for (int i = threadIdx.x; i < group * hd; i += blockDim.x) q_s[i] = __bfloat162float(q[i]);
  for (int i = threadIdx.x; i < nk; i += blockDim.x) row_s[i] = cache_row(a, seq, j0 + i) + int64_t{kvh} * hd;
  __syncthreads();

  // Scores: a warp per key, lanes over head_dim; K row kept in registers for all heads of the group.
  const __nv_bfloat16* kc = static_cast<const __nv_bfloat16*>(a.k_cache);
  for (int i = warp; i < nk; i += n_warps) {
    float kv[kMaxHeadDim / 32];
#pragma unroll
    for (int c = 0; c < kMaxHeadDim / 32; ++c) {
      const int d = lane + 32 * c;
      kv[c] = d < hd ? __bfloat162float(kc[row_s[i] + d]) : 0.0f;
    }
    for (int g = 0; g < group; ++g) {
      float dot = 0.0f;
#pragma unroll
      for (int c = 0; c < kMaxHeadDim / 32; ++c) {
        const int d = lane + 32 * c;
        if (d < hd) dot = fmaf(kv[c], q_s[g * hd + d], dot);
      }
      dot = warp_sum(dot);
      if (lane == 0) p_s[g * kps + i] = cap_score(dot * a.scale, a.softcap);
    }
  }
  __syncthreads();

  // Softmax over this split, one warp per head: p = exp(s - m), l = sum p.
  __shared__ float m_s[kMaxGroup], l_s[kMaxGroup];
  for (int g = warp; g < group; g += n_warps) {
    float m = -INFINITY;
    for (int i = lane; i < nk; i += 32) m = fmaxf(m, p_s[g * kps + i]);
    m = warp_max(m);
    float l = 0.0f;
    for (int i = lane; i < nk; i += 32) {
      const float e = __expf(p_s[g * kps + i] - m);
      p_s[g * kps + i] = e;
      l += e;
    }
    l = warp_sum(l);
    if (lane == 0) m_s[g] = m, l_s[g] = l;
  }
  __syncthreads();

  // acc[g][d] = sum_i p[g][i] * V[i][d]; threads over (g, d), V rows read coalesced along d.
  const __nv_bfloat16* vc = static_cast<const __nv_bfloat16*>(a.v_cache);
  for (int item = threadIdx.x; item < group * hd; item += blockDim.x) {
    const int g = item / hd, d = item % hd;
    // 8 independent V loads in flight per thread before they are used (a serial chain of L2
    // round trips was this kernel's cost at large batches).
    float acc = 0.0f;
    int i = 0;
    for (; i + 8 <= nk; i += 8) {
      float v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = __bfloat162float(vc[row_s[i + u] + d]);
#pragma unroll
      for (int u = 0; u < 8; ++u) acc = fmaf(p_s[g * kps + i + u], v[u], acc);
    }
    for (; i < nk; ++i) acc = fmaf(p_s[g * kps + i], __bfloat162float(vc[row_s[i] + d]), acc);
    const int h = kvh * group + g;
    if (n_splits == 1) {
      static_cast<__nv_bfloat16*>(a.out)[int64_t{t} * q_width + int64_t{h} * hd + d] = __float2bfloat16_rn(acc / l_s[g]);
    } else {
      float* pp = partials + ((int64_t{t} * a.n_heads + h) * n_splits + split) * (hd + 2);
      if (d == 0) pp[0] = m_s[g], pp[1] = l_s[g];
      pp[2 + d] = acc;
    }
  }
}

// grid (token, head): out = sum_s acc_s * e^(m_s - M) / sum_s l_s * e^(m_s - M).
__global__ void attn_combine_kernel(AttnArgs a, int n_splits, const float* partials) {
  const int t = blockIdx.x, h = blockIdx.y, hd = a.head_dim;
  const float* pp = partials + (int64_t{t} * a.n_heads + h) * n_splits * (hd + 2);
  float M = -INFINITY;
  for (int s = 0; s < n_splits; ++s) M = fmaxf(M, pp[s * (hd + 2)]);
  float L = 0.0f;
  for (int s = 0; s < n_splits; ++s) {
    const float m = pp[s * (hd + 2)];
    if (m != -INFINITY) L += pp[s * (hd + 2) + 1] * __expf(m - M);
  }
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
      const float m = pp[s * (hd + 2)];
      if (m != -INFINITY) acc += pp[s * (hd + 2) + 2 + d] * __expf(m - M);
    }
    static_cast<__nv_bfloat16*>(a.out)[(int64_t{t} * a.n_heads + h) * hd + d] = __float2bfloat16_rn(acc / L);
  }
}

// ---- prefill (tensor cores)

constexpr int kBQ = 64;  // query rows per block (4 warps x 16)
constexpr int kBK = 64;  // keys per tile

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <int HD>
__global__ void __launch_bounds__(128) attn_prefill_kernel(AttnArgs a) {
  constexpr int KS = HD + 8;   // K tile row stride (bf16): +16 B keeps the B-fragment loads conflict-free
  constexpr int VS = kBK + 8;  // Vᵀ tile row stride
  __shared__ __align__(16) __nv_bfloat16 Ks[kBK * KS];
  __shared__ __align__(16) __nv_bfloat16 Vt[HD * VS];
  __shared__ int row_seq[kBQ], row_lo[kBQ], row_hi[kBQ];
  __shared__ int pass_seq[kBQ], pass_lo[kBQ], pass_hi[kBQ];
  __shared__ int n_pass;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  const int t0 = blockIdx.x * kBQ, h = blockIdx.y, group = a.n_heads / a.n_kv_heads, kvh = h / group;
  const int64_t q_width = int64_t{a.n_heads} * HD;

  if (tid < kBQ) {
    const int t = t0 + tid;
    if (t < a.n_tokens) {
      const int pos = a.token_pos[t];
      row_seq[tid] = a.token_seq[t];
      row_hi[tid] = pos;
      row_lo[tid] = a.window > 0 ? max(0, pos - a.window + 1) : 0;
    } else {
      row_seq[tid] = -1;
    }
  }
  __syncthreads();
  if (tid == 0) {  // distinct sequences of the tile, with the key range each pass must cover
    int np = 0;
    for (int r = 0; r < kBQ; ++r) {
      if (row_seq[r] < 0) continue;
      int p = 0;
      while (p < np && pass_seq[p] != row_seq[r]) ++p;
      if (p == np) pass_seq[np] = row_seq[r], pass_lo[np] = row_lo[r], pass_hi[np] = row_hi[r], ++np;
      else pass_lo[p] = min(pass_lo[p], row_lo[r]), pass_hi[p] = max(pass_hi[p], row_hi[r]);
    }
    n_pass = np;
  }
  __syncthreads();

  // This thread's two rows (A: g, B: g + 8 of the warp's 16) and its Q fragments.
  const int ra = warp * 16 + g, rb = ra + 8;
  const int seq_a = row_seq[ra], seq_b = row_seq[rb];
  const int lo_a = row_lo[ra], hi_a = row_hi[ra], lo_b = row_lo[rb], hi_b = row_hi[rb];
  uint32_t qf[HD / 16][4];
  {
    const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(a.q) + int64_t{h} * HD;
    const int64_t oa = int64_t{t0 + ra} * q_width, ob = int64_t{t0 + rb} * q_width;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      const int c = kk * 16 + tig * 2;
      qf[kk][0] = seq_a >= 0 ? *reinterpret_cast<const uint32_t*>(q + oa + c) : 0u;
      qf[kk][1] = seq_b >= 0 ? *reinterpret_cast<const uint32_t*>(q + ob + c) : 0u;
      qf[kk][2] = seq_a >= 0 ? *reinterpret_cast<const uint32_t*>(q + oa + c + 8) : 0u;
      qf[kk][3] = seq_b >= 0 ? *reinterpret_cast<const uint32_t*>(q + ob + c + 8) : 0u;
    }
  }
  float o[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  const float sl2 = a.scale * 1.4426950408889634f;  // exp(x) = exp2(x * log2 e)

  const __nv_bfloat16* kc = static_cast<const __nv_bfloat16*>(a.k_cache);
  const __nv_bfloat16* vc = static_cast<const __nv_bfloat16*>(a.v_cache);
  for (int p = 0; p < n_pass; ++p) {
    const int seq = pass_seq[p], klo = pass_lo[p], khi = pass_hi[p];
    const bool act_a = seq_a == seq, act_b = seq_b == seq;
    for (int kt = klo; kt <= khi; kt += kBK) {
      __syncthreads();  // the previous tile is consumed
      // Load K [kBK][HD] and Vᵀ [HD][kBK]: consecutive threads take consecutive keys (conflict-free
      // transposed stores), each a 16-byte chunk of one row; keys past the range are zero.
      for (int idx = tid; idx < kBK * (HD / 8); idx += 128) {
        const int key = idx % kBK, c = idx / kBK;
        const int j = kt + key;
        uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
        if (j <= khi) {
          const int64_t row = cache_row(a, seq, j) + int64_t{kvh} * HD + c * 8;
          kv = *reinterpret_cast<const uint4*>(kc + row);
          vv = *reinterpret_cast<const uint4*>(vc + row);
        }
        *reinterpret_cast<uint4*>(&Ks[key * KS + c * 8]) = kv;
        const __nv_bfloat16* ve = reinterpret_cast<const __nv_bfloat16*>(&vv);
#pragma unroll
        for (int i = 0; i < 8; ++i) Vt[(c * 8 + i) * VS + key] = ve[i];
      }
      __syncthreads();
      if (__all_sync(0xffffffffu, !act_a && !act_b)) continue;  // no row of this warp is in this pass

      // S [16 x kBK] = Q Kᵀ
      float s[kBK / 8][4];
#pragma unroll
      for (int nt = 0; nt < kBK / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk)
#pragma unroll
        for (int nt = 0; nt < kBK / 8; ++nt) {
          const __nv_bfloat16* kr = &Ks[(nt * 8 + g) * KS + kk * 16 + tig * 2];
          mma_bf16(s[nt], qf[kk], *reinterpret_cast<const uint32_t*>(kr), *reinterpret_cast<const uint32_t*>(kr + 8));
        }
      // Scale, softcap, mask (causal, window, other sequences), in log2 units.
      float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kBK / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = kt + nt * 8 + tig * 2 + (e & 1);
          const bool rowb = e >= 2;
          const bool ok = rowb ? (act_b && j >= lo_b && j <= hi_b) : (act_a && j >= lo_a && j <= hi_a);
          float v = s[nt][e];
          if (a.softcap > 0.0f) v = a.softcap * tanhf(v * a.scale / a.softcap) * 1.4426950408889634f;
          else v *= sl2;
          v = ok ? v : -INFINITY;
          s[nt][e] = v;
          if (rowb) mx_b = fmaxf(mx_b, v);
          else mx_a = fmaxf(mx_a, v);
        }
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
      const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
      // A row with nothing visible yet keeps m = -inf: use 0 as the reference so exp2 gives 0, not NaN.
      const float ref_a = mn_a == -INFINITY ? 0.0f : mn_a, ref_b = mn_b == -INFINITY ? 0.0f : mn_b;
      const float al_a = exp2f(m_a - ref_a), al_b = exp2f(m_b - ref_b);
      m_a = mn_a;
      m_b = mn_b;
      float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kBK / 8; ++nt) {
        s[nt][0] = exp2f(s[nt][0] - ref_a);
        s[nt][1] = exp2f(s[nt][1] - ref_a);
        s[nt][2] = exp2f(s[nt][2] - ref_b);
        s[nt][3] = exp2f(s[nt][3] - ref_b);
        sum_a += s[nt][0] + s[nt][1];
        sum_b += s[nt][2] + s[nt][3];
      }
      l_a = l_a * al_a + sum_a;  // per-thread partial sums; reduced over the quad at the end
      l_b = l_b * al_b + sum_b;
#pragma unroll
      for (int dn = 0; dn < HD / 8; ++dn) {
        o[dn][0] *= al_a;
        o[dn][1] *= al_a;
        o[dn][2] *= al_b;
        o[dn][3] *= al_b;
      }
      // O += P V: the S accumulator layout is the A-fragment layout of P (two n-tiles per k-step).
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                          pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int dn = 0; dn < HD / 8; ++dn) {
          const __nv_bfloat16* vr = &Vt[(dn * 8 + g) * VS + kk * 16 + tig * 2];
          mma_bf16(o[dn], pa, *reinterpret_cast<const uint32_t*>(vr), *reinterpret_cast<const uint32_t*>(vr + 8));
        }
      }
    }
  }
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(a.out) + int64_t{h} * HD;
  const float ia = l_a > 0.0f ? 1.0f / l_a : 0.0f, ib = l_b > 0.0f ? 1.0f / l_b : 0.0f;
#pragma unroll
  for (int dn = 0; dn < HD / 8; ++dn) {
    const int c = dn * 8 + tig * 2;
    if (seq_a >= 0)
      *reinterpret_cast<__nv_bfloat162*>(out + int64_t{t0 + ra} * q_width + c) =
          __floats2bfloat162_rn(o[dn][0] * ia, o[dn][1] * ia);
    if (seq_b >= 0)
      *reinterpret_cast<__nv_bfloat162*>(out + int64_t{t0 + rb} * q_width + c) =
          __floats2bfloat162_rn(o[dn][2] * ib, o[dn][3] * ib);
  }
}

}  // namespace

int64_t attention_partials_floats(const AttnArgs& a, int n_splits) {
  return int64_t{a.n_tokens} * a.n_heads * n_splits * (a.head_dim + 2);
}

void launch_attention_decode(const AttnArgs& a, int n_splits, int kps, float* partials, cudaStream_t s) {
  if (a.n_tokens == 0) return;
  const int group = a.n_heads / a.n_kv_heads;
  if (group > kMaxGroup || a.head_dim > kMaxHeadDim) {
    std::fprintf(stderr, "[cuda] attention: GQA group %d > %d or head_dim %d > %d\n", group, kMaxGroup, a.head_dim,
                 kMaxHeadDim);
    std::abort();
  }
  const size_t smem = sizeof(float) * (group * a.head_dim + group * kps + 2) + sizeof(int64_t) * kps;
  static bool raised = false;  // opt in to more than 48 KB of dynamic shared memory, once
  if (!raised) {
    cudaFuncSetAttribute(attn_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
    raised = true;
  }
  dim3 grid(a.n_tokens, a.n_kv_heads, n_splits);
  attn_decode_kernel<<<grid, kDecodeThreads, smem, s>>>(a, n_splits, kps, partials);
  KILN_CUDA_LAUNCH_CHECK("attention_decode");
  if (n_splits > 1) {
    attn_combine_kernel<<<dim3(a.n_tokens, a.n_heads), a.head_dim >= 128 ? 128 : 64, 0, s>>>(a, n_splits, partials);
    KILN_CUDA_LAUNCH_CHECK("attention_combine");
  }
}

bool attention_prefill_supported(int head_dim) { return head_dim == 32 || head_dim == 64 || head_dim == 128; }

void launch_attention_prefill(const AttnArgs& a, cudaStream_t s) {
  if (a.n_tokens == 0) return;
  dim3 grid((a.n_tokens + kBQ - 1) / kBQ, a.n_heads);
  switch (a.head_dim) {
    case 32: attn_prefill_kernel<32><<<grid, 128, 0, s>>>(a); break;
    case 64: attn_prefill_kernel<64><<<grid, 128, 0, s>>>(a); break;
    case 128: attn_prefill_kernel<128><<<grid, 128, 0, s>>>(a); break;
    default: std::fprintf(stderr, "[cuda] attention prefill: head_dim %d\n", a.head_dim); std::abort();
  }
  KILN_CUDA_LAUNCH_CHECK("attention_prefill");
}

}  // namespace kiln::backend::cuda
