// MoE routing on the device: softmax over E router logits, top-k, renormalised weights, and the shared
// expert's sigmoid gate (logit E). One block per token row; ties go to the lower expert id.
#include "common.cuh"

extern "C" __global__ void moe_route(const float* __restrict__ logits, int ldl, int E, int topk,
                                     int* __restrict__ idx, float* __restrict__ wts, int ldw) {
  __shared__ float red[32];
  __shared__ float p[1024];
  __shared__ int sel[16];
  const int m = blockIdx.x;
  const float* l = logits + (size_t)m * ldl;
  float mx = -INFINITY;
  for (int e = threadIdx.x; e < E; e += blockDim.x) mx = fmaxf(mx, l[e]);
  mx = block_max(mx, red);
  float sum = 0.f;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const float v = __expf(l[e] - mx);
    p[e] = v;
    sum += v;
  }
  sum = block_sum(sum, red);  // (block_sum syncs, so p[] is complete afterwards)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float total = 0.f;
  for (int k = 0; k < topk; ++k) {
    float best = -1.f;
    int bi = 0x7fffffff;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      bool taken = false;
      for (int j = 0; j < k; ++j) taken |= sel[j] == e;
      if (!taken && (p[e] > best || (p[e] == best && e < bi))) { best = p[e]; bi = e; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ob > best || (ob == best && oi < bi)) { best = ob; bi = oi; }
    }
    __shared__ float wb[32];
    __shared__ int wi[32];
    if (lane == 0) { wb[warp] = best; wi[warp] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
        if (wb[w] > wb[0] || (wb[w] == wb[0] && wi[w] < wi[0])) { wb[0] = wb[w]; wi[0] = wi[w]; }
      sel[k] = wi[0];
    }
    __syncthreads();
    total += p[sel[k]];
  }
  if (threadIdx.x < topk) {
    idx[(size_t)m * topk + threadIdx.x] = sel[threadIdx.x];
    wts[(size_t)m * ldw + threadIdx.x] = p[sel[threadIdx.x]] / total;
  }
  if (threadIdx.x == 0) wts[(size_t)m * ldw + topk] = sigmoidf_(l[E]);
}
