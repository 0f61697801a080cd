// The delta rule over a prefill chunk in its chunked (WY) form, in two passes (the token-by-token forms,
// and their layouts, are gdn.cu's). Pass 1 (gdn_chunk_prep) and the in-order pass on tensor cores
// (gdn_chunk_scan_tc) are gdn_tc.cu's; this file has the in-order pass on the CUDA cores.
#include "common.cuh"

// For a 64-token piece with cumulative log decay G, start state S0 (engine.ops.ref.gdn_chunked):
//   A[t][s] = beta_t e^(G_t - G_s) k_t.k_s (s < t),  M[t][s] = e^(G_t - G_s) q_t.k_s (s <= t)
//   W = (I + A)^-1 (beta e^G K),  U' = (I + A)^-1 (beta V)      -- no S0: every piece at once (pass 1)
//   U = U' - W S0^T,  O = e^G (Q S0^T) + M U,  S1 = e^(G_L) S0 + U^T (e^(G_L - G) o K)   -- in order (pass 2)
// Same inputs and outputs as gdn_delta_rows (q pre-scaled, state [Hv][128][128] fp32 updated in place,
// o [T][Hv][128]); the pieces' W, U' [P][Hv][64][128], M [P][Hv][64][64] and G [P][Hv][64] pass through
// global scratch. Rows past the prompt's end are zero in W and U', so they add nothing.
#define GC_T 64
#define GC_KS 129  // row stride (floats) of 128-wide rows in shared memory: a warp's column reads hit 32 banks
#define GC_MS 65
#define GDN_SCAN_SMEM(RB) (4 * ((RB) * GC_KS + 3 * GC_T * GC_KS + GC_T * GC_MS + GC_T * ((RB) + 1) + 3 * GC_T))

// Pass 2 (after gdn_chunk_prep): grid (Hv, 128 / RB), 256 threads, GDN_SCAN_SMEM(RB) bytes: value head h's state rows
// [y RB, y RB + RB) walk the pieces in order.
template <int RB>
__global__ void __launch_bounds__(256, 1) gdn_chunk_scan(
    const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ Wg,
    const float* __restrict__ Ug, const float* __restrict__ Mg, const float* __restrict__ Gg,
    float* __restrict__ state, float* __restrict__ o, int Hk, int Hv, int tiled, int T) {
  NI_PDL_ENTRY();
  constexpr int US = RB + 1;
  constexpr int JQ = RB / 8;   // U and O: 2 rows x JQ columns a thread
  constexpr int JR = RB / 16;  // S1: JR rows x 8 columns a thread
  extern __shared__ float gsm[];
  float* Ss = gsm;                  // [RB][129]
  float* Ws = Ss + RB * GC_KS;      // [64][129]
  float* Qs = Ws + GC_T * GC_KS;    // [64][129]
  float* Ks = Qs + GC_T * GC_KS;    // [64][129]
  float* Ms = Ks + GC_T * GC_KS;    // [64][65]
  float* Us = Ms + GC_T * GC_MS;    // [64][RB + 1]: U', then U
  float* Gs = Us + GC_T * US;       // [64]
  float* EG = Gs + GC_T;            // [64]
  float* TL = EG + GC_T;            // [64]
  const int h = blockIdx.x, dv0 = blockIdx.y * RB, tid = threadIdx.x;
  const int kh = tiled ? h % Hk : h / (Hv / Hk);
  float* sg = state + ((size_t)h * 128 + dv0) * 128;
  for (int i = tid; i < RB * 128; i += 256) Ss[(i >> 7) * GC_KS + (i & 127)] = sg[i];
  const int t4 = (tid >> 3) * 2, j4 = (tid & 7) * JQ;
  const int j7 = (tid >> 4) * JR, d7 = tid & 15;
  const int pieces = (T + GC_T - 1) / GC_T;
  for (int piece = 0; piece < pieces; ++piece) {
    const int c0 = piece * GC_T, n = min(GC_T, T - c0);
    const size_t ph = (size_t)piece * Hv + h;
    gdn_piece_load<RB, GC_KS, GC_MS, US>(qn, kn, Wg, Ug, Mg, Gg, Hk, kh, dv0, c0, n, ph, Ws, Ks, Qs, Ms, Us, Gs, EG, TL);
    __syncthreads();
    // U = U' - W S0^T and Q S0^T, 2 rows x JQ columns a thread
    float qs[2][JQ];
    {
      float ws[2][JQ];
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < JQ; ++j) ws[i][j] = qs[i][j] = 0.f;
      for (int d = 0; d < 128; ++d) {
        float sv[JQ];
#pragma unroll
        for (int j = 0; j < JQ; ++j) sv[j] = Ss[(j4 + j) * GC_KS + d];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float wv = Ws[(t4 + i) * GC_KS + d], qv = Qs[(t4 + i) * GC_KS + d];
#pragma unroll
          for (int j = 0; j < JQ; ++j) {
            ws[i][j] = fmaf(wv, sv[j], ws[i][j]);
            qs[i][j] = fmaf(qv, sv[j], qs[i][j]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < JQ; ++j) Us[(t4 + i) * US + j4 + j] -= ws[i][j];
    }
    __syncthreads();
    // O = e^G (Q S0^T) + M U
    {
      float acc[2][JQ];
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < JQ; ++j) acc[i][j] = EG[t4 + i] * qs[i][j];
      for (int s = 0; s < GC_T; ++s) {
        const float m0 = Ms[t4 * GC_MS + s], m1 = Ms[(t4 + 1) * GC_MS + s];
#pragma unroll
        for (int j = 0; j < JQ; ++j) {
          const float u = Us[s * US + j4 + j];
          acc[0][j] = fmaf(m0, u, acc[0][j]);
          acc[1][j] = fmaf(m1, u, acc[1][j]);
        }
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int t = t4 + i;
        if (t < n) {
#pragma unroll
          for (int j = 0; j < JQ; ++j) o[((size_t)(c0 + t) * Hv + h) * 128 + dv0 + j4 + j] = acc[i][j];
        }
      }
    }
    // S1 = e^(G_L) S0 + U^T (e^(G_L - G) o K): each thread rewrites only the S entries it reads here
    {
      const float el = EG[n - 1];
      float sn[JR][8];
#pragma unroll
      for (int r = 0; r < JR; ++r)
#pragma unroll
        for (int i = 0; i < 8; ++i) sn[r][i] = el * Ss[(j7 + r) * GC_KS + d7 + 16 * i];
      for (int t = 0; t < n; ++t) {
        const float tl = TL[t];
        float u[JR];
#pragma unroll
        for (int r = 0; r < JR; ++r) u[r] = Us[t * US + j7 + r] * tl;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float kv = Ks[t * GC_KS + d7 + 16 * i];
#pragma unroll
          for (int r = 0; r < JR; ++r) sn[r][i] = fmaf(u[r], kv, sn[r][i]);
        }
      }
#pragma unroll
      for (int r = 0; r < JR; ++r)
#pragma unroll
        for (int i = 0; i < 8; ++i) Ss[(j7 + r) * GC_KS + d7 + 16 * i] = sn[r][i];
    }
    __syncthreads();  // the next piece overwrites the shared rows and reads the new S
  }
  for (int i = tid; i < RB * 128; i += 256) sg[i] = Ss[(i >> 7) * GC_KS + (i & 127)];
}
