// The GEMVs' decoders (gemv.cu, gemv_variants.cu, persistent.cu, rows.cu): how one 16-byte chunk of packed codes of
// each row-split format (q4/q5/q6 g64, q8 g32; layout row_split_k128_v1) meets its staged x.
// * q4/q5/q6 on int16 pairs: codes turned into signed bytes for dp2a (dot_i16), exact int32 sums a chunk.
// * w8 on int16 pairs (gemv_rs_pre: dot_w8_i16), or on the fp16 pairs a GEMV stages itself (gemv_rs: each code
//   byte PRMT-ed into the mantissa of an fp16 1024 + code, one HSUB2 removes the offset, HFMA2 multiplies with x;
//   x scaled so that the fp16 partial sums cannot overflow, Fmt::XMAX).
#include "common.cuh"

#define FMT_Q4 0
#define FMT_Q5 1
#define FMT_Q6 2
#define FMT_W8 3

template <int FMT> struct Fmt;
template <> struct Fmt<FMT_Q4> { static constexpr int VPU = 32, HB = 0;  static constexpr float XMAX = STAGE_MAX; };
template <> struct Fmt<FMT_Q5> { static constexpr int VPU = 32, HB = 8;  static constexpr float XMAX = STAGE_MAX; };
template <> struct Fmt<FMT_Q6> { static constexpr int VPU = 32, HB = 16; static constexpr float XMAX = STAGE_MAX; };
template <> struct Fmt<FMT_W8> { static constexpr int VPU = 16, HB = 0;  static constexpr float XMAX = 128.f; };

// int16 x pairs (see common.cuh): each word of codes becomes two words of signed bytes, E (codes
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

// w8 on the int16 pairs of the q4-q6 layout (gemv_rs_pre only): the 16 codes of a chunk are values
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

// Word c of a chunk's codes as two words of signed bytes F x code: e the even codes (0, 2, 4, 6), o the odd ones;
// hi: the chunk's high bits (q5: 32, q6: 64; see below). (dot_i16's decoder, and gemv_tc's A fragments.)
template <int FMT>
__device__ __forceinline__ void code_bytes(unsigned int q, uint2 hi, int c, unsigned int& e, unsigned int& o) {
  if constexpr (FMT == FMT_Q4) {  // two's-complement nibbles at the top of each byte
    e = (q << 4) & 0xf0f0f0f0u;
    o = q & 0xf0f0f0f0u;
  } else if constexpr (FMT == FMT_Q5) {
    // low nibble at bits 3..6, the high (sign) bit at 7: the 4 bits of byte c of he (the even codes' high bits, at
    // even positions) at 0, 2, 4, 6 spread by one multiply to 7, 15, 23, 31 (the other copies collide only below
    // those, see the emulator)
    const unsigned int he = hi.x & 0x55555555u, ho = (hi.x >> 1) & 0x55555555u;
    const unsigned int me = __byte_perm(he, 0u, 0x4440u | c) * 0x02082080u;
    const unsigned int mo = __byte_perm(ho, 0u, 0x4440u | c) * 0x02082080u;
    e = ((q << 3) & 0x78787878u) | (me & 0x80808080u);
    o = ((q >> 1) & 0x78787878u) | (mo & 0x80808080u);
  } else {  // q6: low nibble at bits 2..5, the two high bits at 6..7
    const unsigned int hh = ((c < 2 ? hi.x : hi.y) >> (16 * (c & 1))) & 0xffffu;
    e = ((q << 2) & 0x3c3c3c3cu) | q6_spread(hh & 0x3333u);
    o = ((q >> 2) & 0x3c3c3c3cu) | q6_spread((hh >> 2) & 0x3333u);
  }
}

template <int FMT, typename XAt>
__device__ __forceinline__ float dot_i16(uint4 w, uint2 hi, XAt xat) {
  const unsigned int ws[4] = {w.x, w.y, w.z, w.w};
  int se = 0, so = 0;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const uint4 xv = xat(c);
    unsigned int e, o;
    code_bytes<FMT>(ws[c], hi, c, e, o);
    se = dp2a_lo(xv.x, e, se);
    se = dp2a_hi(xv.y, e, se);
    so = dp2a_lo(xv.z, o, so);
    so = dp2a_hi(xv.w, o, so);
  }
  constexpr float inv = FMT == FMT_Q4 ? 1.f / 16 : (FMT == FMT_Q5 ? 1.f / 8 : 1.f / 4);
  return (float)(se + so) * inv;
}

// Chunk j (16 bytes of codes) of row `row` of a row-split matrix: its codes, its group's scale and (q5/q6) its
// high bits, each through the weight-stream load (ldw).
template <int FMT>
__device__ __forceinline__ void load_chunk(const unsigned char* __restrict__ base, const unsigned char* __restrict__ high,
                                           const __half* __restrict__ scales, int gpr, int u4_per_row, size_t row,
                                           int j, uint4& w, float& sc, uint2& hb) {
  const size_t rg = row * gpr + (j >> 1);
  w = ldw(reinterpret_cast<const uint4*>(base) + row * u4_per_row + j);
  sc = __half2float(scales[rg]);
  if constexpr (FMT == FMT_Q5) {
    hb.x = ldw(reinterpret_cast<const unsigned int*>(high + rg * Fmt<FMT>::HB + (j & 1) * 4));
    hb.y = 0u;
  } else if constexpr (FMT == FMT_Q6) {
    hb = ldw(reinterpret_cast<const uint2*>(high + rg * Fmt<FMT>::HB + (j & 1) * 8));
  } else {
    hb = make_uint2(0u, 0u);
  }
}

// xat(c): the x pairs of slot c of this chunk (q4-q6: 4 slots; w8: 2 swizzled slots, see key).
template <int FMT, typename XAt>
__device__ __forceinline__ float dot_core(uint4 w, uint2 hi, XAt xat, int key) {
  const unsigned int ws[4] = {w.x, w.y, w.z, w.w};
  if constexpr (FMT != FMT_W8) {
    return dot_i16<FMT>(w, hi, xat);
  } else {
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
  }
}

// x pairs from memory: xp points at the chunk's first slot (q4-q6: slots 32 uint4 apart; w8: adjacent).
template <int FMT>
__device__ __forceinline__ float dot_u4(uint4 w, uint2 hi, const uint4* __restrict__ xp, int key) {
  return dot_core<FMT>(w, hi, [&](int c) { return FMT == FMT_W8 ? xp[c] : xp[c * 32]; }, key);
}
