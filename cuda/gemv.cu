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
// * One warp handles ROWS rows at once (x read once from shared memory for all of them) and keeps
//   U 16-byte weight loads per row in flight per lane; blocks loop over row groups so that staging x
//   is paid once per block; grid.y splits K (split-K) for the few-row, long-K shapes.
// Epilogues: STORE (y = acc), PARTIAL (split-K slice s writes its own [M, N] plane; the consumer sums),
// SWIGLU (rows r and r + N/2 of a fused [gate; up] parent: y = silu(gate) * up), ADD (y += acc).
#include "common.cuh"

#define FMT_Q4 0
#define FMT_Q5 1
#define FMT_Q6 2
#define FMT_W8 3

#define EPI_STORE 0
#define EPI_PARTIAL 1
#define EPI_SWIGLU 2
#define EPI_ADD 3

template <int FMT> struct Fmt;
template <> struct Fmt<FMT_Q4> { static constexpr int VPU = 32, HB = 0;  static constexpr float XMAX = 512.f; };
template <> struct Fmt<FMT_Q5> { static constexpr int VPU = 32, HB = 8;  static constexpr float XMAX = 256.f; };
template <> struct Fmt<FMT_Q6> { static constexpr int VPU = 32, HB = 16; static constexpr float XMAX = 256.f; };
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

// xat(c): the x pairs of slot c of this chunk (q4-q6: 4 slots; w8: 2 swizzled slots, see key).
template <int FMT, typename XAt>
__device__ __forceinline__ float dot_core(uint4 w, uint2 hi, XAt xat, int key, const DecodeK& dk) {
  const unsigned int ws[4] = {w.x, w.y, w.z, w.w};
  if constexpr (FMT == FMT_W8) {
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

// A warp's finished row group: reduce each row's lane partials and apply the epilogue. TRACK: returns
// the largest |SwiGLU output| this lane wrote (0 elsewhere; gemv_rs_pre's fused staging reads it).
template <int ROWS, int M, bool TRACK = false>
__device__ __forceinline__ float gemv_store(float (&acc)[ROWS][M], int g, int N, int pair_stride, int epi,
                                            const float* inv_sc, float yw, float* __restrict__ y, int ldy, int lane) {
  float wrote = 0.f;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float v[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) v[r] = warp_sum(acc[r][m]) * inv_sc[m] * yw;
    if (lane == 0) {
      if (epi == EPI_SWIGLU) {
        if constexpr (TRACK) {
          if (g < pair_stride) {
            const float o = silu(v[0]) * v[ROWS - 1];
            y[(size_t)m * ldy + g] = o;
            wrote = fmaxf(wrote, fabsf(o));
          }
        } else {
          if (g < pair_stride) y[(size_t)m * ldy + g] = silu(v[0]) * v[ROWS - 1];
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

template <int FMT, int ROWS, int M, int U>
// One-token decode variants held to an occupancy: one row at 5 blocks/SM (51 registers), two rows at
// 4 (64; not q5, which would spill). With the slot-major x the compiler otherwise hoists every x load
// of an iteration (immediate offsets) and grows to 96-116 registers.
__global__ void __launch_bounds__(256, (M == 1 && U == 2) ? (ROWS == 1 ? 5 : (ROWS == 2 && FMT != FMT_Q5 ? 4 : 1)) : 1) gemv_rs(
    const unsigned char* __restrict__ base, const unsigned char* __restrict__ high,
    const __half* __restrict__ scales, int N, int gpr, int pair_stride,
    const float* __restrict__ x, int ldx, int K, int u4_per_split,
    float* __restrict__ y, int ldy, int epi, const float* __restrict__ xinv,
    const int* __restrict__ eidx, int erows, long long xz, int yz, const float* __restrict__ ywt, int pf) {
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
  const int ngroups = epi == EPI_SWIGLU ? pair_stride : (N + ROWS - 1) / ROWS;
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
          ka = (js + jl) * 32 + 8 * c + jp;
          kb = ka + 4;
          dst = m * nloc_pad * 16 + (jl >> 5) * 512 + c * 128 + (jl & 31) * 4 + jp;
        }
        xs[dst] = __floats2half2_rn(ka < K ? xm[ka] * sc : 0.f, kb < K ? xm[kb] * sc : 0.f);
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
            w[u][r] = __ldg(reinterpret_cast<const uint4*>(base) + (size_t)rows[r] * u4_per_row + j);
            sc[u][r] = __half2float(scales[rg]);
            if constexpr (FMT == FMT_Q5) {
              hb[u][r].x = __ldg(reinterpret_cast<const unsigned int*>(high + rg * F::HB + (j & 1) * 4));
              hb[u][r].y = 0u;
            } else if constexpr (FMT == FMT_Q6) {
              hb[u][r] = __ldg(reinterpret_cast<const uint2*>(high + rg * F::HB + (j & 1) * 8));
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

    gemv_store<ROWS, M>(acc, g, N, pair_stride, epi, inv_sc, yw, y, ldy, lane);
  }
}

// gemv_rs for pre-staged x only (the decode step's GEMVs), with the two cuts its SASS asked for: x is
// read with __ldg from global memory (gemv_rs reads it through a generic pointer that may be shared
// memory, so every x load is a generic LD), and each row's weight, scale and high-bit pointers are
// computed once per row group and advanced by constants (gemv_rs recomputes a 64-bit address, ~12
// instructions, for every load). Same arithmetic and epilogues as gemv_rs; MoE routing included.
template <int FMT, int ROWS, int M, int U>
__global__ void __launch_bounds__(256, (M == 1 && U == 2) ? (ROWS == 1 ? 5 : (ROWS == 2 && FMT != FMT_Q5 ? 4 : 1)) : 1)
gemv_rs_pre(const unsigned char* __restrict__ base, const unsigned char* __restrict__ high,
            const __half* __restrict__ scales, int N, int gpr, int pair_stride,
            const float* __restrict__ x, int ldx, int K, int u4_per_split,
            float* __restrict__ y, int ldy, int epi, const float* __restrict__ xinv,
            const int* __restrict__ eidx, int erows, long long xz, int yz, const float* __restrict__ ywt, int pf,
            __half2* __restrict__ sxh, float* __restrict__ sxinv, int skpad, unsigned int* __restrict__ sslot) {
  // sxh != nullptr (SwiGLU, one token, no split, no routing): the output row is also staged for the
  // next GEMV, as stage_x would: every block folds the largest |output| it wrote into sslot[0]
  // (atomicMax on the float bits), takes a ticket in sslot[1], and the last block stages the whole row
  // and resets both words for the next launch. (Written without device time: measure before use.)
  using F = Fmt<FMT>;
  static_assert(F::VPU == 32, "q4-q6 (slot-major staged x)");
  float wrote = 0.f;
  const int u4_per_row = gpr * 2;
  const int z = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wpb = blockDim.x >> 5;
  const int ngroups = epi == EPI_SWIGLU ? pair_stride : (N + ROWS - 1) / ROWS;
  const int js = blockIdx.y * u4_per_split;  // a multiple of 32 (the executor's rule for pre-staged x)
  const int je = min(js + u4_per_split, u4_per_row);
  const int iters = je - js > lane ? (je - js - lane + 31) >> 5 : 0;  // chunks j = js + lane + 32 i
  NI_PDL_ENTRY();
  const long long row_off = eidx != nullptr ? (long long)eidx[z] * erows : 0;
  x = reinterpret_cast<const float*>(reinterpret_cast<const unsigned char*>(x) + z * xz);
  xinv += xz != 0 ? z : 0;
  y += (size_t)z * yz;
  const float yw = ywt != nullptr ? ywt[z] : 1.f;
  float inv_sc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) inv_sc[m] = xinv[m];
  const DecodeK dk = decode_constants(gpr > 0 ? 1u : 0u);
  const int xrow4 = ((u4_per_row + 31) & ~31) * 4;  // uint4 per token row of the staged pairs
  const uint4* xlane = reinterpret_cast<const uint4*>(x) + (js >> 5) * 128 + lane;

  for (int g = blockIdx.x * wpb + warp; g < ngroups; g += gridDim.x * wpb) {
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
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (i + u < iters) {
#pragma unroll
          for (int r = 0; r < ROWS; ++r) {
            w[u][r] = __ldg(wp[r] + 32 * u);
            sc[u][r] = __half2float(sp[r][16 * u]);
            if constexpr (FMT == FMT_Q5) {
              hb[u][r].x = __ldg(reinterpret_cast<const unsigned int*>(hp[r] + 16 * F::HB * u));
              hb[u][r].y = 0u;
            } else if constexpr (FMT == FMT_Q6) {
              hb[u][r] = __ldg(reinterpret_cast<const uint2*>(hp[r] + 16 * F::HB * u));
            } else {
              hb[u][r] = make_uint2(0u, 0u);
            }
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (i + u < iters) {
#pragma unroll
          for (int m = 0; m < M; ++m) {
            // the slot-major x of chunk j sits at (j >> 5) * 128 + (j & 31) uint4; xp[c * 32] is slot c
            const uint4* xp = xp0 + (size_t)m * xrow4 + 128 * u;
            uint4 xv[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) xv[c] = __ldg(xp + 32 * c);
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
              acc[r][m] += sc[u][r] * dot_core<FMT>(w[u][r], hb[u][r], [&](int c) { return xv[c]; }, 0, dk);
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
    wrote = fmaxf(wrote, gemv_store<ROWS, M, true>(acc, g, N, pair_stride, epi, inv_sc, yw, y, ldy, lane));
  }
  if (sxh != nullptr) {
    __shared__ float red[32];
    __shared__ bool last;
    const float bmax = block_max(wrote, red);
    if (threadIdx.x == 0) {
      atomicMax(sslot, __float_as_uint(bmax));  // non-negative floats order as their bits
      __threadfence();
      last = atomicAdd(sslot + 1, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (last) {
      __threadfence();
      const float sc = pow2_scale(__uint_as_float(atomicAdd(sslot, 0u)));
      const int K2 = pair_stride;  // the staged row: the N / 2 SwiGLU outputs
      for (int p = threadIdx.x; p < skpad / 2; p += blockDim.x) {
        const int jl = p >> 4, pi = p & 15, c = pi >> 2, jp = pi & 3;
        const int ka = jl * 32 + 8 * c + jp, kb = ka + 4;
        sxh[(jl >> 5) * 512 + c * 128 + (jl & 31) * 4 + jp] =
            __floats2half2_rn(ka < K2 ? __ldcg(y + ka) * sc : 0.f, kb < K2 ? __ldcg(y + kb) * sc : 0.f);
      }
      if (threadIdx.x == 0) {
        sxinv[0] = 1.f / sc;
        sslot[0] = 0u;
        sslot[1] = 0u;
      }
    }
  }
}

// cp.async: 16 bytes (L2 only) or 4/8 bytes (through L1) from global to this thread's shared slot.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src) : "memory");
}
template <int BYTES>
__device__ __forceinline__ void cp_async_small(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "n"(BYTES) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

// Pre-staged decode GEMV with the weights streamed through shared memory (M token rows, q4/q5/q6).
//
// gemv_rs keeps its U loads per row in registers, so a warp has at most U x ROWS x 16 B in flight and
// waits for them before it decodes; a 5120-wide row is only 2.5 such rounds, so each row group starts
// with a full memory latency (Nsight: 45% of the issue gaps on L1TEX, DRAM 59%). Here every lane copies
// its 16-byte chunk of each row (plus the group's scale word and high bits) with cp.async into its own
// slots of a per-warp ring of S stages, S - 1 work items ahead of the one it decodes. A work item is
// one 32-chunk slice of one row group, and the sequence runs across row groups, so the next group's
// weights are already arriving while a group is reduced and stored. Each lane reads back only what it
// copied itself: cp.async.wait_group orders it, no barrier. The first S - 1 items are requested before
// the programmatic-dependent-launch wait (weights depend on no kernel; MoE expert ids do, so routed
// launches wait first).
template <int FMT, int ROWS, int M, int S>
__global__ void __launch_bounds__(256, 4) gemv_rs_async(
    const unsigned char* __restrict__ base, const unsigned char* __restrict__ high,
    const __half* __restrict__ scales, int N, int gpr, int pair_stride,
    const float* __restrict__ x, int ldx, int K, int u4_per_split,
    float* __restrict__ y, int ldy, int epi, const float* __restrict__ xinv,
    const int* __restrict__ eidx, int erows, long long xz, int yz, const float* __restrict__ ywt, int pf) {
  using F = Fmt<FMT>;
  constexpr int HW = F::HB == 16 ? 2 : 1;  // 32-bit words of high bits per 16-byte chunk
  const int u4_per_row = gpr * 2;
  const int z = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wpb = blockDim.x >> 5;
  const int ngroups = epi == EPI_SWIGLU ? pair_stride : (N + ROWS - 1) / ROWS;
  const int js = blockIdx.y * u4_per_split;
  const int je = min(js + u4_per_split, u4_per_row);
  const int ipg = (je - js + 31) >> 5;  // work items per row group
  const int gstride = gridDim.x * wpb;
  const int g0 = blockIdx.x * wpb + warp;
  const int ntask = g0 < ngroups ? ((ngroups - 1 - g0) / gstride + 1) * ipg : 0;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int WB = S * ROWS * 32 * 16, SB = S * ROWS * 32 * 4, HBB = F::HB > 0 ? S * ROWS * 32 * 4 * HW : 0;
  unsigned char* ring = smem_raw + (size_t)warp * (WB + SB + HBB);
  uint4* wring = reinterpret_cast<uint4*>(ring);
  unsigned int* sring = reinterpret_cast<unsigned int*>(ring + WB);
  unsigned int* hring = reinterpret_cast<unsigned int*>(ring + WB + SB);
  const unsigned long long sbase = reinterpret_cast<unsigned long long>(scales);

  long long row_off = 0;
  const bool routed = eidx != nullptr;
  if (routed) {
    NI_PDL_ENTRY();
    row_off = (long long)eidx[z] * erows;
  }
  // issue: the copies of work item (it_g, it_i) into ring slot `slot`
  int it_g = g0, it_i = 0, it_n = 0, it_slot = 0;
  auto issue = [&]() {
    if (it_n < ntask) {
      const int j = js + it_i * 32 + lane;
      if (j < je) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          const int row0 = epi == EPI_SWIGLU ? it_g + r * pair_stride : it_g * ROWS + r;
          const long long row = (row0 < N ? row0 : N - 1) + row_off;
          const size_t rg = (size_t)row * gpr + (j >> 1);
          const int sl = (it_slot * ROWS + r) * 32 + lane;
          cp_async16(wring + sl, reinterpret_cast<const uint4*>(base) + (size_t)row * u4_per_row + j);
          cp_async_small<4>(sring + sl, reinterpret_cast<const void*>((sbase + rg * 2) & ~3ull));
          if constexpr (F::HB > 0) cp_async_small<4 * HW>(hring + sl * HW, high + rg * F::HB + (j & 1) * 4 * HW);
        }
      }
    }
    cp_async_commit();
    ++it_n;
    it_slot = it_slot == S - 1 ? 0 : it_slot + 1;
    if (++it_i == ipg) { it_i = 0; it_g += gstride; }
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) issue();
  if (!routed) NI_PDL_ENTRY();

  x = reinterpret_cast<const float*>(reinterpret_cast<const unsigned char*>(x) + z * xz);
  if (xinv != nullptr) xinv += xz != 0 ? z : 0;
  y += (size_t)z * yz;
  const float yw = ywt != nullptr ? ywt[z] : 1.f;
  float inv_sc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) inv_sc[m] = xinv[m];
  const DecodeK dk = decode_constants(gpr > 0 ? 1u : 0u);
  const uint4* xs4 = reinterpret_cast<const uint4*>(x);
  const int xrow = (u4_per_row + 31) & ~31;

  float acc[ROWS][M];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
  int g = g0, i = 0, slot = 0;
  for (int n = 0; n < ntask; ++n) {
    issue();
    cp_async_wait<S - 1>();
    const int j = js + i * 32 + lane;
    if (j < je) {
      const size_t rg0 = (size_t)(j >> 1);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const int sl = (slot * ROWS + r) * 32 + lane;
        const uint4 w = wring[sl];
        const unsigned int sw = sring[sl];
        const int row0 = epi == EPI_SWIGLU ? g + r * pair_stride : g * ROWS + r;
        const long long row = (row0 < N ? row0 : N - 1) + row_off;
        const bool hi_half = ((sbase + ((size_t)row * gpr + rg0) * 2) & 2) != 0;
        const float sc = __half2float(__ushort_as_half((unsigned short)(hi_half ? sw >> 16 : sw & 0xffffu)));
        uint2 hb = make_uint2(0u, 0u);
        if constexpr (F::HB > 0) {
          hb.x = hring[sl * HW];
          if constexpr (HW == 2) hb.y = hring[sl * HW + 1];
        }
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4* xp = xs4 + (size_t)m * xrow * 4 + (j >> 5) * 128 + (j & 31);
          acc[r][m] += sc * dot_u4<FMT>(w, hb, xp, 0, dk);
        }
      }
    }
    slot = slot == S - 1 ? 0 : slot + 1;
    if (++i == ipg) {
      gemv_store<ROWS, M>(acc, g, N, pair_stride, epi, inv_sc, yw, y, ldy, lane);
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
      i = 0;
      g += gstride;
    }
  }
  cp_async_wait<0>();
}

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
        if (row < pair_stride) ym[row] = silu(gt) * up;
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
  const int units = swiglu ? pair_stride / 16 : (N + unit_rows - 1) / unit_rows;
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

// bf16 weights [N, K] (row-major, K % 8 == 0), fp32 x [M, K], fp32 math. kw warps share a row (1 or 8):
// with few rows (the 96-row GDN a|b projection) one warp per row would leave most SMs idle and walk
// the whole row in dependent rounds, so the 8 warps of a block split K and reduce in shared memory.
template <int M>
__global__ void __launch_bounds__(256) gemv_bf16(const unsigned short* __restrict__ w, int N, int K,
                                                 const float* __restrict__ x, int ldx,
                                                 float* __restrict__ y, int ldy, int epi, int kw) {
  NI_PDL_ENTRY();
  __shared__ float red[8][M];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row = blockIdx.x * (8 / kw) + warp / kw, part = warp % kw;
  const bool live = row < N;
  const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)(live ? row : 0) * K);
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.f;
  for (int j = lane + 32 * part; live && j < K / 8; j += 32 * kw) {
    const uint4 v = __ldg(wr + j);
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

// Code k of row `row` of a row-split object, times its group scale (the reference: formats.decode).
template <int FMT>
__device__ __forceinline__ float rs_value(const unsigned char* __restrict__ base, const unsigned char* __restrict__ high,
                                          const __half* __restrict__ scales, int gpr, size_t row, int k) {
  const int g = k / (FMT == FMT_W8 ? 32 : 64), lanei = k % (FMT == FMT_W8 ? 32 : 64);
  const size_t rg = row * gpr + g;
  const float s = __half2float(scales[rg]);
  int code;
  if constexpr (FMT == FMT_W8) {
    code = (int)(signed char)base[rg * 32 + lanei];
  } else {
    const unsigned int b = base[rg * 32 + (lanei >> 1)];
    unsigned int u = (lanei & 1) ? (b >> 4) : (b & 15u);
    int bits = 4;
    if constexpr (FMT == FMT_Q5) {
      u |= ((high[rg * 8 + (lanei >> 3)] >> (lanei & 7)) & 1u) << 4;
      bits = 5;
    } else if constexpr (FMT == FMT_Q6) {
      const int t = 2 * lanei;
      u |= ((high[rg * 16 + (t >> 3)] >> (t & 7)) & 3u) << 4;
      bits = 6;
    }
    code = (int)(u << (32 - bits)) >> (32 - bits);
  }
  return s * (float)code;
}

// Embedding gather: x[m][:] = dequantized row tokens[m] of a row-split table [R, K].
template <int FMT>
__global__ void embed_rs(const unsigned char* __restrict__ base, const unsigned char* __restrict__ high,
                         const __half* __restrict__ scales, int gpr, int K,
                         const int* __restrict__ tokens, float* __restrict__ x, int ldx) {
  NI_PDL_ENTRY();
  const int m = blockIdx.x;
  const int row = tokens[m];
  for (int k = threadIdx.x; k < K; k += blockDim.x) x[(size_t)m * ldx + k] = rs_value<FMT>(base, high, scales, gpr, row, k);
}

// Prefill: rows [0, N) of a row-split object dequantized to fp16 [N, ldo] (the tensor-core GEMM's input).
// grid (N), block 256. fp16 holds code x scale to 11 bits, as the GEMVs' decode does.
template <int FMT>
__global__ void dequant_rs(const unsigned char* __restrict__ base, const unsigned char* __restrict__ high,
                           const __half* __restrict__ scales, int gpr, int K, __half* __restrict__ out, int ldo) {
  NI_PDL_ENTRY();
  const size_t row = blockIdx.x;
  for (int k = threadIdx.x; k < K; k += blockDim.x)
    out[row * ldo + k] = __float2half_rn(rs_value<FMT>(base, high, scales, gpr, row, k));
}

// bf16 embedding gather.
extern "C" __global__ void embed_bf16(const unsigned short* __restrict__ table, int K, const int* __restrict__ tokens,
                           float* __restrict__ x, int ldx) {
  NI_PDL_ENTRY();
  const int m = blockIdx.x;
  const unsigned short* r = table + (size_t)tokens[m] * K;
  for (int k = threadIdx.x; k < K; k += blockDim.x) x[(size_t)m * ldx + k] = __uint_as_float(((unsigned int)r[k]) << 16);
}
