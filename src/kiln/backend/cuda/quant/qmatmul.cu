// Quantized-weight kernels (MLX affine layout, docs/quantization.md): weight-streaming GEMVs for
// decode (y = x · dequant(w)ᵀ without materializing w): a CUDA-core kernel for every width and a
// tensor-core one for 4 bits (up to 8 tokens per pass), and a row dequantizer to bf16/f32 (the
// prefill path's tiles for cuBLASLt, and the quantized embedding gather).
// A "unit" is 32 consecutive codes of a row: exactly `bits` u32 words, never split across groups
// (group sizes are multiples of 32), so one lane reads a unit with `bits`-word loads and one scale.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kiln/backend/cuda/core/common.cuh"
#include "kiln/backend/cuda/quant/q4mma.cuh"
#include "kiln/backend/cuda/quant/qkernels.h"
#include "kiln/backend/cuda/quant/qx.cuh"

namespace kiln::backend::cuda {

namespace {

constexpr int kQWarps = 4;  // warps per GEMV block

// Loads N consecutive words (a unit of N-bit codes, or the tiled layout's scale/bias pairs) with
// the widest loads their alignment allows (offsets are multiples of N * 4 bytes: 16 for N = 4/8,
// 8 for N = 2/6, 4 for N = 1/3/5).
template <int N>
__device__ __forceinline__ void load_words(const uint32_t* p, uint32_t (&w)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int c = 0; c < N / 4; ++c) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(p) + c);
      w[4 * c] = u.x, w[4 * c + 1] = u.y, w[4 * c + 2] = u.z, w[4 * c + 3] = u.w;
    }
  } else if constexpr (N % 2 == 0) {
#pragma unroll
    for (int c = 0; c < N / 2; ++c) {
      const uint2 u = __ldg(reinterpret_cast<const uint2*>(p) + c);
      w[2 * c] = u.x, w[2 * c + 1] = u.y;
    }
  } else {
#pragma unroll
    for (int c = 0; c < N; ++c) w[c] = __ldg(p + c);
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
        for (int r = 0; r < R; ++r) load_words<BITS>(q.w + rows[r] * row_words + u * BITS, w[k][r]);
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

// N values (N * sizeof(OT) a multiple of 8) to dst, with 16- (or 8-) byte stores when VEC (dst
// aligned to the store).
template <typename OT, bool VEC, int N>
__device__ __forceinline__ void store_n(OT* d, const float (&v)[N]) {
  if constexpr (VEC) {
    using V = std::conditional_t<N * sizeof(OT) % 16 == 0, uint4, uint2>;
    constexpr int per = sizeof(V) / sizeof(OT);
#pragma unroll
    for (int c = 0; c < N / per; ++c) {
      alignas(16) OT tmp[per];
#pragma unroll
      for (int e = 0; e < per; ++e) tmp[e] = from_f<OT>(v[c * per + e]);
      reinterpret_cast<V*>(d)[c] = *reinterpret_cast<const V*>(tmp);
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) d[j] = from_f<OT>(v[j]);
  }
}

// One thread per (row, unit): 32 values (MLX layout).
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
    float v[32];
    if (row < 0 || row >= q.out) {
#pragma unroll
      for (int j = 0; j < 32; ++j) v[j] = 0.0f;
    } else {
      uint32_t w[BITS];
      load_words<BITS>(q.w + row * row_words + u * BITS, w);
      const int64_t g = row * n_groups + u / upg;
      const float sc = load_s(q.scales, q.sdt, g), bi = load_s(q.biases, q.sdt, g);
#pragma unroll
      for (int j = 0; j < 32; ++j) v[j] = fmaf(sc, code_plus_magic<BITS>(w, j) - M, bi);  // the subtraction is exact
    }
    store_n<OT, VEC>(dst + i * q.in + u * 32, v);
  }
}

// ---- The 4-bit tiled layout (docs/quantization.md, "CUDA"), made once per weight at first use
// (launch_q4_tile): what the tensor-core GEMV and the 4-bit dequantizer read. A tile is 16 rows, a
// quad 4 units (128 codes); T = ceil(out / 16) tiles, Q = ceil(in / 128) quads.
//   codes uint4 [T][Q][2][32]: element (tile, quad, h, lane = 4g + t) holds in its word j 8 codes of
//     unit 4 quad + j of row 16 tile + 8h + g: byte b of the word holds column 4t + b of the unit in
//     its low nibble and column 16 + 4t + b in its high nibble. A warp load is 512 contiguous bytes,
//     and (word & 0x0F0F0F0F, (word >> 4) & 0x0F0F0F0F) are exactly lane (g, t)'s u8 A fragments of
//     an m16n8k32 MMA over the unit (k = the column in the unit).
//   pairs [T][Q][16][GPQ] (scale, bias) in the scales' type, GPQ = 128 / group_size (the quad's groups).
// Rows past `out` and units past in / 32 are zeros (codes, scale and bias), so padding adds nothing.

// The tiled word of lane t for one unit of one row, from the unit's 4 MLX words m (word i holds
// columns 8i..8i+7, LSB first): columns 4t..4t+3 are in word t / 2, 16 + 4t.. in word 2 + t / 2.
__device__ __forceinline__ uint32_t tiled_word(const uint32_t* m, int t) {
  const int sh = 16 * (t & 1);
  const uint32_t lo = m[t >> 1] >> sh, hi = m[2 + (t >> 1)] >> sh;
  uint32_t v = 0u;
#pragma unroll
  for (int b = 0; b < 4; ++b) v |= ((lo >> (4 * b)) & 15u) << (8 * b) | ((hi >> (4 * b)) & 15u) << (8 * b + 4);
  return v;
}

__global__ void q4_tile_codes_kernel(const uint32_t* __restrict__ w, int64_t out, int64_t U, int64_t Q, int64_t n,
                                     uint4* __restrict__ dst) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int lane = static_cast<int>(i & 31), h = static_cast<int>((i >> 5) & 1);
    const int64_t tq = i >> 6, tile = tq / Q, quad = tq % Q;
    const int64_t row = tile * 16 + 8 * h + (lane >> 2);
    uint32_t v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t unit = 4 * quad + j;
      v[j] = row < out && unit < U ? tiled_word(w + (row * U + unit) * 4, lane & 3) : 0u;
    }
    dst[i] = make_uint4(v[0], v[1], v[2], v[3]);
  }
}

template <typename ST>
__global__ void q4_tile_pairs_kernel(const ST* __restrict__ sc, const ST* __restrict__ bi, int64_t out,
                                     int64_t n_groups, int64_t Q, int gpq, int64_t n, ST* __restrict__ dst) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t gi = i % gpq, r = (i / gpq) % 16, tq = i / gpq / 16;
    const int64_t row = (tq / Q) * 16 + r, grp = (tq % Q) * gpq + gi;
    const bool in = row < out && grp < n_groups;
    dst[2 * i] = in ? sc[row * n_groups + grp] : from_f<ST>(0.0f);
    dst[2 * i + 1] = in ? bi[row * n_groups + grp] : from_f<ST>(0.0f);
  }
}

// One thread per (row, quad, t) of the tiled layout: its uint4 holds columns 4t..4t+3 and
// 16+4t..16+4t+3 of the quad's 4 units of the row, written as 8 runs of 4 values (as qdequant_kernel
// computes them). The 4 threads of a (row, quad) read 64 contiguous bytes.
template <typename ST, typename OT, bool VEC>
__global__ void q4_tiled_dequant_kernel(QWeightArgs q, const int32_t* __restrict__ rows, int64_t r0, int64_t n_rows,
                                        OT* __restrict__ dst) {
  const int64_t U = q.in / 32, Q = (U + 3) / 4;
  const int gpq = 128 / q.group_size;
  for (int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < n_rows * Q * 4;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int t = static_cast<int>(idx & 3);
    const int64_t qd = (idx >> 2) % Q, i = (idx >> 2) / Q;
    const int64_t row = rows ? rows[i] : r0 + i;
    const bool in = row >= 0 && row < q.out;
    const int64_t tq = (in ? row / 16 : 0) * Q + qd;
    const int r = in ? static_cast<int>(row % 16) : 0;
    uint4 w4 = make_uint4(0u, 0u, 0u, 0u);
    if (in) w4 = __ldg(reinterpret_cast<const uint4*>(q.w) + (tq * 2 + r / 8) * 32 + 4 * (r % 8) + t);
    const uint32_t w[4] = {w4.x, w4.y, w4.z, w4.w};
    const ST* pp = static_cast<const ST*>(q.pairs) + 2 * (tq * 16 + r) * gpq;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t u = 4 * qd + j;
      if (u >= U) break;
      const int gi = j * 32 / q.group_size;
      const float sc = in ? to_f(pp[2 * gi]) : 0.0f, bi = in ? to_f(pp[2 * gi + 1]) : 0.0f;
      float lo[4], hi[4];
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        lo[b] = fmaf(sc, static_cast<float>((w[j] >> (8 * b)) & 15u), bi);
        hi[b] = fmaf(sc, static_cast<float>((w[j] >> (8 * b + 4)) & 15u), bi);
      }
      store_n<OT, VEC>(dst + i * q.in + u * 32 + 4 * t, lo);
      store_n<OT, VEC>(dst + i * q.in + u * 32 + 16 + 4 * t, hi);
    }
  }
}

// ---- 4-bit GEMV on the tensor cores (mma.sync m16n8k32, u8 codes x s8 activations, s32
// accumulate) over the tiled layout, for 1-8 tokens per pass and up to kQMultiMax matrices sharing x.
// x is first turned into integers (q4_quantize_x_kernel): per (token, group of the weights' group
// size), v = round(x / d) with d = max|x| / (127 * 254) (15 bits of the group's range; the error is
// about d / 2; qx.cuh's qx_encode4 rounds with an approximate reciprocal and a magic-number add), split
// exactly as v = 254 hi + lo with hi, lo in [-127, 127]. Two MMAs per unit (A = the
// raw codes, B = hi, then lo) give exact integer sums, and per (row, group, token) in f32:
//   y += scale · d · (254 C_hi + C_lo) + bias · S        (C = Σ q · hi|lo over the group, S = Σ x).
// Per 8 codes a lane unpacks its two A registers with 3 instructions (the tiled nibble order), and an
// MMA covers 32 codes of 16 rows. For at most 4 tokens one MMA per unit does: a token's hi and lo
// codes go to two of the 8 B columns (q4_quad_mma_packed; the same integers, so the same bits;
// batches 1 / 2 / 4 of llama-3-8b 4-bit +2.5 / 5 / 5% on the H200, BENCHMARKS.md).
//
// The quantized activations ("qx", q4_qx_bytes per call): codes [n][4Q units][16 words], then per
// pass of 8 tokens meta [G][8 tokens] (d, S) as float2, G = 128 Q / group size (units and groups
// past `in` are zeros; the slots of tokens past n in the last pass are never written: the GEMV
// gives their B columns zeros and never stores their results). Unit u of a token holds for lane t
// words 4t..4t+3 = (hi of columns 4t..4t+3, hi of 16+4t.., lo of 4t.., lo of 16+4t..): the lane's
// two B fragments of both MMAs, one 16-byte load.
// One thread per 4 consecutive values of a token's padded row: threads (token, unit, j), the GS / 4
// threads of a group adjacent in a warp.
template <int GS>
__global__ void q4_quantize_x_kernel(const __nv_bfloat16* __restrict__ x, int64_t in, QxLayout L,
                                     uint32_t* __restrict__ codes, float2* __restrict__ meta) {
  KILN_STAMP_SCOPE(kStampQuantizeX);
  pdl_trigger();
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= L.n * L.units * 8) return;  // whole warps (units * 8 is a multiple of 32)
  const int64_t tok = (i >> 3) / L.units, col = (i % (L.units * 8)) * 4;
  pdl_wait();
  float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (col < in) load_bf16x4(x + tok * in + col, f);
  qx_store4<GS>(f, tok, col, L, codes, meta);
}

// Warps per block (4, or 8 for matrices of few tiles: the launcher's choice), quads per round and
// blocks per SM the registers must allow, measured on the H200 (bf16 scales g64, BENCHMARKS.md):
// 4 quads per round (8 code loads in flight per lane) beat 2 quads with more blocks, and
// prefetching the next round into registers did not pay (for the integer kernel too: rounds of 2 or
// 3 quads double-buffered were within the run-to-run spread, 8 warps per SM with 8 quads per round
// or 4 double-buffered were slower). Rounds of two quads where a quad's pair words are many (group
// 32, f32 scales): no spills.
template <typename ST, int GS>
constexpr int q4_round() {
  return q4_pair_words<ST, GS>() >= 4 ? 2 : 4;
}

// grid (total tiles of all matrices, passes of 8 tokens); block W * 32. A block of W warps owns one
// tile of one matrix; warp w takes quads [w Q / W, (w + 1) Q / W). Latency: a round of R quads
// requests all its code and pair loads (512-byte contiguous warp loads) before the first MMA. The
// warps' partial sums meet in shared memory. kPacked (n <= 4): one MMA per unit, a token's hi and
// lo codes in two B columns (q4_quad_mma_packed).
template <typename ST, int GS, int W, bool kPacked>
__global__ void __launch_bounds__(W * 32, 16 / W) qgemv4_tc_kernel(const uint4* __restrict__ qx,
                                                                   const float2* __restrict__ meta, int64_t n,
                                                                   QMulti m) {
  constexpr int R = q4_round<ST, GS>();
  constexpr int GPQ = 128 / GS, PW = q4_pair_words<ST, GS>();  // groups per quad, pair words per row and quad
  __shared__ float red[W][16][8];
  KILN_STAMP_SCOPE(kStampQGemv4);
  pdl_trigger();
  int mi = 0;  // the matrix of this tile
  while (mi + 1 < m.count && static_cast<int64_t>(blockIdx.x) >= m.tiles[mi + 1]) ++mi;
  const QWeightArgs q = m.w[mi];
  const int64_t tile = blockIdx.x - m.tiles[mi];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t t0 = int64_t{blockIdx.y} * 8;
  const int nt = static_cast<int>(n - t0 < 8 ? n - t0 : 8);
  const int64_t Q = (q.in + 127) / 128, G = 4 * Q * 32 / GS;
  const uint4* codes = reinterpret_cast<const uint4*>(q.w) + tile * Q * 64 + lane;
  const uint32_t* pairs = static_cast<const uint32_t*>(q.pairs) + (tile * Q * 16 + g) * PW;
  const int64_t q_begin = warp * Q / W, q_end = (warp + 1) * Q / W;
  const uint4* xq = qx + (t0 + g) * Q * 16 + t;           // B column g: token g (zeros past nt)
  const float4* mt = reinterpret_cast<const float4*>(meta) + blockIdx.y * G * 4 + t;  // (d, S) of tokens 2t, 2t + 1
  // kPacked: B column g: token g / 2's hi (g even) or lo codes; (d, S) of token t.
  const uint2* xp = reinterpret_cast<const uint2*>(qx) + (t0 + g / 2) * Q * 32 + 2 * t + (g & 1);
  const float2* mp = meta + blockIdx.y * G * 8 + t;

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // C layout: rows g, g + 8 x tokens 2t, 2t + 1
  for (int64_t q0 = q_begin; q0 < q_end; q0 += R) {
    uint4 wl[R], wh[R];
    uint32_t pl[R][PW], ph[R][PW];
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const int64_t qd = q0 + k < q_end ? q0 + k : q_end - 1;
      wl[k] = ld_stream(codes + qd * 64);
      wh[k] = ld_stream(codes + qd * 64 + 32);
      load_words<PW>(pairs + qd * 16 * PW, pl[k]);
      load_words<PW>(pairs + (qd * 16 + 8) * PW, ph[k]);
    }
    pdl_wait();  // qx is the previous kernel's output (the loads above read weights only)
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const int64_t qd = q0 + k;
      if (qd >= q_end) break;
      if constexpr (kPacked) {
        uint2 xv[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) xv[u] = g < 2 * nt ? __ldg(xp + (4 * qd + u) * 8) : make_uint2(0u, 0u);
        float a2[2] = {acc[0], acc[2]};
        q4_quad_mma_packed<ST, GS>(a2, wl[k], wh[k], pl[k], ph[k], xv,
                                   [&](int gi) { return __ldg(mp + (qd * GPQ + gi) * 8); });
        acc[0] = a2[0], acc[2] = a2[1];
      } else {
        uint4 xv[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) xv[u] = g < nt ? __ldg(xq + (4 * qd + u) * 4) : make_uint4(0u, 0u, 0u, 0u);
        q4_quad_mma<ST, GS>(acc, wl[k], wh[k], pl[k], ph[k], xv,
                            [&](int gi) { return __ldg(mt + (qd * GPQ + gi) * 4); }, nt > 1);
      }
    }
  }
  KILN_STAMP(2);  // a probe build's stamp: warp 0 done with its K range
  pdl_wait();  // before any store (warps without a K range have not waited yet)
  if constexpr (kPacked) {  // token t in lane t's acc[0] (row g), acc[2] (row g + 8)
    red[warp][g][t] = acc[0], red[warp][g + 8][t] = acc[2];
  } else {
    red[warp][g][2 * t] = acc[0], red[warp][g][2 * t + 1] = acc[1];
    red[warp][g + 8][2 * t] = acc[2], red[warp][g + 8][2 * t + 1] = acc[3];
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    const int r = threadIdx.x >> 3, tok = threadIdx.x & 7;
    const int64_t row = tile * 16 + r;
    if (row < q.out && tok < nt) {
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < W; ++w) v += red[w][r][tok];
      if (m.bias[mi]) v += load_s(m.bias[mi], m.bt[mi], row);
      store_s(m.y[mi], m.yt[mi], (t0 + tok) * q.out + row, v);
    }
  }
}

// Calls f.template operator()<ST, GS>() for the scales' type and the group size.
template <typename F>
void dispatch_q4(Dt sdt, int group_size, F&& f) {
  dispatch(sdt, [&]<typename ST>() {
    switch (group_size) {
      case 32: f.template operator()<ST, 32>(); break;
      case 64: f.template operator()<ST, 64>(); break;
      default: f.template operator()<ST, 128>(); break;
    }
  });
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

Q4Tiled q4_tiled_sizes(int64_t out, int64_t in, int group_size, Dt sdt) {
  Q4Tiled z;
  z.tiles = (out + 15) / 16;
  z.quads = (in + 127) / 128;
  z.code_bytes = z.tiles * z.quads * 1024;
  z.pair_bytes = z.tiles * z.quads * 16 * (128 / group_size) * 2 * (sdt == Dt::f32 ? 4 : 2);
  return z;
}

void launch_q4_tile(const QWeightArgs& w, void* codes, void* pairs, cudaStream_t s) {
  const Q4Tiled z = q4_tiled_sizes(w.out, w.in, w.group_size, w.sdt);
  const int64_t nc = z.code_bytes / 16, np = z.pair_bytes / (w.sdt == Dt::f32 ? 8 : 4);
  q4_tile_codes_kernel<<<grid_for(nc, 256), 256, 0, s>>>(w.w, w.out, w.in / 32, z.quads, nc,
                                                         static_cast<uint4*>(codes));
  dispatch(w.sdt, [&]<typename ST>() {
    q4_tile_pairs_kernel<ST><<<grid_for(np, 256), 256, 0, s>>>(
        static_cast<const ST*>(w.scales), static_cast<const ST*>(w.biases), w.out, w.in / w.group_size, z.quads,
        128 / w.group_size, np, static_cast<ST*>(pairs));
  });
  KILN_CUDA_LAUNCH_CHECK("q4_tile");
}

int64_t q4_qx_bytes(int64_t n, int64_t in, int group_size) {
  const QxLayout L = qx_layout(n, in, group_size);
  return L.code_bytes + L.meta_bytes;
}

void launch_qgemv_multi(const void* x, int64_t n, const QMulti& m, int n_sms, void* qx, bool qx_ready,
                        cudaStream_t s) {
  if (n == 0 || m.count == 0 || m.tiles[m.count] == 0) return;
  const int64_t in = m.w[0].in;
  const int gs = m.w[0].group_size;
  const QxLayout L = qx_layout(n, in, gs);
  if (L.n_pad / 8 > 65535) std::abort();  // grid.y; the caller sends at most qgemv_max_tokens(4)
  auto* codes = static_cast<uint32_t*>(qx);
  auto* meta = reinterpret_cast<float2*>(static_cast<char*>(qx) + L.code_bytes);
  const auto* xp = static_cast<const __nv_bfloat16*>(x);
  const unsigned qgrid = grid_for(n * L.units * 8, 256);
  if (!qx_ready) {
    switch (gs) {
      case 32: launch_pdl(q4_quantize_x_kernel<32>, qgrid, 256, 0, s, xp, in, L, codes, meta); break;
      case 64: launch_pdl(q4_quantize_x_kernel<64>, qgrid, 256, 0, s, xp, in, L, codes, meta); break;
      default: launch_pdl(q4_quantize_x_kernel<128>, qgrid, 256, 0, s, xp, in, L, codes, meta); break;
    }
  }
  const bool wide = q4_gemv_warps(m.tiles[m.count], n_sms) == 8;
  const dim3 grid(static_cast<unsigned>(m.tiles[m.count]), static_cast<unsigned>(L.n_pad / 8));
  const auto* qc = static_cast<const uint4*>(qx);
  const float2* qm = meta;
  dispatch_q4(m.w[0].sdt, gs, [&]<typename ST, int GS>() {
    auto run = [&]<int W, bool kPacked>() { launch_pdl(qgemv4_tc_kernel<ST, GS, W, kPacked>, grid, W * 32, 0, s, qc, qm, n, m); };
    if (n <= 4) wide ? run.template operator()<8, true>() : run.template operator()<4, true>();
    else wide ? run.template operator()<8, false>() : run.template operator()<4, false>();
  });
  KILN_CUDA_LAUNCH_CHECK("qgemv4_tc");
}

void launch_qgemv(const void* x, int64_t n, const QWeightArgs& w, const void* bias, Dt bt, void* y, Dt yt,
                  int n_sms, void* qx, bool qx_ready, cudaStream_t s) {
  if (n == 0 || w.out == 0) return;
  if (w.pairs) {
    QMulti m{};
    m.add(w, bias, bt, y, yt);
    return launch_qgemv_multi(x, n, m, n_sms, qx, qx_ready, s);
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
  const int64_t work = w.pairs ? n_rows * ((w.in + 127) / 128) * 4 : n_rows * (w.in / 32);  // threads
  const unsigned grid = grid_for(work, 256);
  const bool vec = reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  // OT: the destination type; VEC: 16-byte stores. The tiled 4-bit layout or the MLX one.
  auto launch = [&]<typename OT, bool VEC>() {
    auto d = static_cast<OT*>(dst);
    if (w.pairs) {
      dispatch(w.sdt, [&]<typename ST>() {
        q4_tiled_dequant_kernel<ST, OT, VEC><<<grid, 256, 0, s>>>(w, rows, r0, n_rows, d);
      });
    } else {
      dispatch_bits(w.bits, [&]<int BITS>() { qdequant_kernel<BITS, OT, VEC><<<grid, 256, 0, s>>>(w, rows, r0, n_rows, d); });
    }
  };
  if (dt == Dt::f32) {
    if (vec) launch.template operator()<float, true>();
    else launch.template operator()<float, false>();
  } else {
    if (vec) launch.template operator()<__nv_bfloat16, true>();
    else launch.template operator()<__nv_bfloat16, false>();
  }
  KILN_CUDA_LAUNCH_CHECK("qdequant_rows");
}

}  // namespace kiln::backend::cuda
