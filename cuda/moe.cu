// MoE routing on the device: softmax over E router logits, top-k, renormalised weights, and the shared
// expert's sigmoid gate (logit E). One warp per token row; ties go to the lower expert id.
#include "common.cuh"

extern "C" __global__ void moe_route(const float* __restrict__ logits, int ldl, int E, int topk,
                                     int* __restrict__ idx, float* __restrict__ wts, int ldw) {
  NI_PDL_ENTRY();
  // One warp per token (E <= 512): lane l holds experts l, l + 32, ...; top-k by k rounds of warp argmax.
  const int m = blockIdx.x, lane = threadIdx.x & 31;
  if (threadIdx.x >= 32) return;
  const float* l = logits + (size_t)m * ldl;
  constexpr int PER = 16;
  float v[PER];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < E ? l[e] : -INFINITY;
    mx = fmaxf(mx, v[i]);
  }
  mx = warp_max(mx);
  float total = 0.f, mine = 0.f;
  int myidx = 0;
  for (int k = 0; k < topk; ++k) {
    float best = -INFINITY;
    int bi = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < PER; ++i)
      if (v[i] > best) { best = v[i]; bi = lane + 32 * i; }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ob > best || (ob == best && oi < bi)) { best = ob; bi = oi; }
    }
    const float p = __expf(best - mx);  // softmax numerators; the denominator cancels in the renorm
    total += p;
    if (lane == k) { mine = p; myidx = bi; }
    if ((bi & 31) == lane) v[bi >> 5] = -INFINITY;
  }
  if (lane < topk) {
    idx[(size_t)m * topk + lane] = myidx;
    wts[(size_t)m * ldw + lane] = mine / total;
  }
  if (lane == 0) wts[(size_t)m * ldw + topk] = sigmoidf_(l[E]);
}

// MoE prefill (grouped by expert): the (token, slot) pairs sorted by expert on the host; these two
// kernels move rows into and out of that order.
// moe_gather_f16: out[i] = fp16(x[rows[i]]) for the n sorted pairs, zeros where rows[i] < 0 (an expert's
// padding when every expert is padded to the same row count; grid n, any block size).
extern "C" __global__ void moe_gather_f16(const float* __restrict__ x, int ldx, const int* __restrict__ rows,
                                          int H, __half* __restrict__ out) {
  NI_PDL_ENTRY();
  const size_t i = blockIdx.x;
  const int r = rows[i];
  __half* dst = out + i * H;
  if (r < 0) {
    for (int h = threadIdx.x; h < H; h += blockDim.x) dst[h] = __float2half_rn(0.f);
    return;
  }
  const float* src = x + (size_t)r * ldx;
  for (int h = threadIdx.x; h < H; h += blockDim.x) dst[h] = __float2half_rn(src[h]);
}

// moe_combine: out[t] += sum over slots j (in order) of wts[t][j] * ys[inv[t * k + j]], where inv maps a
// (token, slot) pair to its row of the sorted expert outputs ys [n, H] (grid T, any block size).
extern "C" __global__ void moe_combine(const float* __restrict__ ys, int H, const int* __restrict__ inv,
                                       const float* __restrict__ wts, int ldw, int k, float* __restrict__ out,
                                       int ldo) {
  NI_PDL_ENTRY();
  const int t = blockIdx.x;
  float* o = out + (size_t)t * ldo;
  for (int h = threadIdx.x; h < H; h += blockDim.x) {
    float acc = o[h];
    for (int j = 0; j < k; ++j) acc += wts[(size_t)t * ldw + j] * ys[(size_t)inv[t * k + j] * H + h];
    o[h] = acc;
  }
}

// The pairs' order by expert on the device (the host reads back only the E counts):
// moe_count: rank[p] = the place pair p took among its expert's pairs (atomics: the order within an expert
// is arbitrary, and no row's result depends on it), cnt[e] += its pairs (cnt zeroed before); grid n / 256.
extern "C" __global__ void moe_count(const int* __restrict__ ids, int n, int* __restrict__ cnt,
                                     int* __restrict__ rank) {
  NI_PDL_ENTRY();
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p < n) rank[p] = atomicAdd(cnt + ids[p], 1);
}

// moe_place: pair p (token p / k) goes to row base[expert] + rank[p] of the sorted rows: rows[that] = its
// token (for moe_gather_f16), inv[p] = that row (for moe_combine); grid n / 256.
extern "C" __global__ void moe_place(const int* __restrict__ ids, int n, int k, const int* __restrict__ rank,
                                     const int* __restrict__ base, int* __restrict__ rows, int* __restrict__ inv) {
  NI_PDL_ENTRY();
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= n) return;
  const int pos = base[ids[p]] + rank[p];
  rows[pos] = p / k;
  inv[p] = pos;
}
