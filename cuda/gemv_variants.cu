// The pre-staged GEMVs (compiled with gemv.cu into the one module: launch.SOURCES): gemv_rs_pre (pre-staged x
// only, __ldg x, constant-stride pointers, optional fused staging of its SwiGLU output) and gemv_rs_pre_pair (two
// formats' projections in one grid). They share gemv.cu's decode (dot_core) and epilogue (gemv_store); the
// measurements are in docs/performance.md.
#include "common.cuh"

// Slot z of a routed (MoE) launch, pre-staged x: x, xinv and y move to the slot's rows (no-ops for
// z = 0 / xz = 0), inv_sc takes the M token rows' inverse x scales; returns the slot's output weight.
template <int M, typename XP, typename IP, typename YP>  // (the kernels' __restrict__ pointer parameters)
__device__ __forceinline__ float routed_slot(XP& x, IP& xinv, YP& y, long long xz, int yz,
                                             const float* __restrict__ ywt, int z, float (&inv_sc)[M]) {
  x = reinterpret_cast<const float*>(reinterpret_cast<const unsigned char*>(x) + z * xz);
  xinv += xz != 0 ? z : 0;
  y += (size_t)z * yz;
#pragma unroll
  for (int m = 0; m < M; ++m) inv_sc[m] = xinv[m];
  return ywt != nullptr ? ywt[z] : 1.f;
}

// The weight, scale and high-bit loads of U consecutive iterations of ROWS rows (lane chunks 32 apart; those of the
// iterations i + u < iters): the pre-staged GEMVs' (gemv_rs_pre, mlp_fused's WarpRows) load round.
template <int FMT, int ROWS, int U>
__device__ __forceinline__ void load_row_chunks(uint4 (&w)[U][ROWS], uint2 (&hb)[U][ROWS], float (&sc)[U][ROWS],
                                                const uint4* const (&wp)[ROWS], const __half* const (&sp)[ROWS],
                                                const unsigned char* const (&hp)[ROWS], int i, int iters) {
  constexpr int HB = Fmt<FMT>::HB;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (i + u < iters) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        w[u][r] = ldw(wp[r] + 32 * u);
        sc[u][r] = __half2float(sp[r][16 * u]);
        if constexpr (FMT == FMT_Q5) {
          hb[u][r].x = ldw(reinterpret_cast<const unsigned int*>(hp[r] + 16 * HB * u));
          hb[u][r].y = 0u;
        } else if constexpr (FMT == FMT_Q6) {
          hb[u][r] = ldw(reinterpret_cast<const uint2*>(hp[r] + 16 * HB * u));
        } else {
          hb[u][r] = make_uint2(0u, 0u);
        }
      }
    }
  }
}

// gemv_rs for pre-staged x only (the decode step's GEMVs), with the two cuts its SASS asked for: x is
// read with __ldg from global memory (gemv_rs reads it through a generic pointer that may be shared
// memory, so every x load is a generic LD), and each row's weight, scale and high-bit pointers are
// computed once per row group and advanced by constants (gemv_rs recomputes a 64-bit address, ~12
// instructions, for every load). Same arithmetic and epilogues as gemv_rs; MoE routing included.
// XS (one token, q4-q6): x carries a scale a 32-value chunk (sxsc[j], chunk j = the lane's iteration's), multiplied into
// the weight scale, as mlp_fused's chunk-scaled down does (gated_rmsnorm_chunks stages the GDN o-projection's input so).
// (gemv_rs_pre's body; PAIR: as block bid of nb along x, gemv_rs_pre_pair running two of them in one grid. The
// single launch reads blockIdx.x and gridDim.x where it did, which keeps its code as it was.)
template <int FMT, int ROWS, int M, int U, bool CONV, bool XS, bool PAIR = false>
__device__ __forceinline__ void gemv_rs_pre_body(GEMV_RS_PARAMS, __half2* __restrict__ sxh, float* __restrict__ sxinv,
                                                 int skpad, unsigned int* __restrict__ sslot,
                                                 const float* __restrict__ sxsc, int bid, int nb) {
  static_assert(!XS || (M == 1 && FMT != FMT_W8), "chunk scales: one token, q4-q6");
  // sxh != nullptr (SwiGLU, one token, no split, no routing): the output row is also staged for the
  // next GEMV, as stage_x would: every block folds the largest |output| it wrote into sslot[0]
  // (atomicMax on the float bits), takes a ticket in sslot[1], and the last block stages the whole row
  // and resets both words for the next launch. (Written without device time: measure before use.)
  // sxh == nullptr, sslot != nullptr (same conditions): only the fold into sslot[0]; stage_x_amax stages the
  // row from it and resets both words (measured: 27B +2.3%, docs/performance.md).
  // (w8 too with int16 pairs: a 16-code chunk j is half of the staged 32-value block j / 2, dot_w8_i16)
  using F = Fmt<FMT>;
  static_assert(F::VPU == 32 || FMT == FMT_W8, "q4-q6 (slot-major staged x), w8 on the int16 pairs");
  constexpr bool W8 = FMT == FMT_W8;
  float wrote = 0.f;
  const int u4_per_row = gpr * 2;
  const int z = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wpb = blockDim.x >> 5;
  const int ngroups = epi == EPI_SWIGLU ? N - pair_stride : (N + ROWS - 1) / ROWS;
  const int js = blockIdx.y * u4_per_split;  // a multiple of 32 (the executor's rule for pre-staged x)
  const int je = min(js + u4_per_split, u4_per_row);
  const int iters = je - js > lane ? (je - js - lane + 31) >> 5 : 0;  // chunks j = js + lane + 32 i
  NI_PDL_ENTRY();
  const long long row_off = eidx != nullptr ? (long long)eidx[z] * erows : 0;
  float inv_sc[M];
  const float yw = routed_slot<M>(x, xinv, y, xz, yz, ywt, z, inv_sc);
  const int xrow4 = (((W8 ? u4_per_row / 2 : u4_per_row) + 31) & ~31) * 4;  // uint4 per token row of the staged pairs
  const uint4* xlane = reinterpret_cast<const uint4*>(x) + (js >> 5) * 128 + lane;
  // w8: chunk j = js + lane + 32 n is block chunk J = (js + lane) / 2 + 16 n (js: a multiple of 64), slots
  // 2 (lane & 1) and + 1
  const uint4* xw8 = reinterpret_cast<const uint4*>(x) + 64 * (lane & 1);
  const int jw8 = (js + lane) >> 1;

  for (int g = (PAIR ? bid : (int)blockIdx.x) * wpb + warp; g < ngroups; g += (PAIR ? nb : (int)gridDim.x) * wpb) {
    const uint4* wp[ROWS];
    const __half* sp[ROWS];
    const unsigned char* hp[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int row0 = epi == EPI_SWIGLU ? g + r * pair_stride : g * ROWS + r;
      const long long row = (row0 < N ? row0 : N - 1) + row_off;  // clamp: duplicates are computed, never stored
      const int j0 = js + lane;
      wp[r] = reinterpret_cast<const uint4*>(base) + (size_t)row * u4_per_row + j0;
      sp[r] = scales + (size_t)row * gpr + (j0 >> 1);
      hp[r] = high + ((size_t)row * gpr + (j0 >> 1)) * F::HB + (j0 & 1) * (F::HB / 2);
    }
    float acc[ROWS][M];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
    const uint4* xp0 = xlane;
    for (int i = 0; i < iters; i += U) {
      uint4 w[U][ROWS];
      uint2 hb[U][ROWS];
      float sc[U][ROWS];
      load_row_chunks<FMT>(w, hb, sc, wp, sp, hp, i, iters);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (i + u < iters) {
#pragma unroll
          for (int m = 0; m < M; ++m) {
            if constexpr (W8) {
              const int J = jw8 + 16 * (i + u);
              const uint4* xq = xw8 + (size_t)m * xrow4 + ((J >> 5) << 7) + (J & 31);
              const uint4 s0 = __ldg(xq), s1 = __ldg(xq + 32);
#pragma unroll
              for (int r = 0; r < ROWS; ++r) acc[r][m] += sc[u][r] * dot_w8_i16(w[u][r], s0, s1);
            } else {
              // the slot-major x of chunk j sits at (j >> 5) * 128 + (j & 31) uint4; xp[c * 32] is slot c
              const uint4* xp = xp0 + (size_t)m * xrow4 + 128 * u;
              uint4 xv[4];
#pragma unroll
              for (int c = 0; c < 4; ++c) xv[c] = __ldg(xp + 32 * c);
#pragma unroll
              for (int r = 0; r < ROWS; ++r)
                if constexpr (XS) {
                  const float xs = __ldg(sxsc + js + lane + 32 * (i + u));
                  acc[r][m] += (sc[u][r] * xs) * dot_core<FMT>(w[u][r], hb[u][r], [&](int c) { return xv[c]; }, 0);
                } else {
                  acc[r][m] += sc[u][r] * dot_core<FMT>(w[u][r], hb[u][r], [&](int c) { return xv[c]; }, 0);
                }
            }
          }
        }
      }
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        wp[r] += 32 * U;
        sp[r] += 16 * U;
        hp[r] += 16 * F::HB * U;
      }
      xp0 += 128 * U;
    }
    wrote = fmaxf(wrote, gemv_store<ROWS, M, true, CONV>(acc, g, N, pair_stride, epi, inv_sc, yw, y, ldy, lane,
                                                         ConvEpi{conv_w, conv_st, conv_c, conv_base, conv_rows}));
  }
  if (sxh != nullptr) {  // (an earlier version of this tail, one dependent L2 round a pair: +11 us a layer)
    __shared__ float red[32];
    const float bmax = block_max(wrote, red);
    __threadfence();  // this thread's stores of y, before the block's ticket
    __syncthreads();
    stage_row_by_last_block(bmax, sslot, sslot + 1, gridDim.x, y, N - pair_stride, skpad,
                            reinterpret_cast<uint4*>(sxh), sxinv);
  } else if (sslot != nullptr) {  // the largest |output| only, for stage_x_amax (no max pass over the row)
    __shared__ float red[32];
    const float bmax = block_max(wrote, red);
    if (threadIdx.x == 0 && bmax > 0.f) atomicMax(sslot, __float_as_uint(bmax));
  }
}

template <int FMT, int ROWS, int M, int U, bool CONV = false, bool XS = false>
__global__ void __launch_bounds__(256, (M == 1 && U == 2) ? (ROWS == 1 ? 5 : (ROWS == 2 ? 4 : 1)) : 1)
gemv_rs_pre(GEMV_RS_PARAMS, __half2* __restrict__ sxh, float* __restrict__ sxinv, int skpad, unsigned int* __restrict__ sslot,
            const float* __restrict__ sxsc) {
  gemv_rs_pre_body<FMT, ROWS, M, U, CONV, XS>(GEMV_RS_ARGS_P(), sxh, sxinv, skpad, sslot, sxsc, blockIdx.x, gridDim.x);
}

// Two one-token GEMVs on the same staged x in one grid (gemv_plan.pair_launch, the plan's gemv_pair): blocks [0, blocks_a) run
// gemv_rs_pre<FA, RA, 1, 2, CONV>'s body over matrix a (its arguments prefixed a_), the rest that of <FB, RB> over b,
// each looping over its rows with its own block count, so each row is computed exactly as its own launch computes it
// (the same bits). Two launches on two branches of the graph ran one after the other on the H200 (each fills the GPU;
// the second's ramp waits for the first's tail); here both matrices stream at once. MINB: blocks an SM.
template <int FA, int RA, int FB, int RB, bool CONV, int MINB>
__global__ void __launch_bounds__(256, MINB) gemv_rs_pre_pair(GEMV_RS_PARAMS_P(a_), GEMV_RS_PARAMS_P(b_), int blocks_a) {
  if ((int)blockIdx.x < blocks_a)
    gemv_rs_pre_body<FA, RA, 1, 2, CONV, false, true>(GEMV_RS_ARGS_P(a_), nullptr, nullptr, 0, nullptr, nullptr,
                                                       blockIdx.x, blocks_a);
  else
    gemv_rs_pre_body<FB, RB, 1, 2, CONV, false, true>(GEMV_RS_ARGS_P(b_), nullptr, nullptr, 0, nullptr, nullptr,
                                                       blockIdx.x - blocks_a, gridDim.x - blocks_a);
}


