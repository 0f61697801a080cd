// Greedy sampling on the device and the step bookkeeping that keeps decode free of host syncs:
// the argmax becomes the next input token, the position advances, and the token is appended to a
// history ring the host reads once per burst (or once per token when streaming).
#include "common.cuh"

// Ties go to the lowest id at every level: within a thread (ids ascend), across lanes, warps and blocks.
__device__ __forceinline__ void argmax_merge(float& best, int& idx, float ov, int oi) {
  if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
}

// (best, id) over the block, in every thread; bv / bi: 32 entries of shared memory
__device__ __forceinline__ void argmax_block(float& best, int& idx, float* bv, int* bi) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    argmax_merge(best, idx, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, idx, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) { bv[warp] = best; bi[warp] = idx; }
  __syncthreads();
  best = lane < nw ? bv[lane] : -INFINITY;
  idx = lane < nw ? bi[lane] : 0x7fffffff;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    argmax_merge(best, idx, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, idx, o));
}

// the step's bookkeeping for row m once its token is known
__device__ __forceinline__ void argmax_commit(int m, int idx, int* tokens, int* pos, int* history, int* step,
                                              int hist_len) {
  tokens[m] = idx;
  pos[m] += 1;
  const int s = step[m];
  history[(size_t)m * hist_len + (s % hist_len)] = idx;
  step[m] = s + 1;
}

// logits: [M, V] (row stride ldl). One block (1024 threads) per row.
extern "C" __global__ void argmax_step(const float* __restrict__ logits, int ldl, int V, int* __restrict__ tokens,
                            int* __restrict__ pos, int* __restrict__ history, int* __restrict__ step, int hist_len) {
  NI_PDL_ENTRY();
  __shared__ float bv[32];
  __shared__ int bi[32];
  const int m = blockIdx.x;
  const float* l = logits + (size_t)m * ldl;
  float best = -INFINITY;
  int idx = 0x7fffffff;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float v = l[i];
    if (v > best) { best = v; idx = i; }
  }
  argmax_block(best, idx, bv, bi);
  if (threadIdx.x == 0) argmax_commit(m, idx, tokens, pos, history, step, hist_len);
}

// Multi-block argmax: block blockIdx.x of gridDim.x takes its contiguous slice of the row's V logits,
// leaves its (best, id) in part_v / part_i [row blockIdx.y] and returns them (in every thread).
__device__ __forceinline__ void argmax_slice(const float* l, int V, float* part_v, int* part_i, float& best, int& idx,
                                             float* bv, int* bi) {
  const int m = blockIdx.y, nb = gridDim.x, b = blockIdx.x;
  const int per = (V + nb - 1) / nb, i0 = b * per, i1 = min(V, i0 + per), bd = blockDim.x;
  best = -INFINITY;
  idx = 0x7fffffff;
  // 8 values a thread a round, their loads issued before the compares (the loop a value at a time waited for each
  // load: ~15 round trips a thread at the 27B's 248K logits over 64 blocks of 256); the same compares in the same
  // order (ids ascending), so the same token
  for (int i = i0 + threadIdx.x; i < i1; i += 8 * bd) {
    float v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = i + u * bd < i1 ? l[i + u * bd] : -INFINITY;
#pragma unroll
    for (int u = 0; u < 8; ++u)
      if (i + u * bd < i1 && v[u] > best) { best = v[u]; idx = i + u * bd; }
  }
  argmax_block(best, idx, bv, bi);
  if (threadIdx.x == 0) {
    part_v[(size_t)m * nb + b] = best;
    part_i[(size_t)m * nb + b] = idx;
  }
}

// The same over `gridDim.x` blocks a row: each block takes a contiguous slice of the row and leaves its
// (best, id) in part_v / part_i; the last block to finish (a ticket per row, reset for the next launch)
// reduces the slices in order and does the bookkeeping. The same token as argmax_step; one block over
// 248K logits took 45 us a token.
extern "C" __global__ void argmax_step_mb(const float* __restrict__ logits, int ldl, int V, float* __restrict__ part_v,
                                          int* __restrict__ part_i, unsigned int* __restrict__ ticket,
                                          int* __restrict__ tokens, int* __restrict__ pos, int* __restrict__ history,
                                          int* __restrict__ step, int hist_len) {
  NI_PDL_ENTRY();
  __shared__ float bv[32];
  __shared__ int bi[32];
  __shared__ bool last;
  const int m = blockIdx.y, nb = gridDim.x;
  float best;
  int idx;
  argmax_slice(logits + (size_t)m * ldl, V, part_v, part_i, best, idx, bv, bi);
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(ticket + m, 1u) == (unsigned)(nb - 1);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  best = -INFINITY;
  idx = 0x7fffffff;
  for (int j = threadIdx.x; j < nb; j += blockDim.x)
    argmax_merge(best, idx, __ldcg(part_v + (size_t)m * nb + j), __ldcg(part_i + (size_t)m * nb + j));
  argmax_block(best, idx, bv, bi);
  if (threadIdx.x == 0) {
    argmax_commit(m, idx, tokens, pos, history, step, hist_len);
    ticket[m] = 0u;
  }
}

// Columns step bookkeeping: the positions of the T tokens of lane 0, and the advance after the step.
extern "C" __global__ void cols_positions(const int* __restrict__ pos, int* __restrict__ posc, int T) {
  NI_PDL_ENTRY();
  for (int t = threadIdx.x; t < T; t += blockDim.x) posc[t] = pos[0] + t;
}

extern "C" __global__ void advance_pos(int* __restrict__ pos, int n) {
  NI_PDL_ENTRY();
  if (threadIdx.x == 0) pos[0] += n;
}
