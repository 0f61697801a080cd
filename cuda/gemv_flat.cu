// Flat decode GEMV: every warp of one resident wave streams the same number of weight bytes.
//
// gemv_rs hands out whole row groups: a 34816x5120 gate|up is 17408 pairs over 4224 resident warps,
// 4.1 pairs each, so the last round runs a fifth of the warps and the memory system idles through the
// kernel's tail (bench/NOTES-decode.md, session 5). Here the matrix is one sequence of tiles (a tile:
// one row's 32 consecutive 16-byte chunks, one load per lane; a group's tiles are its rows' tiles in
// order: the gate row, then the up row for SwiGLU), and warp w of W takes tiles [T w / W, T (w+1) / W).
// The grid is exactly the resident wave, so every warp starts at once and ends at about the same time.
//
// A group cut by a range boundary is finished by whichever of its two warps gets there second: each
// writes its reduced partial to its side of the boundary's slot, fences, and counts on the boundary's
// counter; the second adds left + right (a fixed order: the same bits whoever comes last), applies the
// epilogue and resets the counter for the next launch. Ranges are at least a group long (the host
// bounds W), so a group spans at most two warps.
//
// Loads are double-buffered: the next U tiles are requested before the current U are decoded, and the
// first U before the programmatic-dependent-launch wait (weights depend on no kernel), so a launch
// streams while the kernel before it finishes. x arrives pre-staged (fp16 pairs, slot-major blocks of 32
// chunks, stage_x); rows must be whole tiles (K a multiple of 1024 values; GemvPlan checks).
// Epilogues: STORE / PARTIAL (one slice) y = acc, ADD y += acc, SWIGLU y = silu(gate) * up.
#include "common.cuh"

template <int FMT>
struct FlatTile {
  uint4 w;
  uint2 hb;
  float sc;
};

template <int FMT, int M, int U>
__global__ void __launch_bounds__(256, U == 2 ? 4 : 3) gemv_flat(
    const unsigned char* __restrict__ base, const unsigned char* __restrict__ high,
    const __half* __restrict__ scales, int ngroups, int gpr, int pair_stride, const uint4* __restrict__ xh,
    const float* __restrict__ xinv, float* __restrict__ y, int ldy, int epi, float* __restrict__ bnd,
    unsigned int* __restrict__ cnt) {
  using F = Fmt<FMT>;
  const int u4_per_row = gpr * 2;
  const int tpr = u4_per_row >> 5;          // tiles a row
  const int rpg = pair_stride > 0 ? 2 : 1;  // rows a group
  const int upg = rpg * tpr;                // tiles a group
  const long long T = (long long)ngroups * upg;
  const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
  const int W = gridDim.x * wpb, w = blockIdx.x * wpb + (threadIdx.x >> 5);
  const long long t0 = T * w / W, t1 = T * (w + 1) / W;
  const int n_t = (int)(t1 - t0);

  // the load cursor: group, row within the group, tile within the row
  int lg = (int)(t0 / upg), lr = (int)(t0 % upg) / tpr, lj = (int)(t0 % upg) % tpr;
  auto load = [&](FlatTile<FMT>* b, int left) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u < left) {
        const int row = lr ? lg + pair_stride : lg;
        const int j = lj * 32 + lane;
        const size_t rg = (size_t)row * gpr + (j >> 1);
        b[u].w = __ldg(reinterpret_cast<const uint4*>(base) + (size_t)row * u4_per_row + j);
        b[u].sc = __half2float(scales[rg]);
        if constexpr (FMT == FMT_Q5) {
          b[u].hb = make_uint2(__ldg(reinterpret_cast<const unsigned int*>(high + rg * F::HB + (j & 1) * 4)), 0u);
        } else if constexpr (FMT == FMT_Q6) {
          b[u].hb = __ldg(reinterpret_cast<const uint2*>(high + rg * F::HB + (j & 1) * 8));
        } else {
          b[u].hb = make_uint2(0u, 0u);
        }
        if (++lj == tpr) {
          lj = 0;
          if (++lr == rpg) { lr = 0; ++lg; }
        }
      }
    }
  };
  FlatTile<FMT> cur[U], nxt[U];
  load(cur, n_t);
  NI_PDL_ENTRY();

  float inv_sc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) inv_sc[m] = xinv[m];
  const DecodeK dk = decode_constants(gpr > 0 ? 1u : 0u);

  // the compute cursor, and the group being accumulated (acc0: its first row, acc1: the up row)
  int cg = (int)(t0 / upg), cr = (int)(t0 % upg) / tpr, cj = (int)(t0 % upg) % tpr;
  int open = cg;
  bool open_head = (t0 % upg) != 0;  // the open group began in warp w - 1
  float acc0[M], acc1[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc0[m] = acc1[m] = 0.f;

  auto finish = [&](int g, const float* v0, const float* v1) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float* out = y + (size_t)m * ldy + g;
      if (epi == EPI_SWIGLU) *out = silu(v0[m]) * v1[m];
      else if (epi == EPI_ADD) *out += v0[m];
      else *out = v0[m];
    }
  };
  // the open group is done in this warp: reduce, then finish it or meet the other warp at the boundary
  auto flush = [&](bool tail) {
    float v0[M], v1[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      v0[m] = warp_sum(acc0[m]) * inv_sc[m];
      v1[m] = rpg == 2 ? warp_sum(acc1[m]) * inv_sc[m] : 0.f;
      acc0[m] = acc1[m] = 0.f;
    }
    if (lane != 0) return;
    if (!open_head && !tail) {
      finish(open, v0, v1);
      return;
    }
    const int b = open_head ? w : w + 1;  // boundary b lies between warps b - 1 (left) and b (right)
    const int side = open_head ? 1 : 0;
    float* mine = bnd + ((size_t)b * 2 + side) * 2 * M;
    const float* other = bnd + ((size_t)b * 2 + (1 - side)) * 2 * M;
#pragma unroll
    for (int m = 0; m < M; ++m) { mine[m] = v0[m]; mine[M + m] = v1[m]; }
    __threadfence();
    if (atomicAdd(cnt + b, 1u) == 1u) {
      __threadfence();
      float s0[M], s1[M];
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float o0 = __ldcg(other + m), o1 = __ldcg(other + M + m);
        s0[m] = side ? o0 + v0[m] : v0[m] + o0;
        s1[m] = side ? o1 + v1[m] : v1[m] + o1;
      }
      finish(open, s0, s1);
      cnt[b] = 0u;
    }
  };

  const uint4* xs4 = xh;
  const int xrow4 = u4_per_row * 4;  // uint4 of staged pairs a token row (rows are whole 32-chunk blocks)
  for (int t = 0; t < n_t; t += U) {
    if (t + U < n_t) load(nxt, n_t - t - U);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (t + u < n_t) {
        if (cg != open) {
          flush(false);
          open = cg;
          open_head = false;
        }
        const uint4* xp = xs4 + cj * 128 + lane;
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const float d = cur[u].sc * dot_u4<FMT>(cur[u].w, cur[u].hb, xp + (size_t)m * xrow4, 0, dk);
          if (cr == 0) acc0[m] += d;
          else acc1[m] += d;
        }
        if (++cj == tpr) {
          cj = 0;
          if (++cr == rpg) { cr = 0; ++cg; }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) cur[u] = nxt[u];
  }
  if (n_t > 0) flush((t1 % upg) != 0);
}
