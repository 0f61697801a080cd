// The GDN delta rule and gated norm on thread block clusters (sm_90): gdn_delta_gated_cl, GdnOps.GDN_GATED_CL. Compiled
// after gdn.cu in the module (kernels.SOURCES): GDN_RAW_PARAMS and gdn_delta_rw_rows (gdn.cu), gated_res and
// stage_head_chunks (norm.cu), cl_rank (norm_cluster.cu).
#include "common.cuh"

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900  // (clusters: sm_90; kernels.cluster_capable)
__device__ __forceinline__ void cl_store4(float* local, unsigned int rank, float4 v) {  // (16-byte aligned)
  unsigned int a = static_cast<unsigned int>(__cvta_generic_to_shared(local)), ra;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(rank));
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};"
               :: "r"(ra), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}

// gdn_delta_raw_rw<4> + gated_rmsnorm_chunks in one launch: grid (Hv * 4, M), 256 threads, a cluster of 4 blocks a
// value head (8 warps x 4 state rows = 32 rows a block). Each block runs its rows as gdn_delta_raw_rw<4> (the same
// state and o) and each warp stores its 4 outputs into the head's first block's shared memory (st.shared::cluster)
// before one cluster barrier, which only that block's warp 0 waits on (a cluster barrier waits for the threads that
// have not exited: the others arrive, with release, and exit). That warp then holds the head's 128 outputs as
// gated_rmsnorm_chunks loads them from o (4 a lane), applies the gated norm (gated_res: gated_vals' arithmetic, z and
// the norm weight loaded before the delta rule) and stages the head's 4 chunks as gated_rmsnorm_chunks does (the
// values it re-reads from out through L2 stay in registers here): out, xh, xsc and xinv the same bits as the two
// launches, without gated_rmsnorm_chunks' launch, its o load and its round trip. (Session 19's first form had warp 0
// read the outputs through DSMEM between two barriers: the one-barrier form measured faster, s19c.)
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(256)
    gdn_delta_gated_cl(GDN_RAW_PARAMS, const float* __restrict__ z, int ldz, const float* __restrict__ nw,
                       float* __restrict__ out, int ldo, float eps, int K, int kpad, __half2* __restrict__ xh,
                       float* __restrict__ xinv, float* __restrict__ xsc, int early) {
  // early (GdnOps.GDN_STATE_EARLY, the decode step): the warp's state rows and the norm weight are loaded before the PDL
  // wait. Only this kernel writes a layer's state within a step (one launch a layer), and the step before ended with
  // the graph launch before this one, so the rows are final while the kernels ahead of it still run.
  __shared__ __align__(16) float orow[128];  // (the head's outputs, in the first block)
  __shared__ __align__(16) float vals[128];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, m = blockIdx.y;
  const int row0 = (blockIdx.x * 8 + warp) * 4, h = blockIdx.x >> 2;  // (grid.x = Hv * 4: no row past the heads)
  const unsigned int rank = cl_rank();
  const bool lead = rank == 0 && warp == 0;
  float4 s[4];
  float4* sp = nullptr;
  float4 zv, wv;
  if (early) {
    sp = gdn_state_rows<4>(state, Hv, m, row0, s);
    if (lead) wv = reinterpret_cast<const float4*>(nw)[lane];
  }
  NI_PDL_ENTRY();
  if (!early) {
    sp = gdn_state_rows<4>(state, Hv, m, row0, s);
    if (lead) wv = reinterpret_cast<const float4*>(nw)[lane];
  }
  if (lead) zv = reinterpret_cast<const float4*>(z + (size_t)m * ldz + (size_t)h * 128)[lane];  // (in flight with the rule's)
  float ov[4];
  gdn_delta_rw_rows_from<4>(GDN_RAW_ARGS, m, row0, sp, s, ov);
  if (lane == 0) cl_store4(orow + (rank * 8 + warp) * 4, 0, make_float4(ov[0], ov[1], ov[2], ov[3]));
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  if (!lead) return;
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");  // (the head's 128 outputs in orow)
  const float4 res = gated_res(reinterpret_cast<const float4*>(orow)[lane], zv, wv, eps);
  reinterpret_cast<float4*>(out + (size_t)m * ldo + (size_t)h * 128)[lane] = res;
  stage_head_chunks(res, vals, h, xh + (size_t)m * kpad / 2, xsc + (size_t)m * (kpad / 32));
  if (h == 0 && lane == 0) xinv[m] = 1.f;
}
#endif
