// The chunked GDN prefill's in-order pass on tensor cores (gdn_chunk_scan_tc<RB, Q1>), after gdn_tc.cu in the
// tensor-core module (kernels.TC_SOURCES): its gtc helpers, layouts and constants are that file's.
#include "common.cuh"

// Pass 2 on tensor cores: grid (Hv, 128 / RB), 256 threads, GDN_SCAN_TC_SMEM(RB) bytes;
// value head h's state rows [y RB, y RB + RB) walk the pieces in order (gdn_chunk_scan's recurrence):
//   P1  U = U' - W S0^T, QS = Q S0^T   warp: m-tiles {p, 3 - p} (p = warp & 1) x RB / 32 n-tiles, K = 128
//   P2  O = e^G o QS + M U (M's tiles above the diagonal skipped), the same tiles, from P1's registers
//       S1 = e^(G_L) S0 + (e^(G_L - G) o U)^T K   warp: one 16-row m-tile x RB / 8 n-tiles of 8 columns
// Loads overlap the other phase (cp.async): K, M of piece p during P1(p); W, Q, U' of piece p + 1 during
// P2(p) (U' double-buffered: U of piece p is read in P2(p)). Three block barriers a piece.
// Q1 = 1: QS and M U, which reach only the output (gdn_output_bf16), in 1xTF32 (one mma from the TF32 heads,
// no remainders split off); U and S1, which reach the state, stay 3xTF32 (Q1 = 1: QS and M U in 1xTF32).
// Estimates: smem (RB = 64) 4 (64 x 132 + 2 x 64 x 132 + 64 x 136 + 64 x 68 + 2 x 64 x 72 + 128) = 190,976 B,
// (RB = 32) 157,696 B: one block an SM, so RB = 64 (96 blocks, one wave on 132 SMs) is the one to run
// (RB = 32: 192 blocks, two waves). mma.sync a piece and block: 3 x (16 x 2 x 2 x RB / 32 x 8 [P1] + 10 x
// RB / 32 x 8 [O] + 8 x RB / 8 x 8 [S1]) = 84 RB = 5,376 at RB = 64; at ~0.5 mma/clk/SM ~10.8 K cycles,
// ~5.5 us a piece, 128 pieces ~0.7 ms a layer: ~35 ms for 48 layers at T = 8192 (expected 35-50 ms with the
// barriers and fragment splits; the CUDA-core pass: 221 ms).
#define GDN_SCAN_TC_SMEM(RB) \
  (4 * ((RB) * GT_KS + 2 * GC_T * GT_KS + GC_T * GT_KB + GC_T * GT_MS + 2 * GC_T * ((RB) + 8) + 2 * GC_T))
template <int RB, int Q1 = 0>
__global__ void __launch_bounds__(256, 1) gdn_chunk_scan_tc(
    const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ Wg,
    const float* __restrict__ Ug, const float* __restrict__ Mg, const float* __restrict__ Gg,
    float* __restrict__ state, float* __restrict__ o, int Hk, int Hv, int tiled, int T) {
  using namespace gtc;
  static_assert(RB % 32 == 0 && RB <= 128, "RB: 32, 64 or 128");
  NI_PDL_ENTRY();
  constexpr int US = RB + 8;
  constexpr int NQ = RB / 32;    // P1 / O: n-tiles a warp
  constexpr int WPM = 128 / RB;  // S1: warps a 16-row m-tile
  constexpr int NS = RB / 8;     // S1: n-tiles a warp
  extern __shared__ __align__(16) float gssm[];
  float* Ss = gssm;                 // [RB][132] state rows
  float* Ws = Ss + RB * GT_KS;      // [64][132]
  float* Qs = Ws + GC_T * GT_KS;    // [64][132]
  float* Ks = Qs + GC_T * GT_KS;    // [64][136]
  float* Ms = Ks + GC_T * GT_KB;    // [64][68]
  float* Ub = Ms + GC_T * GT_MS;    // 2 x [64][RB + 8]: U' of a piece, then its U
  float* EG = Ub + 2 * GC_T * US;   // [64] e^G
  float* TL = EG + GC_T;            // [64] e^(G_L - G), zero past the piece's valid rows
  const int h = blockIdx.x, dv0 = blockIdx.y * RB, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int lg = lane >> 2, lc = lane & 3;
  const int kh = tiled ? h % Hk : h / (Hv / Hk);
  const int pieces = (T + GC_T - 1) / GC_T;
  const size_t qrow = (size_t)Hk * 128;
  // W, Q and U' of piece p into their buffers (U' into Ub[p & 1])
  auto load_wqu = [&](int p) {
    const int pc0 = p * GC_T, pn = min(GC_T, T - pc0);
    const size_t pph = (size_t)p * Hv + h;
    cp_rows128(Ws, GT_KS, Wg + pph * GC_T * 128, 128, GC_T);
    cp_rows128(Qs, GT_KS, qn + ((size_t)pc0 * Hk + kh) * 128, qrow, pn);
    float* ub = Ub + (p & 1) * GC_T * US;
    for (int i = tid; i < GC_T * RB / 4; i += 256) {
      const int t = i / (RB / 4), j4 = (i % (RB / 4)) * 4;
      cp16(ub + t * US + j4, Ug + (pph * GC_T + t) * 128 + dv0 + j4, true);
    }
  };
  load_wqu(0);
  cp_commit();
  float* sg = state + ((size_t)h * 128 + dv0) * 128;
  for (int i = tid; i < RB * 32; i += 256)
    *reinterpret_cast<float4*>(Ss + (i >> 5) * GT_KS + (i & 31) * 4) = reinterpret_cast<const float4*>(sg)[i];
  const int pm = warp & 1, nq = warp >> 1;               // P1 / O tiles
  const int sm = warp / WPM, sn0 = (warp % WPM) * NS;    // S1 tiles
  for (int piece = 0; piece < pieces; ++piece) {
    const int c0 = piece * GC_T, n = min(GC_T, T - c0);
    const size_t ph = (size_t)piece * Hv + h;
    __syncthreads();  // (a) P2 of the last piece done: K, M, EG, TL free
    cp_rows128(Ks, GT_KB, kn + ((size_t)c0 * Hk + kh) * 128, qrow, n);
    for (int i = tid; i < GC_T * 16; i += 256) cp16(Ms + (i >> 4) * GT_MS + (i & 15) * 4, Mg + ph * GC_T * GC_T + i * 4, true);
    cp_commit();
    const float gv = tid < GC_T ? Gg[ph * GC_T + tid] : 0.f, gl = Gg[ph * GC_T + n - 1];
    cp_wait<1>();
    __syncthreads();  // (b) W, Q, U' of this piece in
    float* Us = Ub + (piece & 1) * GC_T * US;
    // P1: U = U' - W S0^T (u), Q S0^T (qs)
    float u[2][NQ][4], qs[2][NQ][4];
#pragma unroll
    for (int mm = 0; mm < 2; ++mm) {
      const int mt = mm ? 3 - pm : pm;
#pragma unroll
      for (int j = 0; j < NQ; ++j) {
        const float* p = Us + (mt * 16 + lg) * US + (nq * NQ + j) * 8 + 2 * lc;
        const float2 u0 = *reinterpret_cast<const float2*>(p), u1 = *reinterpret_cast<const float2*>(p + 8 * US);
        u[mm][j][0] = u0.x; u[mm][j][1] = u0.y; u[mm][j][2] = u1.x; u[mm][j][3] = u1.y;
#pragma unroll
        for (int e = 0; e < 4; ++e) qs[mm][j][e] = 0.f;
      }
    }
#pragma unroll 2
    for (int ks = 0; ks < 16; ++ks) {
      FB b[NQ];
#pragma unroll
      for (int j = 0; j < NQ; ++j) b[j] = ldb_tr(Ss + (nq * NQ + j) * 8 * GT_KS + ks * 8, GT_KS);
#pragma unroll
      for (int mm = 0; mm < 2; ++mm) {
        const int mt = mm ? 3 - pm : pm;
        const FA aw = lda_row(Ws + mt * 16 * GT_KS + ks * 8, GT_KS, -1.f);
        const FA aq = Q1 ? lda_row1(Qs + mt * 16 * GT_KS + ks * 8, GT_KS) : lda_row(Qs + mt * 16 * GT_KS + ks * 8, GT_KS);
#pragma unroll
        for (int j = 0; j < NQ; ++j) {
          mma3(u[mm][j], aw, b[j]);
          if (Q1) mma1(qs[mm][j], aq, b[j]);
          else mma3(qs[mm][j], aq, b[j]);
        }
      }
    }
#pragma unroll
    for (int mm = 0; mm < 2; ++mm) {
      const int mt = mm ? 3 - pm : pm;
#pragma unroll
      for (int j = 0; j < NQ; ++j) {
        float* p = Us + (mt * 16 + lg) * US + (nq * NQ + j) * 8 + 2 * lc;
        *reinterpret_cast<float2*>(p) = make_float2(u[mm][j][0], u[mm][j][1]);
        *reinterpret_cast<float2*>(p + 8 * US) = make_float2(u[mm][j][2], u[mm][j][3]);
      }
    }
    if (tid < GC_T) {
      EG[tid] = expf(gv);
      TL[tid] = tid < n ? expf(gl - gv) : 0.f;
    }
    cp_wait<0>();
    __syncthreads();  // (c) U, K, M, EG, TL in; W, Q and the other U' buffer free
    if (piece + 1 < pieces) load_wqu(piece + 1);
    cp_commit();
    // P2: O = e^G o QS + M U
#pragma unroll
    for (int mm = 0; mm < 2; ++mm) {
      const int mt = mm ? 3 - pm : pm, r0 = mt * 16 + lg;
      const float e0 = EG[r0], e1 = EG[r0 + 8];
#pragma unroll
      for (int j = 0; j < NQ; ++j) {
        qs[mm][j][0] *= e0; qs[mm][j][1] *= e0; qs[mm][j][2] *= e1; qs[mm][j][3] *= e1;
      }
      for (int ks = 0; ks < 2 * mt + 2; ++ks) {
        if (Q1) {
          const FA a = lda_row1(Ms + mt * 16 * GT_MS + ks * 8, GT_MS);
#pragma unroll
          for (int j = 0; j < NQ; ++j) mma1(qs[mm][j], a, ldb_row1(Us + ks * 8 * US + (nq * NQ + j) * 8, US));
        } else {
          const FA a = lda_row(Ms + mt * 16 * GT_MS + ks * 8, GT_MS);
#pragma unroll
          for (int j = 0; j < NQ; ++j) mma3(qs[mm][j], a, ldb_row(Us + ks * 8 * US + (nq * NQ + j) * 8, US));
        }
      }
#pragma unroll
      for (int j = 0; j < NQ; ++j) {
        float* op = o + ((size_t)(c0 + r0) * Hv + h) * 128 + dv0 + (nq * NQ + j) * 8 + 2 * lc;
        if (r0 < n) *reinterpret_cast<float2*>(op) = make_float2(qs[mm][j][0], qs[mm][j][1]);
        if (r0 + 8 < n) *reinterpret_cast<float2*>(op + (size_t)8 * Hv * 128) = make_float2(qs[mm][j][2], qs[mm][j][3]);
      }
    }
    // P2: S1 = e^(G_L) S0 + (TL o U)^T K over this warp's tiles of the state rows (read and written by it only)
    {
      const float el = EG[n - 1];
      float sa[NS][4];
#pragma unroll
      for (int j = 0; j < NS; ++j) {
        const float* p = Ss + (sm * 16 + lg) * GT_KS + (sn0 + j) * 8 + 2 * lc;
        const float2 s0 = *reinterpret_cast<const float2*>(p), s1 = *reinterpret_cast<const float2*>(p + 8 * GT_KS);
        sa[j][0] = el * s0.x; sa[j][1] = el * s0.y; sa[j][2] = el * s1.x; sa[j][3] = el * s1.y;
      }
#pragma unroll 2
      for (int ks = 0; ks < 8; ++ks) {
        const FA a = lda_tr(Us + ks * 8 * US + sm * 16, US, TL + ks * 8);
#pragma unroll
        for (int j = 0; j < NS; ++j) mma3(sa[j], a, ldb_row(Ks + ks * 8 * GT_KB + (sn0 + j) * 8, GT_KB));
      }
#pragma unroll
      for (int j = 0; j < NS; ++j) {
        float* p = Ss + (sm * 16 + lg) * GT_KS + (sn0 + j) * 8 + 2 * lc;
        *reinterpret_cast<float2*>(p) = make_float2(sa[j][0], sa[j][1]);
        *reinterpret_cast<float2*>(p + 8 * GT_KS) = make_float2(sa[j][2], sa[j][3]);
      }
    }
  }
  cp_wait<0>();
  __syncthreads();
  for (int i = tid; i < RB * 32; i += 256)
    reinterpret_cast<float4*>(sg)[i] = *reinterpret_cast<const float4*>(Ss + (i >> 5) * GT_KS + (i & 31) * 4);
}
