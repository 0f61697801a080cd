// The residual norm on a thread block cluster (sm_90): residual_rmsnorm_cl (the plan's norm on sm_90). Compiled after
// norm.cu in the module (kernels.SOURCES): RESIDUAL_RMSNORM_PARAMS, row_sumsq_max, add_planes, norm_emit, stage_chunks.
#include "common.cuh"

// residual_rmsnorm_mb's job on a cluster of NORM_CL blocks a row: block b of the cluster
// loads only its slice of the row (whole 32-value chunks of the kpad staged ones, x_in, w and every partial plane in one
// round of predicated loads), so that no block reads the whole row and its S planes (the mb forms' blocks do: the MoE
// norm's 9 planes of 8 KB each are a block's L2 bandwidth); thread r < NORM_CL stores the block's sum of squares and
// largest |v w| into slot b of block r's shared memory (st.shared::cluster) before one cluster barrier, then every block
// sums the 8 slots in rank order from its own memory, normalizes and stages its own chunks. (A form that read the
// pairs through DSMEM between two barriers measured slower on the H200.) x_out is residual_rmsnorm_mb's
// bits; the sum of squares is added in another order, so out and the staged pairs are within fp32 rounding of its, not
// its bits. Grid (NORM_CL, M), 256 threads; kpad / 32 <= NORM_CL x NORM_CL_CHUNKS.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900  // (clusters: sm_90; kernels.cluster_capable)
#define NORM_CL 8
#define NORM_CL_CHUNKS 32
#define NORM_CL_VPT 4   // (NORM_CL_CHUNKS x 32 / 256 values a thread, at most)
#define NORM_CL_PU 9    // partial planes a round of loads
__device__ __forceinline__ unsigned int cl_rank() {
  unsigned int r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cl_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void cl_store(float* local, unsigned int rank, float v) {  // (local's twin in `rank`)
  unsigned int a = static_cast<unsigned int>(__cvta_generic_to_shared(local)), ra;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(rank));
  asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(ra), "f"(v) : "memory");
}
extern "C" __global__ void __cluster_dims__(NORM_CL, 1, 1) __launch_bounds__(256)
    residual_rmsnorm_cl(RESIDUAL_RMSNORM_PARAMS) {
  NI_PDL_ENTRY();
  __shared__ float red[64];
  __shared__ float slots[NORM_CL][2];
  __shared__ float slice[NORM_CL_CHUNKS * 32];
  const int m = blockIdx.y, b = (int)cl_rank(), tid = threadIdx.x;
  const int nch = kpad / 32, per = (nch + NORM_CL - 1) / NORM_CL;
  const int c0 = min(b * per, nch), c1 = min(c0 + per, nch), k0 = c0 * 32, k1 = c1 * 32;
  const float* xi = x_in + (size_t)m * H;
  float v[NORM_CL_VPT], wv[NORM_CL_VPT];
#pragma unroll
  for (int i = 0; i < NORM_CL_VPT; ++i) {
    const int k = k0 + tid + 256 * i;
    const bool in = k < k1 && k < H;
    v[i] = in ? xi[k] : 0.f;
    wv[i] = in ? (offset ? 1.f + w[k] : w[k]) : 0.f;
  }
  add_planes<NORM_CL_PU, NORM_CL_VPT>(v, part, S, part_stride, (size_t)m * H, k0, 256, min(k1, H));  // (in order)
  float ss, mx;
  row_sumsq_max(v, wv, red, ss, mx);
  if (tid < NORM_CL) {  // (the block's pair into slot b of block tid)
    cl_store(&slots[b][0], tid, ss);
    cl_store(&slots[b][1], tid, mx);
  }
  cl_sync();  // (every block's pair in every block's slots; no block reads another's memory after it)
  float t = 0.f, tm = 0.f;
#pragma unroll
  for (int q = 0; q < NORM_CL; ++q) {
    t += slots[q][0];
    tm = fmaxf(tm, slots[q][1]);
  }
  const float r = rsqrtf(t / H + eps);
  const float sc = pow2_scale(tm * r);
  float* o = out + (size_t)m * H;
#pragma unroll
  for (int i = 0; i < NORM_CL_VPT; ++i) {
    const int k = k0 + tid + 256 * i;
    if (k < k1) norm_emit(v[i], wv[i], r, k, k0, H, x_out + (size_t)m * H, o, slice);
  }
  __syncthreads();
  stage_chunks(slice, k0, c0, c1, xh + (size_t)m * kpad / 2, sc, 256, xpk, m);
  if (b == 0 && tid == 0) xinv[m] = 1.f / sc;
}
#endif
