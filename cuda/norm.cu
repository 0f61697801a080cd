// Norms of the decode step (fp32 in and out).
//
// residual_rmsnorm: x += sum of split-K partials of the previous projection (deterministic order),
//   then out = rmsnorm(x) * (1 + w) (offset=1) or * w. One block per token row.
// gated_rmsnorm: out[h] = rmsnorm(o[h]) * w * silu(z[h]) per 128-wide GDN value head (plain weight).
#include "common.cuh"

// Multi-block forms (grid (nb, M)): every block reduces over the whole row (redundantly, from L2) and
// then writes only its own slice, so a 5120-wide norm is not left to a single multiprocessor.

// The packed twin (common.cuh pk_word) of the pairs of chunks [c0, c1) this thread just wrote to dst (each thread
// reads back its own words, as the staging loops with stride bd left them), for row pm of pk; nothing where pk is
// nullptr. (A pass of its own, so that the staging loops of the one-token step, which write no twin, keep their
// code: the twin's stores inside them took the 35B-A3B's decode from 527.0 to 524.8 tok/s.)
__device__ __forceinline__ void stage_twin(const __half2* dst, int c0, int c1, int bd, unsigned char* pk, int pm) {
  if (pk == nullptr) return;
  for (int p = c0 * 16 + threadIdx.x; p < c1 * 16; p += bd) {
    const int jl = p >> 4, pi = p & 15, c = pi >> 2, jp = pi & 3;
    const unsigned int w = reinterpret_cast<const unsigned int*>(dst)[(jl >> 5) * 512 + c * 128 + (jl & 31) * 4 + jp];
    pk_word(pk, pm, jl, c, jp, w);
  }
}

// The pairs of chunk range [c0, c1) (32 values a chunk) of a row, given its scale. CG: loads through L2
// only (a row other blocks of the same kernel wrote). pk, pm: the packed twin and the row's index in it, or nullptr.
template <bool CG = false>
__device__ __forceinline__ void stage_slice(const float* xm, int K, int c0, int c1, __half2* dst, float sc,
                                            unsigned char* pk = nullptr, int pm = 0) {
  auto at = [&](int k) { return CG ? __ldcg(xm + k) : xm[k]; };
  for (int p = c0 * 16 + threadIdx.x; p < c1 * 16; p += blockDim.x) {
    const int jl = p >> 4, pi = p & 15, c = pi >> 2, jp = pi & 3;
    const int ka = jl * 32 + 8 * c + stage_a(jp), kb = ka + STAGE_GAP;
    reinterpret_cast<unsigned int*>(dst)[(jl >> 5) * 512 + c * 128 + (jl & 31) * 4 + jp] =
        stage_pack(ka < K ? at(ka) * sc : 0.f, kb < K ? at(kb) * sc : 0.f);
  }
  stage_twin(dst, c0, c1, blockDim.x, pk, pm);
}


// Write x[0:K) (fp32, block-shared input) as the pairs the q4/q5/q6 GEMV decodes (stage_pack), scaled by a
// power of two so that |x| <= STAGE_MAX, in the slot-major order of gemv.cu (blocks of 32 chunks of 32
// values: slot c of chunk j at pair (j >> 5) * 512 + c * 128 + (j & 31) * 4); *xinv = 1 / scale.
// kpad = K rounded up to 1024 (whole blocks); pairs past K are zero.
__device__ void stage_pairs(const float* xm, int K, int kpad, __half2* dst, float* xinv, float* red) {
  float mx = 0.f;
  for (int k = threadIdx.x; k < K; k += blockDim.x) mx = fmaxf(mx, fabsf(xm[k]));
  mx = block_max(mx, red);
  const float sc = pow2_scale(mx);
  stage_slice(xm, K, 0, kpad / 32, dst, sc);
  if (threadIdx.x == 0) *xinv = 1.f / sc;
}


// kpad: the values staged (K rounded up to whole blocks of 1024); ldh: half2 pairs per row of xh (kpad / 2,
// or the whole row's when x is a slice of a row staged into the matching part of the row's pairs).
extern "C" __global__ void stage_x_mb(const float* __restrict__ x, int ldx, int K, int kpad,
                                      __half2* __restrict__ xh, int ldh, float* __restrict__ xinv,
                                      unsigned char* __restrict__ xpk) {
  NI_PDL_ENTRY();
  __shared__ float red[32];
  const int m = blockIdx.y;
  const float* xm = x + (size_t)m * ldx;
  float mx = 0.f;
#pragma unroll 8
  for (int k = threadIdx.x; k < K; k += blockDim.x) mx = fmaxf(mx, fabsf(xm[k]));  // (loads in flight)
  const float sc = pow2_scale(block_max(mx, red));
  const int nch = kpad / 32, per = (nch + gridDim.x - 1) / gridDim.x;
  const int c0 = blockIdx.x * per, c1 = min(c0 + per, nch);
  stage_slice(xm, K, c0, c1, xh + (size_t)m * ldh, sc, xpk, m);
  if (blockIdx.x == 0 && threadIdx.x == 0) xinv[m] = 1.f / sc;
}

// stage_x_mb for token rows whose largest |value| their producer folded into slot[2 m] (atomicMax on the
// float bits: gemv_rs_pre's and gemv_tc's SwiGLU with an amax slot), so no block reads the whole row for it: the same
// scale, the same pairs. Grid (blocks, rows): each block of row m takes a ticket in slot[2 m + 1] after reading
// slot[2 m]; the last resets both words. ldx: floats a row of x; ldh: pairs a row of xh.
extern "C" __global__ void stage_x_amax(const float* __restrict__ x, int ldx, int K, int kpad, __half2* __restrict__ xh,
                                        int ldh, float* __restrict__ xinv, unsigned int* __restrict__ slot,
                                        unsigned char* __restrict__ xpk) {
  NI_PDL_ENTRY();
  const int m = blockIdx.y;
  x += (size_t)m * ldx;
  xh += (size_t)m * ldh;
  xinv += m;
  slot += 2 * m;
  __shared__ float gmax;
  if (threadIdx.x == 0) gmax = __uint_as_float(__ldcg(slot));
  __syncthreads();
  const float sc = pow2_scale(gmax);
  const int nch = kpad / 32, per = (nch + gridDim.x - 1) / gridDim.x;
  const int c0 = blockIdx.x * per, c1 = min(c0 + per, nch);
  stage_slice(x, K, c0, c1, xh, sc, xpk, m);
  if (threadIdx.x == 0) {
    if (blockIdx.x == 0) *xinv = 1.f / sc;
    if (atomicAdd(slot + 1, 1u) == gridDim.x - 1) {  // every block has read slot[0] (before its ticket)
      slot[0] = 0u;
      slot[1] = 0u;
    }
  }
}

// x_out = x_in + sum of S partials; out = rmsnorm(x_out) * (1 + w) (offset) or * w; out also staged.
// x_in and x_out must differ (other blocks still read x_in). Blocks of 1024 threads, H <= 8 x 1024: each
// thread keeps its values of the row in registers, the sum of squares and the largest |out| are reduced
// together (the same operation order as block_sum / block_max, so the same bits as residual_rmsnorm),
// and the block's slice of out is staged from shared memory (no second pass over global memory).
// VPT: values a thread holds (VPT * blockDim.x >= H); PU: partial planes loaded a round. residual_rmsnorm_mb is
// <8, 2> (rows up to 8,192 values); residual_rmsnorm_mb2 <2, 8> (up to 2,048 with 1,024 threads: the MoE
// models' norm sums k + 1 = 9 planes in 2 rounds instead of 5; the same operations in the same order, so the
// same bits). NORM_VPT: the largest VPT.
#define NORM_VPT 8
#define NORM_SLICE 8192
#define RESIDUAL_RMSNORM_PARAMS                                                                               \
  const float* __restrict__ x_in, float* __restrict__ x_out, const float* __restrict__ part, int S,           \
      int part_stride, const float* __restrict__ w, float* __restrict__ out, int H, float eps, int offset,    \
      __half2* __restrict__ xh, float* __restrict__ xinv, int kpad, unsigned char* __restrict__ xpk
// The block's sum of v^2 and largest |v w| over the VPT values each thread holds (red: 64 floats of shared memory;
// every thread gets both), in one barrier: the norms' reduction (residual_rmsnorm_mb, mlp_fused), one operation order.
template <int VPT>
__device__ __forceinline__ void row_sumsq_max(const float (&v)[VPT], const float (&wv)[VPT], float* red, float& ss,
                                              float& mx) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = (blockDim.x + 31) >> 5;
  ss = 0.f;
  mx = 0.f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    ss += v[i] * v[i];
    mx = fmaxf(mx, fabsf(v[i] * wv[i]));
  }
  ss = warp_sum(ss);
  mx = warp_max(mx);
  if (lane == 0) {
    red[warp] = ss;
    red[32 + warp] = mx;
  }
  __syncthreads();
  ss = warp_sum(lane < nwarp ? red[lane] : 0.f);
  mx = warp_max(lane < nwarp ? red[32 + lane] : 0.f);
}

// Value k of token row m's norm (v its residual, wv its weight): x_out and out where k < H, and the block's slice of the
// values it stages (0 past H). (residual_rmsnorm_body's and residual_rmsnorm_cl's.)
__device__ __forceinline__ void norm_emit(float v, float wv, float r, int k, int k0, int H, float* xo, float* o,
                                          float* slice) {
  float ov = 0.f;
  if (k < H) {
    xo[k] = v;
    ov = v * r * wv;
    o[k] = ov;
  }
  slice[k - k0] = ov;
}
// Chunks [c0, c1) of a row's staged pairs at dst from the block's slice of values (value k at slice[k - k0], k0 = c0 x
// 32), with scale sc; the block's bd threads stride the chunks' 16 words each.
__device__ __forceinline__ void stage_chunks(const float* slice, int k0, int c0, int c1, __half2* dst, float sc,
                                             int bd, unsigned char* pk = nullptr, int pm = 0) {
  for (int p = c0 * 16 + threadIdx.x; p < c1 * 16; p += bd) {
    const int jl = p >> 4, pi = p & 15, c = pi >> 2, jp = pi & 3;
    const int ka = jl * 32 + 8 * c + stage_a(jp);
    reinterpret_cast<unsigned int*>(dst)[(jl >> 5) * 512 + c * 128 + (jl & 31) * 4 + jp] =
        stage_pack(slice[ka - k0] * sc, slice[ka + STAGE_GAP - k0] * sc);
  }
  stage_twin(dst, c0, c1, bd, pk, pm);
}

// Planes [0, S) of a row (row: its offset in each plane) added to v in order, PU a round of predicated loads (S <= PU:
// one round, beside the caller's x and w): thread value i is column k0 + threadIdx.x + i stride, read where below kend.
// (residual_rmsnorm_body's one-round form and residual_rmsnorm_cl's: the plane loop's additions in its order.)
template <int PU, int VPT>
__device__ __forceinline__ void add_planes(float (&v)[VPT], const float* __restrict__ part, int S, int part_stride,
                                           size_t row, int k0, int stride, int kend) {
  for (int s0 = 0; s0 < S; s0 += PU) {
    float pv[PU][VPT];
#pragma unroll
    for (int u = 0; u < PU; ++u) {
      const float* ps = part + (size_t)(s0 + u) * part_stride + row;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int k = k0 + threadIdx.x + i * stride;
        pv[u][i] = s0 + u < S && k < kend ? ps[k] : 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < PU; ++u)
      if (s0 + u < S) {
#pragma unroll
        for (int i = 0; i < VPT; ++i) v[i] += pv[u][i];
      }
  }
}

// ONE: the planes PU at a time with predicated loads, so that S <= PU planes go out in one round
// with x_in and w. (Without it the loop's remainder runs a plane an iteration, each add waiting for its plane before
// the next plane's loads go out: the SASS of the <5, 4> form loads the 27B's 3 planes in 3 rounds after x_in and w,
// the <2, 8> form the MoE norm's 9 in 2.) The same additions in the same order, so the same bits. Measured (H200,
// one process, two passes): 27B 154.7 / 154.6 against 153.9 / 153.9 tok/s.
template <int VPT, int PU, bool ONE = false>
__device__ __forceinline__ void residual_rmsnorm_body(RESIDUAL_RMSNORM_PARAMS) {
  __shared__ float red[64];
  __shared__ float slice[NORM_SLICE];
  const int m = blockIdx.y, bd = blockDim.x;
  const float* xi = x_in + (size_t)m * H;
  // every load of a pass issued before its first use: x_in and w together, then each partial plane's
  // values (PU planes a round), so that the row costs 1 + S / PU L2 round trips, not one a value
  float v[VPT], wv[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int k = threadIdx.x + i * bd;
    v[i] = k < H ? xi[k] : 0.f;
    wv[i] = k < H ? (offset ? 1.f + w[k] : w[k]) : 0.f;
  }
  if constexpr (ONE) {
    add_planes<PU, VPT>(v, part, S, part_stride, (size_t)m * H, 0, bd, H);
  } else {
#pragma unroll PU
    for (int s = 0; s < S; ++s) {
      const float* ps = part + (size_t)s * part_stride + (size_t)m * H;
      float pv[VPT];
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int k = threadIdx.x + i * bd;
        pv[i] = k < H ? ps[k] : 0.f;
      }
#pragma unroll
      for (int i = 0; i < VPT; ++i) v[i] += pv[i];
    }
  }
  float ss, mx;
  row_sumsq_max(v, wv, red, ss, mx);
  const float r = rsqrtf(ss / H + eps);
  const float sc = pow2_scale(mx * r);
  const int nch = kpad / 32, per = (nch + gridDim.x - 1) / gridDim.x;
  const int c0 = blockIdx.x * per, c1 = min(c0 + per, nch);
  const int k0 = c0 * 32, k1 = c1 * 32;
  float* o = out + (size_t)m * H;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int k = threadIdx.x + i * bd;
    if (k >= k0 && k < k1) norm_emit(v[i], wv[i], r, k, k0, H, x_out + (size_t)m * H, o, slice);
  }
  for (int k = max(k0, VPT * bd) + threadIdx.x; k < k1; k += bd) slice[k - k0] = 0.f;  // padding past the registers
  __syncthreads();
  stage_chunks(slice, k0, c0, c1, xh + (size_t)m * kpad / 2, sc, bd, xpk, m);
  if (blockIdx.x == 0 && threadIdx.x == 0) xinv[m] = 1.f / sc;
}

extern "C" __global__ void __launch_bounds__(1024) residual_rmsnorm_mb(RESIDUAL_RMSNORM_PARAMS) {
  NI_PDL_ENTRY();
  residual_rmsnorm_body<NORM_VPT, 2>(x_in, x_out, part, S, part_stride, w, out, H, eps, offset, xh, xinv, kpad, xpk);
}

extern "C" __global__ void __launch_bounds__(1024) residual_rmsnorm_mb2(RESIDUAL_RMSNORM_PARAMS) {
  NI_PDL_ENTRY();
  residual_rmsnorm_body<2, 8>(x_in, x_out, part, S, part_stride, w, out, H, eps, offset, xh, xinv, kpad, xpk);
}

// <5, 4, one round>: rows up to 5,120 values (the 27B), every partial plane (the fused MLP's 3 down planes) in the first
// round of loads with x_in and w. (The MoE norm's <2, 9> one-round form lost: 474.4 against 475.1 tok/s; its block
// reads 9 planes of the row, bandwidth-bound.)
extern "C" __global__ void __launch_bounds__(1024) residual_rmsnorm_mb5_1r(RESIDUAL_RMSNORM_PARAMS) {
  NI_PDL_ENTRY();
  residual_rmsnorm_body<5, 4, true>(x_in, x_out, part, S, part_stride, w, out, H, eps, offset, xh, xinv, kpad, xpk);
}

// One block per token: stage fp32 x [M, ldx] for pre-staged GEMV input.
extern "C" __global__ void stage_x(const float* __restrict__ x, int ldx, int K, int kpad, __half2* __restrict__ xh,
                                   float* __restrict__ xinv) {
  NI_PDL_ENTRY();
  __shared__ float red[32];
  const int m = blockIdx.x;
  stage_pairs(x + (size_t)m * ldx, K, kpad, xh + (size_t)m * kpad / 2, xinv + m, red);
}

extern "C" __global__ void residual_rmsnorm(float* __restrict__ xres, const float* __restrict__ part, int S, int part_stride,
                                 const float* __restrict__ w, float* __restrict__ out, int H, float eps, int offset,
                                 __half2* __restrict__ xh, float* __restrict__ xinv, int kpad) {
  NI_PDL_ENTRY();
  __shared__ float red[32];
  const int m = blockIdx.x;
  float* xr = xres + (size_t)m * H;
  float ss = 0.f;
  for (int k = threadIdx.x; k < H; k += blockDim.x) {
    float v = xr[k];
    for (int s = 0; s < S; ++s) v += part[(size_t)s * part_stride + (size_t)m * H + k];
    if (S > 0) xr[k] = v;
    ss += v * v;
  }
  ss = block_sum(ss, red);
  const float r = rsqrtf(ss / H + eps);
  for (int k = threadIdx.x; k < H; k += blockDim.x) {
    const float wk = offset ? 1.f + w[k] : w[k];
    out[(size_t)m * H + k] = xr[k] * r * wk;
  }
  if (xh != nullptr) {
    __syncthreads();
    stage_pairs(out + (size_t)m * H, H, kpad, xh + (size_t)m * kpad / 2, xinv + m, red);
  }
}

// o: [M, Hv, D] packed, z: [M, ldz], out: [M, ldo] (the attention-width buffer, which may be wider than
// Hv * D); D == 128; one warp per (token, head).
// One warp: a head's gated norm, rmsnorm(o) w silu(z), from its 128 values (4 a lane: ov, zv, wv).
__device__ __forceinline__ float4 gated_res(float4 ov, float4 zv, float4 wv, float eps) {
  const float ss = warp_sum(ov.x * ov.x + ov.y * ov.y + ov.z * ov.z + ov.w * ov.w);
  const float r = rsqrtf(ss / 128.f + eps);
  float4 res;
  res.x = ov.x * r * wv.x * silu(zv.x);
  res.y = ov.y * r * wv.y * silu(zv.y);
  res.z = ov.z * r * wv.z * silu(zv.z);
  res.w = ov.w * r * wv.w * silu(zv.w);
  return res;
}

// One warp: head gw of token row m, its 128 values ov (4 a lane); returns the largest |value| this lane wrote.
__device__ __forceinline__ float gated_vals(float4 ov, const float* __restrict__ z, int ldz, const float* __restrict__ w,
                                            float* __restrict__ out, int ldo, float eps, int m, int gw) {
  const int lane = threadIdx.x & 31;
  const float4 zv = reinterpret_cast<const float4*>(z + (size_t)m * ldz + (size_t)gw * 128)[lane];
  const float4 wv = reinterpret_cast<const float4*>(w)[lane];
  const float4 res = gated_res(ov, zv, wv, eps);
  reinterpret_cast<float4*>(out + (size_t)m * ldo + (size_t)gw * 128)[lane] = res;
  return fmaxf(fmaxf(fabsf(res.x), fabsf(res.y)), fmaxf(fabsf(res.z), fabsf(res.w)));
}

// One warp: head gw of token row m read from o; returns the largest |value| this lane wrote.
__device__ __forceinline__ float gated_head(const float* __restrict__ o, const float* __restrict__ z, int ldz,
                                            const float* __restrict__ w, float* __restrict__ out, int ldo, int Hv,
                                            float eps, int m, int gw) {
  const float4 ov = reinterpret_cast<const float4*>(o + ((size_t)m * Hv + gw) * 128)[threadIdx.x & 31];
  return gated_vals(ov, z, ldz, w, out, ldo, eps, m, gw);
}

extern "C" __global__ void gated_rmsnorm(const float* __restrict__ o, const float* __restrict__ z, int ldz,
                              const float* __restrict__ w, float* __restrict__ out, int ldo, int Hv, float eps) {
  NI_PDL_ENTRY();
  const int gw = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (gw >= Hv) return;
  gated_head(o, z, ldz, w, out, ldo, Hv, eps, blockIdx.y, gw);
}

// One warp: head h's 128 gated values (res: lane's 4, values 4 lane .. 4 lane + 3) packed as the o-projection's pairs,
// a 32-value chunk at a time with its own power-of-two scale (xsc[c] = its inverse): gated_rmsnorm_chunks' staging and
// gdn_delta_gated_cl's. vals: the warp's 128 floats of shared memory; xh, xsc: the token row's.
__device__ __forceinline__ void stage_head_chunks(const float4 res, float* vals, int h, __half2* __restrict__ xh,
                                                  float* __restrict__ xsc) {
  const int lane = threadIdx.x & 31;
  reinterpret_cast<float4*>(vals)[lane] = res;
  float mx = fmaxf(fmaxf(fabsf(res.x), fabsf(res.y)), fmaxf(fabsf(res.z), fabsf(res.w)));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));  // (lanes 8k .. 8k + 7: chunk k of the head)
  __syncwarp();
  unsigned int* xw = reinterpret_cast<unsigned int*>(xh);
#pragma unroll
  for (int t = 0; t < 2; ++t) {  // 64 pair words a head: lane packs words 2 lane and 2 lane + 1
    const int wi = lane * 2 + t, k = wi >> 4, p = wi & 15, cs = p >> 2, jp = p & 3;
    const float sc = pow2_scale(__shfl_sync(0xffffffffu, mx, k * 8));
    const int ka = 8 * cs + stage_a(jp), c = h * 4 + k;
    xw[(c >> 5) * 512 + cs * 128 + (c & 31) * 4 + jp] = stage_pack(vals[k * 32 + ka] * sc,
                                                                  vals[k * 32 + ka + STAGE_GAP] * sc);
    if (p == 0) xsc[c] = 1.f / sc;
  }
}

// gated_rmsnorm with the o-projection's input staged a 32-value chunk at a time : a warp a head
// (grid (ceil(Hv / 8), M), 256 threads), gated_vals' arithmetic; each of the head's 4 chunks packed with its own
// power-of-two scale (xsc[c] = its inverse, gemv_rs_pre<..., XS> multiplies it in; xinv = 1): no row maximum, so no
// single block walks the row. out (fp32) as gated_rmsnorm_stage writes it.
extern "C" __global__ void __launch_bounds__(256) gated_rmsnorm_chunks(
    const float* __restrict__ o, const float* __restrict__ z, int ldz, const float* __restrict__ w,
    float* __restrict__ out, int ldo, int Hv, float eps, int K, int kpad, __half2* __restrict__ xh,
    float* __restrict__ xinv, float* __restrict__ xsc) {
  NI_PDL_ENTRY();
  __shared__ float vals[8][128];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, m = blockIdx.y;
  const int h = blockIdx.x * 8 + warp;
  if (blockIdx.x == 0 && threadIdx.x == 0) xinv[m] = 1.f;
  if (h >= Hv) return;
  const float4 ov = reinterpret_cast<const float4*>(o + ((size_t)m * Hv + h) * 128)[lane];
  gated_vals(ov, z, ldz, w, out, ldo, eps, m, h);  // (writes out; its row max unused)
  __syncwarp();
  const float4 res = __ldcg(reinterpret_cast<const float4*>(out + (size_t)m * ldo + (size_t)h * 128) + lane);
  stage_head_chunks(res, vals[warp], h, xh + (size_t)m * kpad / 2, xsc + (size_t)m * (kpad / 32));
}

// gated_rmsnorm of every head of token row blockIdx.x (one block of up to 1024 threads, a warp per head
// in turn), then the row [0, K) staged as the GEMV's fp16 pairs: gated_rmsnorm + stage_x in one launch.
extern "C" __global__ void gated_rmsnorm_stage(const float* __restrict__ o, const float* __restrict__ z, int ldz,
                                               const float* __restrict__ w, float* __restrict__ out, int ldo,
                                               int Hv, float eps, int K, int kpad, __half2* __restrict__ xh,
                                               float* __restrict__ xinv, unsigned char* __restrict__ xpk) {
  NI_PDL_ENTRY();
  __shared__ float red[32];
  const int m = blockIdx.x;
  float mx = 0.f;
  for (int gw = threadIdx.x >> 5; gw < Hv; gw += blockDim.x >> 5)
    mx = fmaxf(mx, gated_head(o, z, ldz, w, out, ldo, Hv, eps, m, gw));
  const float sc = pow2_scale(block_max(mx, red));  // its barriers also publish the block's writes of out
  stage_slice(out + (size_t)m * ldo, K, 0, kpad / 32, xh + (size_t)m * kpad / 2, sc, xpk, m);
  if (threadIdx.x == 0) xinv[m] = 1.f / sc;
}

// ---- prefill (the tensor-core chunk path: its GEMMs read fp16 rows [M, K], not staged pairs) ----

// One 256-thread block a token row, float4 accesses: x_out = x_in + the S partial planes (in order; x_out may
// be x_in: each thread writes back only the values it read), then
// rmsnorm(x_out) * w' (w' = 1 + w with offset) as fp16 into o16 [M, H] (the next GEMM's input, rounded
// as the cast of the fp32 value it replaces) and, when out != nullptr, as fp32 into out too (the MoE
// router gather reads fp32 rows). H % 4 == 0, H <= 4 * 256 * RN_V4.
#define RN_V4 8
extern "C" __global__ void __launch_bounds__(256) residual_rmsnorm_f16(
    const float* x_in, float* x_out, const float* __restrict__ part, int S,
    int part_stride, const float* __restrict__ w, float* __restrict__ out, __half* __restrict__ o16, int H,
    float eps, int offset) {
  NI_PDL_ENTRY();
  __shared__ float red[32];
  const int m = blockIdx.x, n4 = H >> 2;
  const float4* xi = reinterpret_cast<const float4*>(x_in + (size_t)m * H);
  float4 v[RN_V4];
#pragma unroll
  for (int i = 0; i < RN_V4; ++i) {
    const int j = threadIdx.x + i * 256;
    v[i] = j < n4 ? xi[j] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  for (int s = 0; s < S; ++s) {
    const float4* ps = reinterpret_cast<const float4*>(part + (size_t)s * part_stride + (size_t)m * H);
#pragma unroll
    for (int i = 0; i < RN_V4; ++i) {
      const int j = threadIdx.x + i * 256;
      if (j < n4) {
        const float4 p = ps[j];
        v[i].x += p.x; v[i].y += p.y; v[i].z += p.z; v[i].w += p.w;
      }
    }
  }
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < RN_V4; ++i) ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
  const float r = rsqrtf(block_sum(ss, red) / H + eps);
  float4* xo = reinterpret_cast<float4*>(x_out + (size_t)m * H);
  const float4* w4 = reinterpret_cast<const float4*>(w);
  __half2* oh = reinterpret_cast<__half2*>(o16 + (size_t)m * H);
#pragma unroll
  for (int i = 0; i < RN_V4; ++i) {
    const int j = threadIdx.x + i * 256;
    if (j < n4) {
      if (S > 0 || x_out != x_in) xo[j] = v[i];  // (in place with nothing added: already there)
      float4 wv = w4[j];
      if (offset) { wv.x += 1.f; wv.y += 1.f; wv.z += 1.f; wv.w += 1.f; }
      const float4 o = make_float4(v[i].x * r * wv.x, v[i].y * r * wv.y, v[i].z * r * wv.z, v[i].w * r * wv.w);
      if (out != nullptr) reinterpret_cast<float4*>(out + (size_t)m * H)[j] = o;
      oh[2 * j] = __floats2half2_rn(o.x, o.y);
      oh[2 * j + 1] = __floats2half2_rn(o.z, o.w);
    }
  }
}

// gated_rmsnorm of T token rows as fp16 [T, Hv * 128] (the o-projection GEMM's input): a warp a (row,
// head), as gated_rmsnorm, its 128 values rounded as the cast of gated_rmsnorm's fp32 output.
extern "C" __global__ void gated_rmsnorm_f16(const float* __restrict__ o, const float* __restrict__ z, int ldz,
                                             const float* __restrict__ w, __half* __restrict__ o16, int Hv,
                                             float eps) {
  NI_PDL_ENTRY();
  const int gw = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), m = blockIdx.y, lane = threadIdx.x & 31;
  if (gw >= Hv) return;
  const float4 ov = reinterpret_cast<const float4*>(o + ((size_t)m * Hv + gw) * 128)[lane];
  const float4 zv = reinterpret_cast<const float4*>(z + (size_t)m * ldz + (size_t)gw * 128)[lane];
  const float4 wv = reinterpret_cast<const float4*>(w)[lane];
  const float ss = warp_sum(ov.x * ov.x + ov.y * ov.y + ov.z * ov.z + ov.w * ov.w);
  const float r = rsqrtf(ss / 128.f + eps);
  __half2* dst = reinterpret_cast<__half2*>(o16 + (size_t)m * Hv * 128 + (size_t)gw * 128) + 2 * lane;
  dst[0] = __floats2half2_rn(ov.x * r * wv.x * silu(zv.x), ov.y * r * wv.y * silu(zv.y));
  dst[1] = __floats2half2_rn(ov.z * r * wv.z * silu(zv.z), ov.w * r * wv.w * silu(zv.w));
}
