// The GDN delta rule and gated norm on thread block clusters (sm_90): gdn_delta_gated_cl, GdnOps.GDN_GATED_CL. Compiled
// after gdn.cu in the module (kernels.SOURCES): GDN_RAW_PARAMS and gdn_delta_rw_rows (gdn.cu), gated_res and
// stage_head_chunks (norm.cu), cl_rank and cl_sync (norm_cluster.cu).
#include "common.cuh"

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900  // (clusters: sm_90; kernels.cluster_capable)
__device__ __forceinline__ float4 cl_load4(const float* local, unsigned int rank) {  // (16-byte aligned)
  unsigned int a = static_cast<unsigned int>(__cvta_generic_to_shared(local)), ra;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(rank));
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(ra) : "memory");
  return v;
}

// gdn_delta_raw_rw<4> + gated_rmsnorm_chunks in one launch: grid (Hv * 4, M), 256 threads, a cluster of 4 blocks a
// value head (8 warps x 4 state rows = 32 rows a block). Each block runs its rows as gdn_delta_raw_rw<4> (the same
// state and o) and keeps their outputs in shared memory; after a cluster barrier, warp 0 of the head's first block
// reads the head's 128 outputs through distributed shared memory (4 a lane, lane l's from block l / 8: the lane
// layout gated_rmsnorm_chunks loads from o), a second barrier lets the other blocks exit, and the warp applies the
// gated norm (gated_res: gated_vals' arithmetic, z and the norm weight loaded before the delta rule) and stages the
// head's 4 chunks as gated_rmsnorm_chunks does (the values it re-reads from out through L2 stay in registers here):
// out, xh, xsc and xinv the same bits as the two launches, without gated_rmsnorm_chunks' launch, its o load and its
// round trip.
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(256)
    gdn_delta_gated_cl(GDN_RAW_PARAMS, const float* __restrict__ z, int ldz, const float* __restrict__ nw,
                       float* __restrict__ out, int ldo, float eps, int K, int kpad, __half2* __restrict__ xh,
                       float* __restrict__ xinv, float* __restrict__ xsc) {
  NI_PDL_ENTRY();
  __shared__ __align__(16) float orow[32];
  __shared__ __align__(16) float vals[128];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, m = blockIdx.y;
  const int row0 = (blockIdx.x * 8 + warp) * 4, h = blockIdx.x >> 2;  // (grid.x = Hv * 4: no row past the heads)
  const bool lead = cl_rank() == 0 && warp == 0;
  float4 zv, wv;
  if (lead) {  // (independent of the delta rule: in flight with its loads)
    zv = reinterpret_cast<const float4*>(z + (size_t)m * ldz + (size_t)h * 128)[lane];
    wv = reinterpret_cast<const float4*>(nw)[lane];
  }
  float ov[4];
  gdn_delta_rw_rows<4>(GDN_RAW_ARGS, m, row0, ov);
  if (lane == 0) reinterpret_cast<float4*>(orow)[warp] = make_float4(ov[0], ov[1], ov[2], ov[3]);
  cl_sync();  // (every block's 32 outputs in its shared memory)
  float4 o4;
  if (lead) o4 = cl_load4(orow + (lane & 7) * 4, lane >> 3);
  cl_sync();  // (read before any block exits)
  if (!lead) return;
  const float4 res = gated_res(o4, zv, wv, eps);
  reinterpret_cast<float4*>(out + (size_t)m * ldo + (size_t)h * 128)[lane] = res;
  stage_head_chunks(res, vals, h, xh + (size_t)m * kpad / 2, xsc + (size_t)m * (kpad / 32));
  if (h == 0 && lane == 0) xinv[m] = 1.f;
}
#endif
