// MoE routing on the device: softmax over E router logits, top-k, renormalised weights, and the shared
// expert's sigmoid gate (logit E). One warp per token row; ties go to the lower expert id.
#include "common.cuh"

// Token row m's top-k of its E logits l (and the shared expert's gate l[E]), by warp 0 of a block.
// CG: the logits were written by other blocks of the same kernel (read through L2 only).
template <bool CG = false>
__device__ __forceinline__ void route_row(const float* __restrict__ l, int E, int topk, int* __restrict__ idx,
                                          float* __restrict__ wts, int ldw, int m) {
  // lane l holds experts l, l + 32, ... (E <= 512); top-k by k rounds of warp argmax
  const int lane = threadIdx.x & 31;
  auto at = [&](int e) { return CG ? __ldcg(l + e) : l[e]; };
  constexpr int PER = 16;
  float v[PER];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < E ? at(e) : -INFINITY;
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
  if (lane == 0) wts[(size_t)m * ldw + topk] = sigmoidf_(at(E));
}

extern "C" __global__ void moe_route(const float* __restrict__ logits, int ldl, int E, int topk,
                                     int* __restrict__ idx, float* __restrict__ wts, int ldw) {
  NI_PDL_ENTRY();
  // One warp per token row
  if (threadIdx.x >= 32) return;
  route_row(logits + (size_t)blockIdx.x * ldl, E, topk, idx, wts, ldw, blockIdx.x);
}

// The router GEMV (bf16 [E + 1, K]: the experts' logits and the shared expert's gate; a block a row, its
// 8 warps splitting K as gemv_bf16 with kw = 8) and moe_route in one launch: the block that finishes last
// (a ticket, reset by it) routes every token row from the logits the others wrote. The same bits as
// gemv_bf16 + moe_route. (Written without device time: CudaQwen35.MOE_ROUTE_FUSED, off until measured.)
template <int M>
__global__ void __launch_bounds__(256) router_route(const unsigned short* __restrict__ w, int N, int K,
                                                    const float* __restrict__ x, int ldx, float* __restrict__ y,
                                                    int ldy, int E, int topk, int* __restrict__ idx,
                                                    float* __restrict__ wts, int ldw, unsigned int* __restrict__ ticket) {
  NI_PDL_ENTRY();
  __shared__ int last;
  gemv_bf16_body<M>(w, N, K, x, ldx, y, ldy, EPI_STORE, 8);
  __threadfence();  // this thread's logits (lane 0 of warp 0 wrote them), before the ticket
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (threadIdx.x < 32) {
    for (int m = 0; m < M; ++m) route_row<true>(y + (size_t)m * ldy, E, topk, idx, wts, ldw, m);
  }
  if (threadIdx.x == 0) *ticket = 0u;
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
