// Multi-column GEMV on the tensor cores: y[m][n] = sum_k W[n][k] x[m][k] for M = 2..8 token columns (the K + 1
// verified columns of speculative decoding), reading each weight once for all columns.
//
// Why: the register GEMVs (gemv.cu) spend 16 dp2a a 16-byte chunk a column, so at four columns they are bound by
// the integer pipe, not by memory. Here a warp decodes a tile of 16 rows x one quantization group into signed bytes
// (the dp2a decoders' byte form, gemv_decode.cu: F x code), and one int8 MMA (m16n8k32) multiplies 32 of its values
// by all 8 columns at once. x is the same int16 pairs the other GEMVs read (pre-staged by the producer or staged
// here), split into a signed high byte and an unsigned low byte (x = 256 hi + lo): two MMAs a step, whose int32 sums
// combine exactly. A group's int32 sum times its scale is accumulated in fp32 (the order differs from gemv_rs's
// lane-strided one; the integer part is exact).
//
// Fragments (m16n8k32, row.col): lane = 4 g + t holds A rows g and g + 8 at MMA k 4t..4t+3 (a0, a1) and
// 16+4t..16+4t+3 (a2, a3), B column g at the same k (b0, b1), C rows g and g + 8 at columns 2t, 2t+1. The MMA's k is
// any permutation of the group's values that A and B share: lane t loads bytes 8t..8t+7 of the group's codes (two
// 32-bit words of 8 codes each; w8: of 4, the 8 codes one step), a step s takes word s; a0/a1 are the even codes of
// that word (rows g, g + 8), a2/a3 the odd ones, and b0/b1 the matching staged pairs (x0, x2, x4, x6) and
// (x1, x3, x5, x7) of that word's slot.
//
// A block: 8 warps over one K slice (grid.y, as gemv_rs: EPI_PARTIAL planes), looping over turns of 8 / wt tiles of
// 16 rows (SwiGLU: 8 gate rows and their 8 up rows a tile); a tile's wt warps take every wt-th run of GU groups of
// the slice, each with the next run's loads in flight while it multiplies the current one (the loop is bound by the
// latency of its loads, not by the MMAs), then the wt warps' sums meet in shared memory (a fixed order) for the
// epilogue. wt (1, 2, 4 or 8) is chosen by the launcher: few warps a tile where there are many tiles.
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

// One row's share of a group for lane t: its two words of codes, their high bits (q5: the 16 bits of the two words,
// q6: their 32), the group's scale.
template <int FMT>
__device__ __forceinline__ void tc_load(const unsigned char* __restrict__ base, const unsigned char* __restrict__ high,
                                        const __half* __restrict__ scales, int gpr, size_t row, int G, int t, uint2& q,
                                        unsigned& h, float& sc) {
  const size_t rg = row * gpr + G;
  q = ldw(reinterpret_cast<const uint2*>(base + rg * 32 + 8 * t));
  sc = __half2float(scales[rg]);
  if constexpr (FMT == FMT_Q5) {
    h = __ldg(reinterpret_cast<const unsigned short*>(high + rg * 8 + (t >> 1) * 4 + (t & 1) * 2));
  } else if constexpr (FMT == FMT_Q6) {
    h = ldw(reinterpret_cast<const unsigned int*>(high + rg * 16 + (t >> 1) * 8 + (t & 1) * 4));
  } else {
    h = 0u;
  }
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

// A lane's loads of one run of GU groups: both rows of the tile, codes, high bits, scales.
template <int FMT, int GU>
struct TcRun {
  uint2 q[GU][2];
  unsigned h[GU][2];
  float sc[GU][2];
};

template <int FMT, int M, int GU>
__global__ void __launch_bounds__(256) gemv_tc(GEMV_RS_PARAMS, int wt) {
  static_assert(M >= 1 && M <= 8, "up to 8 columns (one MMA n-tile)");
  constexpr bool W8 = FMT == FMT_W8;
  constexpr int GV = W8 ? 32 : 64;           // values a group
  constexpr int STEPS = W8 ? 1 : 2;          // MMAs (k = 32) a group, a plane
  constexpr float INV = FMT == FMT_Q4 ? 1.f / 16 : (FMT == FMT_Q5 ? 1.f / 8 : (FMT == FMT_Q6 ? 1.f / 4 : 1.f));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int per_turn = 8 / wt, sub = warp / wt, kw = warp % wt;  // tiles a turn, this warp's tile and K share
  const int u4_per_row = gpr * 2;
  const int js = blockIdx.y * u4_per_split, je = min(js + u4_per_split, u4_per_row);
  const int gs = js >> 1, ge = (je + 1) >> 1;  // the slice's groups
  const bool swiglu = epi == EPI_SWIGLU;
  const int outs = swiglu ? N - pair_stride : N;
  const int rows_tile = swiglu ? 8 : 16;
  const int ntiles = (outs + rows_tile - 1) / rows_tile;
  NI_PDL_ENTRY();

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const bool pre = xinv != nullptr;
  const int xc0 = gs * GV / 32, xc1 = ge * GV / 32;  // the slice's 32-value x chunks
  const int nloc_pad = (xc1 - xc0 + 31) & ~31;
  float* red = reinterpret_cast<float*>(smem_raw + (pre ? 0 : (size_t)M * nloc_pad * 64));
  __shared__ float inv_sc[8];  // a column's inverse staging scale
  if (pre) {
    if (threadIdx.x < M) inv_sc[threadIdx.x] = xinv[threadIdx.x];
  } else {  // stage x[m][xc0*32 : xc1*32) as gemv_rs stages q4-q6 (slot-major blocks of 32 chunks, int16 pairs)
    unsigned int* xs = reinterpret_cast<unsigned int*>(smem_raw);
#pragma unroll 1
    for (int m = 0; m < M; ++m) {
      const float* xm = x + (size_t)m * ldx;
      const int k0 = xc0 * 32, k1 = min(xc1 * 32, K);
      float mx = 0.f;
      for (int k = k0 + threadIdx.x; k < k1; k += blockDim.x) mx = fmaxf(mx, fabsf(xm[k]));
      const float sc = pow2_scale(block_max(mx, red));
      if (threadIdx.x == 0) inv_sc[m] = 1.f / sc;
      for (int p = threadIdx.x; p < (xc1 - xc0) * 16; p += blockDim.x) {
        const int jl = p >> 4, c = (p >> 2) & 3, jp = p & 3;
        const int ka = (xc0 + jl) * 32 + 8 * c + stage_a(jp), kb = ka + STAGE_GAP;
        const float a = ka < K ? xm[ka] * sc : 0.f, b = kb < K ? xm[kb] * sc : 0.f;
        xs[m * nloc_pad * 16 + (jl >> 5) * 512 + c * 128 + (jl & 31) * 4 + jp] = stage_pack(a, b);
      }
    }
  }
  __syncthreads();
  // x pairs of column g (the B fragment's column): uint4 xb[(jx >> 5) * 128 + slot * 32 + (jx & 31)], jx its chunk
  const uint4* xb = pre ? reinterpret_cast<const uint4*>(x) : reinterpret_cast<const uint4*>(smem_raw);
  const int xrow4 = pre ? ((gpr * GV / 32 + 31) & ~31) * 4 : nloc_pad * 4;
  const int xoff = pre ? 0 : xc0;
  const bool col_live = g < M;
  xb += (size_t)(col_live ? g : 0) * xrow4;

  auto load = [&](TcRun<FMT, GU>& b, size_t r0, size_t r1, int G0) {
#pragma unroll
    for (int u = 0; u < GU; ++u) {
      if (G0 + u < ge) {
        tc_load<FMT>(base, high, scales, gpr, r0, G0 + u, t, b.q[u][0], b.h[u][0], b.sc[u][0]);
        tc_load<FMT>(base, high, scales, gpr, r1, G0 + u, t, b.q[u][1], b.h[u][1], b.sc[u][1]);
      }
    }
  };
  const int turns = (ntiles + per_turn - 1) / per_turn;
  for (int turn = blockIdx.x; turn < turns; turn += gridDim.x) {
    const int tile = turn * per_turn + sub;
    // this lane's A rows (g, g + 8), clamped (duplicates are computed, never stored)
    const int o = min(tile * rows_tile + g, outs - 1);
    const size_t r0 = swiglu ? o : min(o, N - 1), r1 = swiglu ? o + pair_stride : min(o + 8, N - 1);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    TcRun<FMT, GU> cur, nxt;
    int G0 = gs + kw * GU;
    if (G0 < ge) load(cur, r0, r1, G0);
    for (; G0 < ge; G0 += wt * GU) {
      if (G0 + wt * GU < ge) load(nxt, r0, r1, G0 + wt * GU);
#pragma unroll
      for (int u = 0; u < GU; ++u) {
        const int G = G0 + u;
        if (G >= ge) break;
        int chi[4] = {0, 0, 0, 0}, clo[4] = {0, 0, 0, 0};
#pragma unroll
        for (int s = 0; s < STEPS; ++s) {
          // this lane's slot of x: chunk G * GV / 32 + (q4-q6: t >> 1), slot (q4-q6: 2 (t & 1) + s; w8: t)
          const int jx = G * GV / 32 + (W8 ? 0 : t >> 1) - xoff, slot = W8 ? t : 2 * (t & 1) + s;
          uint4 xv = make_uint4(0u, 0u, 0u, 0u);
          if (col_live) xv = xb[(jx >> 5) * 128 + slot * 32 + (jx & 31)];
          const unsigned b0h = __byte_perm(xv.x, xv.y, 0x7531), b0l = __byte_perm(xv.x, xv.y, 0x6420);
          const unsigned b1h = __byte_perm(xv.z, xv.w, 0x7531), b1l = __byte_perm(xv.z, xv.w, 0x6420);
          unsigned e0, o0, e1, o1;
          tc_bytes<FMT>(cur.q[u][0], cur.h[u][0], s, e0, o0);
          tc_bytes<FMT>(cur.q[u][1], cur.h[u][1], s, e1, o1);
          imma<false>(chi, e0, e1, o0, o1, b0h, b1h);
          imma<true>(clo, e0, e1, o0, o1, b0l, b1l);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i] = fmaf(cur.sc[u][i >> 1], (float)(chi[i] * 256 + clo[i]) * INV, acc[i]);
      }
      cur = nxt;
    }

    // the tile's wt warps: red[warp][row 0..15][column 0..7], then a thread an output adds them in order
#pragma unroll
    for (int i = 0; i < 4; ++i) red[(warp * 16 + g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = acc[i];
    __syncthreads();
    for (int idx = threadIdx.x; idx < per_turn * (swiglu ? 64 : 128); idx += blockDim.x) {
      const int st = swiglu ? idx >> 6 : idx >> 7, r = (idx >> 3) & (swiglu ? 7 : 15), m = idx & 7;
      const int oo = (turn * per_turn + st) * rows_tile + r;
      if (m >= M || oo >= outs) continue;
      auto total = [&](int rr) {
        float v = 0.f;
        for (int w = st * wt; w < (st + 1) * wt; ++w) v += red[(w * 16 + rr) * 8 + m];
        return v * inv_sc[m];
      };
      if (swiglu) {
        y[(size_t)m * ldy + oo] = silu(total(r)) * total(r + 8);
      } else {
        const float v = total(r);
        if (epi == EPI_STORE) y[(size_t)m * ldy + oo] = v;
        else if (epi == EPI_ADD) y[(size_t)m * ldy + oo] += v;
        else y[((size_t)blockIdx.y * M + m) * ldy + oo] = v;
      }
    }
    __syncthreads();
  }
}
