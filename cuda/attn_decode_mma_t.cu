// attn_decode_mma_t: the transposed int8 decode attention (split from attn_decode_mma.cu; compiled right after it in
// the module, kernels.SOURCES: it uses that file's adm_* helpers and attn_prefill.cu's fa_* ones).
#include "common.cuh"
// The transposed int8 form (CudaQwen35.ATTN_TR; same arguments and partials as attn_decode_mma; raw K and V codes of an
// int8 cache only; G <= 8). attn_decode_mma's 16-row tile holds the G query heads (6 on the 27B: 10 rows of padding in
// every MMA and accumulator); here the tokens are the MMAs' 16 rows and the heads one n8 tile: S^T = K Q^T (K's codes as
// A fragments: a k-step's two bytes of a token by PRMT, Q's dims in their natural order, a lane's 4 k-steps of a 64-dim
// group one 16-byte load), the online softmax down the C fragment's columns (a head's maximum across the 8 lanes of a
// quad column), P^T packed and moved into B fragments by movmatrix.trans, O^T = V^T P^T over 16 m-tiles of dims (m-tile
// i, row r: dim 64 (i / 4) + 4 (r % 8) + 32 (r / 8) + i % 4, so that a lane's A fragments of a group's 4 m-tiles are two
// 32-bit loads a token; the tokens' group scales on P^T as VRAW puts them on P). Half the MMAs and 64 accumulator
// registers, so that MINB blocks of W warps fit an SM (kernel_names.ATTN_MMA_T_FORMS). dev/emu_attn_tr.py replays a
// warp's lanes in NumPy. Shared memory ADT_SMEM(W, NS): Q as fp16 [8][ADT_QLD], then each warp's NS raw stages.
#define ADT_QLD 264
#define ADT_SMEM(W, NS) (8 * ADT_QLD * 2 + (W) * (NS) * ADM_RAW)
template <int G, int W, int NS, int MINB>
__global__ void __launch_bounds__(32 * W, MINB) attn_decode_mma_t(ATTN_DECODE_PARAMS) {
#if NI_PRE_SM80  // below sm_80: never launched (kernels.mma_ok)
  __trap();
#else
  static_assert(G >= 1 && G <= 8, "one n8 tile of query heads");
  static_assert(W >= 1 && W <= 16 && NS >= 1, "a form");
  static_assert(W * 8 * 258 * 4 <= ADT_SMEM(W, NS), "merge room");
  constexpr int T = 32 * W, RT = 16 * W;  // threads; tokens a round
  constexpr float LOG2E = 1.4426950408889634f;
  extern __shared__ __align__(16) unsigned short adt_smem[];
  NI_PDL_ENTRY();
  const int kvh = blockIdx.x, split = blockIdx.y, m = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
  const int Hq = Hkv * G;
  const int L = pos[m] + 1;
  const int per = (((L + nsplit - 1) / nsplit + 15) / 16) * 16;  // nsplit * per >= L; rounds in one page
  const int t0 = split * per, t1 = min(t0 + per, L);
  const int* pt = page_table + (size_t)m * pt_stride;
  unsigned short* Qs = adt_smem;
  unsigned char* wbase = reinterpret_cast<unsigned char*>(adt_smem + 8 * ADT_QLD) + warp * NS * ADM_RAW;
  const int nr = t1 - t0 > 16 * warp ? (t1 - t0 - 16 * warp + RT - 1) / RT : 0;  // the warp's rounds
  const unsigned stage0 = fa_smem_addr(wbase);
#pragma unroll
  for (int i = 0; i < NS - 1; ++i) {  // the first rounds asked for before Q is even staged
    if (i < nr) adm_issue<true>(stage0 + i * ADM_RAW, kc, vc, ks, vsc, pt, Hkv, kvh, t0 + 16 * warp + RT * i, t1, lane);
    fa_cp_commit();
  }
  // Q: the G heads scaled, as fp16 in natural dim order (heads past G zero); 1152 x each 64-dim group's sum
  for (int i = tid; i < 8 * 64; i += T) {
    const int r = i >> 6, c = (i & 63) * 4;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < G) v = *reinterpret_cast<const float4*>(q + ((size_t)m * Hq + kvh * G + r) * 256 + c);
    uint2 p;
    p.x = fa_pack<false>(v.x * scale, v.y * scale);
    p.y = fa_pack<false>(v.z * scale, v.w * scale);
    *reinterpret_cast<uint2*>(Qs + r * ADT_QLD + c) = p;
  }
  __syncthreads();
  __shared__ float qsum[8][4];
  if (tid < 32) {
    const int r = tid >> 2, gq = tid & 3;
    float t = 0.f;
    for (int d = 0; d < 64; d += 2) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(Qs + r * ADT_QLD + 64 * gq + d));
      t += f.x + f.y;
    }
    qsum[r][gq] = 1152.f * t;
  }
  __syncthreads();
  float qs0[4], qs1[4];  // heads 2 t4, 2 t4 + 1 (this lane's C columns)
#pragma unroll
  for (int gq = 0; gq < 4; ++gq) {
    qs0[gq] = qsum[2 * t4][gq];
    qs1[gq] = qsum[2 * t4 + 1][gq];
  }

  float o[16][4];
#pragma unroll
  for (int n = 0; n < 16; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // heads 2 t4, 2 t4 + 1 (log2 units; l: this lane's share)
  const __half2 off = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));  // 1152
  const unsigned short* qrow = Qs + g * ADT_QLD + 16 * t4;  // B fragments: head g
  int st = 0;
  for (int i = 0; i < nr; ++i) {
    const int tb = t0 + 16 * warp + RT * i;
    {  // round i + NS - 1 into the stage round i - 1 used
      const int ia = i + NS - 1, sa = st == 0 ? NS - 1 : st - 1;
      if (ia < nr) adm_issue<true>(stage0 + sa * ADM_RAW, kc, vc, ks, vsc, pt, Hkv, kvh, tb + RT * (NS - 1), t1, lane);
      fa_cp_commit();
    }
    adm_cp_wait<NS - 1>();
    __syncwarp();
    const unsigned char* raw = wbase + st * ADM_RAW;
    // S^T: tokens g, g + 8 (rows) x heads 2 t4, 2 t4 + 1 (columns), a 64-dim group at a time
    const uint2 kscl = *reinterpret_cast<const uint2*>(raw + 8192 + g * 8);        // token g's 4 group scales
    const uint2 ksch = *reinterpret_cast<const uint2*>(raw + 8192 + (g + 8) * 8);  // token g + 8's
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int gq = 0; gq < 4; ++gq) {
      const uint4 kl = *reinterpret_cast<const uint4*>(raw + g * 256 + 64 * gq + 16 * t4);
      const uint4 kh = *reinterpret_cast<const uint4*>(raw + (g + 8) * 256 + 64 * gq + 16 * t4);
      float sg[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const unsigned ul = (j == 0 ? kl.x : j == 1 ? kl.y : j == 2 ? kl.z : kl.w) ^ 0x80808080u;
        const unsigned uh = (j == 0 ? kh.x : j == 1 ? kh.y : j == 2 ? kh.z : kh.w) ^ 0x80808080u;
        const unsigned a[4] = {__byte_perm(ul, 0x64646464u, 0x4140), __byte_perm(uh, 0x64646464u, 0x4140),
                               __byte_perm(ul, 0x64646464u, 0x4342), __byte_perm(uh, 0x64646464u, 0x4342)};
        const uint2 qb = *reinterpret_cast<const uint2*>(qrow + 64 * gq + 4 * j);
        fa_mma<false>(sg, a, qb.x, qb.y);
      }
      const unsigned wl = gq < 2 ? kscl.x : kscl.y, wh = gq < 2 ? ksch.x : ksch.y;
      const float sl = __half2float(__ushort_as_half((unsigned short)((gq & 1) ? wl >> 16 : wl & 0xFFFF)));
      const float sh = __half2float(__ushort_as_half((unsigned short)((gq & 1) ? wh >> 16 : wh & 0xFFFF)));
      s[0] += sl * (sg[0] - qs0[gq]);
      s[1] += sl * (sg[1] - qs1[gq]);
      s[2] += sh * (sg[2] - qs0[gq]);
      s[3] += sh * (sg[3] - qs1[gq]);
    }
    // the online softmax down the columns: a head's maximum over its 16 tokens across the quad column's 8 lanes
    const int nv = t1 - tb;
    s[0] = g < nv ? s[0] * LOG2E : -INFINITY;
    s[1] = g < nv ? s[1] * LOG2E : -INFINITY;
    s[2] = g + 8 < nv ? s[2] * LOG2E : -INFINITY;
    s[3] = g + 8 < nv ? s[3] * LOG2E : -INFINITY;
    float mx0 = fmaxf(s[0], s[2]), mx1 = fmaxf(s[1], s[3]);
#pragma unroll
    for (int o2 = 4; o2 < 32; o2 <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
    }
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float ms0 = mn0 == -INFINITY ? 0.f : mn0, ms1 = mn1 == -INFINITY ? 0.f : mn1;
    const float c0 = exp2f(m0 - ms0), c1 = exp2f(m1 - ms1);
    m0 = mn0;
    m1 = mn1;
    const float p0 = exp2f(s[0] - ms0), p1 = exp2f(s[1] - ms1), p2 = exp2f(s[2] - ms0), p3 = exp2f(s[3] - ms1);
    l0 = l0 * c0 + p0 + p2;
    l1 = l1 * c1 + p1 + p3;
#pragma unroll
    for (int n = 0; n < 16; ++n) {
      o[n][0] *= c0;
      o[n][1] *= c1;
      o[n][2] *= c0;
      o[n][3] *= c1;
    }
    // P^T (tokens x heads, C layout) into B fragments: head g's tokens 2 t4, 2 t4 + 1 (pb0) and 8 past them (pb1)
    unsigned pb0, pb1;
    const unsigned top = fa_pack<false>(p0, p1), bot = fa_pack<false>(p2, p3);
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(pb0) : "r"(top));
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(pb1) : "r"(bot));
    // O^T += V^T P^T: each group's scales of tokens 2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9 on P^T, V's codes as A
    uint2 sv[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      sv[k] = *reinterpret_cast<const uint2*>(raw + 8192 + 128 + (2 * t4 + (k & 1) + 8 * (k >> 1)) * 8);
    const unsigned char* vr = raw + 4096;
#pragma unroll
    for (int gr = 0; gr < 4; ++gr) {
      const unsigned sel = (gr & 1) ? 0x7632u : 0x5410u;
      const unsigned s01 = __byte_perm(gr < 2 ? sv[0].x : sv[0].y, gr < 2 ? sv[1].x : sv[1].y, sel);
      const unsigned s89 = __byte_perm(gr < 2 ? sv[2].x : sv[2].y, gr < 2 ? sv[3].x : sv[3].y, sel);
      const unsigned b0 = adm_hmul2(pb0, s01), b1 = adm_hmul2(pb1, s89);
      unsigned lo[4], hi[4];  // [token pair 01 / 89][rows g / g + 8] byte pairs: lo bytes 0-1, hi bytes 2-3
#pragma unroll
      for (int h = 0; h < 4; ++h) {  // h: (token pair h >> 1, rows g + 8 (h & 1))
        const int ta = 2 * t4 + 8 * (h >> 1), d = 64 * gr + 32 * (h & 1) + 4 * g;
        const unsigned wa = *reinterpret_cast<const unsigned*>(vr + ta * 256 + d) ^ 0x80808080u;
        const unsigned wb = *reinterpret_cast<const unsigned*>(vr + (ta + 1) * 256 + d) ^ 0x80808080u;
        lo[h] = __byte_perm(wa, wb, 0x5140u);
        hi[h] = __byte_perm(wa, wb, 0x7362u);
      }
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const unsigned sel2 = (jj & 1) ? 0x4342u : 0x4140u;
        unsigned a[4];
#pragma unroll
        for (int h = 0; h < 4; ++h)  // a0: rows g, tokens 01; a1: rows g + 8; a2: rows g, tokens 89; a3
          a[(h & 1) + 2 * (h >> 1)] = adm_hsub2(__byte_perm(jj < 2 ? lo[h] : hi[h], 0x64646464u, sel2), off);
        fa_mma<false>(o[4 * gr + jj], a, b0, b1);
      }
    }
    __syncwarp();  // every lane done with the stage before the next round's copies reuse it
    st = st + 1 == NS ? 0 : st + 1;
  }
  fa_cp_wait_all();
#pragma unroll
  for (int o2 = 4; o2 < 32; o2 <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
  }
  // merge the W warps through shared memory (over Q and the stages), O's dims back in order
  __syncthreads();
  float* sm_o = reinterpret_cast<float*>(adt_smem);  // [W][8][256]
  float* sm_ml = sm_o + W * 8 * 256;                  // [W][8][2]
#pragma unroll
  for (int n = 0; n < 16; ++n) {
    const int d = 64 * (n >> 2) + 4 * g + (n & 3);
    sm_o[(warp * 8 + 2 * t4) * 256 + d] = o[n][0];
    sm_o[(warp * 8 + 2 * t4 + 1) * 256 + d] = o[n][1];
    sm_o[(warp * 8 + 2 * t4) * 256 + d + 32] = o[n][2];
    sm_o[(warp * 8 + 2 * t4 + 1) * 256 + d + 32] = o[n][3];
  }
  if (g == 0) {
    sm_ml[(warp * 8 + 2 * t4) * 2] = m0;
    sm_ml[(warp * 8 + 2 * t4) * 2 + 1] = l0;
    sm_ml[(warp * 8 + 2 * t4 + 1) * 2] = m1;
    sm_ml[(warp * 8 + 2 * t4 + 1) * 2 + 1] = l1;
  }
  __syncthreads();
  adm_merge<G, W, 8>(sm_o, sm_ml, part_ml, part_acc, ((size_t)m * Hq + kvh * G) * nsplit + split, nsplit, tid);
#endif
}
