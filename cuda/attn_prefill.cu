// Flash attention for the tensor-core prefill: causal GQA over the paged KV cache, head_dim 256,
// output times sigmoid(gate), in one kernel (no gathered K/V copies, no score matrix in memory).
//
// Queries: T rows at positions start..start+T-1 (q: [T, Hq*256] fp32, after q-norm + RoPE); each
// attends to cache positions 0..its own (earlier chunks' keys included; this chunk's K/V were written
// by qk_norm_rope_kv before). Cache layout as in attention.cu: [pages, 64, Hkv, 256] bf16 bits, or
// int8 codes with fp16 scales [pages, 64, Hkv, 4] (one per 64 dims).
//
// Block: NW warps, BM = 16 NW query rows of one query head; key tiles of 64 = one cache page. Warp w
// owns query rows 16w..16w+15 and every one of the 256 output dims (fp32 accumulator: 32 n-tiles x 4
// = 128 registers a thread); S = Q K^T and O += P V with mma.sync m16n8k16 (fp32 accumulate), online
// softmax in fp32 (log2 units). bf16 cache: bf16 MMAs, K/V tiles copied raw with cp.async (the V
// copy overlaps S, the next K copy overlaps P V); int8 cache: fp16 MMAs, K/V decoded to fp16 through
// registers (code * scale, one rounding). Q and P are rounded to the MMA type (fp32 row sums).
//
// Grid (Hq, query tiles): one query head per block keeps a warp's accumulator at 128 registers (a
// block over all G heads of a KV head would need G times that, or G passes). The head index varies
// fastest, so the G blocks reading the same K/V tiles run side by side and share them through L2.
// Query tiles are taken last-first: the long causal rows start first and the short ones fill the tail.
// Fully masked key tiles are never visited; a warp skips the math of a tile wholly past its rows.
//
// Shared memory (dynamic): Q [BM][264], K [64][264], V [64][264] 16-bit; rows padded by 16 bytes so
// that the 8 rows an ldmatrix phase reads fall in distinct banks. NW = 4: 101,376 bytes (2 blocks an
// SM), NW = 8: 135,168.
#include "common.cuh"

#define FA_D 256
#define FA_BN 64
#define FA_LD 264  // row stride in 16-bit elements (528 bytes)

#if !NI_PRE_SM80
__device__ __forceinline__ unsigned fa_smem_addr(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void fa_ldsm_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void fa_ldsm_x4_t(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// d += A B: A 16x16 (a0..a3), B 16x8 (b0, b1), d 16x8 fp32; BF16 picks bf16 inputs, else fp16.
template <bool BF16>
__device__ __forceinline__ void fa_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (BF16) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// (lo, hi) rounded to the MMA type, lo in the low half.
template <bool BF16>
__device__ __forceinline__ unsigned fa_pack(float lo, float hi) {
  if constexpr (BF16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&v);
  }
}

// 16 bytes global -> shared, or 16 zero bytes when !ok (src-size 0: nothing is read)
__device__ __forceinline__ void fa_cp_async16(unsigned dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void fa_cp_commit() { asm volatile("cp.async.commit_group;"); }
__device__ __forceinline__ void fa_cp_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

// Four int8 codes (one word) times an fp16 scale pair as two fp16 pairs: (code + 128) | 0x6400 is the
// fp16 1024 + code + 128, so code = that - 1152 exactly; one rounding in the product.
__device__ __forceinline__ void fa_dequant4(unsigned w, __half2 s2, unsigned& lo, unsigned& hi) {
  const unsigned u = w ^ 0x80808080u;
  const __half2 off = __float2half2_rn(1152.f);
  const unsigned a = __byte_perm(u, 0x64646464u, 0x4140), b = __byte_perm(u, 0x64646464u, 0x4342);
  const __half2 x = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&a), off), s2);
  const __half2 y = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&b), off), s2);
  lo = *reinterpret_cast<const unsigned*>(&x);
  hi = *reinterpret_cast<const unsigned*>(&y);
}

// Key tile of cache page `page` for KV head kvh into dst [64][FA_LD]: cp.async of the bf16 rows, or the
// int8 rows decoded to fp16 (plain loads and stores). Rows >= nrows are zeros: keys past the block's
// last query (a padded chunk's rows, never-written positions) are masked, P = 0 there, and 0 * NaN
// in P V would still be NaN.
template <int NT, bool KV8>
__device__ __forceinline__ void fa_load_tile(unsigned short* dst, const unsigned short* __restrict__ cache,
                                             const __half* __restrict__ scales, int page, int Hkv, int kvh,
                                             int nrows) {
  const int tid = threadIdx.x;
  if constexpr (!KV8) {
#pragma unroll
    for (int i = 0; i < 64 * 32 / NT; ++i) {
      const int idx = tid + i * NT, r = idx >> 5, c = idx & 31;
      const unsigned short* src = cache + (((size_t)page * 64 + r) * Hkv + kvh) * FA_D + c * 8;
      fa_cp_async16(fa_smem_addr(dst + r * FA_LD + c * 8), src, r < nrows);
    }
    fa_cp_commit();
  } else {
    const signed char* codes = reinterpret_cast<const signed char*>(cache);
#pragma unroll 4
    for (int i = 0; i < 64 * 16 / NT; ++i) {
      const int idx = tid + i * NT, r = idx >> 4, c = idx & 15;
      const size_t row = ((size_t)page * 64 + r) * Hkv + kvh;
      uint4 o0 = make_uint4(0u, 0u, 0u, 0u), o1 = o0;
      if (r < nrows) {
        const uint4 w = __ldg(reinterpret_cast<const uint4*>(codes + row * FA_D + c * 16));
        const __half s = scales[row * 4 + (c >> 2)];
        const __half2 s2 = __halves2half2(s, s);
        fa_dequant4(w.x, s2, o0.x, o0.y);
        fa_dequant4(w.y, s2, o0.z, o0.w);
        fa_dequant4(w.z, s2, o1.x, o1.y);
        fa_dequant4(w.w, s2, o1.z, o1.w);
      }
      uint4* d = reinterpret_cast<uint4*>(dst + r * FA_LD + c * 16);
      d[0] = o0;
      d[1] = o1;
    }
  }
}

#endif  // !NI_PRE_SM80

// out[t][h*256 + d] (row stride ldo) = softmax(scale q_t K^T, causal) V [d] * sigmoid(gate[t][h*256 + d])
// for the nq query rows t of q (row stride ldq) at positions start + t, query head h = blockIdx.x
// (KV head h / (Hq / Hkv)). grid (Hq, ceil(nq / (16 NW))), block 32 NW, dynamic smem FA_SMEM(NW).
template <int NW, bool KV8>
__global__ void __launch_bounds__(NW * 32, NW == 4 ? 2 : 1) attn_prefill_fa(
    const float* __restrict__ q, int ldq, const unsigned short* __restrict__ kc,
    const unsigned short* __restrict__ vc, const __half* __restrict__ ks, const __half* __restrict__ vs,
    const int* __restrict__ page_table, int Hq, int Hkv, int start, int nq, float scale,
    const float* __restrict__ gate, int ldg, float* __restrict__ out, int ldo) {
#if NI_PRE_SM80  // below sm_80: never launched (engine.gpu.plan refuses them)
  __trap();
#else
  constexpr int NT = NW * 32, BM = 16 * NW;
  constexpr bool BF = !KV8;  // MMA input type: bf16 for a bf16 cache, fp16 for int8 codes * scales
  extern __shared__ __align__(16) unsigned short fa_smem[];
  unsigned short* Qs = fa_smem;
  unsigned short* Ks = Qs + BM * FA_LD;
  unsigned short* Vs = Ks + FA_BN * FA_LD;

  NI_PDL_ENTRY();
  const int h = blockIdx.x, kvh = h / (Hq / Hkv);
  const int q0 = (gridDim.y - 1 - blockIdx.y) * BM;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int last = start + min(q0 + BM, nq) - 1;  // the position of the block's last query
  const int ntiles = last / FA_BN + 1;

  fa_load_tile<NT, KV8>(Ks, kc, ks, page_table[0], Hkv, kvh, last + 1);
  // Q rows (zero past nq) rounded to the MMA type
#pragma unroll 4
  for (int i = tid; i < BM * (FA_D / 4); i += NT) {
    const int r = i / (FA_D / 4), c = (i % (FA_D / 4)) * 4;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (q0 + r < nq) v = *reinterpret_cast<const float4*>(q + (size_t)(q0 + r) * ldq + h * FA_D + c);
    uint2 p;
    p.x = fa_pack<BF>(v.x, v.y);
    p.y = fa_pack<BF>(v.z, v.w);
    *reinterpret_cast<uint2*>(Qs + r * FA_LD + c) = p;
  }

  const float sl2 = scale * 1.4426950408889634f;  // scores in log2 units
  const int row0 = start + q0 + 16 * warp;         // position of the warp's first row
  const int pos_a = row0 + g, pos_b = row0 + g + 8;  // this thread's two rows
  float o[32][4];
#pragma unroll
  for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;

  // ldmatrix lane addresses (byte offsets within a tile): A rows of Q; B of K (keys x dims); B of V (.trans)
  const unsigned qa = fa_smem_addr(Qs + (16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1)) * FA_LD + 8 * (lane >> 4));
  const unsigned ka = fa_smem_addr(Ks + ((lane & 7) + 8 * (lane >> 4)) * FA_LD + 8 * ((lane >> 3) & 1));
  const unsigned va = fa_smem_addr(Vs + ((lane & 7) + 8 * ((lane >> 3) & 1)) * FA_LD + 8 * (lane >> 4));

  for (int j = 0; j < ntiles; ++j) {
    fa_cp_wait_all();
    __syncthreads();  // K_j (and Q) in place; every warp done with V_{j-1}
    fa_load_tile<NT, KV8>(Vs, vc, vs, page_table[j], Hkv, kvh, last + 1 - j * FA_BN);
    const int k0 = j * FA_BN;
    const bool live = k0 <= row0 + 15;  // some key of the tile is visible to some row of the warp
    unsigned p[4][4];                   // P as the A fragments of the 4 k-steps of P V
    if (live) {
      float s[8][4];
#pragma unroll
      for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < FA_D / 16; ++kk) {
        unsigned a[4];
        fa_ldsm_x4(a, qa + kk * 32);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          unsigned b[4];
          fa_ldsm_x4(b, ka + (np * 16 * FA_LD) * 2 + kk * 32);
          fa_mma<BF>(s[2 * np], a, b[0], b[1]);
          fa_mma<BF>(s[2 * np + 1], a, b[2], b[3]);
        }
      }
      const bool diag = k0 + FA_BN - 1 > row0;  // the tile reaches past the warp's first row
      // (attn_decode_mma.cu's fa_softmax_tile, inline: the form this kernel was measured in; with the helper
      // its bf16 SASS differs)
      float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = k0 + 8 * n + 2 * t4 + e;
          float sa = s[n][e] * sl2, sb = s[n][2 + e] * sl2;
          if (diag) {
            if (key > pos_a) sa = -INFINITY;
            if (key > pos_b) sb = -INFINITY;
          }
          s[n][e] = sa;
          s[n][2 + e] = sb;
          mx_a = fmaxf(mx_a, sa);
          mx_b = fmaxf(mx_b, sb);
        }
      }
#pragma unroll
      for (int off = 1; off < 4; off <<= 1) {
        mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
      }
      const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
      // (a row with no visible key yet keeps m = -inf: subtract 0 instead, its p are all 0)
      const float ms_a = mn_a == -INFINITY ? 0.f : mn_a, ms_b = mn_b == -INFINITY ? 0.f : mn_b;
      const float c_a = exp2f(m_a - ms_a), c_b = exp2f(m_b - ms_b);
      m_a = mn_a;
      m_b = mn_b;
      float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        s[n][0] = exp2f(s[n][0] - ms_a);
        s[n][1] = exp2f(s[n][1] - ms_a);
        s[n][2] = exp2f(s[n][2] - ms_b);
        s[n][3] = exp2f(s[n][3] - ms_b);
        sum_a += s[n][0] + s[n][1];
        sum_b += s[n][2] + s[n][3];
      }
      l_a = l_a * c_a + sum_a;  // this thread's share of the row sum (the quad adds them at the end)
      l_b = l_b * c_b + sum_b;
#pragma unroll
      for (int n = 0; n < 32; ++n) {
        o[n][0] *= c_a;
        o[n][1] *= c_a;
        o[n][2] *= c_b;
        o[n][3] *= c_b;
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        p[kk][0] = fa_pack<BF>(s[2 * kk][0], s[2 * kk][1]);
        p[kk][1] = fa_pack<BF>(s[2 * kk][2], s[2 * kk][3]);
        p[kk][2] = fa_pack<BF>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        p[kk][3] = fa_pack<BF>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      }
    }
    fa_cp_wait_all();
    __syncthreads();  // V_j in place; every warp done with K_j
    if (j + 1 < ntiles) fa_load_tile<NT, KV8>(Ks, kc, ks, page_table[j + 1], Hkv, kvh, last + 1 - (j + 1) * FA_BN);
    if (live) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int dp = 0; dp < 16; ++dp) {
          unsigned b[4];
          fa_ldsm_x4_t(b, va + (kk * 16 * FA_LD) * 2 + dp * 32);
          fa_mma<BF>(o[2 * dp], p[kk], b[0], b[1]);
          fa_mma<BF>(o[2 * dp + 1], p[kk], b[2], b[3]);
        }
      }
    }
  }

#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, off);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, off);
  }
  const float inv_a = 1.f / l_a, inv_b = 1.f / l_b;
  const int ta = q0 + 16 * warp + g, tb = ta + 8;
#pragma unroll
  for (int n = 0; n < 32; ++n) {
    const int d = h * FA_D + 8 * n + 2 * t4;
    if (ta < nq) {
      const float2 gv = *reinterpret_cast<const float2*>(gate + (size_t)ta * ldg + d);
      *reinterpret_cast<float2*>(out + (size_t)ta * ldo + d) =
          make_float2(o[n][0] * inv_a * sigmoidf_(gv.x), o[n][1] * inv_a * sigmoidf_(gv.y));
    }
    if (tb < nq) {
      const float2 gv = *reinterpret_cast<const float2*>(gate + (size_t)tb * ldg + d);
      *reinterpret_cast<float2*>(out + (size_t)tb * ldo + d) =
          make_float2(o[n][2] * inv_b * sigmoidf_(gv.x), o[n][3] * inv_b * sigmoidf_(gv.y));
    }
  }
#endif
}
