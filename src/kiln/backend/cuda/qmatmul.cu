// Quantized-weight kernels (MLX affine layout, docs/quantization.md): weight-streaming GEMVs for
// decode (y = x · dequant(w)ᵀ without materializing w): a CUDA-core kernel for every width and a
// tensor-core one for 4 bits (up to 8 tokens per pass), and a row dequantizer to bf16/f32 (the
// prefill path's tiles for cuBLASLt, and the quantized embedding gather).
// A "unit" is 32 consecutive codes of a row: exactly `bits` u32 words, never split across groups
// (group sizes are multiples of 32), so one lane reads a unit with `bits`-word loads and one scale.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kiln/backend/cuda/common.cuh"
#include "kiln/backend/cuda/qkernels.h"

namespace kiln::backend::cuda {

namespace {

constexpr int kQWarps = 4;  // warps per GEMV block

// Loads one unit (BITS words) with the widest loads its alignment allows (unit offsets are
// multiples of BITS * 4 bytes: 16 for 4/8-bit, 8 for 2/6-bit, 4 for 3/5-bit).
template <int BITS>
__device__ __forceinline__ void load_unit(const uint32_t* p, uint32_t (&w)[BITS]) {
  if constexpr (BITS % 4 == 0) {
#pragma unroll
    for (int c = 0; c < BITS / 4; ++c) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(p) + c);
      w[4 * c] = u.x, w[4 * c + 1] = u.y, w[4 * c + 2] = u.z, w[4 * c + 3] = u.w;
    }
  } else if constexpr (BITS % 2 == 0) {
#pragma unroll
    for (int c = 0; c < BITS / 2; ++c) {
      const uint2 u = __ldg(reinterpret_cast<const uint2*>(p) + c);
      w[2 * c] = u.x, w[2 * c + 1] = u.y;
    }
  } else {
#pragma unroll
    for (int c = 0; c < BITS; ++c) w[c] = __ldg(p + c);
  }
}

// Code j of a unit as the float 2^BITS + q, built by placing q at mantissa bit 23 - BITS under the
// exponent of 2^BITS (exact: q < 2^BITS fits the mantissa). One shift and one and-or per code once
// the loops are unrolled (j constant); codes straddling two words use a funnel shift.
template <int BITS>
__device__ __forceinline__ float code_plus_magic(const uint32_t (&w)[BITS], int j) {
  constexpr int pos = 23 - BITS;
  constexpr uint32_t magic = static_cast<uint32_t>(127 + BITS) << 23;
  constexpr uint32_t mask = ((1u << BITS) - 1) << pos;
  const int b = j * BITS, i = b >> 5, off = b & 31;
  uint32_t v;
  if (off + BITS <= 32) {
    v = pos >= off ? w[i] << (pos - off) : w[i] >> (off - pos);
  } else {
    v = __funnelshift_r(w[i], w[i + 1], off) << pos;
  }
  return __uint_as_float((v & mask) | magic);
}

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

// 8 bf16 (one 16-byte load) as floats: bf16 is the high half of an f32.
__device__ __forceinline__ void load_x8(const __nv_bfloat16* p, float (&v)[8]) {
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  const uint32_t a[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(a[i] << 16);
    v[2 * i + 1] = __uint_as_float(a[i] & 0xffff0000u);
  }
}

// grid (ceil(out / (kQWarps * R)), ceil(n / NT)); block kQWarps * 32. Warp w of the block owns rows
// [R * (blockIdx.x * kQWarps + w), +R) and tokens [NT * blockIdx.y, +NT); lanes stride over units,
// UN units per iteration with all their loads issued before use (bytes in flight hide DRAM latency).
// Per unit and token: part = Σ x·(2^BITS + q) and xs = Σ x, folded as
//   acc += scale · part + (bias − 2^BITS · scale) · xs   (= scale · Σ x·q + bias · Σ x).
// The x reads (L1 hits) are shared by the R rows of the warp.
template <int BITS, int NT, int R, int UN>
__global__ void __launch_bounds__(kQWarps * 32) qgemv_kernel(const __nv_bfloat16* __restrict__ x, int64_t n,
                                                             QWeightArgs q, const void* bias, Dt bt, void* y, Dt yt) {
  const int lane = threadIdx.x & 31;
  const int64_t r0 = (int64_t{blockIdx.x} * kQWarps + (threadIdx.x >> 5)) * R;
  if (r0 >= q.out) return;
  const int64_t t0 = int64_t{blockIdx.y} * NT;
  const int nt = static_cast<int>(n - t0 < NT ? n - t0 : NT);
  const int64_t U = q.in / 32, row_words = U * BITS, n_groups = q.in / q.group_size;
  const int gshift = q.group_size == 32 ? 0 : (q.group_size == 64 ? 1 : 2);  // unit -> group: u >> gshift
  constexpr float M = static_cast<float>(1 << BITS);
  int64_t rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = r0 + r < q.out ? r0 + r : q.out - 1;  // past-the-end rows: computed, not stored

  float acc[R][NT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;

  for (int64_t u0 = lane; u0 < U; u0 += 32 * UN) {
    uint32_t w[UN][R][BITS];
    float sc[UN][R], bi[UN][R];
#pragma unroll
    for (int k = 0; k < UN; ++k) {
      const int64_t u = u0 + 32 * k;
      if (u < U) {
#pragma unroll
        for (int r = 0; r < R; ++r) load_unit<BITS>(q.w + rows[r] * row_words + u * BITS, w[k][r]);
      }
    }
#pragma unroll
    for (int k = 0; k < UN; ++k) {
      const int64_t u = u0 + 32 * k;
      if (u < U) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int64_t g = rows[r] * n_groups + (u >> gshift);
          sc[k][r] = load_s(q.scales, q.sdt, g);
          bi[k][r] = load_s(q.biases, q.sdt, g);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < UN; ++k) {
      const int64_t u = u0 + 32 * k;
      if (u >= U) break;
      float part[R][NT], xs[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        xs[t] = 0.0f;
#pragma unroll
        for (int r = 0; r < R; ++r) part[r][t] = 0.0f;
      }
#pragma unroll
      for (int c = 0; c < 4; ++c) {  // 8 codes at a time
        float xv[NT][8];
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          if (t < nt) {
            load_x8(x + (t0 + t) * q.in + u * 32 + c * 8, xv[t]);
          } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) xv[t][e] = 0.0f;
          }
#pragma unroll
          for (int e = 0; e < 8; ++e) xs[t] += xv[t][e];
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float f[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) f[e] = code_plus_magic<BITS>(w[k][r], c * 8 + e);
#pragma unroll
          for (int t = 0; t < NT; ++t)
#pragma unroll
            for (int e = 0; e < 8; ++e) part[r][t] = fmaf(f[e], xv[t][e], part[r][t]);
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t)
          acc[r][t] = fmaf(sc[k][r], part[r][t], fmaf(bi[k][r] - M * sc[k][r], xs[t], acc[r][t]));
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = warp_sum(acc[r][t]);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r0 + r >= q.out) break;
      const float b = bias ? load_s(bias, bt, r0 + r) : 0.0f;
#pragma unroll
      for (int t = 0; t < NT; ++t)
        if (t < nt) store_s(y, yt, (t0 + t) * q.out + r0 + r, acc[r][t] + b);
    }
  }
}

template <int BITS, int NT, int R, int UN>
void launch_q(const void* x, int64_t n, const QWeightArgs& q, const void* bias, Dt bt, void* y, Dt yt, cudaStream_t s) {
  dim3 grid(static_cast<unsigned>((q.out + kQWarps * R - 1) / (kQWarps * R)), static_cast<unsigned>((n + NT - 1) / NT));
  qgemv_kernel<BITS, NT, R, UN><<<grid, kQWarps * 32, 0, s>>>(static_cast<const __nv_bfloat16*>(x), n, q, bias, bt, y,
                                                               yt);
}

// Rows per warp R: the x loads, their bf16 -> f32 conversion and Σx are per (unit, token) and
// shared by the warp's R rows (4.3 TB/s of 4-bit codes is ~8.6e12 codes/s against ~3.3e13 lane
// instructions/s on the H200, so per-code work must stay at a few instructions). R = 4 needs
// out >= 4096 rows to keep >= 1024 warps; fewer rows take R = 2 or 1. UN keeps about eight 16-byte
// weight loads in flight per lane. Measured (BENCHMARKS.md): 25% of the copy rate at 4 bits, batch 1
// on llama-3-8b's projections — loads and unpacking do not overlap enough (16 warps per SM).
constexpr int un_for(int bits, int nt, int r) {
  const int loads = bits > 4 ? 2 : 1;  // 16-byte loads per unit, rounded up
  const int un = 8 / (r * loads) / (nt > 1 ? 2 : 1);
  return un < 1 ? 1 : un;
}

template <int BITS, int NT>
void launch_rows(const void* x, int64_t n, const QWeightArgs& q, const void* bias, Dt bt, void* y, Dt yt,
                 cudaStream_t s) {
  if constexpr (NT == 1) {
    if (q.out >= 4096) return launch_q<BITS, NT, 4, un_for(BITS, NT, 4)>(x, n, q, bias, bt, y, yt, s);
  }
  if (q.out >= 2048) return launch_q<BITS, NT, 2, un_for(BITS, NT, 2)>(x, n, q, bias, bt, y, yt, s);
  launch_q<BITS, NT, 1, un_for(BITS, NT, 1)>(x, n, q, bias, bt, y, yt, s);
}

template <int BITS>
void launch_bits(const void* x, int64_t n, const QWeightArgs& q, const void* bias, Dt bt, void* y, Dt yt,
                 cudaStream_t s) {
  // One token per grid row: the caller sends more than one token only to the tensor-core kernel
  // (qgemv_max_tokens); NT = 4/8 variants exist in the template but cost 4-8x at 8 tokens.
  launch_rows<BITS, 1>(x, n, q, bias, bt, y, yt, s);
}

// One thread per (row, unit): 32 values, written with 16-byte stores when VEC (dst aligned).
template <int BITS, typename OT, bool VEC>
__global__ void qdequant_kernel(QWeightArgs q, const int32_t* __restrict__ rows, int64_t r0, int64_t n_rows,
                                OT* __restrict__ dst) {
  const int64_t U = q.in / 32, row_words = U * BITS, n_groups = q.in / q.group_size;
  const int upg = q.group_size / 32;
  constexpr float M = static_cast<float>(1 << BITS);
  for (int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < n_rows * U;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = idx / U, u = idx % U;
    const int64_t row = rows ? rows[i] : r0 + i;
    OT* d = dst + i * q.in + u * 32;
    float v[32];
    if (row < 0 || row >= q.out) {
#pragma unroll
      for (int j = 0; j < 32; ++j) v[j] = 0.0f;
    } else {
      uint32_t w[BITS];
      load_unit<BITS>(q.w + row * row_words + u * BITS, w);
      const int64_t g = row * n_groups + u / upg;
      const float sc = load_s(q.scales, q.sdt, g), bi = load_s(q.biases, q.sdt, g);
#pragma unroll
      for (int j = 0; j < 32; ++j) v[j] = fmaf(sc, code_plus_magic<BITS>(w, j) - M, bi);  // the subtraction is exact
    }
    if constexpr (VEC) {
      constexpr int per = 16 / sizeof(OT);
#pragma unroll
      for (int c = 0; c < 32 / per; ++c) {
        alignas(16) OT tmp[per];
#pragma unroll
        for (int e = 0; e < per; ++e) tmp[e] = from_f<OT>(v[c * per + e]);
        reinterpret_cast<uint4*>(d)[c] = *reinterpret_cast<const uint4*>(tmp);
      }
    } else {
#pragma unroll
      for (int j = 0; j < 32; ++j) d[j] = from_f<OT>(v[j]);
    }
  }
}

// ---- 4-bit GEMV on the tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulate), for 1-8 tokens
// per pass and up to kQMultiMax matrices sharing x in one launch (q/k/v, gate/up).
// A block of kTcWarps warps owns a tile of 16 rows of one matrix; the K dimension is cut into
// super-units (SU) of 4 units (128 codes) and warp w takes the SUs [w * S / 8, (w + 1) * S / 8).
// Lane (g, t) (g = lane / 4, t = lane % 4) reads unit 4s + t of rows g and g + 8 with one 16-byte load
// each (so a warp load covers 8 rows x 64 contiguous bytes) and x[token g] of the same unit. The MMA's
// k order is permuted consistently in A and B: for word ww of the unit and half h, the lane's k slots
// (2t, 2t+1, 2t+8, 2t+9) hold codes (8ww+2h, 8ww+2h+4, 8ww+2h+1, 8ww+2h+5), so an A register is
//   ((w >> 8h) & 0x000F000F) | 0x43004300 = bf16x2 (128 + q_i, 128 + q_{i+4})    (exact)
// minus 128 (exact), times scale plus bias in one bf16x2 FMA (the dequantized weight, rounded once to
// bf16 as MLX's bf16 models hold it); B registers are byte permutes of x. Each MMA sums over four
// units of possibly different groups, which is why the scale is applied before it.
// Latency: a round of kTcSU SUs requests all its weight words, scales and biases, and the warp copies
// the round's x (every token of the pass) into its slice of shared memory, before the first MMA; the
// MMAs then read x from shared memory, so no global load sits between them. The 8 warps' partial
// sums meet in shared memory.
constexpr int kTcWarps = 8;
constexpr int kTcSU = 4;
constexpr int kTcRoundCodes = kTcSU * 128;  // x values per token a warp stages per round

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Codes i and i + 4 of word w (i in 0..3) dequantized: bf16x2 (s·q_i + b, s·q_{i+4} + b).
__device__ __forceinline__ uint32_t deq_pair(uint32_t w, int i, __nv_bfloat162 s, __nv_bfloat162 b) {
  const uint32_t m = ((w >> (4 * i)) & 0x000F000Fu) | 0x43004300u;  // (128 + q_i, 128 + q_{i+4})
  const __nv_bfloat162 q = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&m), __float2bfloat162_rn(128.0f));
  const __nv_bfloat162 v = __hfma2(q, s, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// grid (total 16-row tiles of all matrices, ceil(n / 8)); block kTcWarps * 32; dynamic shared memory
// kTcWarps * NT * kTcRoundCodes bf16 (NT = tokens per pass, min(n, 8)). ST: the scales' C++ type.
template <typename ST>
__global__ void __launch_bounds__(kTcWarps * 32) qgemv4_tc_kernel(const __nv_bfloat16* __restrict__ x, int64_t n,
                                                                  int nt_max, QMulti m) {
  extern __shared__ uint4 xs_all[];  // [warp][token][kTcRoundCodes / 8] x as 16-byte vectors
  __shared__ float red[kTcWarps][16][8];
  pdl_trigger();
  int mi = 0;  // the matrix of this tile
  while (mi + 1 < m.count && static_cast<int64_t>(blockIdx.x) >= m.tiles[mi + 1]) ++mi;
  const QWeightArgs q = m.w[mi];
  const int64_t tile = blockIdx.x - m.tiles[mi];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t t0 = int64_t{blockIdx.y} * 8;
  const int nt = static_cast<int>(n - t0 < 8 ? n - t0 : 8);
  const int64_t U = q.in / 32, n_groups = q.in / q.group_size, S = (U + 3) / 4;
  const int gshift = q.group_size == 32 ? 0 : (q.group_size == 64 ? 1 : 2);  // unit -> group: u >> gshift
  const int64_t row_lo = tile * 16 + g < q.out ? tile * 16 + g : q.out - 1;  // past-the-end rows: not stored
  const int64_t row_hi = tile * 16 + g + 8 < q.out ? tile * 16 + g + 8 : q.out - 1;
  const uint4* w_lo = reinterpret_cast<const uint4*>(q.w) + row_lo * U;  // a unit is one uint4
  const uint4* w_hi = reinterpret_cast<const uint4*>(q.w) + row_hi * U;
  const ST* sc = static_cast<const ST*>(q.scales);
  const ST* bi = static_cast<const ST*>(q.biases);
  const bool has_x = g < nt;
  uint4* xs = xs_all + warp * nt_max * (kTcRoundCodes / 8);
  const uint4* xg = reinterpret_cast<const uint4*>(x + t0 * q.in);  // this pass's tokens, 8 x per uint4
  const int64_t s_begin = warp * S / kTcWarps, s_end = (warp + 1) * S / kTcWarps;

  float c0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c1[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // two MMA chains
  for (int64_t s0 = s_begin; s0 < s_end; s0 += kTcSU) {
    uint4 wl[kTcSU], wh[kTcSU];
    float sl[kTcSU], bl[kTcSU], sh[kTcSU], bh[kTcSU];
#pragma unroll
    for (int k = 0; k < kTcSU; ++k) {
      const int64_t u = 4 * (s0 + k < s_end ? s0 + k : s_end - 1) + t;  // this lane's unit
      const int64_t uc = u < U ? u : U - 1;  // units past the row end: loaded, weighted 0
      wl[k] = ld_stream(w_lo + uc);
      wh[k] = ld_stream(w_hi + uc);
      const int64_t grp = uc >> gshift;
      sl[k] = to_f(sc[row_lo * n_groups + grp]);
      bl[k] = to_f(bi[row_lo * n_groups + grp]);
      sh[k] = to_f(sc[row_hi * n_groups + grp]);
      bh[k] = to_f(bi[row_hi * n_groups + grp]);
      if (u >= U) sl[k] = bl[k] = sh[k] = bh[k] = 0.0f;
    }
    // The round's x: codes [128 s0, 128 (s0 + kTcSU)) of each token (zeros past the row end).
    pdl_wait();    // x is the previous kernel's output (the loads above read weights only)
    __syncwarp();  // the previous round's readers are done
    for (int i = lane; i < nt * (kTcRoundCodes / 8); i += 32) {
      const int tok = i / (kTcRoundCodes / 8), v = i % (kTcRoundCodes / 8);
      const int64_t col = 16 * s0 + v;  // 16-byte vector index within the token's row
      xs[i] = col < q.in / 8 ? __ldg(xg + tok * (q.in / 8) + col) : make_uint4(0u, 0u, 0u, 0u);
    }
    __syncwarp();
#pragma unroll
    for (int k = 0; k < kTcSU; ++k) {
      if (s0 + k >= s_end) break;
      const __nv_bfloat162 Sl = __float2bfloat162_rn(sl[k]), Bl = __float2bfloat162_rn(bl[k]);
      const __nv_bfloat162 Sh = __float2bfloat162_rn(sh[k]), Bh = __float2bfloat162_rn(bh[k]);
      const uint32_t lo[4] = {wl[k].x, wl[k].y, wl[k].z, wl[k].w}, hi[4] = {wh[k].x, wh[k].y, wh[k].z, wh[k].w};
      const uint4* xk = xs + (has_x ? g : 0) * (kTcRoundCodes / 8) + k * 16 + t * 4;  // unit 4(s0+k)+t of token g
#pragma unroll
      for (int ww = 0; ww < 4; ++ww) {
        const uint4 xv = has_x ? xk[ww] : make_uint4(0u, 0u, 0u, 0u);
        mma_bf16(c0, deq_pair(lo[ww], 0, Sl, Bl), deq_pair(hi[ww], 0, Sh, Bh), deq_pair(lo[ww], 1, Sl, Bl),
                 deq_pair(hi[ww], 1, Sh, Bh), __byte_perm(xv.x, xv.z, 0x5410), __byte_perm(xv.x, xv.z, 0x7632));
        mma_bf16(c1, deq_pair(lo[ww], 2, Sl, Bl), deq_pair(hi[ww], 2, Sh, Bh), deq_pair(lo[ww], 3, Sl, Bl),
                 deq_pair(hi[ww], 3, Sh, Bh), __byte_perm(xv.y, xv.w, 0x5410), __byte_perm(xv.y, xv.w, 0x7632));
      }
    }
  }
  pdl_wait();  // before any store (warps without a K range have not waited yet)
  // C fragment: c[0..1] row g, tokens 2t, 2t+1; c[2..3] row g + 8.
  red[warp][g][2 * t] = c0[0] + c1[0];
  red[warp][g][2 * t + 1] = c0[1] + c1[1];
  red[warp][g + 8][2 * t] = c0[2] + c1[2];
  red[warp][g + 8][2 * t + 1] = c0[3] + c1[3];
  __syncthreads();
  if (threadIdx.x < 128) {
    const int r = threadIdx.x >> 3, tok = threadIdx.x & 7;
    const int64_t row = tile * 16 + r;
    if (row < q.out && tok < nt) {
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < kTcWarps; ++w) v += red[w][r][tok];
      if (m.bias[mi]) v += load_s(m.bias[mi], m.bt[mi], row);
      store_s(m.y[mi], m.yt[mi], (t0 + tok) * q.out + row, v);
    }
  }
}

template <typename F>
void dispatch_bits(int bits, F&& f) {
  switch (bits) {
    case 2: f.template operator()<2>(); break;
    case 3: f.template operator()<3>(); break;
    case 4: f.template operator()<4>(); break;
    case 5: f.template operator()<5>(); break;
    case 6: f.template operator()<6>(); break;
    case 8: f.template operator()<8>(); break;
    default:
      std::fprintf(stderr, "[cuda] quantized kernel: unsupported bits %d\n", bits);
      std::abort();
  }
}

}  // namespace

bool qgemv_use_mma() {
  static const bool on = [] {
    const char* e = std::getenv("KILN_CUDA_QGEMV");
    return !(e && std::strcmp(e, "ffma") == 0);
  }();
  return on;
}

void launch_qgemv_multi(const void* x, int64_t n, const QMulti& m, cudaStream_t s) {
  if (n == 0 || m.count == 0 || m.tiles[m.count] == 0) return;
  for (int64_t t0 = 0; t0 < n; t0 += 8 * 65535) {  // grid.y limit (never reached by the caller's batches)
    const int64_t nn = n - t0 < 8 * 65535 ? n - t0 : 8 * 65535;
    QMulti mm = m;
    for (int i = 0; i < m.count; ++i)
      mm.y[i] = static_cast<char*>(m.y[i]) + t0 * m.w[i].out * (m.yt[i] == Dt::f32 ? 4 : 2);
    dim3 grid(static_cast<unsigned>(m.tiles[m.count]), static_cast<unsigned>((nn + 7) / 8));
    const int nt_max = static_cast<int>(nn < 8 ? nn : 8);
    const size_t smem = sizeof(uint16_t) * kTcWarps * nt_max * kTcRoundCodes;  // 8 KB per token of a pass
    const auto* xp = static_cast<const __nv_bfloat16*>(x) + t0 * m.w[0].in;
    dispatch(m.w[0].sdt, [&]<typename ST>() {
      static bool raised = false;  // 8 tokens need 64 KB: opt in above the 48 KB default, once per type
      if (!raised) {
        cudaFuncSetAttribute(qgemv4_tc_kernel<ST>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(sizeof(uint16_t) * kTcWarps * 8 * kTcRoundCodes));
        raised = true;
      }
      launch_pdl(qgemv4_tc_kernel<ST>, grid, kTcWarps * 32, smem, s, xp, nn, nt_max, mm);
    });
  }
  KILN_CUDA_LAUNCH_CHECK("qgemv4_tc");
}

void launch_qgemv(const void* x, int64_t n, const QWeightArgs& w, const void* bias, Dt bt, void* y, Dt yt,
                  cudaStream_t s) {
  if (n == 0 || w.out == 0) return;
  if (w.bits == 4 && qgemv_use_mma()) {
    QMulti m{};
    m.add(w, bias, bt, y, yt);
    return launch_qgemv_multi(x, n, m, s);
  }
  for (int64_t t0 = 0; t0 < n; t0 += 65535) {  // grid.y limit (never reached by the caller's batches)
    const int64_t nn = n - t0 < 65535 ? n - t0 : 65535;
    const void* xp = static_cast<const __nv_bfloat16*>(x) + t0 * w.in;
    void* yp = static_cast<char*>(y) + t0 * w.out * (yt == Dt::f32 ? 4 : 2);
    dispatch_bits(w.bits, [&]<int BITS>() { launch_bits<BITS>(xp, nn, w, bias, bt, yp, yt, s); });
  }
  KILN_CUDA_LAUNCH_CHECK("qgemv");
}

void launch_qdequant_rows(const QWeightArgs& w, const int32_t* rows, int64_t r0, int64_t n_rows, void* dst, Dt dt,
                          cudaStream_t s) {
  if (n_rows == 0 || w.in == 0) return;
  const int64_t work = n_rows * (w.in / 32);
  const unsigned grid = grid_for(work, 256);
  const bool vec = reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  dispatch_bits(w.bits, [&]<int BITS>() {
    if (dt == Dt::f32) {
      auto d = static_cast<float*>(dst);
      if (vec) qdequant_kernel<BITS, float, true><<<grid, 256, 0, s>>>(w, rows, r0, n_rows, d);
      else qdequant_kernel<BITS, float, false><<<grid, 256, 0, s>>>(w, rows, r0, n_rows, d);
    } else {
      auto d = static_cast<__nv_bfloat16*>(dst);
      if (vec) qdequant_kernel<BITS, __nv_bfloat16, true><<<grid, 256, 0, s>>>(w, rows, r0, n_rows, d);
      else qdequant_kernel<BITS, __nv_bfloat16, false><<<grid, 256, 0, s>>>(w, rows, r0, n_rows, d);
    }
  });
  KILN_CUDA_LAUNCH_CHECK("qdequant_rows");
}

}  // namespace kiln::backend::cuda
