// Paged attention, prefill (semantics: Backend::attention in backend.h): FA2-style on mma.sync
//   m16n8k16 bf16 tensor cores: a block of 4 warps owns 128 query rows (tokens x the heads of a GQA
//   group that share a K/V tile), K/V tiles double-buffered in shared memory by cp.async, fragments
//   by ldmatrix, online softmax in f32 (log2 units). A tile whose rows belong to several sequences
//   runs one pass per sequence. The decode kernels are in attention_decode.cu.
#include <cfloat>
#include <climits>
#include <cmath>

#include "kiln/backend/cuda/attention/kv_read.cuh"
#include "kiln/backend/cuda/core/common.cuh"

namespace kiln::backend::cuda {

namespace {

constexpr float kLog2e = 1.4426950408889634f;

// ---- prefill (tensor cores), FA2-style.
// grid (kv head x head chunk, query tile), 4 warps. A block owns 128 query rows: TB = 128 / GH
// tokens x GH heads of one GQA group (GH = 1 << lgh, the largest power of two <= 8 dividing the
// group), row r = (token t0 + r / GH, head h0 + r % GH), so every K/V tile staged in shared memory
// serves the GH heads at once (llama-3-8b: 32 tokens x 4 heads, a quarter of the per-head K/V
// traffic). Warp w owns rows [32w, 32w + 32) as two m16 tiles, so each K/V fragment read from
// shared memory feeds two MMAs. Shared memory (bf16, rows padded by 16 B so that the 8 row
// addresses of every ldmatrix phase fall in distinct bank groups):
//   Qs [128][HD + 8], Ks [2][BK][HD + 8], Vs [2][BK][HD + 8]  (two stages: cp.async double buffer)
// Per K/V tile of BK keys: S = Q Kᵀ (ldmatrix Q and K fragments, mma.sync m16n8k16 bf16 -> f32),
// online softmax in log2 units (scale * log2 e folded into one multiply), O += P V (P straight from
// the S accumulators, V fragments by ldmatrix.trans of the row-major tile: no transposing store).
// The next tile's cp.async loads are in flight while the current one is computed. Masks are only
// evaluated on tiles that cut a row's visible range; a warp skips tiles none of its rows can see
// (causal tails, windows, rows of other sequences). A tile whose tokens belong to several
// sequences runs one pass per sequence (rows of other sequences are masked in that pass), and a
// sequence whose rows keep sink keys before their windows (a rotating cache, backend.h) one more pass
// over those keys [0, n_sink) (the online softmax carries across passes).

constexpr int kPWarps = 4;
constexpr int kPThreads = kPWarps * 32;
constexpr int kPRows = kPWarps * 32;  // query rows per block: 2 m16 tiles per warp

template <int HD>
struct PrefillCfg {
  // Keys per tile: 32 at head_dim 128 keeps S (2 x 4 x 4 f32) beside O (2 x 16 x 4 f32) in registers.
  static constexpr int BK = HD == 128 ? 32 : 64;
  static constexpr int S = HD + 8;  // shared row stride in bf16 elements (HD * 2 + 16 bytes)
  static constexpr int kQ = kPRows * S;
  static constexpr int kKV = BK * S;  // one stage of K (or V)
  static constexpr size_t kBytes = sizeof(__nv_bfloat16) * (kQ + 4 * kKV);
};

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

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that bypasses registers; valid == false writes 16 zero bytes (the
// source is not read), so keys past the range give zero K and V rows (P·V then adds 0, not NaN).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, register i receives it
// (lane l: row l / 4, columns 2 (l % 4), +1; .trans: column l / 4 of rows 2 (l % 4), +1).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// CAP: softcap > 0 (a template flag keeps tanh out of the common kernel's registers). QB: 0 for bf16
// caches (tiles by cp.async); 8 or 4 for quantized ones: each 8-value chunk of a tile is loaded as
// codes, dequantized (kv_dequant8) and stored to shared memory as bf16, the tile the MMAs read.
template <int HD, bool CAP, int QB>
__global__ void __launch_bounds__(kPThreads) attn_prefill_kernel(AttnArgs a, int lgh) {
  using C = PrefillCfg<HD>;
  constexpr int BK = C::BK, S = C::S, CH = HD / 8;  // CH: 16-byte chunks per row
  extern __shared__ __align__(16) unsigned char prefill_smem[];
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(prefill_smem);
  __nv_bfloat16* Ks = Qs + C::kQ;       // [2][BK][S]
  __nv_bfloat16* Vs = Ks + 2 * C::kKV;  // [2][BK][S]
  __shared__ int tok_seq[kPRows], tok_lo[kPRows], tok_hi[kPRows], tok_ns[kPRows];
  // Passes: up to two per sequence (its window keys, then its sink keys).
  __shared__ int pass_seq[2 * kPRows], pass_lo[2 * kPRows], pass_hi[2 * kPRows];
  __shared__ bool pass_sink[2 * kPRows];
  __shared__ int n_pass;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  const int gh = 1 << lgh, tb = kPRows >> lgh;  // heads and tokens of the block
  const int group = a.n_heads / a.n_kv_heads, chunks = group >> lgh;
  const int kvh = blockIdx.x / chunks, h0 = kvh * group + (blockIdx.x % chunks) * gh;
  const int t0 = (gridDim.y - 1 - blockIdx.y) * tb;  // latest tokens (most keys) first: a shorter tail
  const int64_t q_width = int64_t{a.n_heads} * HD, kv_width = int64_t{a.n_kv_heads} * HD;
  const __nv_bfloat16* qg = static_cast<const __nv_bfloat16*>(a.q);
  const __nv_bfloat16* kc = static_cast<const __nv_bfloat16*>(a.k_cache);
  const __nv_bfloat16* vc = static_cast<const __nv_bfloat16*>(a.v_cache);

  // Q tile in flight first (its own cp.async group, waited for with the first K/V tile).
#pragma unroll
  for (int u = 0; u < CH; ++u) {  // kPRows * CH chunks over kPThreads (= kPRows) threads
    const int idx = tid + u * kPThreads, r = idx / CH, c = idx % CH, t = t0 + (r >> lgh);
    const bool ok = t < a.n_tokens;
    const __nv_bfloat16* src = ok ? qg + int64_t{t} * q_width + int64_t{h0 + (r & (gh - 1))} * HD + c * 8 : qg;
    cp_async16(smem_addr(Qs + r * S + c * 8), src, ok);
  }
  cp_async_commit();

  if (tid < tb) {
    const int t = t0 + tid;
    if (t < a.n_tokens) {
      const int pos = a.token_pos[t];
      tok_seq[tid] = a.token_seq[t];
      tok_hi[tid] = pos;
      tok_lo[tid] = a.window > 0 ? max(0, pos - a.window + 1) : 0;
      tok_ns[tid] = a.window > 0 ? min(max(a.sink, 0), tok_lo[tid]) : 0;  // sink keys before the window
    } else {
      tok_seq[tid] = -1;
    }
  }
  __syncthreads();
  if (tid == 0) {  // distinct sequences of the tile, with the key range each pass must cover
    int np = 0;
    for (int r = 0; r < tb; ++r) {
      const int sq = tok_seq[r];
      if (sq < 0) continue;
      int p = 0;
      while (p < np && pass_seq[p] != sq) ++p;
      if (p == np) pass_seq[np] = sq, pass_lo[np] = tok_lo[r], pass_hi[np] = tok_hi[r], pass_sink[np] = false, ++np;
      else pass_lo[p] = min(pass_lo[p], tok_lo[r]), pass_hi[p] = max(pass_hi[p], tok_hi[r]);
    }
    const int n_window = np;
    for (int w = 0; w < n_window; ++w) {  // the sink passes: keys [0, the most sink keys of a row)
      int ns = 0;
      for (int r = 0; r < tb; ++r)
        if (tok_seq[r] == pass_seq[w]) ns = max(ns, tok_ns[r]);
      if (ns > 0) pass_seq[np] = pass_seq[w], pass_lo[np] = 0, pass_hi[np] = ns - 1, pass_sink[np] = true, ++np;
    }
    n_pass = np;
  }
  __syncthreads();
  // The keys row token tl sees in a pass over sequence seq (sink: its sink keys, else its window);
  // none: the empty range [INT_MAX, INT_MIN].
  const auto row_range = [&](int tl, int seq, bool sink, int& lo, int& hi) {
    const bool in = tok_seq[tl] == seq && (!sink || tok_ns[tl] > 0);
    lo = !in ? INT_MAX : sink ? 0 : tok_lo[tl];
    hi = !in ? INT_MIN : sink ? tok_ns[tl] - 1 : tok_hi[tl];
  };

  // This thread's 4 rows: i = 2 mt + half -> row warp * 32 + mt * 16 + half * 8 + g (the C/A
  // fragment rows g and g + 8 of m-tile mt); their tokens' facts stay in shared memory (registers
  // are short at head_dim 128).
  const auto row_of = [&](int i) { return warp * 32 + (i >> 1) * 16 + (i & 1) * 8 + g; };
  // ldmatrix row addresses (bytes, relative to the tile): Q A-fragments (rows lane % 16, columns
  // 8 (lane / 16)); K B-fragments for n-tiles 2np, 2np+1 (keys 8 (lane / 16) + lane % 8, columns
  // 8 ((lane / 8) % 2)); V B-fragments for d-tiles 2dp, 2dp+1 (.trans: keys 8 ((lane / 8) % 2) +
  // lane % 8, columns 8 (lane / 16)).
  const uint32_t q_base = smem_addr(Qs) + 2 * ((warp * 32 + (lane & 15)) * S + (lane >> 4) * 8);
  const uint32_t k_off = 2 * (((lane >> 4) * 8 + (lane & 7)) * S + ((lane >> 3) & 1) * 8);
  const uint32_t v_off = 2 * ((((lane >> 3) & 1) * 8 + (lane & 7)) * S + (lane >> 4) * 8);
  const uint32_t k_base = smem_addr(Ks), v_base = smem_addr(Vs);

  float o[2][HD / 8][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.0f;
  float m[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) m[i] = -INFINITY, l[i] = 0.0f;
  // Scores in log2 units: s * scale * log2 e, or cap * tanh(s * scale / cap) * log2 e.
  const float pre = CAP ? a.scale / a.softcap : a.scale * kLog2e, post = a.softcap * kLog2e;

  for (int p = 0; p < n_pass; ++p) {
    const int seq = pass_seq[p], klo = pass_lo[p], khi = pass_hi[p];
    const bool sink = pass_sink[p];
    const int n_tiles = (khi - klo) / BK + 1;
    // The warp's rows in this pass see keys within [any_lo, any_hi] (a hull: a tile outside it is
    // skipped) and all see [all_lo, all_hi] (a tile inside needs no mask). Rows outside the pass
    // see nothing: an empty range [INT_MAX, INT_MIN]. Warp-uniform values, kept off the registers
    // that O and S need.
    int any_lo = INT_MAX, any_hi = INT_MIN, all_lo = INT_MIN, all_hi = INT_MAX;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int lo, hi;
      row_range(row_of(i) >> lgh, seq, sink, lo, hi);
      any_lo = min(any_lo, lo), any_hi = max(any_hi, hi), all_lo = max(all_lo, lo), all_hi = min(all_hi, hi);
    }
    any_lo = __reduce_min_sync(0xffffffffu, any_lo), any_hi = __reduce_max_sync(0xffffffffu, any_hi);
    all_lo = __reduce_max_sync(0xffffffffu, all_lo), all_hi = __reduce_min_sync(0xffffffffu, all_hi);
    const int32_t* table = a.block_tables + int64_t{seq} * a.max_blocks;
    // K/V tile of keys kt + [0, BK) into stage st: thread takes 16-byte chunks, consecutive threads
    // consecutive chunks of a row (coalesced reads); keys past khi are zero-filled.
    const auto load_tile = [&](int st, int kt) {
      static_assert(BK * CH % kPThreads == 0);
#pragma unroll
      for (int u = 0; u < BK * CH / kPThreads; ++u) {
        const int idx = tid + u * kPThreads, key = idx / CH, c = idx % CH, j = kt + key;
        const bool ok = j <= khi;
        int64_t off = 0;
        if (ok) off = (int64_t{table[j / a.block_size]} * a.block_size + j % a.block_size) * kv_width + kvh * HD + c * 8;
        const uint32_t d = 2 * (st * C::kKV + key * S + c * 8);
        if constexpr (QB == 0) {
          cp_async16(k_base + d, kc + off, ok);
          cp_async16(v_base + d, vc + off, ok);
        } else {
          uint4 kw = make_uint4(0u, 0u, 0u, 0u), vw = kw;  // keys past the range: zero rows
          if (ok) {
            float f[8];
            kv_dequant8<QB>(a.k_cache, a.k_scales, a.k_biases, a.kv_group, off, f);
            kw = make_uint4(pack_bf16(f[0], f[1]), pack_bf16(f[2], f[3]), pack_bf16(f[4], f[5]), pack_bf16(f[6], f[7]));
            kv_dequant8<QB>(a.v_cache, a.v_scales, a.v_biases, a.kv_group, off, f);
            vw = make_uint4(pack_bf16(f[0], f[1]), pack_bf16(f[2], f[3]), pack_bf16(f[4], f[5]), pack_bf16(f[6], f[7]));
          }
          *reinterpret_cast<uint4*>(Ks + st * C::kKV + key * S + c * 8) = kw;
          *reinterpret_cast<uint4*>(Vs + st * C::kKV + key * S + c * 8) = vw;
        }
      }
      cp_async_commit();
    };
    load_tile(0, klo);

    for (int it = 0; it < n_tiles; ++it) {
      const int kt = klo + it * BK, st = it & 1;
      if (it + 1 < n_tiles) {
        load_tile(st ^ 1, kt + BK);  // the stage computed in iteration it - 1, freed by its barrier
        cp_async_wait<1>();          // everything but the newest group: Q and tile it
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();

      // Warp-uniform: may a row of the warp see a key of the tile, do all rows see all of them?
      const bool all = kt >= all_lo && kt + BK - 1 <= all_hi;
      if (kt <= any_hi && kt + BK - 1 >= any_lo) {
        // S [2 m-tiles][BK / 8 n-tiles] = Q Kᵀ
        float s[2][BK / 8][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nt = 0; nt < BK / 8; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
        const uint32_t kb_addr = k_base + 2 * st * C::kKV + k_off;
#pragma unroll 4  // a full unroll at head_dim 128 spilled more (ptxas hoists every fragment load)
        for (int kk = 0; kk < HD / 16; ++kk) {
          uint32_t qa[2][4];
          ldsm_x4(qa[0], q_base + 2 * kk * 16);
          ldsm_x4(qa[1], q_base + 2 * (16 * S + kk * 16));
#pragma unroll
          for (int np = 0; np < BK / 16; ++np) {
            uint32_t kb[4];
            ldsm_x4(kb, kb_addr + 2 * (np * 16 * S + kk * 16));
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              mma_bf16(s[mt][2 * np], qa[mt], kb[0], kb[1]);
              mma_bf16(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
            }
          }
        }
        // Scale / softcap into log2 units, mask where the tile cuts a row's range, online softmax.
        // Row i = 2 mt + half holds elements e = 2 half, 2 half + 1 of every n-tile.
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          // This thread's rows of the m-tile (hf 0, 1): their visible range, re-read from shared
          // memory only on tiles that need a mask.
          int lo[2] = {INT_MIN, INT_MIN}, hi[2] = {INT_MAX, INT_MAX};
          if (!all)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
              row_range(row_of(2 * mt + hf) >> lgh, seq, sink, lo[hf], hi[hf]);
            }
          float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
          for (int nt = 0; nt < BK / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float v = CAP ? post * tanhf(s[mt][nt][e] * pre) : s[mt][nt][e] * pre;
              if (!all) {
                const int j = kt + nt * 8 + tig * 2 + (e & 1);
                v = j >= lo[e >> 1] && j <= hi[e >> 1] ? v : -INFINITY;
              }
              s[mt][nt][e] = v;
              mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int i = 2 * mt + hf;
            float x = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 1));
            x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
            const float mn = fmaxf(m[i], x);
            // A row with nothing visible yet keeps m = -inf: 0 as the reference gives exp2 0, not NaN.
            const float ref = mn == -INFINITY ? 0.0f : mn;
            const float alpha = exp2f(m[i] - ref);
            m[i] = mn;
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < BK / 8; ++nt) {
              s[mt][nt][2 * hf] = exp2f(s[mt][nt][2 * hf] - ref);
              s[mt][nt][2 * hf + 1] = exp2f(s[mt][nt][2 * hf + 1] - ref);
              sum += s[mt][nt][2 * hf] + s[mt][nt][2 * hf + 1];
            }
            l[i] = fmaf(l[i], alpha, sum);  // per-thread partial sums; reduced over the quad at the end
#pragma unroll
            for (int dn = 0; dn < HD / 8; ++dn) o[mt][dn][2 * hf] *= alpha, o[mt][dn][2 * hf + 1] *= alpha;
          }
        }
        // O += P V: the S accumulator layout is the A-fragment layout of P (two n-tiles per k-step).
        const uint32_t vb_addr = v_base + 2 * st * C::kKV + v_off;
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
          uint32_t pa[2][4];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            pa[mt][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
            pa[mt][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
            pa[mt][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
            pa[mt][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
          }
#pragma unroll
          for (int dp = 0; dp < HD / 16; ++dp) {
            uint32_t vb[4];
            ldsm_x4_trans(vb, vb_addr + 2 * (kk * 16 * S + dp * 16));
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              mma_bf16(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
              mma_bf16(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
            }
          }
        }
      }
      __syncthreads();  // every warp is done with stage st before the next iteration refills it
    }
  }

  // out[token, head, :] = O / l for the rows of real tokens (rows past n_tokens have seq -1).
  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(a.out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float li = l[i];
    li += __shfl_xor_sync(0xffffffffu, li, 1);
    li += __shfl_xor_sync(0xffffffffu, li, 2);
    const float inv = li > 0.0f ? 1.0f / li : 0.0f;
    const int r = row_of(i);
    if (tok_seq[r >> lgh] < 0) continue;
    __nv_bfloat16* orow = out + int64_t{t0 + (r >> lgh)} * q_width + int64_t{h0 + (r & (gh - 1))} * HD;
    const int mt = i >> 1, hf = i & 1;
#pragma unroll
    for (int dn = 0; dn < HD / 8; ++dn)
      *reinterpret_cast<__nv_bfloat162*>(orow + dn * 8 + tig * 2) =
          __floats2bfloat162_rn(o[mt][dn][2 * hf] * inv, o[mt][dn][2 * hf + 1] * inv);
  }
}

}  // namespace

bool attention_prefill_supported(int head_dim) { return head_dim == 32 || head_dim == 64 || head_dim == 128; }
// (a quantized cache's groups are >= 8 values and divide head_dim, so 8-value chunks never straddle two)

namespace {

template <int HD, bool CAP, int QB>
void launch_prefill(const AttnArgs& a, int lgh, cudaStream_t s) {
  constexpr size_t bytes = PrefillCfg<HD>::kBytes;  // > 48 KB at head_dim 64/128: opt in, once
  static const bool raised = [] {
    cudaFuncSetAttribute(attn_prefill_kernel<HD, CAP, QB>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    return true;
  }();
  (void)raised;
  const int group = a.n_heads / a.n_kv_heads, tb = kPRows >> lgh;
  const dim3 grid(a.n_kv_heads * (group >> lgh), (a.n_tokens + tb - 1) / tb);
  attn_prefill_kernel<HD, CAP, QB><<<grid, kPThreads, bytes, s>>>(a, lgh);
}

template <int HD, int QB>
void launch_prefill(const AttnArgs& a, int lgh, cudaStream_t s) {
  if (a.softcap > 0.0f) launch_prefill<HD, true, QB>(a, lgh, s);
  else launch_prefill<HD, false, QB>(a, lgh, s);
}

template <int HD>
void launch_prefill(const AttnArgs& a, int lgh, cudaStream_t s) {
  switch (a.kv_bits) {
    case 8: launch_prefill<HD, 8>(a, lgh, s); break;
    case 4: launch_prefill<HD, 4>(a, lgh, s); break;
    default: launch_prefill<HD, 0>(a, lgh, s); break;
  }
}

}  // namespace

void launch_attention_prefill(const AttnArgs& a, cudaStream_t s) {
  if (a.n_tokens == 0) return;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!aligned(a.q) || !aligned(a.k_cache) || !aligned(a.v_cache) || !aligned(a.out)) {
    std::fprintf(stderr, "[cuda] attention prefill: q, caches and out must be 16-byte aligned\n");
    std::abort();
  }
  // Heads per block: the largest power of two <= 8 that divides the GQA group (1 for odd groups).
  // (The block count is n_tokens * n_heads / 128 whatever this choice: it only sets the K/V reuse.)
  const int group = a.n_heads / a.n_kv_heads;
  int lgh = 0;
  while (lgh < 3 && group % (2 << lgh) == 0) ++lgh;
  switch (a.head_dim) {
    case 32: launch_prefill<32>(a, lgh, s); break;
    case 64: launch_prefill<64>(a, lgh, s); break;
    case 128: launch_prefill<128>(a, lgh, s); break;
    default: std::fprintf(stderr, "[cuda] attention prefill: head_dim %d\n", a.head_dim); std::abort();
  }
  KILN_CUDA_LAUNCH_CHECK("attention_prefill");
}

}  // namespace kiln::backend::cuda
