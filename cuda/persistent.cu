// Building blocks of the persistent decode launches (mlp_fused.cu): a grid barrier in two halves, a warp's
// rows of a row-split GEMV over pre-staged pairs (gemv_rs_pre's loads and arithmetic) and a block's own RMS norm
// of the residual row. Device functions only; kernels.SOURCES puts this file before its users.
#pragma once
#include "common.cuh"

#define MLP_THREADS 1024  // (the persistent launches' block)

// grid_barrier in two halves: arrive (every thread of the block; thread 0 gets the count to wait for) and wait, so
// that a block can issue loads that the barrier need not wait for (its fence would) between the two.
// light (mlp_fused's local_stage bit 2, moe_fused's MOE_OPT_LIGHT_BAR): thread 0 arrives with a release atomic instead
// of a fence and a relaxed atomic, and does not fence again after its acquire load (the block's barrier after it
// orders the other threads' reads behind that load): the same ordering in the PTX memory model, less waiting.
__device__ __forceinline__ unsigned long long grid_arrive(unsigned long long* ctr, bool light = false) {
  __syncthreads();
  unsigned long long target = 0;
  if (threadIdx.x == 0) {
    const unsigned long long n = gridDim.x;
    unsigned long long old;
    if (light) {
      asm volatile("atom.add.release.gpu.global.u64 %0, [%1], 1;" : "=l"(old) : "l"(ctr) : "memory");
    } else {
      __threadfence();
      old = atomicAdd(ctr, 1ull);
    }
    target = (old / n + 1) * n;
  }
  return target;
}
__device__ __forceinline__ void grid_wait(unsigned long long* ctr, unsigned long long target, bool light = false) {
  if (threadIdx.x == 0) {
    const long long t0 = clock64();
    unsigned long long cur;
    do {
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(cur) : "l"(ctr) : "memory");
      if (clock64() - t0 > (1ll << 32)) __trap();
    } while (cur < target);
    if (!light) __threadfence();
  }
  __syncthreads();
}

// All blocks of the grid: every block's prior writes visible to every block after it. `ctr` only grows (a
// launch adds gridDim.x per barrier), so it needs no reset as long as every launch on it has the same grid.
__device__ __forceinline__ void grid_barrier(unsigned long long* ctr, bool light = false) {
  grid_wait(ctr, grid_arrive(ctr, light), light);
}

// The red form (mlp_fused's local_stage bit 4, moe_fused's MOE_OPT_RED; its waits are the light ones): thread 0 reads
// the counter once at entry (grid_count: no block of this launch can pass its first barrier before this block arrives,
// so the count floors to the launch's base), and arrives with a release reduction that returns nothing: its poll goes
// out right behind it instead of after the atomic's round trip. Barrier b of the launch (0, 1, ...) waits for base + (b
// + 1) n. The count is used at the first arrival only (its load in flight through the first phase), which keeps the
// next target in shared memory (*next), not in a register across the launch.
__device__ __forceinline__ unsigned long long grid_count(const unsigned long long* ctr) {
  unsigned long long c = 0;
  if (threadIdx.x == 0) asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(c) : "l"(ctr) : "memory");
  return c;
}
__device__ __forceinline__ unsigned long long grid_arrive_red(unsigned long long* ctr, unsigned long long count,
                                                              bool first, unsigned long long* next) {
  __syncthreads();
  unsigned long long target = 0;
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u64 [%0], 1;" :: "l"(ctr) : "memory");
    const unsigned long long n = gridDim.x;
    target = first ? (count / n + 1) * n : *next;
    *next = target + n;
  }
  return target;
}

// A launch's grid barriers in the form its flags choose (red, light or fenced; red waits light): `arrive` returns what
// thread 0 then waits for (grid_wait(ctr, t, light)); `next`: a shared word for the red form's next target.
struct GridBar {
  unsigned long long* ctr;
  unsigned long long count;  // (thread 0, red: the counter at entry)
  unsigned long long* next;
  bool red, light, first;
  __device__ __forceinline__ GridBar(unsigned long long* c, bool red_, bool light_, unsigned long long* next_)
      : ctr(c), count(red_ ? grid_count(c) : 0ull), next(next_), red(red_), light(red_ || light_), first(true) {}
  __device__ __forceinline__ unsigned long long arrive() {
    if (!red) return grid_arrive(ctr, light);
    const unsigned long long t = grid_arrive_red(ctr, count, first, next);
    first = false;
    return t;
  }
};

// Thread 0 of each block writes %globaltimer (ns) to tstamp[block x 8 + i] where tstamp != nullptr: a persistent
// launch's phase boundaries, for bench/'s probes.
__device__ __forceinline__ void phase_stamp(unsigned long long* tstamp, int i) {
  if (tstamp != nullptr && threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    tstamp[blockIdx.x * 8 + i] = t;
  }
}

// One warp's rows of a row-split GEMV over pre-staged pairs (gemv_rs_pre's loads and arithmetic): `start` sets the
// row pointers of a row group, `load` issues the next U iterations' weight, scale and high-bit loads (lane j0 + 32 i),
// `run` multiplies them with x (xat(i, c): slot c of iteration i's chunk) into acc, loading the rest as it goes.
template <int FMT, int ROWS, int U>
struct WarpRows {
  using F = Fmt<FMT>;
  const uint4* wp[ROWS];
  const __half* sp[ROWS];
  const unsigned char* hp[ROWS];
  uint4 w[U][ROWS];
  uint2 hb[U][ROWS];
  float sc[U][ROWS];
  int iters, i;

  __device__ __forceinline__ void start(const unsigned char* base, const unsigned char* high, const __half* scales,
                                        int gpr, const int (&row)[ROWS], int j0, int n_iters) {
    iters = n_iters;
    i = 0;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      wp[r] = reinterpret_cast<const uint4*>(base) + (size_t)row[r] * gpr * 2 + j0;
      sp[r] = scales + (size_t)row[r] * gpr + (j0 >> 1);
      hp[r] = high + ((size_t)row[r] * gpr + (j0 >> 1)) * F::HB + (j0 & 1) * (F::HB / 2);
    }
  }

  // split-K item `it` of an [n, gpr x 64] matrix (row group it / splits, slice it % splits of u4ps chunks; rows past n
  // clamped to n - 1): its rows started and the first loads issued (mlp_fused's o-projection and down items)
  __device__ __forceinline__ void start_item(const unsigned char* base, const unsigned char* high, const __half* scales,
                                             int gpr, int n, int it, int splits, int u4ps, int lane) {
    const int grp = it / splits, s = it - grp * splits;
    const int js = s * u4ps, je = min(js + u4ps, gpr * 2);
    int rows[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) rows[r] = min(grp * ROWS + r, n - 1);
    start(base, high, scales, gpr, rows, js + lane, je - js > lane ? (je - js - lane + 31) >> 5 : 0);
    load();
  }

  __device__ __forceinline__ void load() {
    load_row_chunks<FMT>(w, hb, sc, wp, sp, hp, i, iters);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      wp[r] += 32 * U;
      sp[r] += 16 * U;
      hp[r] += 16 * F::HB * U;
    }
  }

  // the loaded iterations i .. i + U - 1 into acc; then the next U loads, if any (the caller loaded the first)
  // XS: x has a scale a 32-value chunk, xs(i) that of iteration i's chunk (mlp_fused's chunk-scaled pairs)
  template <bool XS = false, typename XAt, typename XSc = float (*)(int)>
  __device__ __forceinline__ void run(float (&acc)[ROWS], XAt xat, XSc xs = nullptr) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.f;
    for (; i < iters;) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (i + u < iters) {
          uint4 xv[4];
#pragma unroll
          for (int c = 0; c < 4; ++c) xv[c] = xat(i + u, c);
          float xsu = 1.f;
          if constexpr (XS) xsu = xs(i + u);
#pragma unroll
          for (int r = 0; r < ROWS; ++r) {
            const float d = dot_core<FMT>(w[u][r], hb[u][r], [&](int c) { return xv[c]; }, 0);
            if constexpr (XS) acc[r] += (sc[u][r] * xsu) * d;
            else acc[r] += sc[u][r] * d;
          }
        }
      }
      i += U;
      if (i < iters) load();
    }
  }
};

// The persistent launch's norm (mlp_fused; formerly gdn_in_fused too, in git history at 509b065): x_out = x_in +
// planes; every block computes rmsnorm(x_out) (1 + w) into its own shared memory (the fp32 values xf, then the staged
// pairs at smem), with residual_rmsnorm_mb's operations in its order (the same bits). `load` issues the first loads
// (x_in, 1 + w, the first plane), so that a kernel can issue its first weight loads behind them before `finish`.
// Returns the pairs' inverse scale.
template <int VPT>
struct RowNorm {
  float v[VPT], wv[VPT], p0[VPT];

  __device__ __forceinline__ void load(const float* __restrict__ x_in, const float* __restrict__ norm_w,
                                       const float* __restrict__ part, int nplanes, int H) {
#pragma unroll
    for (int k8 = 0; k8 < VPT; ++k8) {
      const int k = threadIdx.x + k8 * MLP_THREADS;
      v[k8] = k < H ? x_in[k] : 0.f;
      wv[k8] = k < H ? 1.f + norm_w[k] : 0.f;
      p0[k8] = k < H && nplanes > 0 ? __ldcg(part + k) : 0.f;  // (L2: the launch may rewrite the planes)
    }
  }

  // x_in and 1 + w only (the o-projection's launch: before its barrier; the planes after it, load_planes2)
  __device__ __forceinline__ void load_xw(const float* __restrict__ x_in, const float* __restrict__ norm_w, int H) {
#pragma unroll
    for (int k8 = 0; k8 < VPT; ++k8) {
      const int k = threadIdx.x + k8 * MLP_THREADS;
      v[k8] = k < H ? x_in[k] : 0.f;
      wv[k8] = k < H ? 1.f + norm_w[k] : 0.f;
    }
  }
  // the first two planes in one round of loads, added in order (finish then starts at plane 2: s_from = 2)
  __device__ __forceinline__ void load_planes2(const float* __restrict__ part, int nplanes, int part_stride, int H) {
    float q1[VPT];
#pragma unroll
    for (int k8 = 0; k8 < VPT; ++k8) {
      const int k = threadIdx.x + k8 * MLP_THREADS;
      p0[k8] = k < H && nplanes > 0 ? __ldcg(part + k) : 0.f;
      q1[k8] = k < H && nplanes > 1 ? __ldcg(part + part_stride + k) : 0.f;
    }
#pragma unroll
    for (int k8 = 0; k8 < VPT; ++k8) {
      v[k8] += p0[k8];
      v[k8] += q1[k8];
    }
  }

  __device__ __forceinline__ float finish(const float* __restrict__ part, int nplanes, int part_stride, int H,
                                          float eps, int kpad_h, float* __restrict__ x_out, float* red,
                                          unsigned char* smem, int s_from = 1) {
    const int tid = threadIdx.x;
    float* xf = reinterpret_cast<float*>(smem + (size_t)kpad_h * 2);
    if (nplanes > 0 && s_from == 1) {
#pragma unroll
      for (int k8 = 0; k8 < VPT; ++k8) v[k8] += p0[k8];
    }
    for (int s = s_from; s < nplanes; ++s) {
      float pv[VPT];
#pragma unroll
      for (int k8 = 0; k8 < VPT; ++k8) {
        const int k = tid + k8 * MLP_THREADS;
        pv[k8] = k < H ? __ldcg(part + (size_t)s * part_stride + k) : 0.f;
      }
#pragma unroll
      for (int k8 = 0; k8 < VPT; ++k8) v[k8] += pv[k8];
    }
    float ss, mx;
    row_sumsq_max(v, wv, red, ss, mx);
    const float r = rsqrtf(ss / H + eps);
    const float sc = pow2_scale(mx * r);
#pragma unroll
    for (int k8 = 0; k8 < VPT; ++k8) {
      const int k = tid + k8 * MLP_THREADS;
      if (k < kpad_h) xf[k] = k < H ? v[k8] * r * wv[k8] : 0.f;
      if (k < H && blockIdx.x == 0) x_out[k] = v[k8];
    }
    __syncthreads();
    unsigned int* dst = reinterpret_cast<unsigned int*>(smem);
    for (int p = tid; p < kpad_h / 2; p += MLP_THREADS) {
      const int jl = p >> 4, pi = p & 15, c = pi >> 2, jp = pi & 3;
      const int ka = jl * 32 + 8 * c + stage_a(jp);
      dst[(jl >> 5) * 512 + c * 128 + (jl & 31) * 4 + jp] = stage_pack(xf[ka] * sc, xf[ka + STAGE_GAP] * sc);
    }
    __syncthreads();
    return 1.f / sc;
  }
};
