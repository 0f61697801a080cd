// The GEMVs' decoders (gemv.cu, gemv_variants.cu, gemv_mma.cu, rows.cu): how one 16-byte chunk of packed codes
// of each row-split format (q4/q5/q6 g64, q8 g32; layout row_split_k128_v1) meets its staged x.
// * fp16 pairs (NI_XI16=0): each 4-bit nibble is OR-ed into the mantissa of an fp16 1024.0 ("magic number"),
//   so two codes become an exact half2 in one LOP3, one HSUB2 removes the offset, and HFMA2 multiplies with x
//   (int->float conversion is quarter-rate). Partial sums leave fp16 after every 32-bit word of codes (4
//   products per half lane) and accumulate in fp32; x is scaled so that they cannot overflow (Fmt::XMAX).
// * int16 pairs (NI_XI16=1, the default): codes turned into signed bytes for dp2a (dot_i16, dot_w8_i16),
//   about half the decode instructions of the fp16 path, exact int32 sums a chunk.
#include "common.cuh"

#define FMT_Q4 0
#define FMT_Q5 1
#define FMT_Q6 2
#define FMT_W8 3

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
