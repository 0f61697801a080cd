// MoE routing on the device: softmax over E router logits, top-k, renormalised weights, and the shared
// expert's sigmoid gate (logit E). One warp per token row; ties go to the lower expert id.
#include "common.cuh"

// Token row m's top-k of its E logits l (and the shared expert's gate l[E]), by warp 0 of a block.
// CG: the logits were written by other blocks of the same kernel (read through L2 only).
template <bool CG = false>
__device__ __forceinline__ void route_row(const float* __restrict__ l, int E, int topk, int* __restrict__ idx,
                                          float* __restrict__ wts, int ldw, int m) {
  // lane l holds experts l, l + 32, ... (E <= 512); top-k by k rounds of warp argmax
  const int lane = threadIdx.x & 31;
  auto at = [&](int e) { return CG ? __ldcg(l + e) : l[e]; };
  constexpr int PER = 16;
  float v[PER];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < E ? at(e) : -INFINITY;
    mx = fmaxf(mx, v[i]);
  }
  mx = warp_max(mx);
  float total = 0.f, mine = 0.f;
  int myidx = 0;
  for (int k = 0; k < topk; ++k) {
    float best = -INFINITY;
    int bi = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < PER; ++i)
      if (v[i] > best) { best = v[i]; bi = lane + 32 * i; }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ob > best || (ob == best && oi < bi)) { best = ob; bi = oi; }
    }
    const float p = __expf(best - mx);  // softmax numerators; the denominator cancels in the renorm
    total += p;
    if (lane == k) { mine = p; myidx = bi; }
    if ((bi & 31) == lane) v[bi >> 5] = -INFINITY;
  }
  if (lane < topk) {
    idx[(size_t)m * topk + lane] = myidx;
    wts[(size_t)m * ldw + lane] = mine / total;
  }
  if (lane == 0) wts[(size_t)m * ldw + topk] = sigmoidf_(at(E));
}

// The warp's largest (MAX) or smallest unsigned value in every lane: redux.sync on sm_80 and newer, shuffles before
// (the same result; the module also builds for older GPUs).
template <bool MAX>
__device__ __forceinline__ unsigned int warp_uext(unsigned int v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return MAX ? __reduce_max_sync(0xffffffffu, v) : __reduce_min_sync(0xffffffffu, v);
#else
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned int u = __shfl_xor_sync(0xffffffffu, v, o);
    v = MAX ? max(v, u) : min(v, u);
  }
  return v;
#endif
}

// route_row's routing with the warp's reductions in hardware (redux.sync, sm_80+, warp_uext; moe_fused's
// top-k): each lane keeps
// its own best (the lowest expert id among equal values) across the rounds, the warp's best is the largest order key
// (__reduce_max_sync), its expert the lowest id among the lanes holding it (__reduce_min_sync), and only the winning
// lane rescans its PER values; the softmax's maximum is round 0's best. The same experts and weights as route_row.
__device__ __forceinline__ unsigned int order_key(float f) {  // (unsigned order = float order; -0 < +0)
  const unsigned int u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
template <int PER, bool CG = false>
__device__ __forceinline__ void route_row_redux(const float* __restrict__ l, int E, int topk, int* __restrict__ idx,
                                                float* __restrict__ wts, int ldw, int m) {
  const int lane = threadIdx.x & 31;
  auto at = [&](int e) { return CG ? __ldcg(l + e) : l[e]; };
  float v[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) v[i] = lane + 32 * i < E ? at(lane + 32 * i) : -INFINITY;
  const float gate = at(E);
  float best = -INFINITY, mx = 0.f, total = 0.f, mine = 0.f;
  int bi = 0x7fffffff, myidx = 0;
  auto scan = [&]() {
    best = -INFINITY;
    bi = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < PER; ++i)
      if (v[i] > best) { best = v[i]; bi = lane + 32 * i; }
  };
  scan();
  for (int k = 0; k < topk; ++k) {
    const unsigned int key = order_key(best), kmax = warp_uext<true>(key);
    const int id = (int)warp_uext<false>(key == kmax ? (unsigned int)bi : 0xffffffffu);
    const float bv = __shfl_sync(0xffffffffu, best, id & 31);
    if (k == 0) mx = bv;
    const float p = __expf(bv - mx);
    total += p;
    if (lane == k) { mine = p; myidx = id; }
    if ((id & 31) == lane) {
#pragma unroll
      for (int i = 0; i < PER; ++i)
        if (lane + 32 * i == id) v[i] = -INFINITY;
      scan();
    }
  }
  if (lane < topk) {
    idx[(size_t)m * topk + lane] = myidx;
    wts[(size_t)m * ldw + lane] = mine / total;
  }
  if (lane == 0) wts[(size_t)m * ldw + topk] = sigmoidf_(gate);
}

extern "C" __global__ void moe_route(const float* __restrict__ logits, int ldl, int E, int topk,
                                     int* __restrict__ idx, float* __restrict__ wts, int ldw) {
  NI_PDL_ENTRY();
  // One warp per token row
  if (threadIdx.x >= 32) return;
  route_row(logits + (size_t)blockIdx.x * ldl, E, topk, idx, wts, ldw, blockIdx.x);
}

// The MoE block over M token rows (speculation's verified columns, engine/gpu/moe.py column_ops): the M * k routed
// slots in slot order z = j * M + r (slot j of row r), so one gate|up and one down launch over grid.z = M * k read row
// r's staged x at xrep[z] and write slot j of row r into partial plane j, row r. From moe_route's eidx [M, k] and
// ewts [M, k + 1]: eidx_t[z], ewts_t[z]; xrep [M * k, W] and xinv_rep [M * k] copy the staged rows xh [M, W] (u32
// words) and their inverse scales xinv [M]; the shared expert's SwiGLU rows act [M, lda] (their first inter_sh values)
// are scaled by its gate ewts[r, k]. One block a slot.
extern "C" __global__ void moe_cols_prep(const int* __restrict__ eidx, const float* __restrict__ ewts, int k, int M,
                                         int* __restrict__ eidx_t, float* __restrict__ ewts_t, float* __restrict__ act,
                                         int lda, int inter_sh, const unsigned int* __restrict__ xh, int W,
                                         const float* __restrict__ xinv, unsigned int* __restrict__ xrep,
                                         float* __restrict__ xinv_rep) {
  NI_PDL_ENTRY();
  const int z = blockIdx.x, j = z / M, r = z % M;
  if (threadIdx.x == 0) {
    eidx_t[z] = eidx[r * k + j];
    ewts_t[z] = ewts[(size_t)r * (k + 1) + j];
    xinv_rep[z] = xinv[r];
  }
  for (int i = threadIdx.x; i < W; i += blockDim.x) xrep[(size_t)z * W + i] = xh[(size_t)r * W + i];
  if (j == 0) {
    const float gate = ewts[(size_t)r * (k + 1) + k];
    for (int i = threadIdx.x; i < inter_sh; i += blockDim.x) act[(size_t)r * lda + i] *= gate;
  }
}

// Word c of a 16-byte chunk of codes (format FMT, the chunk's high bits hb) against its PER fp32 x values:
// sum of code * x. A code becomes an exact float by OR-ing its offset-binary form into the mantissa of 2^23
// and subtracting 2^23 + offset (no int->float conversions, which are quarter-rate). Value i of the word
// sits at bits 4i for q4-q6 (byte i / 2, even values in the low nibble), at bits 8i for w8; the word's
// values are values c * PER + i of the chunk (which picks its high bits).
template <int FMT, int PER>
__device__ __forceinline__ float word_dot_f32(unsigned int wd, uint2 hb, int c, const float (&xv)[PER]) {
  constexpr unsigned int OFF = FMT == FMT_Q4 ? 8u : FMT == FMT_Q5 ? 16u : FMT == FMT_Q6 ? 32u : 128u;
  constexpr float BIAS = 8388608.f + (float)OFF;
  float s0 = 0.f, s1 = 0.f;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int v = c * PER + i;  // value index in the chunk
    unsigned int u;
    if constexpr (FMT == FMT_W8) {
      u = ((wd >> (8 * i)) & 0xffu) ^ 0x80u;
    } else {
      u = (wd >> (4 * i)) & 0xfu;
      if constexpr (FMT == FMT_Q5) u |= ((hb.x >> v) & 1u) << 4;
      if constexpr (FMT == FMT_Q6) u |= ((v < 16 ? hb.x >> (2 * v) : hb.y >> (2 * v - 32)) & 3u) << 4;
      u ^= OFF;
    }
    const float f = __uint_as_float(0x4B000000u | u) - BIAS;
    if (i & 1) s1 = fmaf(f, xv[i], s1);
    else s0 = fmaf(f, xv[i], s0);
  }
  return s0 + s1;
}

// The VPU x values of one chunk as the int16 pairs of dot_i16 / dot_w8_i16 (slot s: (x0, x2), (x4, x6), (x1, x3),
// (x5, x7) of its 8 values), scaled by the power of two that takes their largest |value| to at most 32767: a
// scale per chunk, so a lane needs no other lane's x. Rounding by adding 1.5 * 2^23 (the integer lands in the
// low mantissa bits; |value| <= 2^15 < 2^22), one byte permute a pair. Returns the inverse scale.
template <int VPU>
__device__ __forceinline__ float chunk_pairs(const float* __restrict__ x, uint4 (&px)[VPU / 8]) {
  float xv[VPU];
  const float4* x4 = reinterpret_cast<const float4*>(x);
#pragma unroll
  for (int q = 0; q < VPU / 4; ++q) {
    const float4 t = __ldg(x4 + q);
    xv[4 * q] = t.x;
    xv[4 * q + 1] = t.y;
    xv[4 * q + 2] = t.z;
    xv[4 * q + 3] = t.w;
  }
  float mx = 0.f;
#pragma unroll
  for (int i = 0; i < VPU; ++i) mx = fmaxf(mx, fabsf(xv[i]));
  const float sc = pow2_scale(mx, 32767.f);
  auto pk = [&](int a, int b) {
    return __byte_perm(__float_as_uint(fmaf(xv[a], sc, 12582912.f)), __float_as_uint(fmaf(xv[b], sc, 12582912.f)), 0x5410);
  };
#pragma unroll
  for (int sl = 0; sl < VPU / 8; ++sl) {
    const int b = 8 * sl;
    px[sl] = make_uint4(pk(b, b + 2), pk(b + 4, b + 6), pk(b + 1, b + 3), pk(b + 5, b + 7));
  }
  return 1.f / sc;
}

// R rows of one [N, K] row-split matrix (format FMT) against one fp32 x row, a half-warp per row group:
// lane hl of the half takes chunks hl, hl + 16, ... of each row (K = 512 at q4-q6: one chunk a lane; every
// weight load of the group is issued before the first product). Returns the row sums in every lane of the half.
template <int FMT, int R, bool I16>
__device__ __forceinline__ void half_warp_rows(const unsigned char* __restrict__ base, const unsigned char* __restrict__ high,
                                               const __half* __restrict__ scales, int gpr, long long row0, int nrows,
                                               const float* __restrict__ x, int K, float (&acc)[R]) {
  using F = Fmt<FMT>;
  constexpr int U = F::VPU == 16 ? 2 : 1;  // chunk rounds a lane loads at once (w8 K = 512: 32 chunks)
  const int hl = threadIdx.x & 15;
  const int u4_per_row = gpr * 2, nch = K / F::VPU;
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  for (int j0 = hl; j0 < nch; j0 += 16 * U) {
    uint4 w[U][R];
    uint2 hb[U][R];
    float sc[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + 16 * u;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const long long row = row0 + (r < nrows ? r : 0);
        if (j < nch) load_chunk<FMT>(base, high, scales, gpr, u4_per_row, (size_t)row, j, w[u][r], sc[u][r], hb[u][r]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + 16 * u;
      if (j < nch && I16) {  // the chunk's x as int16 pairs once, then dp2a for each row
        uint4 px[F::VPU / 8];
        const float xinv = chunk_pairs<F::VPU>(x + (size_t)j * F::VPU, px);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float d;
          if constexpr (FMT == FMT_W8) d = dot_w8_i16(w[u][r], px[0], px[1]);
          else d = dot_i16<FMT>(w[u][r], hb[u][r], [&](int c) { return px[c]; });
          acc[r] += sc[u][r] * xinv * d;
        }
      } else if (j < nch) {
        // a word of x at a time for all R rows (the chunk's 32 x values are not all held at once)
        constexpr int PER = F::VPU / 4;
        const float4* x4 = reinterpret_cast<const float4*>(x + (size_t)j * F::VPU);
        float part[R];
#pragma unroll
        for (int r = 0; r < R; ++r) part[r] = 0.f;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          float xv[PER];
#pragma unroll
          for (int q = 0; q < PER / 4; ++q) {
            const float4 t = __ldg(x4 + c * (PER / 4) + q);
            xv[4 * q] = t.x;
            xv[4 * q + 1] = t.y;
            xv[4 * q + 2] = t.z;
            xv[4 * q + 3] = t.w;
          }
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const unsigned int wd = c == 0 ? w[u][r].x : c == 1 ? w[u][r].y : c == 2 ? w[u][r].z : w[u][r].w;
            part[r] += word_dot_f32<FMT, PER>(wd, hb[u][r], c, xv);
          }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] += sc[u][r] * part[r];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
}

// The MoE decode's down projections in one launch (one token): blockIdx.z < slots is routed slot z (expert
// eidx[z]'s rows of the stacked [E * N, K] object, format FR, x = row z of act_e), blockIdx.z == slots the
// shared expert (format FS, [N, sK], x = act); each writes its own partial plane y + z * ldp, times wts[z]
// (the next norm sums the slots + 1 planes). K, sK % 32 == 0, x rows 16-byte aligned (the executor's rule).
// Replaces a routed GEMV that staged its x rows block by block and left half of each warp idle on K = 512
// rows, and the shared down-projection on its own branch. I16: each lane turns its chunk of x into int16 pairs
// (its own power-of-two scale) and takes dp2a (dot_i16, dot_w8_i16: ~2 instructions a value a row); else
// fp32 products of codes made floats (~6 a value a row).
template <int FR, int FS, int R, bool I16>
__global__ void __launch_bounds__(256) moe_down(const unsigned char* __restrict__ rbase, const unsigned char* __restrict__ rhigh,
                                                const __half* __restrict__ rscales, int rgpr, const int* __restrict__ eidx,
                                                const float* __restrict__ act_e, int ld_ae,
                                                const unsigned char* __restrict__ sbase, const unsigned char* __restrict__ shigh,
                                                const __half* __restrict__ sscales, int sgpr, const float* __restrict__ act,
                                                int sK, int N, int K, float* __restrict__ y, int ldp, const float* __restrict__ wts,
                                                int slots) {
  NI_PDL_ENTRY();
  const int z = blockIdx.z, half = (threadIdx.x >> 4) & 1, warp = threadIdx.x >> 5;
  const int grp = (blockIdx.x * (blockDim.x >> 5) + warp) * 2 + half;
  // a half past the last row computes row 0 again and stores nothing (its warp's shuffles need every lane)
  const int row0 = grp * R < N ? grp * R : 0;
  const int nrows = grp * R < N ? min(R, N - row0) : 0;
  float acc[R];
  if (z < slots) {
    half_warp_rows<FR, R, I16>(rbase, rhigh, rscales, rgpr, (long long)eidx[z] * N + row0, nrows, act_e + (size_t)z * ld_ae,
                          K, acc);
  } else {
    half_warp_rows<FS, R, I16>(sbase, shigh, sscales, sgpr, row0, nrows, act, sK, acc);
  }
  if ((threadIdx.x & 15) == 0) {
    const float wt = wts[z];
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (r < nrows) y[(size_t)z * ldp + row0 + r] = acc[r] * wt;
  }
}

// MoE prefill (grouped by expert): the (token, slot) pairs sorted by expert on the host; these two
// kernels move rows into and out of that order.
// moe_gather_f16: out[i] = fp16(x[rows[i]]) for the n sorted pairs, zeros where rows[i] < 0 (an expert's
// padding when every expert is padded to the same row count; grid n, any block size).
extern "C" __global__ void moe_gather_f16(const float* __restrict__ x, int ldx, const int* __restrict__ rows,
                                          int H, __half* __restrict__ out) {
  NI_PDL_ENTRY();
  const size_t i = blockIdx.x;
  const int r = rows[i];
  __half* dst = out + i * H;
  if (r < 0) {
    for (int h = threadIdx.x; h < H; h += blockDim.x) dst[h] = __float2half_rn(0.f);
    return;
  }
  const float* src = x + (size_t)r * ldx;
  for (int h = threadIdx.x; h < H; h += blockDim.x) dst[h] = __float2half_rn(src[h]);
}

// moe_combine: out[t] += sum over slots j (in order) of wts[t][j] * ys[inv[t * k + j]], where inv maps a
// (token, slot) pair to its row of the sorted expert outputs ys [n, H] (grid T, any block size).
extern "C" __global__ void moe_combine(const float* __restrict__ ys, int H, const int* __restrict__ inv,
                                       const float* __restrict__ wts, int ldw, int k, float* __restrict__ out,
                                       int ldo) {
  NI_PDL_ENTRY();
  const int t = blockIdx.x;
  float* o = out + (size_t)t * ldo;
  for (int h = threadIdx.x; h < H; h += blockDim.x) {
    float acc = o[h];
    for (int j = 0; j < k; ++j) acc += wts[(size_t)t * ldw + j] * ys[(size_t)inv[t * k + j] * H + h];
    o[h] = acc;
  }
}

// The pairs' order by expert on the device (the host reads back only the E counts):
// moe_count: rank[p] = the place pair p took among its expert's pairs (atomics: the order within an expert
// is arbitrary, and no row's result depends on it), cnt[e] += its pairs (cnt zeroed before); grid n / 256.
extern "C" __global__ void moe_count(const int* __restrict__ ids, int n, int* __restrict__ cnt,
                                     int* __restrict__ rank) {
  NI_PDL_ENTRY();
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p < n) rank[p] = atomicAdd(cnt + ids[p], 1);
}

// moe_place: pair p (token p / k) goes to row base[expert] + rank[p] of the sorted rows: rows[that] = its
// token (for moe_gather_f16), inv[p] = that row (for moe_combine); grid n / 256.
extern "C" __global__ void moe_place(const int* __restrict__ ids, int n, int k, const int* __restrict__ rank,
                                     const int* __restrict__ base, int* __restrict__ rows, int* __restrict__ inv) {
  NI_PDL_ENTRY();
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= n) return;
  const int pos = base[ids[p]] + rank[p];
  rows[pos] = p / k;
  inv[p] = pos;
}
