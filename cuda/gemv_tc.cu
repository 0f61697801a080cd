// Multi-column GEMV on the tensor cores: y[m][n] = sum_k W[n][k] x[m][k] for M = 2..8 token columns (the K + 1
// verified columns of speculative decoding), reading each weight once for all columns.
//
// Why: the register GEMVs (gemv.cu) spend 16 dp2a a 16-byte chunk a column, so at four columns they are bound by
// the integer pipe, not by memory. Here a warp decodes a tile of 16 rows x one quantization group into signed bytes
// (the dp2a decoders' byte form, gemv_decode.cu: F x code), and one int8 MMA (m16n8k32) multiplies 32 of its values
// by all 8 columns at once. x is the same int16 pairs the other GEMVs read (pre-staged by the producer or staged
// here), split into a signed high byte and an unsigned low byte (x = 256 hi + lo): two MMAs a step, whose int32 sums
// combine exactly. A group's int32 sum times its scale is accumulated in fp32 (the order differs from gemv_rs's
// lane-strided one; the integer part is exact). Up to 4 columns of q4-q6 read x from its packed twin instead
// (PK, tc_run_pk): the producer has split it into signed high and low bytes, so one MMA a step takes both, the
// high ones in B columns 0-3 and the low ones in 4-7.
//
// Fragments (m16n8k32, row.col): lane = 4 g + t holds A rows g and g + 8 at MMA k 4t..4t+3 (a0, a1) and
// 16+4t..16+4t+3 (a2, a3), B column g at the same k (b0, b1), C rows g and g + 8 at columns 2t, 2t+1. The MMA's k is
// any permutation of the group's values that A and B share: lane t loads bytes 8t..8t+7 of the group's codes (two
// 32-bit words of 8 codes each; w8: of 4, the 8 codes one step), a step s takes word s; a0/a1 are the even codes of
// that word (rows g, g + 8), a2/a3 the odd ones, and b0/b1 the matching staged pairs (x0, x2, x4, x6) and
// (x1, x3, x5, x7) of that word's slot.
//
// gemv_tc<FMT, M, GU, S, PK>: GU groups a run, S stages a warp's ring (see the kernel), PK: x from the packed twin.
#include "common.cuh"

template <bool U8>
__device__ __forceinline__ void imma(int (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                     unsigned b1) {
#if NI_PRE_SM80
  __trap();
#else
  if constexpr (U8) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
#endif
}

// Word s (0, 1) of a lane's loaded codes as signed bytes F x code: even codes in e, odd in o.
template <int FMT>
__device__ __forceinline__ void tc_bytes(uint2 q, unsigned h, int s, unsigned& e, unsigned& o) {
  if constexpr (FMT == FMT_W8) {  // plain int8 codes, 4 a word: the lane's 8 codes are one step
    e = __byte_perm(q.x, q.y, 0x6420);
    o = __byte_perm(q.x, q.y, 0x7531);
  } else {
    code_bytes<FMT>(s == 0 ? q.x : q.y, make_uint2(h, 0u), s, e, o);
  }
}

// A stage of a warp's ring: one run of GU groups of a tile of R = 16 rows, as cp.async left it. Codes: row r's
// GU * 32 bytes at r * GU * 32, its group u at slot u ^ tc_swz(r) (so that the fragment reads below, 8 bytes a lane, a
// half-warp reading one group of 4 rows, meet every bank once); then the high bits (row-major, GU * HB bytes a row)
// and the scales (GU halves a row).
template <int FMT, int GU>
struct TcStage {
  static constexpr int R = 16;
  static constexpr int HB = FMT == FMT_Q5 ? 8 : (FMT == FMT_Q6 ? 16 : 0);  // high-bit bytes a group
  static constexpr int CODES = R * GU * 32, HIGH = R * GU * HB, SCALES = R * GU * 2;
  static constexpr int BYTES = CODES + HIGH + SCALES;
  static_assert(GU == 2 || GU == 4, "runs of 2 or 4 groups");
};
template <int GU>
__device__ __forceinline__ int tc_swz(int r) {
  return (r * GU / 4) & (GU - 1);
}

// A lane's copies of a run into its warp's stage: fixed pieces of the R x GU tile (the same for every run), each a
// row of the tile, a byte offset in the stage and its first group in the run; the source offsets (bytes from the
// plane's start, 32-bit: planes under 4 GiB) move on by a constant a run. Codes: 16-byte chunks, CV a lane, chunk v
// of row lane / (2 GU) + v 16 / GU at cdst + 512 v (the swizzle depends on the row only through lane / 8, the same
// for every v), group cg of the run; high bits: 16-byte chunks (q5: two groups each, q6: one); scales: 4-byte pairs.
// A piece whose group is past the slice's end is not copied (never read); one that covers two groups starts at an
// even group (the launcher's slices), so it stays inside its row. Stage addresses are shared-window offsets (what
// cp.async takes), so a copy is an add and the instruction.
template <int FMT, int GU>
struct TcCopy {
  using S = TcStage<FMT, GU>;
  static constexpr int R = S::R;
  static constexpr int HCPR = GU * S::HB / 16 > 0 ? GU * S::HB / 16 : 1;  // high-bit chunks a row
  static constexpr int HV = S::HB > 0 ? (R * HCPR + 31) / 32 : 0;          // high-bit chunks a lane
  static constexpr int SV = (R * GU / 2 + 31) / 32;                         // scale pairs a lane
  static constexpr int CV = R * 2 * GU / 32;                                // code chunks a lane
  static_assert(CV * 32 == R * 2 * GU, "whole code chunks a lane");
  unsigned co[CV], ho[HV > 0 ? HV : 1], so[SV];
  unsigned cdst;
  int crow0, cg;
  short hdst[HV > 0 ? HV : 1], sdst[SV];
  signed char hrow[HV > 0 ? HV : 1], hg[HV > 0 ? HV : 1], srow[SV], sg[SV];

  __device__ __forceinline__ void init(int lane) {
    const int r = lane / (2 * GU), c = lane % (2 * GU);
    crow0 = r;
    cg = c >> 1;
    cdst = r * GU * 32 + (((c >> 1) ^ tc_swz<GU>(r)) << 5) + (c & 1) * 16;
    asm volatile("" : "+r"(cdst));
#pragma unroll
    for (int v = 0; v < HV; ++v) {
      const int q = lane + 32 * v, hr = q / HCPR, hc = q % HCPR;
      hrow[v] = hr < R ? hr : -1;
      hg[v] = hc * (S::HB > 0 ? 16 / S::HB : 1);
      hdst[v] = S::CODES + q * 16;
    }
#pragma unroll
    for (int v = 0; v < SV; ++v) {
      const int q = lane + 32 * v;
      srow[v] = q < R * GU / 2 ? q / (GU / 2) : -1;
      sg[v] = 2 * (q % (GU / 2));
      sdst[v] = S::CODES + S::HIGH + q * 4;
    }
  }
  // the offsets of a tile's run whose first group is G0 (rows(r): the plane row of tile row r)
  template <typename Rows>
  __device__ __forceinline__ void at(int gpr, int G0, Rows rows) {
#pragma unroll
    for (int v = 0; v < CV; ++v) co[v] = ((unsigned)rows(crow0 + v * (16 / GU)) * gpr + G0 + cg) * 32u + (cdst & 16);
#pragma unroll
    for (int v = 0; v < HV; ++v) ho[v] = ((unsigned)rows(max((int)hrow[v], 0)) * gpr + G0 + hg[v]) * S::HB;
#pragma unroll
    for (int v = 0; v < SV; ++v) so[v] = ((unsigned)rows(max((int)srow[v], 0)) * gpr + G0 + sg[v]) * 2u;
  }
  // the run whose first group is G (of the slice ending at ge) into the stage at shared offset st, then the offsets
  // on by `step` groups
  __device__ __forceinline__ void copy(unsigned st, const unsigned char* __restrict__ base,
                                       const unsigned char* __restrict__ high, const __half* __restrict__ scales,
                                       int G, int ge, int step) {
    const bool live = G + cg < ge;
#pragma unroll
    for (int v = 0; v < CV; ++v) {
      if (live) ni_cp16(st + cdst + 512 * v, base + co[v]);
      co[v] += step * 32;
    }
#pragma unroll
    for (int v = 0; v < HV; ++v) {
      if (hrow[v] >= 0 && G + hg[v] < ge) ni_cp16(st + hdst[v], high + ho[v]);
      ho[v] += step * S::HB;
    }
#pragma unroll
    for (int v = 0; v < SV; ++v) {
      if (srow[v] >= 0 && G + sg[v] < ge) ni_cp4(st + sdst[v], reinterpret_cast<const unsigned char*>(scales) + so[v]);
      so[v] += step * 2;
    }
  }
};

// A lane's offsets in a stage (its A rows g and g + 8: + 8 GU 32 codes, + 8 GU HB high bits, + 16 GU scales): the
// code words of group u, its high bits' first group, its row's scales.
template <int FMT, int GU>
struct TcLane {
  using S = TcStage<FMT, GU>;
  unsigned code[GU], high, scale;
  __device__ __forceinline__ void init(int g, int t) {
#pragma unroll
    for (int u = 0; u < GU; ++u) code[u] = g * GU * 32 + ((u ^ tc_swz<GU>(g)) << 5) + 8 * t;
    high = S::CODES + g * GU * S::HB + (FMT == FMT_Q5 ? 2 * t : 4 * t);
    scale = S::CODES + S::HIGH + g * GU * 2;
  }
};

// Group u of a stage for a lane's A rows g (q0, h0) and g + 8 (q1, h1): the two code words and the high bits (q5: 16
// bits, q6: 32); the same values the fragment layout above names.
template <int FMT, int GU>
__device__ __forceinline__ void tc_read(const unsigned char* st, const TcLane<FMT, GU>& ln, int u, uint2& q0,
                                        uint2& q1, unsigned& h0, unsigned& h1) {
  using S = TcStage<FMT, GU>;
  q0 = *reinterpret_cast<const uint2*>(st + ln.code[u]);
  q1 = *reinterpret_cast<const uint2*>(st + ln.code[u] + 8 * GU * 32);
  const unsigned char* hs = st + ln.high + u * S::HB;
  if constexpr (FMT == FMT_Q5) {
    h0 = *reinterpret_cast<const unsigned short*>(hs);
    h1 = *reinterpret_cast<const unsigned short*>(hs + 8 * GU * S::HB);
  } else if constexpr (FMT == FMT_Q6) {
    h0 = *reinterpret_cast<const unsigned int*>(hs);
    h1 = *reinterpret_cast<const unsigned int*>(hs + 8 * GU * S::HB);
  } else {
    h0 = h1 = 0u;
  }
}

// A row's GU scales of a stage (p: its first), as floats.
template <int GU>
__device__ __forceinline__ void tc_scales(const unsigned char* p, float (&sc)[GU]) {
  const __half2* h = reinterpret_cast<const __half2*>(p);
#pragma unroll
  for (int u = 0; u < GU; u += 2) {
    const float2 f = __half22float2(h[u / 2]);
    sc[u] = f.x;
    sc[u + 1] = f.y;
  }
}

// The MMAs of one run (stage st) for a lane's A rows g, g + 8 and B column g, into its accumulators (C rows g, g + 8
// at columns 2t, 2t + 1). xr: the lane's x pairs of the run's first group (see the kernel); group u's step s at
// xr[u * 2 + s * 32] (w8: xr[u]); col_live: the lane's column g is below M.
// FULL: every group of the run is below the slice's end, else the first `live` are.
template <int FMT, int GU, bool FULL>
__device__ __forceinline__ void tc_run(const unsigned char* st, const TcLane<FMT, GU>& ln, int live, bool col_live,
                                       const uint4* xr, float (&acc)[4]) {
  constexpr bool W8 = FMT == FMT_W8;
  constexpr int STEPS = W8 ? 1 : 2;  // MMAs (k = 32) a group, a plane
  // the lanes of columns past M load nothing (their sums are never stored; a warp's loads take half the L1
  // wavefronts at 4 columns), except in q6, where the predicate's registers spill at 80: there they read column 0
  uint4 xv[GU][STEPS];
  if (FMT == FMT_Q6 || col_live)
#pragma unroll
    for (int u = 0; u < GU; ++u)
#pragma unroll
      for (int s = 0; s < STEPS; ++s) xv[u][s] = xr[u * (W8 ? 1 : 2) + s * 32];
  float s0[GU], s1[GU];
  tc_scales<GU>(st + ln.scale, s0);
  tc_scales<GU>(st + ln.scale + 16 * GU, s1);
#pragma unroll
  for (int u = 0; u < GU; ++u) {
    if (!FULL && u >= live) break;
    uint2 q0, q1;
    unsigned h0, h1;
    tc_read<FMT, GU>(st, ln, u, q0, q1, h0, h1);
    int chi[4] = {0, 0, 0, 0}, clo[4] = {0, 0, 0, 0};
#pragma unroll
    for (int s = 0; s < STEPS; ++s) {
      const uint4 x = xv[u][s];
      const unsigned b0h = __byte_perm(x.x, x.y, 0x7531), b0l = __byte_perm(x.x, x.y, 0x6420);
      const unsigned b1h = __byte_perm(x.z, x.w, 0x7531), b1l = __byte_perm(x.z, x.w, 0x6420);
      unsigned e0, o0, e1, o1;
      tc_bytes<FMT>(q0, h0, s, e0, o0);
      tc_bytes<FMT>(q1, h1, s, e1, o1);
      imma<false>(chi, e0, e1, o0, o1, b0h, b1h);
      imma<true>(clo, e0, e1, o0, o1, b0l, b1l);
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[c] = fmaf(c < 2 ? s0[u] : s1[u], (float)(chi[c] * 256 + clo[c]), acc[c]);
  }
}

// The MMAs of one run with x read from the packed twin (PK; q4-q6, up to 4 columns): one MMA a step, B columns 0-3
// the columns' high bytes, 4-7 their low bytes, both signed (common.cuh pk_word); xr: the lane's 16 bytes of the run's
// first group (a group's 32 lanes 512 bytes apart). C's columns 2t, 2t + 1 are then high sums (t < 2) or low ones
// (t >= 2), each added into acc times its row's scale; the epilogue takes 256 x high + low. Against tc_run: no split
// of x in the warp (8 PRMT a group), half the MMAs, half the x registers.
template <int FMT, int GU, bool FULL>
__device__ __forceinline__ void tc_run_pk(const unsigned char* st, const TcLane<FMT, GU>& ln, int live,
                                          const unsigned char* xr, float (&acc)[4]) {
  static_assert(FMT != FMT_W8, "the twin holds 64-value groups");
  uint4 xv[GU];
#pragma unroll
  for (int u = 0; u < GU; ++u) xv[u] = reinterpret_cast<const uint4*>(xr)[u * 32];
  float s0[GU], s1[GU];
  tc_scales<GU>(st + ln.scale, s0);
  tc_scales<GU>(st + ln.scale + 16 * GU, s1);
#pragma unroll
  for (int u = 0; u < GU; ++u) {
    if (!FULL && u >= live) break;
    uint2 q0, q1;
    unsigned h0, h1, e0, o0, e1, o1;
    tc_read<FMT, GU>(st, ln, u, q0, q1, h0, h1);
    int c4[4] = {0, 0, 0, 0};
    tc_bytes<FMT>(q0, h0, 0, e0, o0);
    tc_bytes<FMT>(q1, h1, 0, e1, o1);
    imma<false>(c4, e0, e1, o0, o1, xv[u].x, xv[u].y);
    tc_bytes<FMT>(q0, h0, 1, e0, o0);
    tc_bytes<FMT>(q1, h1, 1, e1, o1);
    imma<false>(c4, e0, e1, o0, o1, xv[u].z, xv[u].w);
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[c] = fmaf(c < 2 ? s0[u] : s1[u], (float)c4[c], acc[c]);
  }
}

// A block: 8 warps over one K slice (grid.y, EPI_PARTIAL planes), looping over turns of 8 / wt tiles of 16 rows
// (SwiGLU: 8 gate rows and their 8 up rows); a tile's wt warps take every wt-th run of GU groups of the slice. Each warp streams its runs, turn after turn, through its own ring of S stages in shared memory (cp.async: S - 1
// runs in flight while it multiplies one, across the turns' boundaries; the first S - 1 before the PDL wait), then the
// wt warps' sums meet in shared memory (a fixed order) for the epilogue. amax (SwiGLU, or nullptr): 2 uint32 words a
// column, the first of which each block folds the largest |output| it wrote of that column into (atomicMax on the bits;
// stage_x_amax stages the rows from it and resets them).
template <int FMT, int M, int GU, int S, bool PK = false>
// (4 blocks an SM, 64 registers; 3 and 80 for runs of 4 groups, which spill at 64)
__global__ void __launch_bounds__(256, GU > 2 ? 3 : 4) gemv_tc(GEMV_RS_PARAMS, int wt, unsigned int* __restrict__ amax) {
  static_assert(M >= 1 && M <= 8, "up to 8 columns (one MMA n-tile)");
  static_assert(S >= 2, "a ring of at least two stages");
  static_assert(!PK || (M <= 4 && FMT != FMT_W8), "the packed twin: up to 4 columns, q4-q6");
  using ST = TcStage<FMT, GU>;
  constexpr bool W8 = FMT == FMT_W8;
  constexpr int GV = W8 ? 32 : 64;           // values a group
  constexpr float INV = FMT == FMT_Q4 ? 1.f / 16 : (FMT == FMT_Q5 ? 1.f / 8 : (FMT == FMT_Q6 ? 1.f / 4 : 1.f));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int per_turn = 8 / wt, sub = warp / wt, kw = warp % wt;  // tiles a turn, this warp's tile and K share
  const int u4_per_row = gpr * 2;
  const int js = blockIdx.y * u4_per_split, je = min(js + u4_per_split, u4_per_row);
  const int gs = js >> 1, ge = (je + 1) >> 1;  // the slice's groups
  const bool swiglu = epi == EPI_SWIGLU;
  const int outs = swiglu ? N - pair_stride : N;
  const int rows_tile = swiglu ? 8 : 16;  // outputs a tile
  const int ntiles = (outs + rows_tile - 1) / rows_tile;
  const int turns = (ntiles + per_turn - 1) / per_turn;
  const int my_turns = (int)blockIdx.x < turns ? (turns - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
  const int g_first = gs + kw * GU, g_step = wt * GU;  // this warp's first group of a turn, groups between its runs
  const int nruns = g_first < ge ? (ge - g_first + g_step - 1) / g_step : 0;  // its runs a turn

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const bool pre = xinv != nullptr;
  const int xc0 = gs * GV / 32, xc1 = ge * GV / 32;  // the slice's 32-value x chunks
  const int nloc_pad = (xc1 - xc0 + 31) & ~31;
  unsigned char* after_x = smem_raw + (pre ? 0 : (size_t)M * nloc_pad * 64);
  float* red = reinterpret_cast<float*>(after_x);  // [warp][row of the tile][column]
  unsigned char* ring = after_x + 8 * 16 * 8 * 4 + (size_t)warp * S * ST::BYTES;
  unsigned ring_s = (unsigned)__cvta_generic_to_shared(ring);  // (its shared-window offset, for cp.async)
  asm volatile("" : "+r"(ring_s));

  // row r (0..15) of a tile: the rows lane g = r & 7 multiplies as A rows g (r < 8) and g + 8: output o and o + 8
  // (SwiGLU: o's up row), clamped (duplicates are computed, never stored)
  auto tile_rows = [&](int bt) {
    const int tile = ((int)blockIdx.x + bt * (int)gridDim.x) * per_turn + sub;
    return [=](int r) -> int {
      const int o = min(tile * rows_tile + (r & 7), outs - 1);
      return swiglu ? o + (r & 8 ? pair_stride : 0) : min(o + (r & 8), N - 1);
    };
  };
  // the producer: the warp's runs in order, turn after turn, one stage each (weights depend on no kernel)
  TcCopy<FMT, GU> cpy;
  cpy.init(lane);
  int p_bt = 0, p_left = nruns, p_G = g_first, p_slot = 0;
  if (nruns > 0 && my_turns > 0) cpy.at(gpr, g_first, tile_rows(0));
  auto issue = [&]() {
    if (nruns > 0 && p_bt < my_turns) {
      cpy.copy(ring_s + p_slot * ST::BYTES, base, high, scales, p_G, ge, g_step);
      p_G += g_step;
      if (--p_left == 0) {
        p_left = nruns;
        p_G = g_first;
        if (++p_bt < my_turns) cpy.at(gpr, g_first, tile_rows(p_bt));
      }
    }
    ni_cp_commit();
    p_slot = p_slot + 1 == S ? 0 : p_slot + 1;
  };
#pragma unroll
  for (int i = 0; i < S - 1; ++i) issue();
  NI_PDL_ENTRY();

  __shared__ float inv_sc[8];  // a column's inverse staging scale, times the codes' factor
  __shared__ unsigned int bmax[8];  // (SwiGLU with amax: the block's largest |output| a column, as float bits)
  if (threadIdx.x < 8) bmax[threadIdx.x] = 0u;
  if (pre) {
    if (threadIdx.x < M) inv_sc[threadIdx.x] = xinv[threadIdx.x] * INV;
  } else {  // stage x[m][xc0*32 : xc1*32) as gemv_rs stages q4-q6 (slot-major blocks of 32 chunks, int16 pairs)
    unsigned int* xs = reinterpret_cast<unsigned int*>(smem_raw);
#pragma unroll 1
    for (int m = 0; m < M; ++m) {
      const float* xm = x + (size_t)m * ldx;
      const int k0 = xc0 * 32, k1 = min(xc1 * 32, K);
      float mx = 0.f;
      for (int k = k0 + threadIdx.x; k < k1; k += blockDim.x) mx = fmaxf(mx, fabsf(xm[k]));
      const float sc = pow2_scale(block_max(mx, red));
      if (threadIdx.x == 0) inv_sc[m] = INV / sc;
      for (int p = threadIdx.x; p < (xc1 - xc0) * 16; p += blockDim.x) {
        const int jl = p >> 4, c = (p >> 2) & 3, jp = p & 3;
        const int ka = (xc0 + jl) * 32 + 8 * c + stage_a(jp), kb = ka + STAGE_GAP;
        const float a = ka < K ? xm[ka] * sc : 0.f, b = kb < K ? xm[kb] * sc : 0.f;
        xs[m * nloc_pad * 16 + (jl >> 5) * 512 + c * 128 + (jl & 31) * 4 + jp] = stage_pack(a, b);
      }
    }
  }
  __syncthreads();
  // x pairs of column g (the B fragment's column, see tc_run)
  const uint4* xb = pre ? reinterpret_cast<const uint4*>(x) : reinterpret_cast<const uint4*>(smem_raw);
  const int xrow4 = pre ? ((gpr * GV / 32 + 31) & ~31) * 4 : nloc_pad * 4;
  const int xoff = pre ? 0 : xc0;
  // this lane's: column g, slot 2 (t & 1) (w8: t) of chunk 2 G + (t >> 1) (w8: G) less xoff
  const bool col_live = g < M;
  xb += (size_t)(col_live ? g : 0) * xrow4 + (W8 ? t : 2 * (t & 1)) * 32;
  TcLane<FMT, GU> ln;
  ln.init(g, t);

  int c_slot = 0;
  for (int bt = 0; bt < my_turns; ++bt) {
    const int turn = (int)blockIdx.x + bt * (int)gridDim.x;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int G0 = g_first; G0 < ge; G0 += g_step) {
      ni_cp_wait<S - 2>();  // (this run's copies: every group but the S - 2 committed after it)
      __syncwarp();
      issue();  // (into the stage of the run before, which every lane has finished)
      const unsigned char* st = ring + c_slot * ST::BYTES;
      c_slot = c_slot + 1 == S ? 0 : c_slot + 1;
      // (a whole run without a bound check, so that its groups' loads and MMAs interleave; the slice's last run
      // checks each group)
      const unsigned jx = (unsigned)((W8 ? G0 : 2 * G0 + (t >> 1)) - xoff);  // (a run's chunks: one block of 32)
      const uint4* xr = xb + (jx >> 5) * 128 + (jx & 31);
      if constexpr (PK) {
        const unsigned char* xp = reinterpret_cast<const unsigned char*>(x) + ((size_t)G0 * 32 + lane) * 16;
        if (G0 + GU <= ge) tc_run_pk<FMT, GU, true>(st, ln, GU, xp, acc);
        else tc_run_pk<FMT, GU, false>(st, ln, ge - G0, xp, acc);
      } else {
        if (G0 + GU <= ge) tc_run<FMT, GU, true>(st, ln, GU, col_live, xr, acc);
        else tc_run<FMT, GU, false>(st, ln, ge - G0, col_live, xr, acc);
      }
    }

    // the tile's wt warps: red[warp][tile row 0..15][column 0..7], then a thread an output adds them in order
#pragma unroll
    for (int c = 0; c < 4; ++c) red[(warp * 16 + g + 8 * (c >> 1)) * 8 + 2 * t + (c & 1)] = acc[c];
    __syncthreads();
    for (int idx = threadIdx.x; idx < per_turn * rows_tile * 8; idx += blockDim.x) {
      const int stl = idx / (rows_tile * 8), o = (idx >> 3) % rows_tile, m = idx & 7;
      const int oo = (turn * per_turn + stl) * rows_tile + o;
      if (m >= M || oo >= outs) continue;
      auto sum = [&](int rr) {
        float v = 0.f;
        for (int w = stl * wt; w < (stl + 1) * wt; ++w) v += red[(w * 16 + rr) * 8 + m];
        if constexpr (PK) {  // (the high sums in columns 0-3, the low ones in 4-7)
          float lo = 0.f;
          for (int w = stl * wt; w < (stl + 1) * wt; ++w) lo += red[(w * 16 + rr) * 8 + m + 4];
          v = fmaf(v, 256.f, lo);
        }
        return v * inv_sc[m];
      };
      if (swiglu) {  // (output o's gate row o, its up row o + 8)
        const float v = silu(sum(o)) * sum(o + 8);
        y[(size_t)m * ldy + oo] = v;
        if (amax != nullptr) atomicMax(bmax + m, __float_as_uint(fabsf(v)));
      } else {
        const float v = sum(o);
        if (epi == EPI_STORE) y[(size_t)m * ldy + oo] = v;
        else if (epi == EPI_ADD) y[(size_t)m * ldy + oo] += v;
        else y[((size_t)blockIdx.y * M + m) * ldy + oo] = v;
      }
    }
    __syncthreads();
  }
  // (the loop's last barrier is behind every thread's shared maxima; nothing stays live across the loop for them, whose
  // registers are full)
  if (swiglu && amax != nullptr && threadIdx.x < M && bmax[threadIdx.x] != 0u)
    atomicMax(amax + 2 * threadIdx.x, bmax[threadIdx.x]);
  ni_cp_wait<0>();
}
