// Decode GEMV with the weights streamed by the copy engine (cp.async.bulk, sm_90): one block an SM, a producer
// warp and NW consumer warps, a ring of S stages in shared memory (q4/q5/q6 row-split planes, one token,
// pre-staged int16 x pairs).
//
// Why: the register kernels (gemv_rs, gemv_rs_pre) hold at most U x ROWS x 16 B a lane in flight, 41-65 KB an SM,
// and each warp waits for its loads before it decodes; the q5 shapes stay at 67-76% of the copy bandwidth and
// every GEMV pays a ramp. Here the bytes in flight do not cost registers: the producer keeps S stages of
// whole rows requested (up to ~190 KB an SM) with a few bulk copies a stage, and the consumers decode from
// shared memory with the same dp2a arithmetic (dot_i16). (Session 4's per-lane cp.async ring issued three
// small copies a chunk and lost to the register kernel; this one issues three or six a stage.)
//
// Work: block b takes the contiguous groups [b ng / nb, (b+1) ng / nb) (a group: one row, or for SwiGLU the
// gate row g and the up row g + pair_stride), so blocks differ by at most one group. A stage holds RS = NW / P
// groups' rows (all P pieces of each: consecutive rows are contiguous in every plane, so a stage is one bulk copy
// a plane, two for SwiGLU); consumer warp w decodes piece w % P of group w / P of the stage. P > 1 (split K):
// EPI_PARTIAL's piece p writes plane p (plane_stride floats apart), which the next norm sums as it sums split-K
// planes; SwiGLU's P warps of a group add their sums through shared memory (named barrier 2 + group) first.
// Barriers: full[s] (the producer's expect_tx, completed by the copies), empty[s] (NW consumer arrivals).
// Layout of a stage (RSL = RS row slots, 2 RS for SwiGLU: gate rows then up rows): codes RSL x gpr x 32 B, then
// scales RSL x gpr x 2 B, then high bits RSL x gpr x HB B; gpr % 8 == 0 keeps every part 16-byte aligned.
// Shared memory: the x pairs (kpad x 2 B, one bulk copy), S stages, 2 S + 1 barriers.
//
// Measured (H200, session 13; bench/NOTES-decode.md): correct everywhere (tests/gpu/test_gemv.py), but not faster
// than gemv_rs_pre where it matters: fast sweep gate|up 27.2 us against 25.8, down 19.2 against 17.8, v|z 15.8
// against 14.3, o-projection 8.3 against 8.6; in the step the MLP on it (CudaQwen35.MLP_TMA, with the x prologues
// below) 146.4 against 146.9 tok/s. With the weights streaming, not registers, as the bound on bytes in flight,
// the GEMVs are no faster: what the register kernels lose to the copy rate is not bytes in flight. Kept in the
// experimental module, off, as the base of a persistent (several ops a launch) decode.
#include "common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define NI_TMA 1
#else
#define NI_TMA 0
#endif

__device__ __forceinline__ unsigned int smem_addr(const void* p) { return (unsigned int)__cvta_generic_to_shared(p); }

#if NI_TMA
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned int bytes) {
  unsigned long long state;
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], %2;" : "=l"(state) : "r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  unsigned long long state;
  asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];" : "=l"(state) : "r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned int parity) {
  unsigned int done = 0;
  while (!done) {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
  }
}
// bytes (a multiple of 16, both addresses 16-byte aligned) from global to this block's shared memory; completes
// `bytes` of bar's transaction count
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, unsigned int bytes, unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}
#endif

#define GEMV_TMA_PARAMS                                                                                          \
  const unsigned char* __restrict__ base, const unsigned char* __restrict__ high,                                \
      const unsigned char* __restrict__ scales, int N, int gpr, int pair_stride, const uint4* __restrict__ xh,   \
      const float* __restrict__ xinv, int kpad, int P, float* __restrict__ y, int plane_stride, int epi,         \
      unsigned int* __restrict__ amax_slot, int S, int pro, const float* __restrict__ x_in, float* __restrict__ x_out, \
      const float* __restrict__ part, int nplanes, int part_stride, const float* __restrict__ norm_w, int H,     \
      float eps, unsigned int* __restrict__ slot_in

// The x prologues (pro): GEMV_PRO_PAIRS copies the pre-staged pairs (xh, xinv); GEMV_PRO_NORM is residual_rmsnorm's
// work done by every block while its producer already streams weights: x = x_in + the nplanes partial planes, out =
// rmsnorm(x) (1 + norm_w) staged as the pairs (block 0 also writes x to x_out, the next norm's residual), so the
// norm kernel and a kernel boundary go; GEMV_PRO_AMAX stages the fp32 row xh (H values) with the scale of the
// largest |value| its producer folded into slot_in[0] (stage_x_amax's pairs, bit for bit), the last block to take
// a ticket in slot_in[1] resetting both words.
#define GEMV_PRO_PAIRS 0
#define GEMV_PRO_NORM 1
#define GEMV_PRO_AMAX 2

// The NORM / AMAX prologue of gemv_tma on its NW consumer warps (named barrier 1): stage the x pairs into xs (slot-major,
// as stage_slice writes them); returns 1 / the scale.
#define TMA_VPT 16  // values a consumer thread holds in the NORM prologue (H <= 8,192 with 16 consumer warps)
template <int NW>
__device__ __forceinline__ float tma_prologue(int pro, unsigned char* xs, int kpad, const float* __restrict__ row,
                                              const float* __restrict__ x_in, float* __restrict__ x_out,
                                              const float* __restrict__ part, int nplanes, int part_stride,
                                              const float* __restrict__ norm_w, int H, float eps,
                                              unsigned int* __restrict__ slot_in) {
  constexpr int NT = NW * 32;
  __shared__ float red[2][32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  unsigned int* dst = reinterpret_cast<unsigned int*>(xs);
  float sc;
  if (pro == GEMV_PRO_NORM) {  // (H <= NT x TMA_VPT; every load of a round issued before its first use)
    float* scr = reinterpret_cast<float*>(xs + (size_t)kpad * 2);  // x, then (1 + w), kpad floats each
    float* wscr = scr + kpad;
    float v[TMA_VPT], wv[TMA_VPT];
#pragma unroll
    for (int i = 0; i < TMA_VPT; ++i) {
      const int k = tid + i * NT;
      v[i] = k < H ? x_in[k] : 0.f;
      wv[i] = k < H ? 1.f + norm_w[k] : 0.f;
    }
    for (int s = 0; s < nplanes; ++s) {
      float pv[TMA_VPT];
#pragma unroll
      for (int i = 0; i < TMA_VPT; ++i) {
        const int k = tid + i * NT;
        pv[i] = k < H ? part[(size_t)s * part_stride + k] : 0.f;
      }
#pragma unroll
      for (int i = 0; i < TMA_VPT; ++i) v[i] += pv[i];
    }
    float ss = 0.f, mx = 0.f;
#pragma unroll
    for (int i = 0; i < TMA_VPT; ++i) {
      const int k = tid + i * NT;
      if (k < kpad) {
        scr[k] = v[i];
        wscr[k] = wv[i];
      }
      if (k < H && blockIdx.x == 0) x_out[k] = v[i];
      ss += v[i] * v[i];
      mx = fmaxf(mx, fabsf(v[i] * wv[i]));
    }
    ss = warp_sum(ss);
    mx = warp_max(mx);
    if (lane == 0) {
      red[0][warp] = ss;
      red[1][warp] = mx;
    }
    asm volatile("bar.sync 1, %0;" :: "n"(NT) : "memory");
    ss = warp_sum(lane < NW ? red[0][lane] : 0.f);
    mx = warp_max(lane < NW ? red[1][lane] : 0.f);
    const float r = rsqrtf(ss / H + eps);
    sc = pow2_scale(mx * r);
    for (int p = tid; p < kpad / 2; p += NT) {
      const int jl = p >> 4, pi = p & 15, c = pi >> 2, jp = pi & 3;
      const int ka = jl * 32 + 8 * c + stage_a(jp), kb = ka + STAGE_GAP;
      dst[(jl >> 5) * 512 + c * 128 + (jl & 31) * 4 + jp] =
          stage_pack(scr[ka] * r * wscr[ka] * sc, scr[kb] * r * wscr[kb] * sc);  // (zeros past H)
    }
  } else {  // GEMV_PRO_AMAX
    if (tid == 0) red[0][0] = __uint_as_float(__ldcg(slot_in));
    asm volatile("bar.sync 1, %0;" :: "n"(NT) : "memory");
    sc = pow2_scale(red[0][0]);
    if (tid == 0 && atomicAdd(slot_in + 1, 1u) == gridDim.x - 1) {  // every block has read slot_in[0]
      slot_in[0] = 0u;
      slot_in[1] = 0u;
    }
    constexpr int B = 8;  // pairs a thread loads before it stores them
    for (int p0 = tid; p0 < kpad / 2; p0 += B * NT) {
      float a[B], b[B];
#pragma unroll
      for (int u = 0; u < B; ++u) {
        const int p = p0 + u * NT;
        const int jl = p >> 4, pi = p & 15, c = pi >> 2, jp = pi & 3;
        const int ka = jl * 32 + 8 * c + stage_a(jp), kb = ka + STAGE_GAP;
        a[u] = p < kpad / 2 && ka < H ? __ldcg(row + ka) : 0.f;
        b[u] = p < kpad / 2 && kb < H ? __ldcg(row + kb) : 0.f;
      }
#pragma unroll
      for (int u = 0; u < B; ++u) {
        const int p = p0 + u * NT;
        if (p < kpad / 2) {
          const int jl = p >> 4, pi = p & 15, c = pi >> 2, jp = pi & 3;
          dst[(jl >> 5) * 512 + c * 128 + (jl & 31) * 4 + jp] = stage_pack(a[u] * sc, b[u] * sc);
        }
      }
    }
  }
  asm volatile("bar.sync 1, %0;" :: "n"(NT) : "memory");
  return 1.f / sc;
}

template <int FMT, int NW>
__global__ void __launch_bounds__((NW + 1) * 32, 1) gemv_tma(GEMV_TMA_PARAMS) {
#if NI_TMA
  using F = Fmt<FMT>;
  static_assert(F::VPU == 32 && NI_XI16, "q4-q6 on int16 x pairs");
  constexpr int HB = F::HB;
  const bool swiglu = epi == EPI_SWIGLU;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int u4_per_row = gpr * 2, rowb = gpr * 32;
  const int ng = swiglu ? N - pair_stride : N;
  const int g_lo = (int)((long long)blockIdx.x * ng / gridDim.x), g_hi = (int)((long long)(blockIdx.x + 1) * ng / gridDim.x);
  const int RS = NW / P;  // groups a stage
  const int RSL = swiglu ? 2 * RS : RS;  // row slots a stage
  const int T = (g_hi - g_lo + RS - 1) / RS;  // stages this block fills
  const unsigned int stage_bytes = (unsigned int)RSL * gpr * (32 + 2 + HB);

  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned long long* bars = reinterpret_cast<unsigned long long*>(smem_raw);  // full[S], empty[S], x
  unsigned char* xs = smem_raw + 128 * ((2 * S + 1) * 8 / 128 + 1);
  unsigned char* ring = xs + (size_t)kpad * (pro == GEMV_PRO_NORM ? 10 : 2);  // (NORM: x and 1 + w after the pairs)
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(bars + s, 1);
      mbar_init(bars + S + s, NW);
    }
    mbar_init(bars + 2 * S, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  NI_PDL_ENTRY();

  if (warp == NW) {  // producer
    if (lane == 0) {
      if (pro == GEMV_PRO_PAIRS) {
        mbar_expect_tx(bars + 2 * S, (unsigned int)kpad * 2);
        bulk_g2s(xs, xh, (unsigned int)kpad * 2, bars + 2 * S);
      }
      for (int t = 0; t < T; ++t) {
        const int s = t % S;
        if (t >= S) mbar_wait(bars + S + s, ((t / S) - 1) & 1);
        const int g0 = g_lo + t * RS, nr = min(RS, g_hi - g0);
        unsigned char* st = ring + (size_t)s * stage_bytes;
        const int halves = swiglu ? 2 : 1;
        mbar_expect_tx(bars + s, (unsigned int)(halves * nr * gpr * (32 + 2 + HB)));
        for (int h = 0; h < halves; ++h) {
          const size_t r0 = (size_t)g0 + h * pair_stride;  // first row of this half
          const int slot0 = h * RS;
          bulk_g2s(st + (size_t)slot0 * rowb, base + r0 * rowb, (unsigned int)(nr * rowb), bars + s);
          bulk_g2s(st + (size_t)RSL * rowb + (size_t)slot0 * gpr * 2, scales + r0 * gpr * 2, (unsigned int)(nr * gpr * 2), bars + s);
          if constexpr (HB > 0)
            bulk_g2s(st + (size_t)RSL * gpr * 34 + (size_t)slot0 * gpr * HB, high + r0 * gpr * HB,
                     (unsigned int)(nr * gpr * HB), bars + s);
        }
      }
    }
    return;
  }

  // consumers
  float inv;
  if (pro == GEMV_PRO_PAIRS) {
    inv = xinv[0];
    mbar_wait(bars + 2 * S, 0);
  } else {
    inv = tma_prologue<NW>(pro, xs, kpad, reinterpret_cast<const float*>(xh), x_in, x_out, part, nplanes, part_stride,
                           norm_w, H, eps, slot_in);
  }
  const int q = warp / P, p = warp % P;  // this warp's group of a stage, and its piece of the group's rows
  const int js = p * u4_per_row / P, je = (p + 1) * u4_per_row / P;
  __shared__ float red_sw[2][NW][2];  // SwiGLU pieces' sums (P > 1), by stage parity
  const uint4* xs4 = reinterpret_cast<const uint4*>(xs);
  float wrote = 0.f;
  for (int t = 0; t < T; ++t) {
    const int s = t % S;
    const int g0 = g_lo + t * RS, nr = min(RS, g_hi - g0);
    mbar_wait(bars + s, (t / S) & 1);
    const unsigned char* st = ring + (size_t)s * stage_bytes;
    constexpr int R = 2;  // rows a group at most (SwiGLU)
    float acc[R] = {0.f, 0.f};
    const bool live = q < nr;
    if (live) {
      const int nrow = swiglu ? 2 : 1;
#pragma unroll 2
      for (int j = js + lane; j < je; j += 32) {
        uint4 xv[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) xv[c] = xs4[(j >> 5) * 128 + c * 32 + (j & 31)];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (r < nrow) {
            const int slot = q + r * RS;
            const uint4 w = reinterpret_cast<const uint4*>(st + (size_t)slot * rowb)[j];
            const int gi = slot * gpr + (j >> 1);
            const float sc = __half2float(reinterpret_cast<const __half*>(st + (size_t)RSL * rowb)[gi]);
            uint2 hb = make_uint2(0u, 0u);
            if constexpr (FMT == FMT_Q5) {
              hb.x = reinterpret_cast<const unsigned int*>(st + (size_t)RSL * gpr * 34)[gi * 2 + (j & 1)];
            } else if constexpr (FMT == FMT_Q6) {
              hb = reinterpret_cast<const uint2*>(st + (size_t)RSL * gpr * 34)[gi * 2 + (j & 1)];
            }
            acc[r] += sc * dot_i16<FMT>(w, hb, [&](int c) { return xv[c]; });
          }
        }
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(bars + S + s);  // this warp is done with the stage
    if (live) {
      if (swiglu) {
        float v0 = warp_sum(acc[0]), v1 = warp_sum(acc[1]);
        if (P > 1) {  // the group's P warps meet at barrier 2 + q; piece 0 adds the pieces in order
          if (lane == 0) {
            red_sw[t & 1][warp][0] = v0;
            red_sw[t & 1][warp][1] = v1;
          }
          asm volatile("bar.sync %0, %1;" :: "r"(2 + q), "r"(P * 32) : "memory");
          if (p == 0) {
            v0 = 0.f;
            v1 = 0.f;
            for (int i = 0; i < P; ++i) {
              v0 += red_sw[t & 1][q * P + i][0];
              v1 += red_sw[t & 1][q * P + i][1];
            }
          }
        }
        if (p == 0 && lane == 0) {
          const float o = silu(v0 * inv) * (v1 * inv);
          y[g0 + q] = o;
          wrote = fmaxf(wrote, fabsf(o));
        }
      } else {
        const float v0 = warp_sum(acc[0]) * inv;
        if (lane == 0) y[(size_t)p * plane_stride + g0 + q] = v0;
      }
    }
  }
  if (swiglu && amax_slot != nullptr && lane == 0 && wrote > 0.f) atomicMax(amax_slot, __float_as_uint(wrote));
#else
  __trap();  // sm_90 only (kernels.tma_capable)
#endif
}

// Dynamic shared memory of gemv_tma with S stages (kernels.gemv_tma_smem mirrors it): barriers, the pairs (and for
// the NORM prologue the fp32 row), the stages.
