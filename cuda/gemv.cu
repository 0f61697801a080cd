// Decode GEMV straight from row-split quantized planes (q4/q5/q6 g64, q8 g32; layout row_split_k128_v1).
//
//   y[m][n] = sum_k W[n][k] * x[m][k]       W: [N, K] packed, x: [M, K] fp32 (M = tokens in flight)
//
// Why it looks like this (spec/performance.md §4g: a plain kernel reaches ~50% of the bandwidth):
// * Codes are decoded a 16-byte chunk at a time without int->float conversions (gemv_decode.cu).
// * x is staged once per block into shared memory (or read pre-staged) as int16 pairs scaled by a power of two,
//   in the pair order dp2a takes (dot_i16: exact int32 sums a chunk; w8 staging its own: fp16 pairs, scaled so
//   that the fp16 partial sums cannot overflow), and swizzled so that a warp's 16-byte reads are bank-conflict
//   free.
// * One warp handles ROWS rows at once (x read once from shared memory for all of them) and keeps
//   U 16-byte weight loads per row in flight per lane; blocks loop over row groups so that staging x
//   is paid once per block; grid.y splits K (split-K) for the few-row, long-K shapes.
// Epilogues: STORE (y = acc), PARTIAL (split-K slice s writes its own [M, N] plane; the consumer sums),
// SWIGLU (rows g and g + pair_stride of a fused [gate; up] parent, g < N - pair_stride: y[g] = silu(gate) *
// up; a view of rows [a, I + b) of an [I gate; I up] parent with pair_stride I is the slice a..b), ADD (y += acc).
#include "common.cuh"

#define EPI_STORE 0
#define EPI_PARTIAL 1
#define EPI_SWIGLU 2
#define EPI_ADD 3
#define EPI_CONV 4

// EPI_CONV (the GDN projections of one decode token): output row r < rows is channel base + r of the
// causal depthwise conv (kernel 4, weights w [4, C] tap-major, history st [M, 3, C] oldest first, shifted
// here), stored after SiLU, in gdn_prep's operation order; rows past `rows` (v|z's z) are stored plain.
struct ConvEpi {
  const float* w;
  float* st;
  int C, base, rows;
};

// The parameters of the row-split GEMV kernels (gemv_rs and the variants in gemv_variants.cu): one
// argument list, which GemvPlan builds once for all of them.
// (GEMV_RS_PARAMS_P(p), GEMV_RS_ARGS_P(p): the same list with every name prefixed by p, for gemv_rs_pre_pair's two.)
#define GEMV_RS_PARAMS_P(p)                                                                                       \
  const unsigned char* __restrict__ p##base, const unsigned char* __restrict__ p##high,                         \
      const __half* __restrict__ p##scales, int p##N, int p##gpr, int p##pair_stride,                           \
      const float* __restrict__ p##x, int p##ldx, int p##K, int p##u4_per_split, float* __restrict__ p##y,      \
      int p##ldy, int p##epi, const float* __restrict__ p##xinv, const int* __restrict__ p##eidx, int p##erows, \
      long long p##xz, int p##yz, const float* __restrict__ p##ywt, int p##pf,                                  \
      const float* __restrict__ p##conv_w, float* __restrict__ p##conv_st, int p##conv_c, int p##conv_base,    \
      int p##conv_rows
#define GEMV_RS_ARGS_P(p)                                                                                        \
  p##base, p##high, p##scales, p##N, p##gpr, p##pair_stride, p##x, p##ldx, p##K, p##u4_per_split, p##y, p##ldy, \
      p##epi, p##xinv, p##eidx, p##erows, p##xz, p##yz, p##ywt, p##pf, p##conv_w, p##conv_st, p##conv_c,        \
      p##conv_base, p##conv_rows
#define GEMV_RS_PARAMS GEMV_RS_PARAMS_P()

// A warp's finished row group: reduce each row's lane partials and apply the epilogue. TRACK: returns
// the largest |SwiGLU output| this lane wrote (0 elsewhere; gemv_rs_pre's fused staging reads it).
// CONV: the instantiation with EPI_CONV compiled in (a template flag, so that the GEMVs without it keep
// their code: the branch in every GEMV moved the scheduling of their main loops, the q5 down projection
// 6.7% slower on the H200).
template <int ROWS, int M, bool TRACK = false, bool CONV = false>
__device__ __forceinline__ float gemv_store(float (&acc)[ROWS][M], int g, int N, int pair_stride, int epi,
                                            const float* inv_sc, float yw, float* __restrict__ y, int ldy, int lane,
                                            const ConvEpi& cv) {
  float wrote = 0.f;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float v[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) v[r] = warp_sum(acc[r][m]) * inv_sc[m] * yw;
    if constexpr (CONV) {  // lane r: row r of the group (its history loads in parallel)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const int row = g * ROWS + r;
        if (lane == r && row < N) {
          float o = v[r];
          if (row < cv.rows) {
            const int c = cv.base + row, C = cv.C;
            float* st = cv.st + (size_t)m * 3 * C;
            const float s0 = st[c], s1 = st[C + c], s2 = st[2 * C + c];
            const float a = cv.w[c] * s0 + cv.w[C + c] * s1 + cv.w[2 * C + c] * s2 + cv.w[3 * C + c] * o;
            st[c] = s1;
            st[C + c] = s2;
            st[2 * C + c] = o;
            o = silu(a);
          }
          y[(size_t)m * ldy + row] = o;
        }
      }
      continue;
    }
    if (lane == 0) {
      if (epi == EPI_SWIGLU) {
        if constexpr (TRACK) {
          if (g < N - pair_stride) {
            const float o = silu(v[0]) * v[ROWS - 1];
            y[(size_t)m * ldy + g] = o;
            wrote = fmaxf(wrote, fabsf(o));
          }
        } else {
          if (g < N - pair_stride) y[(size_t)m * ldy + g] = silu(v[0]) * v[ROWS - 1];
        }
      } else {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          const int row = g * ROWS + r;
          if (row < N) {
            if (epi == EPI_STORE) y[(size_t)m * ldy + row] = v[r];
            else if (epi == EPI_ADD) y[(size_t)m * ldy + row] += v[r];
            else y[((size_t)blockIdx.y * M + m) * ldy + row] = v[r];
          }
        }
      }
    }
  }
  return wrote;
}

template <int FMT, int ROWS, int M, int U, bool CONV = false>
// One-token decode variants held to an occupancy: one row at 5 blocks/SM (51 registers), two rows at
// 4 (64; not q5, which would spill). With the slot-major x the compiler otherwise hoists every x load
// of an iteration (immediate offsets) and grows to 96-116 registers.
__global__ void __launch_bounds__(256, (M == 1 && U == 2) ? (ROWS == 1 ? 5 : (ROWS == 2 ? 4 : 1)) : 1) gemv_rs(GEMV_RS_PARAMS) {
  // MoE: grid.z picks a routed slot; its expert's rows start at eidx[z] * erows of the stacked object,
  // its x is xz bytes further on (and its own xinv), its output yz floats further on, times ywt[z].
  // pf > 0: before the PDL wait (weights depend on no kernel), each lane asks L2 for the weights, scales
  // and high bits of its warp's first pf loop iterations. (Prefetching pf iterations ahead inside the
  // loop was measured too: no gain, and 10-60 more registers.)
  using F = Fmt<FMT>;
  constexpr int VPU = F::VPU;
  const int u4_per_row = gpr * 2;
  const int z = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wpb = blockDim.x >> 5;
  const int ngroups = epi == EPI_SWIGLU ? N - pair_stride : (N + ROWS - 1) / ROWS;
  const int js = blockIdx.y * u4_per_split;
  const int je = min(js + u4_per_split, u4_per_row);
  const int pf_span = 32 * U * pf;  // chunks of a row requested ahead
  auto group_rows = [&](int g, long long off, int* rows) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int row = epi == EPI_SWIGLU ? g + r * pair_stride : g * ROWS + r;
      rows[r] = (row < N ? row : N - 1) + (int)off;  // clamp: duplicates are computed, never stored
    }
  };
  auto prefetch = [&](const int* rows, int j0, int j1) {
    for (int j = j0 + lane; j < min(j1, je); j += 32) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        prefetch_l2(base + ((size_t)rows[r] * u4_per_row + j) * 16);
        if ((j & 15) == 0) {
          const size_t rg = (size_t)rows[r] * gpr + (j >> 1);
          prefetch_l2(scales + rg);
          if constexpr (F::HB > 0) prefetch_l2(high + rg * F::HB);
        }
      }
    }
  };
  const int g_first = blockIdx.x * wpb + warp;
  if (pf > 0 && eidx == nullptr && g_first < ngroups) {
    int rows0[ROWS];
    group_rows(g_first, 0, rows0);
    prefetch(rows0, js, js + pf_span);
  }
  NI_PDL_ENTRY();
  const long long row_off = eidx != nullptr ? (long long)eidx[z] * erows : 0;
  x = reinterpret_cast<const float*>(reinterpret_cast<const unsigned char*>(x) + z * xz);
  if (xinv != nullptr) xinv += xz != 0 ? z : 0;
  y += (size_t)z * yz;
  const float yw = ywt != nullptr ? ywt[z] : 1.f;
  const int nloc = je - js;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __half2* xs = reinterpret_cast<__half2*>(smem_raw);
  // q4-q6: x pairs in slot-major blocks of 32 chunks (a block: 4 slots x 32 chunks x 16 B), so a warp's
  // 16-byte reads of one slot are 512 contiguous bytes (4 L1 wavefronts, no bank conflicts); rows padded
  // to whole blocks. w8: chunk-major with a 2-slot swizzle, as before.
  const int nloc_pad = VPU == 32 ? ((nloc + 31) & ~31) : nloc;
  float* red = reinterpret_cast<float*>(smem_raw + (size_t)M * nloc_pad * VPU * 2);

  // x arrives pre-staged (xinv != nullptr: fp16 pairs in decode order for the whole row, written once
  // by the producing kernel) or is staged here from fp32: x[m][js*VPU : je*VPU) -> shared memory.
  const bool pre = xinv != nullptr;
  float inv_sc[M];
  if (pre) {
#pragma unroll
    for (int m = 0; m < M; ++m) inv_sc[m] = xinv[m];
  } else {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float* xm = x + (size_t)m * ldx;
      const int k0 = js * VPU, k1 = min(je * VPU, K);
      float mx = 0.f;
      for (int k = k0 + threadIdx.x; k < k1; k += blockDim.x) mx = fmaxf(mx, fabsf(xm[k]));
      mx = block_max(mx, red);
      float sc = 1.f;
      if (mx > 0.f) {
        int e;
        frexpf(F::XMAX / mx, &e);
        sc = ldexpf(1.f, e - 1);
      }
      inv_sc[m] = 1.f / sc;
      const int npairs = nloc * (VPU / 2);
      for (int p = threadIdx.x; p < npairs; p += blockDim.x) {
        const int jl = p / (VPU / 2), pi = p % (VPU / 2);
        int ka, kb, dst;
        if constexpr (FMT == FMT_W8) {
          const int c = pi >> 1, jp = pi & 1;
          ka = (js + jl) * 16 + 4 * c + jp;
          kb = ka + 2;
          const int phys = ((c >> 1) + (jl >> 2)) & 1;
          dst = (m * nloc + jl) * 8 + phys * 4 + (c & 1) * 2 + jp;
        } else {
          const int c = pi >> 2, jp = pi & 3;
          ka = (js + jl) * 32 + 8 * c + stage_a(jp);
          kb = ka + STAGE_GAP;
          dst = m * nloc_pad * 16 + (jl >> 5) * 512 + c * 128 + (jl & 31) * 4 + jp;
        }
        const float a = ka < K ? xm[ka] * sc : 0.f, b = kb < K ? xm[kb] * sc : 0.f;
        if constexpr (FMT == FMT_W8) xs[dst] = __floats2half2_rn(a, b);
        else reinterpret_cast<unsigned int*>(xs)[dst] = stage_pack(a, b);
      }
    }
    __syncthreads();
  }
  const uint4* xs4 = pre ? reinterpret_cast<const uint4*>(x) : reinterpret_cast<const uint4*>(xs);
  const int xrow = pre ? ((u4_per_row + 31) & ~31) : nloc_pad;  // chunks per token row of the x pairs
  const int xoff = pre ? js : 0;
  constexpr int SLOTS = VPU == 32 ? 4 : 2;

  for (int g = g_first; g < ngroups; g += gridDim.x * wpb) {
    int rows[ROWS];
    group_rows(g, row_off, rows);
    float acc[ROWS][M];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m) acc[r][m] = 0.f;

    for (int jj = js + lane; jj < je; jj += 32 * U) {
      uint4 w[U][ROWS];
      uint2 hb[U][ROWS];
      float sc[U][ROWS];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int j = jj + 32 * u;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          if (j < je) load_chunk<FMT>(base, high, scales, gpr, u4_per_row, (size_t)rows[r], j, w[u][r], sc[u][r], hb[u][r]);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int j = jj + 32 * u;
        if (j < je) {
          const int jl = j - js;
          const int key = SLOTS == 4 ? 0 : ((jl + xoff) >> 2);
          const int jx = jl + xoff;  // chunk index in the staged row
#pragma unroll
          for (int m = 0; m < M; ++m) {
            const uint4* xp = SLOTS == 4 ? xs4 + (size_t)m * xrow * 4 + (jx >> 5) * 128 + (jx & 31)
                                         : xs4 + (size_t)(m * xrow + jx) * SLOTS;
#pragma unroll
            for (int r = 0; r < ROWS; ++r) acc[r][m] += sc[u][r] * dot_u4<FMT>(w[u][r], hb[u][r], xp, key);
          }
        }
      }
    }

    gemv_store<ROWS, M, false, CONV>(acc, g, N, pair_stride, epi, inv_sc, yw, y, ldy, lane,
                                     ConvEpi{conv_w, conv_st, conv_c, conv_base, conv_rows});
  }
}

// bf16 weights [N, K] (row-major, K % 8 == 0), fp32 x [M, K], fp32 math. kw warps share a row (1 or 8): with few
// rows (the 96-row GDN a|b projection) one warp per row would leave most SMs idle and walk the whole row in dependent
// rounds, so the 8 warps of a block split K and reduce in shared memory. A lane takes chunks of 8 values j = lane +
// 32 part + 32 kw i, BF16_CH of them a batch: the batch's weight loads are issued together (the first batch's before
// the PDL wait: weights depend on no kernel), then its x loads and sums, so that a batch costs one round trip where a
// chunk at a time cost one a chunk (the verified columns' a|b: K = 5,120 is one batch). The sums are added a chunk
// at a time in j's order, as before.
constexpr int BF16_CH = 4;
template <int M>
__global__ void __launch_bounds__(256) gemv_bf16(const unsigned short* __restrict__ w, int N, int K,
                                                 const float* __restrict__ x, int ldx,
                                                 float* __restrict__ y, int ldy, int epi, int kw) {
  __shared__ float red[8][M];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row = blockIdx.x * (8 / kw) + warp / kw, part = warp % kw;
  const bool live = row < N;
  const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)(live ? row : 0) * K);
  const int nj = live ? K / 8 : 0, step = 32 * kw;
  uint4 wv[BF16_CH];
  auto load = [&](int j0) {
#pragma unroll
    for (int i = 0; i < BF16_CH; ++i)
      if (j0 + i * step < nj) wv[i] = ldw(wr + j0 + i * step);
  };
  int j0 = lane + 32 * part;
  load(j0);
  NI_PDL_ENTRY();
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.f;
  for (; j0 < nj; j0 += BF16_CH * step) {
#pragma unroll
    for (int i = 0; i < BF16_CH; ++i) {
      const int j = j0 + i * step;
      if (j >= nj) break;
      const uint4 v = wv[i];
      const float wf[8] = {bf16_lo(v.x), bf16_hi(v.x), bf16_lo(v.y), bf16_hi(v.y),
                           bf16_lo(v.z), bf16_hi(v.z), bf16_lo(v.w), bf16_hi(v.w)};
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float4* xp = reinterpret_cast<const float4*>(x + (size_t)m * ldx + j * 8);
        const float4 a = xp[0], b = xp[1];
        acc[m] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y +
                  wf[6] * b.z + wf[7] * b.w;
      }
    }
    if (j0 + BF16_CH * step < nj) load(j0 + BF16_CH * step);
  }
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = warp_sum(acc[m]);
  if (kw > 1) {
    if (lane == 0) {
#pragma unroll
      for (int m = 0; m < M; ++m) red[warp][m] = acc[m];
    }
    __syncthreads();
    if (part != 0) return;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float t = 0.f;
      for (int p = 0; p < kw; ++p) t += red[warp + p][m];
      acc[m] = t;
    }
  }
  if (!live) return;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    if (lane == 0) {
      if (epi == EPI_ADD) y[(size_t)m * ldy + row] += acc[m];
      else y[(size_t)m * ldy + row] = acc[m];
    }
  }
}
