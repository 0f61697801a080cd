// Tensor-core GEMV variant under measurement (kernels.EXPERIMENTAL, not in the tuning table; slower than
// gemv_rs on every 27B shape so far, bench/NOTES-decode.md session 4). Uses gemv.cu's DecodeK.
#include "common.cuh"
#if !NI_PRE_SM80  // (mma.sync on fp16: sm_80 here; the experimental module only)

// ---- Tensor-core decode GEMV (q4/q5, pre-staged x, 1-8 token columns) ----------------------------
//
// The register kernels spend ~80 instructions per 16-byte chunk and row (decode, offset removal,
// HFMA2 with x, fp16->fp32 flushes, address math): at 85% of the bandwidth that is more issue slots
// than an SM has (SASS count, session 4). Here the multiply-accumulate is mma.sync.m16n8k16 (fp16 in,
// fp32 accumulate): A = 16 weight rows x 16 k, B = 16 k x 8 token columns (x; columns >= M are zero,
// so 2..8 tokens cost the same as one), C = 16 rows x 8 tokens.
// * A is decoded without removing the offset: (q & 0x000f000f) ^ 0x00080008 is the fp16 pair of
//   SUBNORMALS (code + 8) * 2^-24 (exact; q5: code + 16 with the complemented high bit); odd nibbles
//   are taken in place, 16 (code + 8) 2^-24, and their x is multiplied by 1/16 once per group. The
//   offsets are removed by four more MMAs per group with a constant A (-8 * 2^-24 even, -128 * 2^-24
//   odd) whose result seeds every tile's accumulator: C = 2^-24 sum code * x, exact products in fp32.
//   One LOP3 per two codes (q4), no HSUB2, no HFMA2, no conversions.
// * A 64-code group shares one scale per row, so an MMA may only mix k of one group: each lane (row
//   group gid = lane / 4, q = lane % 4) takes bytes [8q, 8q + 8) of the group for rows gid and gid + 8
//   of a 16-row tile, i.e. words 2(q&1), 2(q&1)+1 of the group's 16-byte chunk q >> 1. The staged x
//   pairs of those words are the B fragments of the same lane (token column gid).
// * A warp handles TILES tiles of 16 rows (SwiGLU: the gate tile and its up tile) over every KW-th
//   group of its slice; the KW warps of a row unit reduce through shared memory. U groups are loaded
//   before any is decoded.
__device__ __forceinline__ void mma16816(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1, const float (&c)[4]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%10,%11,%12,%13};"
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

// The 4 value pairs of one word of codes as fp16 subnormal pairs (code + off) * 2^-24 (odd pairs x16):
// v[0] (k0, k4), v[1] (k1, k5) in place, v[2] (k2, k6), v[3] (k3, k7). hm: the word's 8 high bits (q5),
// complemented, zero above.
template <int FMT>
__device__ __forceinline__ void decode_sub(unsigned int q, unsigned int hm, const DecodeK& dk, unsigned int (&v)[4]) {
  const unsigned int q8 = q >> 8;
  if constexpr (FMT == FMT_Q4) {
    v[0] = (q & dk.lo) ^ 0x00080008u;
    v[1] = (q & dk.hi) ^ 0x00800080u;
    v[2] = (q8 & dk.lo) ^ 0x00080008u;
    v[3] = (q8 & dk.hi) ^ 0x00800080u;
  } else {
    v[0] = (q & dk.lo) | ((hm * dk.q5m.x) & 0x00100010u);
    v[1] = (q & dk.hi) | ((hm * dk.q5m.y) & 0x01000100u);
    v[2] = (q8 & dk.lo) | ((hm * dk.q5m.z) & 0x00100010u);
    v[3] = (q8 & dk.hi) | ((hm * dk.q5m.w) & 0x01000100u);
  }
}

// One 64-code group for TILES tiles: offset MMAs, decode, 4 MMAs a tile, scale into acc.
template <int FMT, int TILES>
__device__ __forceinline__ void mma_group(const uint2 (&w)[TILES][2], const unsigned int (&hb)[TILES][2],
                                          const float (&sc)[TILES][2], uint4 xa, uint4 xb, float (&acc)[TILES][4],
                                          const DecodeK& dk) {
  const unsigned int ce = FMT == FMT_Q4 ? 0x80088008u : 0x80108010u;
  const unsigned int co = FMT == FMT_Q4 ? 0x80808080u : 0x81008100u;
  const __half2 s16 = __floats2half2_rn(0.0625f, 0.0625f);
  // B fragments: (even pair, odd pair / 16) of MMA m = 0..3
  unsigned int b[4][2];
  const unsigned int xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    b[m][0] = xw[2 * m];
    const __half2 o = __hmul2(u32_as_half2(xw[2 * m + 1]), s16);
    b[m][1] = *reinterpret_cast<const unsigned int*>(&o);
  }
  float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int m = 0; m < 4; ++m) mma16816(d, ce, ce, co, co, b[m][0], b[m][1], d);
#pragma unroll
  for (int t = 0; t < TILES; ++t) {
    unsigned int v[2][2][4];  // [row half][word][pair]
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const unsigned int hm0 = FMT == FMT_Q5 ? (hb[t][h] & 0xffu) : 0u;
      const unsigned int hm1 = FMT == FMT_Q5 ? ((hb[t][h] >> 8) & 0xffu) : 0u;
      decode_sub<FMT>(w[t][h].x, hm0, dk, v[h][0]);
      decode_sub<FMT>(w[t][h].y, hm1, dk, v[h][1]);
    }
    float c[4];
    mma16816(c, v[0][0][0], v[1][0][0], v[0][0][1], v[1][0][1], b[0][0], b[0][1], d);
    mma16816(c, v[0][0][2], v[1][0][2], v[0][0][3], v[1][0][3], b[1][0], b[1][1], c);
    mma16816(c, v[0][1][0], v[1][1][0], v[0][1][1], v[1][1][1], b[2][0], b[2][1], c);
    mma16816(c, v[0][1][2], v[1][1][2], v[0][1][3], v[1][1][3], b[3][0], b[3][1], c);
    acc[t][0] += sc[t][0] * c[0];
    acc[t][1] += sc[t][0] * c[1];
    acc[t][2] += sc[t][1] * c[2];
    acc[t][3] += sc[t][1] * c[3];
  }
}

// A row unit's results: the KW warps of the unit reduce through shared memory (block-wide barriers:
// every warp of the block calls this the same number of times), the first stores.
template <int TILES, int KW>
__device__ __forceinline__ void mma_unit_store(float (&acc)[TILES][4], float (*red)[TILES][16][8], int warp, int wk,
                                               bool live, int u, int N, int pair_stride, int epi, int M,
                                               const float (&inv)[2], float* __restrict__ y, int ldy) {
  const int lane = threadIdx.x & 31, gid = lane >> 2, q = lane & 3;
  const bool swiglu = epi == EPI_SWIGLU;
  const int unit_rows = 16 * TILES;
  // lane (gid, q) holds rows gid, gid + 8 of each tile for tokens 2q, 2q + 1
  if (KW > 1) {
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
      red[warp][t][gid][2 * q] = acc[t][0];
      red[warp][t][gid][2 * q + 1] = acc[t][1];
      red[warp][t][gid + 8][2 * q] = acc[t][2];
      red[warp][t][gid + 8][2 * q + 1] = acc[t][3];
    }
    __syncthreads();
    if (wk == 0) {
#pragma unroll
      for (int t = 0; t < TILES; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float s = 0.f;
#pragma unroll
          for (int p = 0; p < KW; ++p) s += red[warp + p][t][gid + 8 * (e >> 1)][2 * q + (e & 1)];
          acc[t][e] = s;
        }
    }
    __syncthreads();
  }
  if (wk == 0 && live) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int m = 2 * q + (e & 1);
      if (m >= M) continue;
      const int rl = gid + 8 * (e >> 1);  // row within a tile
      float* ym = y + (size_t)m * ldy;
      if (swiglu) {
        const float gt = acc[0][e] * inv[e & 1], up = acc[TILES - 1][e] * inv[e & 1];
        const int row = u * 16 + rl;
        if (row < N - pair_stride) ym[row] = silu(gt) * up;
      } else {
#pragma unroll
        for (int t = 0; t < TILES; ++t) {
          const int row = u * unit_rows + t * 16 + rl;
          const float v = acc[t][e] * inv[e & 1];
          if (row < N) {
            if (epi == EPI_STORE) ym[row] = v;
            else if (epi == EPI_ADD) ym[row] += v;
            else y[((size_t)blockIdx.y * M + m) * ldy + row] = v;
          }
        }
      }
    }
  }
}

template <int FMT, int TILES, int KW, int U>
__global__ void __launch_bounds__(256) gemv_mma(
    const unsigned char* __restrict__ base, const unsigned char* __restrict__ high,
    const __half* __restrict__ scales, int N, int gpr, int pair_stride,
    const uint4* __restrict__ xs4, int M, int gps,
    float* __restrict__ y, int ldy, int epi, const float* __restrict__ xinv) {
  static_assert(FMT == FMT_Q4 || FMT == FMT_Q5, "q4/q5 only");
  constexpr int UPB = 8 / KW;  // row units per block
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gid = lane >> 2, q = lane & 3;
  const int wk = warp % KW, wu = warp / KW;
  const bool swiglu = epi == EPI_SWIGLU;
  const int unit_rows = 16 * TILES;
  const int units = swiglu ? (N - pair_stride) / 16 : (N + unit_rows - 1) / unit_rows;
  const int gs = blockIdx.y * gps, ge = min(gs + gps, gpr);
  const int xrow = ((gpr * 2 + 31) & ~31) * 4;  // uint4 per token row of the staged pairs
  __shared__ float red[8][TILES][16][8];
  NI_PDL_ENTRY();
  const DecodeK dk = decode_constants(gpr > 0 ? 1u : 0u);
  const int c0 = 2 * (q & 1);  // this lane's first word in its 16-byte chunk
  const bool xlane = gid < M;
  float inv[2];
  inv[0] = 2 * q < M ? xinv[2 * q] * 16777216.f : 0.f;
  inv[1] = 2 * q + 1 < M ? xinv[2 * q + 1] * 16777216.f : 0.f;

  for (int ub = blockIdx.x * UPB; ub < units; ub += gridDim.x * UPB) {
    const int u = ub + wu;
    const bool live = u < units;
    int rows[TILES][2];
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
      const int r0 = swiglu ? u * 16 + t * pair_stride : u * unit_rows + t * 16;
#pragma unroll
      for (int h = 0; h < 2; ++h) rows[t][h] = min(r0 + gid + 8 * h, N - 1);
    }
    float acc[TILES][4];
#pragma unroll
    for (int t = 0; t < TILES; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][e] = 0.f;
    // per-row plane pointers at this warp's first group, advanced by KW * U groups a round
    const uint2* wp[TILES][2];
    const __half* sp[TILES][2];
    const unsigned short* hp[TILES][2];
#pragma unroll
    for (int t = 0; t < TILES; ++t)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const size_t rg = (size_t)rows[t][h] * gpr + gs + wk;
        wp[t][h] = reinterpret_cast<const uint2*>(base + rg * 32 + 8 * q);
        sp[t][h] = scales + rg;
        hp[t][h] = reinterpret_cast<const unsigned short*>(high + rg * 8 + 2 * q);
      }
    const uint4* xlp = xs4 + (size_t)gid * xrow + c0 * 32;

    for (int g0 = gs + wk; live && g0 < ge; g0 += KW * U) {
      uint2 w[U][TILES][2];
      unsigned int hb[U][TILES][2];
      float sc[U][TILES][2];
      uint4 xa[U], xb[U];
#pragma unroll
      for (int uu = 0; uu < U; ++uu) {
        const int g = g0 + uu * KW;
        if (g < ge) {
#pragma unroll
          for (int t = 0; t < TILES; ++t)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              w[uu][t][h] = __ldg(wp[t][h] + uu * KW * 4);
              sc[uu][t][h] = __half2float(sp[t][h][uu * KW]);
              if constexpr (FMT == FMT_Q5) hb[uu][t][h] = ~(unsigned int)__ldg(hp[t][h] + uu * KW * 4);
            }
          if (xlane) {
            const int jx = 2 * g + (q >> 1);
            const uint4* xp = xlp + (jx >> 5) * 128 + (jx & 31);
            xa[uu] = xp[0];
            xb[uu] = xp[32];
          } else {
            xa[uu] = make_uint4(0u, 0u, 0u, 0u);
            xb[uu] = xa[uu];
          }
        }
      }
#pragma unroll
      for (int t = 0; t < TILES; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          wp[t][h] += KW * U * 4;
          sp[t][h] += KW * U;
          hp[t][h] += KW * U * 4;
        }
#pragma unroll
      for (int uu = 0; uu < U; ++uu)
        if (g0 + uu * KW < ge) mma_group<FMT, TILES>(w[uu], hb[uu], sc[uu], xa[uu], xb[uu], acc, dk);
    }
    mma_unit_store<TILES, KW>(acc, red, warp, wk, live, u, N, pair_stride, epi, M, inv, y, ldy);
  }
}
#endif
