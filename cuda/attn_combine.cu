// The split-K decode attention's combine (attention.cu's split kernels and attn_decode_mma.cu leave per-split
// (max, sum) pairs and accumulators): each output value from the splits' partials times the sigmoid output gate, and
// the forms that also stage it as the o-projection's input (one scale for the row, or a scale a 32-value chunk).
// Compiled after attention.cu in the module (kernels.SOURCES).
#include "common.cuh"

// out[m][h*256 + d] (row stride ldo) = (sum_s acc_s e^{m_s - M}) / (sum_s l_s e^{m_s - M}) * sigmoid(gate[m][h][d]). grid (Hq, M), block 256.
// Output value d of query head h, token row m, from the nsplit partial results; written to out.
// (ns: the splits read, the first ns of nsplit; -1: all)
__device__ __forceinline__ float combine_one(const float* __restrict__ part_ml, const float* __restrict__ part_acc,
                                             int nsplit, const float* __restrict__ gate, int ldg,
                                             float* __restrict__ out, int ldo, int Hq, int m, int h, int d,
                                             int ns = -1) {
  const size_t hs0 = ((size_t)m * Hq + h) * nsplit;
  if (ns < 0) ns = nsplit;
  float M_ = -INFINITY;
  for (int s = 0; s < ns; ++s) M_ = fmaxf(M_, part_ml[(hs0 + s) * 2]);
  float L = 0.f, A = 0.f;
  for (int s = 0; s < ns; ++s) {
    const float ms = part_ml[(hs0 + s) * 2];
    if (ms > -INFINITY) {
      const float c = __expf(ms - M_);
      L += part_ml[(hs0 + s) * 2 + 1] * c;
      A += part_acc[(hs0 + s) * 256 + d] * c;
    }
  }
  const float gv = gate[(size_t)m * ldg + h * 256 + d];
  const float v = A / L * sigmoidf_(gv);
  out[(size_t)m * ldo + h * 256 + d] = v;
  return v;
}

// combine_one with its loads batched (attn_combine_chunks_b): the first CB splits' (max, sum) pairs and accumulator
// values are loaded with the gate, before `ns` (from the position, loaded beside them) is known, guarded by nsplit
// only; later splits CB at a time. combine_one's loop took an L2 round trip a 4 splits after a pass for the maximum and
// the position's (~7 at a short context: ~5 of its ~7 us); this is one. Splits past ns add nothing, as there; the
// same operations in the same order, so the same bits.
#define COMBINE_B 16
__device__ __forceinline__ float combine_one_b(const float* __restrict__ part_ml, const float* __restrict__ part_acc,
                                               int nsplit, const float* __restrict__ gate, int ldg,
                                               float* __restrict__ out, int ldo, int Hq, int m, int h, int d,
                                               const int* __restrict__ pos, int round) {
  const size_t hs0 = ((size_t)m * Hq + h) * nsplit;
  const float2* ml = reinterpret_cast<const float2*>(part_ml) + hs0;
  const float* ac = part_acc + hs0 * 256 + d;
  const int L = pos[m] + 1;
  const float gv = gate[(size_t)m * ldg + h * 256 + d];
  float2 p[COMBINE_B];
  float a[COMBINE_B];
#pragma unroll
  for (int i = 0; i < COMBINE_B; ++i) {
    p[i] = i < nsplit ? ml[i] : make_float2(-INFINITY, 0.f);
    a[i] = i < nsplit ? ac[(size_t)i * 256] : 0.f;
  }
  const int per = ((L + nsplit - 1) / nsplit + round - 1) / round * round;
  const int ns = min(nsplit, (L + per - 1) / per);
  float M_ = -INFINITY;
#pragma unroll
  for (int i = 0; i < COMBINE_B; ++i)
    if (i < ns) M_ = fmaxf(M_, p[i].x);
  for (int s0 = COMBINE_B; s0 < ns; s0 += COMBINE_B) {
    float q[COMBINE_B];
#pragma unroll
    for (int i = 0; i < COMBINE_B; ++i) q[i] = s0 + i < ns ? ml[s0 + i].x : -INFINITY;
#pragma unroll
    for (int i = 0; i < COMBINE_B; ++i) M_ = fmaxf(M_, q[i]);
  }
  float Ls = 0.f, A = 0.f;
  auto add = [&](float2 pi, float ai) {
    if (pi.x > -INFINITY) {
      const float c = __expf(pi.x - M_);
      Ls += pi.y * c;
      A += ai * c;
    }
  };
#pragma unroll
  for (int i = 0; i < COMBINE_B; ++i)
    if (i < ns) add(p[i], a[i]);
  for (int s0 = COMBINE_B; s0 < ns; s0 += COMBINE_B) {
#pragma unroll
    for (int i = 0; i < COMBINE_B; ++i) {
      p[i] = s0 + i < ns ? ml[s0 + i] : make_float2(-INFINITY, 0.f);
      a[i] = s0 + i < ns ? ac[(size_t)(s0 + i) * 256] : 0.f;
    }
#pragma unroll
    for (int i = 0; i < COMBINE_B; ++i)
      if (s0 + i < ns) add(p[i], a[i]);
  }
  const float v = A / Ls * sigmoidf_(gv);
  out[(size_t)m * ldo + h * 256 + d] = v;
  return v;
}

extern "C" __global__ void attn_combine(const float* __restrict__ part_ml, const float* __restrict__ part_acc, int nsplit,
                             const float* __restrict__ gate, int ldg, float* __restrict__ out, int ldo, int Hq) {
  NI_PDL_ENTRY();
  combine_one(part_ml, part_acc, nsplit, gate, ldg, out, ldo, Hq, blockIdx.y, blockIdx.x, threadIdx.x);
}

// attn_combine + the o-projection's staging in one launch: each block (query head h, token row m) combines
// its head as attn_combine does, folds the largest |value| it wrote into amax[m] (atomicMax on the bits of
// values >= 0) and takes a ticket in ticket[m]; the last head of the row stages the row [0, K) as the fp16
// pairs stage_x_mb writes (the max is exact, so the same scale and bits) and resets both words. (A
// single block doing combine + staging measured 48 us a layer; this keeps the Hq blocks. Written
// without device time.)
extern "C" __global__ void attn_combine_stage(const float* __restrict__ part_ml, const float* __restrict__ part_acc,
                                              int nsplit, const float* __restrict__ gate, int ldg,
                                              float* __restrict__ out, int ldo, int Hq, int K, int kpad,
                                              __half2* __restrict__ xh, float* __restrict__ xinv,
                                              unsigned int* __restrict__ amax, unsigned int* __restrict__ ticket,
                                              unsigned char* __restrict__ xpk) {
  NI_PDL_ENTRY();
  __shared__ float red[32];
  const int m = blockIdx.y;
  const float v = combine_one(part_ml, part_acc, nsplit, gate, ldg, out, ldo, Hq, m, blockIdx.x, threadIdx.x);
  __threadfence();  // this thread's value, before the row's ticket
  const float bmax = block_max(fabsf(v), red);  // (its barriers order every thread's fence before the ticket)
  stage_row_by_last_block(bmax, amax + m, ticket + m, gridDim.x, out + (size_t)m * ldo, K, kpad,
                          reinterpret_cast<uint4*>(xh + (size_t)m * kpad / 2), xinv + m, xpk, m);
}

// attn_combine with the o-projection's input staged a 32-value chunk at a time: block (head h, token row m) of 256
// threads combines the head's dims as attn_combine does, but only over the splits that hold tokens (the decode kernels
// give split s the tokens [s per, (s + 1) per), per = ceil(L / nsplit) rounded up to `round`: attn_decode_mma's 16,
// the split kernels' 1; the others hold -inf maxima and add nothing, so the same values), its loads batched (the first
// 16 splits' partials, the gate and the position in one round: combine_one_b); warp w packs chunk 8 h + w with its own
// power-of-two scale (xsc[c] = its inverse, xinv = 1), as gated_rmsnorm_chunks does for the GDN layers: no row
// maximum, no last block staging the row.
#define ATTN_COMBINE_CHUNKS_PARAMS                                                                                \
  const float* __restrict__ part_ml, const float* __restrict__ part_acc, int nsplit, const float* __restrict__ gate,  \
      int ldg, float* __restrict__ out, int ldo, int Hq, int K, int kpad, __half2* __restrict__ xh,                  \
      float* __restrict__ xinv, float* __restrict__ xsc, const int* __restrict__ pos, int round
extern "C" __global__ void __launch_bounds__(256) attn_combine_chunks_b(ATTN_COMBINE_CHUNKS_PARAMS) {
  NI_PDL_ENTRY();
  const int m = blockIdx.y, h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float v = combine_one_b(part_ml, part_acc, nsplit, gate, ldg, out, ldo, Hq, m, h, threadIdx.x, pos, round);
  if (h == 0 && threadIdx.x == 0) xinv[m] = 1.f;
  const float sc = pow2_scale(warp_max(fabsf(v)));
  const int cs = (lane >> 2) & 3, jp = lane & 3, ka = 8 * cs + stage_a(jp), c = h * 8 + warp;
  const float va = __shfl_sync(0xffffffffu, v, ka), vb = __shfl_sync(0xffffffffu, v, ka + STAGE_GAP);
  if (lane < 16)
    reinterpret_cast<unsigned int*>(xh + (size_t)m * kpad / 2)[(c >> 5) * 512 + cs * 128 + (c & 31) * 4 + jp] =
        stage_pack(va * sc, vb * sc);
  if (lane == 0) xsc[(size_t)m * (kpad / 32) + c] = 1.f / sc;
}
