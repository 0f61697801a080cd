// Split-K decode attention on tensor cores (the plan's attention on sm_80 and newer; same arguments and partials as
// attn_decode_split). grid (Hkv, nsplit, M), block 32 W (W warps), dynamic smem ADM_SMEM_OF(KV8, W, NS) (one
// block an SM; the executor sizes nsplit to one wave). A block takes KV head kvh's G query heads as the rows
// of one m16 tile (G <= 16; rows past G zero) over the split's tokens [t0, t1) (a split's share rounded up
// to 16 tokens, so a round never crosses a 64-token page), 16 W a round: warp w the round's tokens 16 w ..
// 16 w + 15, S = Q K^T (16 k-steps x 2 n-tiles of m16n8k16), the online softmax of each row over the warp's
// tokens (log2 units), O += P V (32 n-tiles of 8 dims). No block barrier in the loop: a warp reads only its
// own shared memory. Loads run ahead of the math: each warp keeps its next NS - 1 rounds' K and V rows in
// flight through cp.async (int8: NS stages of raw codes and scales, decoded to one fp16 tile a round; bf16:
// NS tiles copied as they are; NS = 1: each round's rows loaded, then used). On the H200, 27B at
// depth 32768 (int8 KV): W 4 with NS 1 (~80 us a layer, against ~17 us of bytes) 110.6 tok/s, with NS 4
// 118.1, the split kernel 105.2. The W warps' (max, sum, O) are then merged through shared memory into the
// split's partials as attn_decode_merge writes them (max in natural-log units). Compiled after
// attn_prefill.cu in the module (kernels.SOURCES): it uses that file's fa_* helpers (ldmatrix, mma.sync,
// packing, cp.async, the int8 decode).
#include "common.cuh"
#define ADM_LD 264                      // row stride in 16-bit elements (as FA_LD: ldmatrix phases conflict-free)
#define ADM_TILE (2 * 16 * ADM_LD * 2)  // a warp's K and V tiles, fp16 / bf16: 16,896 bytes
#define ADM_RAW (2 * 16 * 256 + 2 * 16 * 8)  // int8: 16 rows of K and V codes, then their 4 scales a row
// A form: W warps a block, NS stages a warp (int8: raw stages, one fp16 tile; bf16: tile stages); shared
// memory ADM_SMEM_OF(KV8, W, NS): the Q tile, then the warps' stages (kernels.attn_mma_smem mirrors it).
// The H100/H200 form: int8 W 4, NS 4 (3 rounds in flight while one is used), bf16 W 4, NS 3: 211,200
// bytes; smaller ones for GPUs with less shared memory a block (kernels.ATTN_MMA_FORMS).
#define ADM_WARP_OF(KV8, NS) ((KV8) ? (NS) * ADM_RAW + ADM_TILE : (NS) * ADM_TILE)
#define ADM_SMEM_OF(KV8, W, NS) (16 * ADM_LD * 2 + (W) * ADM_WARP_OF(KV8, NS))
// KRAW forms: K is never decoded, so a warp's fp16 tile is V's alone (kernels.attn_mma_smem(..., kraw=True)); the
// room that saves takes more warps a block (kernel_names.ATTN_MMA_KRAW_FORMS: W 6 with NS 3, W 8 with NS 2 in the
// H200's 211,200 bytes), more rounds' math in flight an SM for the same bytes in flight.
#define ADM_WARP_KR(NS) ((NS) * ADM_RAW + ADM_TILE / 2)
#define ADM_SMEM_KR(W, NS) (16 * ADM_LD * 2 + (W) * ADM_WARP_KR(NS))
// VRAW forms (with KRAW): V's codes too go straight into the MMAs, so a warp keeps its raw stages only
// (ADM_SMEM_VR; kernel_names.ATTN_MMA_VRAW_FORMS: W 8 with NS 3 in 211,200 bytes).
#define ADM_SMEM_VR(W, NS) (16 * ADM_LD * 2 + (W) * (NS) * ADM_RAW)

#if !NI_PRE_SM80
// One key tile's online-softmax step for a thread's two rows (a: g, b: g + 8) of a 16-row MMA tile: each
// score of s [N][4] through score(n, e, sa, sb) (to log2 units, hidden keys -inf; e: the column of the
// pair), then p = 2^(s - the new max) in place; the running maxima and this thread's shares of the row sums
// updated (the quad adds the shares at the end), the accumulator o rescaled. A row with no visible key yet
// keeps m = -inf and subtracts 0 instead (its p are all 0).
template <int N, int NO, class Score>
__device__ __forceinline__ void fa_softmax_tile(float (&s)[N][4], float (&o)[NO][4], float& m_a, float& m_b,
                                                float& l_a, float& l_b, Score score) {
  float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float sa = s[n][e], sb = s[n][2 + e];
      score(n, e, sa, sb);
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
  const float ms_a = mn_a == -INFINITY ? 0.f : mn_a, ms_b = mn_b == -INFINITY ? 0.f : mn_b;
  const float c_a = exp2f(m_a - ms_a), c_b = exp2f(m_b - ms_b);
  m_a = mn_a;
  m_b = mn_b;
  float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    s[n][0] = exp2f(s[n][0] - ms_a);
    s[n][1] = exp2f(s[n][1] - ms_a);
    s[n][2] = exp2f(s[n][2] - ms_b);
    s[n][3] = exp2f(s[n][3] - ms_b);
    sum_a += s[n][0] + s[n][1];
    sum_b += s[n][2] + s[n][3];
  }
  l_a = l_a * c_a + sum_a;
  l_b = l_b * c_b + sum_b;
#pragma unroll
  for (int n = 0; n < NO; ++n) {
    o[n][0] *= c_a;
    o[n][1] *= c_a;
    o[n][2] *= c_b;
    o[n][3] *= c_b;
  }
}

// p of key k-step kk (keys 16 kk .. 16 kk + 15: n-tiles 2 kk, 2 kk + 1 of s) as the A fragment of P V
template <bool BF, int N>
__device__ __forceinline__ void fa_pack_p(const float (&s)[N][4], int kk, unsigned (&p)[4]) {
  p[0] = fa_pack<BF>(s[2 * kk][0], s[2 * kk][1]);
  p[1] = fa_pack<BF>(s[2 * kk][2], s[2 * kk][3]);
  p[2] = fa_pack<BF>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  p[3] = fa_pack<BF>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

__device__ __forceinline__ void adm_cp_async8(unsigned dst, const void* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" :: "r"(dst), "l"(src), "r"(ok ? 8 : 0));
}
template <int N>
__device__ __forceinline__ void adm_cp_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

// Ask for the warp's 16 K and V rows, tokens tb .. tb + 15 (those >= t1 zero-filled) of KV head kvh, all in
// one 64-token page: bf16 into the tiles at dst ([16][ADM_LD] K, then V); int8 into the raw stage at dst
// (codes [16][256] K, then V, then the rows' 4 scales, K then V). The caller commits the group.
template <bool KV8>
__device__ __forceinline__ void adm_issue(unsigned dst, const unsigned short* __restrict__ kc,
                                          const unsigned short* __restrict__ vc, const __half* __restrict__ ks,
                                          const __half* __restrict__ vsc, const int* __restrict__ pt, int Hkv,
                                          int kvh, int tb, int t1, int lane) {
  const size_t base = (size_t)pt[tb / KV_PAGE] * KV_PAGE;  // the page's first row
  if constexpr (!KV8) {  // 16 rows x 32 chunks of 16 bytes: lane = chunk, one row a step
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const bool ok = tb + r < t1;
      const size_t row = (base + (tb + (ok ? r : 0)) % KV_PAGE) * Hkv + kvh;
      fa_cp_async16(dst + (r * ADM_LD + lane * 8) * 2, kc + row * 256 + lane * 8, ok);
      fa_cp_async16(dst + ((16 + r) * ADM_LD + lane * 8) * 2, vc + row * 256 + lane * 8, ok);
    }
  } else {  // 16 rows x 16 chunks of 16 codes: two rows a step; lanes 0-15 a K row's scales, 16-31 a V row's
    const signed char* kb = reinterpret_cast<const signed char*>(kc);
    const signed char* vb = reinterpret_cast<const signed char*>(vc);
    const int c = lane & 15;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int r = 2 * i + (lane >> 4);
      const bool ok = tb + r < t1;
      const size_t row = (base + (tb + (ok ? r : 0)) % KV_PAGE) * Hkv + kvh;
      fa_cp_async16(dst + r * 256 + c * 16, kb + row * 256 + c * 16, ok);
      fa_cp_async16(dst + 4096 + r * 256 + c * 16, vb + row * 256 + c * 16, ok);
    }
    const int r = lane & 15;
    const bool ok = tb + r < t1;
    const size_t row = (base + (tb + (ok ? r : 0)) % KV_PAGE) * Hkv + kvh;
    adm_cp_async8(dst + 8192 + (lane >> 4) * 128 + r * 8, (lane < 16 ? ks : vsc) + row * 4, ok);
  }
}

// fp16 pairs as 32-bit words: a * b, a - b
__device__ __forceinline__ unsigned adm_hmul2(unsigned a, unsigned b) {
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
  return *reinterpret_cast<const unsigned*>(&r);
}
__device__ __forceinline__ unsigned adm_hsub2(unsigned a, __half2 b) {
  const __half2 r = __hsub2(*reinterpret_cast<const __half2*>(&a), b);
  return *reinterpret_cast<const unsigned*>(&r);
}

// The W warps' rows merged into the split's partials (as attn_decode_merge writes them: max in natural-log units):
// sm_o [W][RS][256] fp32 rows and sm_ml [W][RS][2] (max in log2 units, sum) of each warp, rows 0..C G-1 real (C
// columns of G query heads); hs0 the partials' index of query row 0 (row r: column r / G, head r % G, at
// hs0 + (r / G) cstride + (r % G) nsplit); thread tid of 32 W takes dims tid, tid + 32 W, ...
template <int G, int W, int RS, int C = 1>
__device__ __forceinline__ void adm_merge(const float* sm_o, const float* sm_ml, float* __restrict__ part_ml,
                                          float* __restrict__ part_acc, size_t hs0, int nsplit, size_t cstride,
                                          int tid) {
  for (int r = 0; r < C * G; ++r) {
    float M_ = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; ++w) M_ = fmaxf(M_, sm_ml[(w * RS + r) * 2]);
    float cw[W], Ls = 0.f;  // each warp's weight in the merged row
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float mw = sm_ml[(w * RS + r) * 2];
      cw[w] = M_ > -INFINITY && mw > -INFINITY ? exp2f(mw - M_) : 0.f;
      Ls += sm_ml[(w * RS + r) * 2 + 1] * cw[w];
    }
    const size_t hs = C == 1 ? hs0 + (size_t)r * nsplit : hs0 + (size_t)(r / G) * cstride + (size_t)(r % G) * nsplit;
    for (int d = tid; d < 256; d += 32 * W) {
      float A = 0.f;
#pragma unroll
      for (int w = 0; w < W; ++w) A += sm_o[(w * RS + r) * 256 + d] * cw[w];
      part_acc[hs * 256 + d] = A;
    }
    if (tid == 0) {
      part_ml[hs * 2] = M_ > -INFINITY ? M_ * 0.6931471805599453f : -INFINITY;  // natural-log units
      part_ml[hs * 2 + 1] = Ls;
    }
  }
}

// int8: a raw stage's codes times their scales into the warp's fp16 K and V tiles (two rows a step); KV0 = 1:
// the V tile only (KRAW: K is read raw by the MMAs).
template <int KV0 = 0>
__device__ __forceinline__ void adm_decode(unsigned short* tile, const unsigned char* raw, int lane) {
  const int c = lane & 15;
#pragma unroll
  for (int kv = KV0; kv < 2; ++kv) {
#pragma unroll 4
    for (int i = 0; i < 8; ++i) {
      const int r = 2 * i + (lane >> 4);
      const uint4 w = *reinterpret_cast<const uint4*>(raw + kv * 4096 + r * 256 + c * 16);
      const __half s = *reinterpret_cast<const __half*>(raw + 8192 + kv * 128 + r * 8 + (c >> 2) * 2);
      const __half2 s2 = __halves2half2(s, s);
      uint4 o0, o1;
      fa_dequant4(w.x, s2, o0.x, o0.y);
      fa_dequant4(w.y, s2, o0.z, o0.w);
      fa_dequant4(w.z, s2, o1.x, o1.y);
      fa_dequant4(w.w, s2, o1.z, o1.w);
      uint4* d = reinterpret_cast<uint4*>(tile + (kv * 16 + r) * ADM_LD + c * 16);
      d[0] = o0;
      d[1] = o1;
    }
  }
}
#endif

// KRAW (int8 only): K never becomes an fp16 tile. Q is staged with its 256 dims permuted so that the B
// fragment of k-step kk for quad t4 is the 4 contiguous codes at dim 64 (kk / 4) + 16 t4 + 4 (kk % 4) (one
// 16-byte shared load a row covers a 64-dim group's 4 k-steps); each code pair is PRMT-ed to the fp16 pair
// 1152 + code (exact), S accumulates a 64-dim group at a time, and S = sum over the 4 groups of the token's
// group scale x (S_group - 1152 x the group's sum of the staged Q row). V is decoded as before, unless VRAW:
// O's 256 dims are permuted so that n-tile j, column c is dim 32 (j / 4) + 4 c + j % 4: the B fragments of the 4
// n-tiles of quad q for lane (g, t4) are then the 4 contiguous codes at dim 32 q + 4 g of tokens 2 t4, 2 t4 + 1,
// 2 t4 + 8, 2 t4 + 9 (one 32-bit shared load each), paired by PRMT into fp16 1152 + code and made exact codes by
// one HSUB2; each token's group scale goes on P instead (P's fp16 A fragment times the 4 tokens' scales of the
// quad's 64-dim group), so that O = sum over tokens of (P x scale) x code. The merge writes the dims back in order.
//
// C > 1 (consecutive positions of one sequence: the verified columns, whose rows read one page table): a block's
// tile holds C columns' query groups (row r: column (blockIdx.x / Hkv) C + r / G, head r % G), so that their keys and values
// are read once for the C columns. The split's range is the last column's; a row masks the tokens past its own
// position, and a row that sees none of a split's tokens leaves (max -inf, sum 0) for the combine.
template <int G, bool KV8, int W, int NS, bool KRAW = false, bool VRAW = false, int C = 1>
__global__ void __launch_bounds__(32 * W) attn_decode_mma(ATTN_DECODE_PARAMS) {
#if NI_PRE_SM80  // below sm_80: never launched (engine.gpu.plan refuses them)
  __trap();
#else
  static_assert(G >= 1 && C >= 1 && C * G <= 16, "one m16 tile of query heads");
  static_assert(W >= 1 && W <= 8 && NS >= 1, "a form");
  constexpr int T = 32 * W, RT = 16 * W;  // threads; tokens a round
  constexpr bool BF = !KV8;  // MMA inputs: bf16 for a bf16 cache, fp16 for int8 codes x scales
  constexpr bool KR = KV8 && KRAW;
  constexpr bool VR = KR && VRAW;
  static_assert(!VRAW || KR, "raw V codes: with raw K codes only");
  constexpr int WARP_BYTES = VR ? NS * ADM_RAW : KR ? ADM_WARP_KR(NS) : ADM_WARP_OF(KV8, NS);
  // (the merge's [W][16][256] fp32 rows and their (max, sum) reuse the stages)
  static_assert(W * 16 * 258 * 4 <= 16 * ADM_LD * 2 + W * WARP_BYTES, "merge room");
  static_assert(!KRAW || KV8, "raw K codes: int8 caches only");
  constexpr float LOG2E = 1.4426950408889634f;
  extern __shared__ __align__(16) unsigned short adm_smem[];
  NI_PDL_ENTRY();
  // (C > 1: grid (Hkv x tiles, nsplit, 1), the tiles varying fastest with the KV head, so that the first wave of
  // resident blocks holds the first splits of every tile: at a short context the splits past the last token are
  // the ones left for a later wave, where grid.z = tiles queued every split of the second tile behind the first's)
  const int kvh = C > 1 ? (int)blockIdx.x % Hkv : (int)blockIdx.x, split = blockIdx.y;
  const int m = (C > 1 ? (int)blockIdx.x / Hkv : (int)blockIdx.z) * C;  // (the block's first column)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
  const int Hq = Hkv * G;
  const int L = pos[m + C - 1] + 1;
  const int per = (((L + nsplit - 1) / nsplit + 15) / 16) * 16;  // nsplit * per >= L; rounds in one page
  const int t0 = split * per, t1 = min(t0 + per, L);
  const int* pt = page_table + (size_t)m * pt_stride;
  unsigned short* Qs = adm_smem;
  unsigned char* wbase = reinterpret_cast<unsigned char*>(adm_smem + 16 * ADM_LD) + warp * WARP_BYTES;
  // the tile the MMAs read: int8 the one after the raw stages; bf16 the round's stage (stage 0 here); KR: V's half
  // only, right after the raw stages (Ks is never read there: adm_decode<1> writes Ks + 16 rows = Vs)
  unsigned short* Vs = reinterpret_cast<unsigned short*>(wbase + (KV8 ? NS * ADM_RAW : 0)) + (KR ? 0 : 16 * ADM_LD);
  unsigned short* Ks = Vs - 16 * ADM_LD;
  const int nr = t1 - t0 > 16 * warp ? (t1 - t0 - 16 * warp + RT - 1) / RT : 0;  // the warp's rounds
  const unsigned stage0 = fa_smem_addr(wbase);
  constexpr unsigned STAGE = KV8 ? ADM_RAW : ADM_TILE;
#pragma unroll
  for (int i = 0; i < NS - 1; ++i) {  // the first rounds asked for before Q is even staged
    if (i < nr) adm_issue<KV8>(stage0 + i * STAGE, kc, vc, ks, vsc, pt, Hkv, kvh, t0 + 16 * warp + RT * i, t1, lane);
    fa_cp_commit();
  }

  // Q: the G rows scaled (rows past G zero), rounded to the MMA type
  for (int i = tid; i < 16 * 64; i += T) {
    const int r = i >> 6, c = (i & 63) * 4;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    const size_t qr = C == 1 ? (size_t)m * Hq + kvh * G + r : (size_t)(m + r / G) * Hq + kvh * G + r % G;
    if (r < C * G) v = *reinterpret_cast<const float4*>(q + qr * 256 + c);
    uint2 p;
    p.x = fa_pack<BF>(v.x * scale, v.y * scale);
    p.y = fa_pack<BF>(v.z * scale, v.w * scale);
    if constexpr (KR) {  // dims c..c+3 = 64 gq + 16 t + 4 j: k-step 4 gq + j, columns 2t, 2t + 1 and 2t + 8, 2t + 9
      const int gq = c >> 6, t = (c >> 4) & 3, j = (c >> 2) & 3, col = (4 * gq + j) * 16 + 2 * t;
      *reinterpret_cast<unsigned*>(Qs + r * ADM_LD + col) = p.x;
      *reinterpret_cast<unsigned*>(Qs + r * ADM_LD + col + 8) = p.y;
    } else {
      *reinterpret_cast<uint2*>(Qs + r * ADM_LD + c) = p;
    }
  }
  __syncthreads();
  float qs_a[4], qs_b[4];  // KR: 1152 x the sum of the staged Q of rows g and g + 8 over each 64-dim group
  if constexpr (KR) {
    __shared__ float qsum[16][4];
    if (tid < 64) {
      const int r = tid >> 2, gq = tid & 3;
      float t = 0.f;
      for (int d = 0; d < 64; d += 2) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(Qs + r * ADM_LD + 64 * gq + d));
        t += f.x + f.y;
      }
      qsum[r][gq] = 1152.f * t;
    }
    __syncthreads();
#pragma unroll
    for (int gq = 0; gq < 4; ++gq) {
      qs_a[gq] = qsum[g][gq];
      qs_b[gq] = qsum[g + 8][gq];
    }
  }

  float o[32][4];
#pragma unroll
  for (int n = 0; n < 32; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;  // rows g, g + 8 (log2 units)
  // (C > 1: the positions rows g and g + 8 see, their column's; rows past C G the last column's)
  const int len_a = C > 1 && g < C * G ? pos[m + g / G] + 1 : L;
  const int len_b = C > 1 && g + 8 < C * G ? pos[m + (g + 8) / G] + 1 : L;
  // ldmatrix lane addresses: A rows of Q; B of K (tokens x dims); B of V (.trans)
  const unsigned qa = fa_smem_addr(Qs + ((lane & 7) + 8 * ((lane >> 3) & 1)) * ADM_LD + 8 * (lane >> 4));
  const unsigned ka = fa_smem_addr(Ks + ((lane & 7) + 8 * (lane >> 4)) * ADM_LD + 8 * ((lane >> 3) & 1));
  const unsigned va = fa_smem_addr(Vs + ((lane & 7) + 8 * ((lane >> 3) & 1)) * ADM_LD + 8 * (lane >> 4));

  int st = 0;  // round i's stage: i % NS
  for (int i = 0; i < nr; ++i) {
    const int tb = t0 + 16 * warp + RT * i;
    {  // round i + NS - 1 into the stage round i - 1 used (every lane done with it: the loop's last __syncwarp)
      const int ia = i + NS - 1, sa = st == 0 ? NS - 1 : st - 1;
      if (ia < nr) adm_issue<KV8>(stage0 + sa * STAGE, kc, vc, ks, vsc, pt, Hkv, kvh, tb + RT * (NS - 1), t1, lane);
      fa_cp_commit();
    }
    adm_cp_wait<NS - 1>();  // this lane's copies of round i have landed
    __syncwarp();           // ... and every lane's
    unsigned koff = 0;      // bf16: the stage's tiles relative to Ks
    if constexpr (VR) {
      // (nothing decoded: both K's and V's codes go into the MMAs)
    } else if constexpr (KR) {
      adm_decode<1>(Ks, wbase + st * ADM_RAW, lane);
      __syncwarp();
    } else if constexpr (KV8) {
      adm_decode(Ks, wbase + st * ADM_RAW, lane);
      __syncwarp();
    } else {
      koff = st * ADM_TILE;
    }
    float s[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    if constexpr (KR) {
      const unsigned char* raw = wbase + st * ADM_RAW;
      const __half* ksc = reinterpret_cast<const __half*>(raw + 8192);  // [16 rows][4 groups]
#pragma unroll
      for (int gq = 0; gq < 4; ++gq) {
        float sg[2][4];
#pragma unroll
        for (int n = 0; n < 2; ++n) sg[n][0] = sg[n][1] = sg[n][2] = sg[n][3] = 0.f;
        uint4 kw[2];  // tokens g and 8 + g: the group's 16 codes of quad t4
#pragma unroll
        for (int n = 0; n < 2; ++n)
          kw[n] = *reinterpret_cast<const uint4*>(raw + (8 * n + g) * 256 + 64 * gq + 16 * t4);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          unsigned a[4];
          fa_ldsm_x4(a, qa + (4 * gq + j) * 32);
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            const unsigned u = (j == 0 ? kw[n].x : j == 1 ? kw[n].y : j == 2 ? kw[n].z : kw[n].w) ^ 0x80808080u;
            fa_mma<false>(sg[n], a, __byte_perm(u, 0x64646464u, 0x4140), __byte_perm(u, 0x64646464u, 0x4342));
          }
        }
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int tok = 8 * n + 2 * t4 + (e & 1);
            const float sc = __half2float(ksc[tok * 4 + gq]);
            s[n][e] += sc * (sg[n][e] - (e < 2 ? qs_a[gq] : qs_b[gq]));
          }
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < 16; ++kk) {
        unsigned a[4], b[4];
        fa_ldsm_x4(a, qa + kk * 32);
        fa_ldsm_x4(b, ka + koff + kk * 32);
        fa_mma<BF>(s[0], a, b[0], b[1]);
        fa_mma<BF>(s[1], a, b[2], b[3]);
      }
    }
    // valid tokens of the warp's 16 for rows g and g + 8 (C = 1: token 0 is, the maxima stay finite; C > 1: a row
    // of an earlier column may see none, fa_softmax_tile keeps its max at -inf)
    const int nv_a = (C > 1 ? min(t1, len_a) : t1) - tb, nv_b = (C > 1 ? min(t1, len_b) : t1) - tb;
    fa_softmax_tile(s, o, m_a, m_b, l_a, l_b, [&](int n, int e, float& sa, float& sb) {
      const int tok = 8 * n + 2 * t4 + e;
      sa = tok < nv_a ? sa * LOG2E : -INFINITY;
      sb = tok < nv_b ? sb * LOG2E : -INFINITY;
    });
    unsigned p[4];
    fa_pack_p<BF>(s, 0, p);
    if constexpr (VR) {
      const unsigned char* raw = wbase + st * ADM_RAW;
      // the V scales of tokens 2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9: 4 groups each (.x groups 0-1, .y 2-3)
      uint2 sv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        sv[i] = *reinterpret_cast<const uint2*>(raw + 8192 + 128 + (2 * t4 + (i & 1) + 8 * (i >> 1)) * 8);
      const unsigned char* vr = raw + 4096;
      const __half2 off = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));  // 1152
#pragma unroll
      for (int gr = 0; gr < 4; ++gr) {
        // (scale of token 2 t4, of 2 t4 + 1) and (2 t4 + 8, 2 t4 + 9) for group gr: P's A fragment times them
        const unsigned sel = (gr & 1) ? 0x7632u : 0x5410u;
        const unsigned s01 = __byte_perm(gr < 2 ? sv[0].x : sv[0].y, gr < 2 ? sv[1].x : sv[1].y, sel);
        const unsigned s89 = __byte_perm(gr < 2 ? sv[2].x : sv[2].y, gr < 2 ? sv[3].x : sv[3].y, sel);
        unsigned pg[4];
        pg[0] = adm_hmul2(p[0], s01);
        pg[1] = adm_hmul2(p[1], s01);
        pg[2] = adm_hmul2(p[2], s89);
        pg[3] = adm_hmul2(p[3], s89);
#pragma unroll
        for (int qq = 0; qq < 2; ++qq) {
          const int q = 2 * gr + qq, dim0 = 32 * q + 4 * g;
          const unsigned w0 = *reinterpret_cast<const unsigned*>(vr + (2 * t4) * 256 + dim0) ^ 0x80808080u;
          const unsigned w1 = *reinterpret_cast<const unsigned*>(vr + (2 * t4 + 1) * 256 + dim0) ^ 0x80808080u;
          const unsigned w2 = *reinterpret_cast<const unsigned*>(vr + (2 * t4 + 8) * 256 + dim0) ^ 0x80808080u;
          const unsigned w3 = *reinterpret_cast<const unsigned*>(vr + (2 * t4 + 9) * 256 + dim0) ^ 0x80808080u;
          // (token 2 t4's byte r beside token 2 t4 + 1's: [w0.0, w1.0, w0.1, w1.1] and [w0.2, w1.2, w0.3, w1.3])
          const unsigned lo01 = __byte_perm(w0, w1, 0x5140u), hi01 = __byte_perm(w0, w1, 0x7362u);
          const unsigned lo89 = __byte_perm(w2, w3, 0x5140u), hi89 = __byte_perm(w2, w3, 0x7362u);
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const unsigned sel2 = (r & 1) ? 0x4342u : 0x4140u;
            const unsigned b0 = adm_hsub2(__byte_perm(r < 2 ? lo01 : hi01, 0x64646464u, sel2), off);
            const unsigned b1 = adm_hsub2(__byte_perm(r < 2 ? lo89 : hi89, 0x64646464u, sel2), off);
            fa_mma<false>(o[4 * q + r], pg, b0, b1);
          }
        }
      }
    } else {
#pragma unroll
      for (int dp = 0; dp < 16; ++dp) {
        unsigned b[4];
        fa_ldsm_x4_t(b, va + koff + dp * 32);
        fa_mma<BF>(o[2 * dp], p, b[0], b[1]);
        fa_mma<BF>(o[2 * dp + 1], p, b[2], b[3]);
      }
    }
    __syncwarp();  // every lane done with the stage and tiles before the next round's copies reuse them
    st = st + 1 == NS ? 0 : st + 1;
  }
  fa_cp_wait_all();  // (only empty groups are left: every round's copies were waited for)
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, off);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, off);
  }

  // merge the W warps: their rows' (max, sum) and O through shared memory (over the stages), thread d
  // handling dimensions d, d + T, ... of each row
  __syncthreads();
  float* sm_o = reinterpret_cast<float*>(adm_smem);  // [W][16][256]
  float* sm_ml = sm_o + W * 16 * 256;                 // [W][16][2]
#pragma unroll
  for (int n = 0; n < 32; ++n) {
    if constexpr (VR) {  // n-tile n's columns 2 t4, 2 t4 + 1: dims 32 (n / 4) + 8 t4 + n % 4 and 4 past it
      const int d = 32 * (n >> 2) + 8 * t4 + (n & 3);
      sm_o[(warp * 16 + g) * 256 + d] = o[n][0];
      sm_o[(warp * 16 + g) * 256 + d + 4] = o[n][1];
      sm_o[(warp * 16 + g + 8) * 256 + d] = o[n][2];
      sm_o[(warp * 16 + g + 8) * 256 + d + 4] = o[n][3];
    } else {
      const int d = 8 * n + 2 * t4;
      *reinterpret_cast<float2*>(sm_o + (warp * 16 + g) * 256 + d) = make_float2(o[n][0], o[n][1]);
      *reinterpret_cast<float2*>(sm_o + (warp * 16 + g + 8) * 256 + d) = make_float2(o[n][2], o[n][3]);
    }
  }
  if (t4 == 0) {
    sm_ml[(warp * 16 + g) * 2] = m_a;
    sm_ml[(warp * 16 + g) * 2 + 1] = l_a;
    sm_ml[(warp * 16 + g + 8) * 2] = m_b;
    sm_ml[(warp * 16 + g + 8) * 2 + 1] = l_b;
  }
  __syncthreads();
  adm_merge<G, W, 16, C>(sm_o, sm_ml, part_ml, part_acc, ((size_t)m * Hq + kvh * G) * nsplit + split, nsplit,
                         (size_t)Hq * nsplit, tid);
#endif
}
