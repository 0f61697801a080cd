// Decode GEMV straight from row-split quantized planes (q4/q5/q6 g64, q8 g32; layout row_split_k128_v1).
//
//   y[m][n] = sum_k W[n][k] * x[m][k]       W: [N, K] packed, x: [M, K] fp32 (M = tokens in flight)
//
// Why it looks like this (spec/performance.md §4g: a plain kernel reaches ~50% of the bandwidth):
// * Decoding a code with int->float conversion is quarter-rate; instead each 4-bit nibble is OR-ed into
//   the mantissa of an fp16 1024.0 ("magic number"), so two codes become an exact half2 in one LOP3,
//   one HSUB2 removes the offset, and HFMA2 multiplies with x. Partial sums leave fp16 after every 32-bit
//   word of codes (4 products per half lane) and accumulate in fp32.
// * x is staged once per block into shared memory as fp16, scaled by a power of two so that the fp16
//   partial sums cannot overflow (target bound per format below), in the pair order the magic decode
//   produces, and swizzled so that a warp's 16-byte reads are bank-conflict free.
// * NI_XI16 (NINFER_XI16=1): x staged as int16 pairs instead, and q4/q5/q6 codes turned into signed bytes
//   for dp2a (dot_i16): about half the decode instructions of the fp16 path, exact int32 sums a chunk.
// * One warp handles ROWS rows at once (x read once from shared memory for all of them) and keeps
//   U 16-byte weight loads per row in flight per lane; blocks loop over row groups so that staging x
//   is paid once per block; grid.y splits K (split-K) for the few-row, long-K shapes.
// Epilogues: STORE (y = acc), PARTIAL (split-K slice s writes its own [M, N] plane; the consumer sums),
// SWIGLU (rows g and g + pair_stride of a fused [gate; up] parent, g < N - pair_stride: y[g] = silu(gate) *
// up; a view of rows [a, I + b) of an [I gate; I up] parent with pair_stride I is the slice a..b), ADD (y += acc).
#include "common.cuh"

#define FMT_Q4 0
#define FMT_Q5 1
#define FMT_Q6 2
#define FMT_W8 3

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

template <int FMT> struct Fmt;
template <> struct Fmt<FMT_Q4> { static constexpr int VPU = 32, HB = 0;  static constexpr float XMAX = NI_XI16 ? STAGE_MAX : 512.f; };
template <> struct Fmt<FMT_Q5> { static constexpr int VPU = 32, HB = 8;  static constexpr float XMAX = NI_XI16 ? STAGE_MAX : 256.f; };
template <> struct Fmt<FMT_Q6> { static constexpr int VPU = 32, HB = 16; static constexpr float XMAX = NI_XI16 ? STAGE_MAX : 256.f; };
template <> struct Fmt<FMT_W8> { static constexpr int VPU = 16, HB = 0;  static constexpr float XMAX = 128.f; };

// Dot product of one 16-byte word of codes (and its high bits) with the matching x pairs.
// xp: the x pairs of this uint4 (4 slots of 16 B for q4-q6, 32 uint4 apart: the slot-major layout of
// stage_pairs; 2 swizzled adjacent slots for w8, with the swizzle key).
// q5: the multipliers that spread a word's 8 high bits onto the magic positions of its 4 pairs
// (hm * (2^a + 2^b) puts bit i at i+a and i+b with no carries, as the two copies never overlap).
// Passed in registers so that the products are IMADs, which issue on the FMA pipe, not the ALU pipe
// that the LOP3s of the decode already load.
#define Q5_MUL0 0x00010010u  // bits 0 -> 4, 4 -> 20: pair (k0, k4)
#define Q5_MUL1 0x00080080u  // bits 1 -> 8, 5 -> 24: pair (k1, k5), odd nibbles in place (x16)
#define Q5_MUL2 0x00004004u  // bits 2 -> 4, 6 -> 20: pair (k2, k6) of q >> 8
#define Q5_MUL3 0x00020020u  // bits 3 -> 8, 7 -> 24: pair (k3, k7) of q >> 8, in place
// Decode constants held in registers for the whole kernel. Built from a value the compiler cannot fold,
// so that it neither rematerializes the LOP3 masks before every use (a MOV per pair, measured in the
// SASS) nor strength-reduces the q5 multiplies into ALU shifts.
struct DecodeK {
  unsigned int lo, hi, magic;  // 0x000f000f, 0x00f000f0, 0x64006400
  uint4 q5m;                   // Q5_MUL0..3
};

__device__ __forceinline__ DecodeK decode_constants(unsigned int one) {
  DecodeK k;
  k.lo = one * 0x000f000fu;
  k.hi = one * 0x00f000f0u;
  k.magic = one * 0x64006400u;
  k.q5m = make_uint4(one * Q5_MUL0, one * Q5_MUL1, one * Q5_MUL2, one * Q5_MUL3);
  return k;
}

// q4/q5: the 4 words of a uint4 against their x pairs, 8 products per half lane between flushes to
// fp32. `decode(c, v)` gives word c's value pairs: v[0] (k, k+4), v[1] the odd nibbles in place,
// v[2] and v[3] the same from q >> 8.
// MERGE16 (q4: codes -8..7): the two 8-product chains are added in fp16 and converted once,
// |sum| <= 16 * 8 * 256 = 32768.
template <bool MERGE16 = false, typename XAt, typename Decode>
__device__ __forceinline__ float dot_words(XAt xat, Decode decode) {
  float s = 0.f;
  __half2 part[2];
#pragma unroll
  for (int c2 = 0; c2 < 4; c2 += 2) {
    __half2 a;
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      const int c = c2 + cc;
      const uint4 xv = xat(c);
      __half2 v[4];
      decode(c, v);
      a = cc == 0 ? __hmul2(v[0], u32_as_half2(xv.x)) : __hfma2(v[0], u32_as_half2(xv.x), a);
      a = __hfma2(v[1], u32_as_half2(xv.y), a);
      a = __hfma2(v[2], u32_as_half2(xv.z), a);
      a = __hfma2(v[3], u32_as_half2(xv.w), a);
    }
    if constexpr (MERGE16) {
      part[c2 >> 1] = a;
    } else {
      const float2 f = __half22float2(a);  // |sum| <= 8 * 16 * 256 (q5), 8 * 8 * 256 (q4)
      s += f.x + f.y;
    }
  }
  if constexpr (MERGE16) {
    const float2 f = __half22float2(__hadd2(part[0], part[1]));
    s = f.x + f.y;
  }
  return s;
}

// NI_XI16 (int16 x pairs, see common.cuh): each word of codes becomes two words of signed bytes, E (codes
// 0, 2, 4, 6 of the word: nibbles 0, 2, 4, 6) and O (1, 3, 5, 7), every byte F times its code (the code's
// bits placed at the top of the byte: q4 F = 16, q5 8, q6 4), and dp2a takes two products a step against
// the pairs (x0, x2) (x4, x6) (x1, x3) (x5, x7). No offset, no fp16 rounding: the chunk's 32 products sum
// exactly in int32 (|F code| <= 128, |x| <= 32767). dev/emu_gemv_xi16.py checks the bit manipulations.
__device__ __forceinline__ int dp2a_lo(unsigned int a, unsigned int b, int c) {
  int d;
  asm("dp2a.lo.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ int dp2a_hi(unsigned int a, unsigned int b, int c) {
  int d;
  asm("dp2a.hi.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// w8 on the int16 pairs of the q4-q6 layout (gemv_rs_pre only, NI_XI16): the 16 codes of a chunk are values
// 0..15 of a 32-value block, i.e. slots s0 (codes 0..7) and s1 (8..15); each word's bytes (codes k..k+3, plain
// int8) permuted to (k, k+2, k+1, k+3) meet the pairs (x0, x2) and (x1, x3) (or (x4, x6), (x5, x7)).
__device__ __forceinline__ float dot_w8_i16(uint4 w, uint4 s0, uint4 s1) {
  const unsigned int p0 = __byte_perm(w.x, 0u, 0x3120u), p1 = __byte_perm(w.y, 0u, 0x3120u);
  const unsigned int p2 = __byte_perm(w.z, 0u, 0x3120u), p3 = __byte_perm(w.w, 0u, 0x3120u);
  int a = dp2a_lo(s0.x, p0, 0), b = dp2a_lo(s0.y, p1, 0);
  a = dp2a_hi(s0.z, p0, a);
  b = dp2a_hi(s0.w, p1, b);
  a = dp2a_lo(s1.x, p2, a);
  b = dp2a_lo(s1.y, p3, b);
  a = dp2a_hi(s1.z, p2, a);
  b = dp2a_hi(s1.w, p3, b);
  return (float)(a + b);
}

// q6: 2-bit fields at bits 4b (b = 0..3) of h -> bits 8b + 6 (the top two bits of byte b).
__device__ __forceinline__ unsigned int q6_spread(unsigned int h) {
  return ((h & 0x3u) << 6) | ((h & 0x30u) << 10) | ((h & 0x300u) << 14) | ((h & 0x3000u) << 18);
}

template <int FMT, typename XAt>
__device__ __forceinline__ float dot_i16(uint4 w, uint2 hi, XAt xat) {
  const unsigned int ws[4] = {w.x, w.y, w.z, w.w};
  // q5: the chunk's high bits of even / odd codes, each at even bit positions
  const unsigned int he = hi.x & 0x55555555u, ho = (hi.x >> 1) & 0x55555555u;
  int se = 0, so = 0;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const uint4 xv = xat(c);
    const unsigned int q = ws[c];
    unsigned int e, o;
    if constexpr (FMT == FMT_Q4) {  // two's-complement nibbles at the top of each byte
      e = (q << 4) & 0xf0f0f0f0u;
      o = q & 0xf0f0f0f0u;
    } else if constexpr (FMT == FMT_Q5) {
      // low nibble at bits 3..6, the high (sign) bit at 7: the 4 bits of byte c of he at 0, 2, 4, 6
      // spread by one multiply to 7, 15, 23, 31 (the other copies collide only below those, see the emulator)
      const unsigned int me = __byte_perm(he, 0u, 0x4440u | c) * 0x02082080u;
      const unsigned int mo = __byte_perm(ho, 0u, 0x4440u | c) * 0x02082080u;
      e = ((q << 3) & 0x78787878u) | (me & 0x80808080u);
      o = ((q >> 1) & 0x78787878u) | (mo & 0x80808080u);
    } else {  // q6: low nibble at bits 2..5, the two high bits at 6..7
      const unsigned int hh = ((c < 2 ? hi.x : hi.y) >> (16 * (c & 1))) & 0xffffu;
      e = ((q << 2) & 0x3c3c3c3cu) | q6_spread(hh & 0x3333u);
      o = ((q >> 2) & 0x3c3c3c3cu) | q6_spread((hh >> 2) & 0x3333u);
    }
    se = dp2a_lo(xv.x, e, se);
    se = dp2a_hi(xv.y, e, se);
    so = dp2a_lo(xv.z, o, so);
    so = dp2a_hi(xv.w, o, so);
  }
  constexpr float inv = FMT == FMT_Q4 ? 1.f / 16 : (FMT == FMT_Q5 ? 1.f / 8 : 1.f / 4);
  return (float)(se + so) * inv;
}

// xat(c): the x pairs of slot c of this chunk (q4-q6: 4 slots; w8: 2 swizzled slots, see key).
template <int FMT, typename XAt>
__device__ __forceinline__ float dot_core(uint4 w, uint2 hi, XAt xat, int key, const DecodeK& dk) {
  const unsigned int ws[4] = {w.x, w.y, w.z, w.w};
  if constexpr (NI_XI16 && FMT != FMT_W8) {
    return dot_i16<FMT>(w, hi, xat);
  } else if constexpr (FMT == FMT_W8) {
    const __half2 B = __floats2half2_rn(1152.f, 1152.f);
    float s = 0.f;
#pragma unroll
    for (int sl = 0; sl < 2; ++sl) {
      const uint4 xv = xat((sl + key) & 1);
      const unsigned int xs[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const unsigned int q = ws[sl * 2 + h] ^ 0x80808080u;
        __half2 a = __hmul2(__hsub2(u32_as_half2(__byte_perm(q, 0x64646464u, 0x4240)), B), u32_as_half2(xs[2 * h]));
        a = __hfma2(__hsub2(u32_as_half2(__byte_perm(q, 0x64646464u, 0x4341)), B), u32_as_half2(xs[2 * h + 1]), a);
        const float2 f = __half22float2(a);
        s += f.x + f.y;
      }
    }
    return s;
  } else if constexpr (FMT == FMT_Q4) {
    // (q & 0x000F000F) ^ 0x64086408 = fp16 pair 1024 + (n ^ 8) = 1032 + code: one LOP3 per two codes
    // (the XOR turns the two's-complement nibble into offset binary). The odd pairs are taken in place
    // (1024 + 16 u) and scaled by 1/16 inside the HFMA2 that removes the offset, so q is shifted once.
    const __half2 B = __floats2half2_rn(1032.f, 1032.f);
    const __half2 S16 = __floats2half2_rn(0.0625f, 0.0625f), B16 = __floats2half2_rn(-72.f, -72.f);
    return dot_words<true>(xat, [&](int c, __half2* v) {
      const unsigned int q = ws[c], q8 = q >> 8;
      v[0] = __hsub2(u32_as_half2((q & dk.lo) ^ 0x64086408u), B);
      v[1] = __hfma2(u32_as_half2((q & dk.hi) ^ 0x64806480u), S16, B16);
      v[2] = __hsub2(u32_as_half2((q8 & dk.lo) ^ 0x64086408u), B);
      v[3] = __hfma2(u32_as_half2((q8 & dk.hi) ^ 0x64806480u), S16, B16);
    });
  } else if constexpr (FMT == FMT_Q5) {
    // As q4, plus the (complemented) high bit of each code OR-ed into the magic word at 4/20 (even
    // pairs) or 8/24 (odd pairs, taken in place in the x16 domain): one PRMT picks the word's 8 bits,
    // one IMAD per pair spreads them (Q5_MUL*), one LOP3 merges them under the pair's mask.
    const __half2 B = __floats2half2_rn(1040.f, 1040.f);
    const __half2 S16 = __floats2half2_rn(0.0625f, 0.0625f), B16 = __floats2half2_rn(-80.f, -80.f);
    const unsigned int nh = ~hi.x;
    return dot_words(xat, [&](int c, __half2* v) {
      const unsigned int q = ws[c], q8 = q >> 8;
      const unsigned int hm = __byte_perm(nh, 0u, 0x4440u | c);  // byte c of nh, zero above
      const unsigned int p0 = hm * dk.q5m.x, p1 = hm * dk.q5m.y, p2 = hm * dk.q5m.z, p3 = hm * dk.q5m.w;
      // two LOP3 per pair: t = (p & bits) | magic (one immediate, magic in a register), then (q & mask) | t
      v[0] = __hsub2(u32_as_half2((q & dk.lo) | ((p0 & 0x00100010u) | dk.magic)), B);
      v[1] = __hfma2(u32_as_half2((q & dk.hi) | ((p1 & 0x01000100u) | dk.magic)), S16, B16);
      v[2] = __hsub2(u32_as_half2((q8 & dk.lo) | ((p2 & 0x00100010u) | dk.magic)), B);
      v[3] = __hfma2(u32_as_half2((q8 & dk.hi) | ((p3 & 0x01000100u) | dk.magic)), S16, B16);
    });
  } else {
    // q6: two high bits a code, spread per word; 4 products per half lane between flushes (4 * 32 * 256)
    const __half2 B = __floats2half2_rn(1056.f, 1056.f);
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const uint4 xv = xat(c);
      const unsigned int q = ws[c];
      const unsigned int hh = (((c < 2 ? hi.x : hi.y) ^ 0xaaaaaaaau) >> (16 * (c & 1))) & 0xffffu;
      const unsigned int s4 = ((hh & 0xffu) | ((hh & 0xff00u) << 8)) << 4;
      __half2 a;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const unsigned int t = ((q >> (4 * j)) & 0x000f000fu) | ((s4 >> (2 * j)) & 0x00300030u) | 0x64006400u;
        const unsigned int xw = j == 0 ? xv.x : (j == 1 ? xv.y : (j == 2 ? xv.z : xv.w));
        const __half2 v = __hsub2(u32_as_half2(t), B);
        a = j == 0 ? __hmul2(v, u32_as_half2(xw)) : __hfma2(v, u32_as_half2(xw), a);
      }
      const float2 f = __half22float2(a);
      s += f.x + f.y;
    }
    return s;
  }
}

// x pairs from memory: xp points at the chunk's first slot (q4-q6: slots 32 uint4 apart; w8: adjacent).
template <int FMT>
__device__ __forceinline__ float dot_u4(uint4 w, uint2 hi, const uint4* __restrict__ xp, int key, const DecodeK& dk) {
  return dot_core<FMT>(w, hi, [&](int c) { return FMT == FMT_W8 ? xp[c] : xp[c * 32]; }, key, dk);
}

// The parameters of the row-split GEMV kernels (gemv_rs and the variants in gemv_variants.cu): one
// argument list, which GemvPlan builds once for all of them.
#define GEMV_RS_PARAMS                                                                                  \
  const unsigned char* __restrict__ base, const unsigned char* __restrict__ high,                     \
      const __half* __restrict__ scales, int N, int gpr, int pair_stride, const float* __restrict__ x, \
      int ldx, int K, int u4_per_split, float* __restrict__ y, int ldy, int epi,                      \
      const float* __restrict__ xinv, const int* __restrict__ eidx, int erows, long long xz, int yz,  \
      const float* __restrict__ ywt, int pf, const float* __restrict__ conv_w, float* __restrict__ conv_st,    \
      int conv_c, int conv_base, int conv_rows

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
__global__ void __launch_bounds__(256, (M == 1 && U == 2) ? (ROWS == 1 ? 5 : (ROWS == 2 && (FMT != FMT_Q5 || NI_XI16) ? 4 : 1)) : 1) gemv_rs(GEMV_RS_PARAMS) {
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
  const DecodeK dk = decode_constants(gpr > 0 ? 1u : 0u);  // gpr >= 1 always; the compiler cannot know
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
          if (j < je) {
            const size_t rg = (size_t)rows[r] * gpr + (j >> 1);
            w[u][r] = ldw(reinterpret_cast<const uint4*>(base) + (size_t)rows[r] * u4_per_row + j);
            sc[u][r] = __half2float(scales[rg]);
            if constexpr (FMT == FMT_Q5) {
              hb[u][r].x = ldw(reinterpret_cast<const unsigned int*>(high + rg * F::HB + (j & 1) * 4));
              hb[u][r].y = 0u;
            } else if constexpr (FMT == FMT_Q6) {
              hb[u][r] = ldw(reinterpret_cast<const uint2*>(high + rg * F::HB + (j & 1) * 8));
            } else {
              hb[u][r] = make_uint2(0u, 0u);
            }
          }
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
            for (int r = 0; r < ROWS; ++r) acc[r][m] += sc[u][r] * dot_u4<FMT>(w[u][r], hb[u][r], xp, key, dk);
          }
        }
      }
    }

    gemv_store<ROWS, M, false, CONV>(acc, g, N, pair_stride, epi, inv_sc, yw, y, ldy, lane,
                                     ConvEpi{conv_w, conv_st, conv_c, conv_base, conv_rows});
  }
}

// bf16 weights [N, K] (row-major, K % 8 == 0), fp32 x [M, K], fp32 math. kw warps share a row (1 or 8):
// with few rows (the 96-row GDN a|b projection) one warp per row would leave most SMs idle and walk
// the whole row in dependent rounds, so the 8 warps of a block split K and reduce in shared memory.
// (The body is a device function: router_route in moe.cu runs it before its routing tail.)
template <int M>
__device__ __forceinline__ void gemv_bf16_body(const unsigned short* __restrict__ w, int N, int K,
                                               const float* __restrict__ x, int ldx, float* __restrict__ y, int ldy,
                                               int epi, int kw) {
  __shared__ float red[8][M];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row = blockIdx.x * (8 / kw) + warp / kw, part = warp % kw;
  const bool live = row < N;
  const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)(live ? row : 0) * K);
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.f;
  for (int j = lane + 32 * part; live && j < K / 8; j += 32 * kw) {
    const uint4 v = ldw(wr + j);
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

template <int M>
__global__ void __launch_bounds__(256) gemv_bf16(const unsigned short* __restrict__ w, int N, int K,
                                                 const float* __restrict__ x, int ldx,
                                                 float* __restrict__ y, int ldy, int epi, int kw) {
  NI_PDL_ENTRY();
  gemv_bf16_body<M>(w, N, K, x, ldx, y, ldy, epi, kw);
}
