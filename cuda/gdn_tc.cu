// The chunked GDN prefill's in-order pass on tensor cores (gdn_chunk_scan_tc<RB>). Compiled into a module
// of its own (engine/ops/kernels.py module_tc: common.cuh + this file), so that a machine whose NVRTC
// headers lack mma.h loses only this path. The layouts and the algorithm are gdn_chunk_scan's (gdn_chunked.cu).
#include "common.cuh"
#define GC_T 64

// Pass 2 on tensor cores (NINFER_GDN_TC=1): the same recurrence over the pieces as gdn_chunk_scan, its
// four products (W S0^T, Q S0^T, M U, (e^(G_L - G) o U)^T K) as WMMA m16n16k8 tiles in 3xTF32 (each
// operand split into a TF32 head and a TF32 remainder; the three products that matter keep fp32-level
// accuracy), elementwise steps on the CUDA cores. Shared rows padded to multiples of 4 floats (WMMA's
// leading dimensions). grid (Hv, 128 / RB), 256 threads, GDN_SCAN_TC_SMEM(RB) bytes.
#include <mma.h>
#define GT_KS 132
#define GT_MS 68
#define GDN_SCAN_TC_SMEM(RB) (4 * ((RB) * GT_KS + 3 * GC_T * GT_KS + GC_T * GT_MS + 3 * GC_T * ((RB) + 4) + 3 * GC_T))

namespace gdn_tc {
using namespace nvcuda;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> FragAr;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::col_major> FragAc;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> FragBr;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> FragBc;
typedef wmma::fragment<wmma::accumulator, 16, 16, 8, float> FragC;

// frag -> (head, remainder) in TF32; `neg` negates both
template <typename F>
__device__ __forceinline__ void split(F& hi, F& lo, bool neg = false) {
#pragma unroll
  for (int i = 0; i < hi.num_elements; ++i) {
    const float v = neg ? -hi.x[i] : hi.x[i];
    const float h = wmma::__float_to_tf32(v);
    hi.x[i] = h;
    lo.x[i] = wmma::__float_to_tf32(v - h);
  }
}

// c += a b in 3xTF32 (a_hi b_hi + a_hi b_lo + a_lo b_hi)
template <typename FA, typename FB>
__device__ __forceinline__ void mma3(FragC& c, FA& ah, FA& al, FB& bh, FB& bl) {
  wmma::mma_sync(c, al, bh, c);
  wmma::mma_sync(c, ah, bl, c);
  wmma::mma_sync(c, ah, bh, c);
}
}  // namespace gdn_tc

template <int RB>
__global__ void __launch_bounds__(256, 1) gdn_chunk_scan_tc(
    const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ Wg,
    const float* __restrict__ Ug, const float* __restrict__ Mg, const float* __restrict__ Gg,
    float* __restrict__ state, float* __restrict__ o, int Hk, int Hv, int tiled, int T) {
  using namespace gdn_tc;
  NI_PDL_ENTRY();
  constexpr int US = RB + 4;
  constexpr int JT = RB / 16;  // column tiles of U (16 wide)
  extern __shared__ __align__(32) float gsm[];
  float* Ss = gsm;                  // [RB][132]
  float* Ws = Ss + RB * GT_KS;      // [64][132]
  float* Qs = Ws + GC_T * GT_KS;    // [64][132]
  float* Ks = Qs + GC_T * GT_KS;    // [64][132]
  float* Ms = Ks + GC_T * GT_KS;    // [64][68]
  float* Us = Ms + GC_T * GT_MS;    // [64][RB + 4]: U', then U
  float* Ts = Us + GC_T * US;       // [64][RB + 4]: S0 q, then e^(G_L - G) o U
  float* Os = Ts + GC_T * US;       // [64][RB + 4]: M U
  float* Gs = Os + GC_T * US;       // [64]
  float* EG = Gs + GC_T;            // [64]
  float* TL = EG + GC_T;            // [64]
  const int h = blockIdx.x, dv0 = blockIdx.y * RB, tid = threadIdx.x, warp = tid >> 5;
  const int kh = tiled ? h % Hk : h / (Hv / Hk);
  float* sg = state + ((size_t)h * 128 + dv0) * 128;
  for (int i = tid; i < RB * 128; i += 256) Ss[(i >> 7) * GT_KS + (i & 127)] = sg[i];
  const int pieces = (T + GC_T - 1) / GC_T;
  for (int piece = 0; piece < pieces; ++piece) {
    const int c0 = piece * GC_T, n = min(GC_T, T - c0);
    const size_t ph = (size_t)piece * Hv + h;
    gdn_piece_load<RB, GT_KS, GT_MS, US>(qn, kn, Wg, Ug, Mg, Gg, Hk, kh, dv0, c0, n, ph, Ws, Ks, Qs, Ms, Us, Gs, EG, TL);
    __syncthreads();
    // U = U' - W S0^T and S0 q: tiles (16 rows, 16 columns) of the 64 x RB outputs
    for (int tile = warp; tile < 4 * JT; tile += 8) {
      const int ti = tile / JT, tj = tile % JT;
      FragC cu, cq;
      wmma::load_matrix_sync(cu, Us + ti * 16 * US + tj * 16, US, wmma::mem_row_major);
      wmma::fill_fragment(cq, 0.f);
      for (int k = 0; k < 128; k += 8) {
        FragAr wh, wl, qh, ql;
        FragBc sh, sl;  // S0^T: element (k, j) at Ss[j * 132 + k]
        wmma::load_matrix_sync(wh, Ws + ti * 16 * GT_KS + k, GT_KS);
        wmma::load_matrix_sync(qh, Qs + ti * 16 * GT_KS + k, GT_KS);
        wmma::load_matrix_sync(sh, Ss + tj * 16 * GT_KS + k, GT_KS);
        split(wh, wl, true);
        split(qh, ql);
        split(sh, sl);
        mma3(cu, wh, wl, sh, sl);
        mma3(cq, qh, ql, sh, sl);
      }
      wmma::store_matrix_sync(Us + ti * 16 * US + tj * 16, cu, US, wmma::mem_row_major);
      wmma::store_matrix_sync(Ts + ti * 16 * US + tj * 16, cq, US, wmma::mem_row_major);
    }
    __syncthreads();
    // M U
    for (int tile = warp; tile < 4 * JT; tile += 8) {
      const int ti = tile / JT, tj = tile % JT;
      FragC c;
      wmma::fill_fragment(c, 0.f);
      for (int k = 0; k < GC_T; k += 8) {
        FragAr mh, ml;
        FragBr uh, ul;
        wmma::load_matrix_sync(mh, Ms + ti * 16 * GT_MS + k, GT_MS);
        wmma::load_matrix_sync(uh, Us + k * US + tj * 16, US);
        split(mh, ml);
        split(uh, ul);
        mma3(c, mh, ml, uh, ul);
      }
      wmma::store_matrix_sync(Os + ti * 16 * US + tj * 16, c, US, wmma::mem_row_major);
    }
    __syncthreads();
    // O = e^G (S0 q) + M U to global; Ts becomes e^(G_L - G) o U for the state update
    for (int i = tid; i < GC_T * RB; i += 256) {
      const int t = i / RB, j = i % RB;
      if (t < n) o[((size_t)(c0 + t) * Hv + h) * 128 + dv0 + j] = EG[t] * Ts[t * US + j] + Os[t * US + j];
    }
    __syncthreads();
    for (int i = tid; i < GC_T * RB; i += 256) {
      const int t = i / RB, j = i % RB;
      Ts[t * US + j] = t < n ? TL[t] * Us[t * US + j] : 0.f;
    }
    __syncthreads();
    // S1 = e^(G_L) S0 + (e^(G_L - G) o U)^T K: tiles of the RB x 128 state rows
    {
      const float el = EG[n - 1];
      for (int tile = warp; tile < JT * 8; tile += 8) {
        const int si = tile / 8, sd = tile % 8;
        FragC c;
        wmma::load_matrix_sync(c, Ss + si * 16 * GT_KS + sd * 16, GT_KS, wmma::mem_row_major);
#pragma unroll
        for (int e = 0; e < c.num_elements; ++e) c.x[e] *= el;
        for (int k = 0; k < GC_T; k += 8) {
          FragAc ah, al;  // (T o U)^T: element (j, t) at Ts[t * US + j]
          FragBr kh2, kl2;
          wmma::load_matrix_sync(ah, Ts + k * US + si * 16, US);
          wmma::load_matrix_sync(kh2, Ks + k * GT_KS + sd * 16, GT_KS);
          split(ah, al);
          split(kh2, kl2);
          mma3(c, ah, al, kh2, kl2);
        }
        wmma::store_matrix_sync(Ss + si * 16 * GT_KS + sd * 16, c, GT_KS, wmma::mem_row_major);
      }
    }
    __syncthreads();  // the next piece overwrites the shared rows and reads the new S
  }
  for (int i = tid; i < RB * 128; i += 256) sg[i] = Ss[(i >> 7) * GT_KS + (i & 127)];
}
