// The GDN delta rule and gated norm on thread block clusters (sm_90): gdn_delta_gated_cl (the plan's gdn on sm_90). Compiled
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
// launches, without gated_rmsnorm_chunks' launch, its o load and its round trip. (A first form had warp 0
// read the outputs through DSMEM between two barriers: the one-barrier form measured faster.)
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(256)
    gdn_delta_gated_cl(GDN_RAW_PARAMS, const float* __restrict__ z, int ldz, const float* __restrict__ nw,
                       float* __restrict__ out, int ldo, float eps, int K, int kpad, __half2* __restrict__ xh,
                       float* __restrict__ xinv, float* __restrict__ xsc, int early,
                       const unsigned short* __restrict__ abw, const float* __restrict__ xab, int ldx, int H) {
  // abw != nullptr (the plan's gdn_ab_in): the head's a and b projections computed here from the bf16 [a; b] weights (2 Hv
  // rows of H) and the fp32 normed row xab (ldx apart), as gemv_bf16 with 8 warps a row (kw 8) computes them, instead
  // of reading ab: the layer's a|b GEMV, its branch and its join go (the launch after a join is a plain one). Every
  // block computes both for its head: warp p takes chunks p, p + 8, ... of 8 values of both rows (its weights loaded
  // before the PDL wait), then the 8 warps' sums in order through shared memory. H % 8 == 0, H <= 8192.
  // early (the decode step): the warp's state rows and the norm weight are loaded before the PDL
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
  __shared__ float abred[8][2];
  __shared__ float abv[2];
  constexpr int ABC = 4;  // chunks of 8 values a lane a row, at most
  const int abn = (H + 2047) >> 11, abj = H >> 3;  // (H / 8 chunks a row over 256 threads)
  uint4 wa[ABC], wb[ABC];
  if (abw != nullptr) {
    const uint4* ra = reinterpret_cast<const uint4*>(abw + (size_t)h * H);
    const uint4* rb = reinterpret_cast<const uint4*>(abw + (size_t)(Hv + h) * H);
#pragma unroll
    for (int i = 0; i < ABC; ++i)
      if (i < abn && lane + 32 * warp + 256 * i < abj) {
        wa[i] = ldw(ra + lane + 32 * warp + 256 * i);
        wb[i] = ldw(rb + lane + 32 * warp + 256 * i);
      }
  }
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
  if (abw != nullptr) {
    float aa = 0.f, ab2 = 0.f;
#pragma unroll
    for (int i = 0; i < ABC; ++i)
      if (i < abn && lane + 32 * warp + 256 * i < abj) {
        const int j = lane + 32 * warp + 256 * i;
        const float4* xp = reinterpret_cast<const float4*>(xab + (size_t)m * ldx + j * 8);
        const float4 a = xp[0], b = xp[1];
        const uint4 v = wa[i], u = wb[i];
        aa += bf16_lo(v.x) * a.x + bf16_hi(v.x) * a.y + bf16_lo(v.y) * a.z + bf16_hi(v.y) * a.w + bf16_lo(v.z) * b.x +
              bf16_hi(v.z) * b.y + bf16_lo(v.w) * b.z + bf16_hi(v.w) * b.w;
        ab2 += bf16_lo(u.x) * a.x + bf16_hi(u.x) * a.y + bf16_lo(u.y) * a.z + bf16_hi(u.y) * a.w + bf16_lo(u.z) * b.x +
               bf16_hi(u.z) * b.y + bf16_lo(u.w) * b.z + bf16_hi(u.w) * b.w;
      }
    aa = warp_sum(aa);
    ab2 = warp_sum(ab2);
    if (lane == 0) {
      abred[warp][0] = aa;
      abred[warp][1] = ab2;
    }
    __syncthreads();
    if (threadIdx.x < 2) {
      float t = 0.f;
      for (int p = 0; p < 8; ++p) t += abred[p][threadIdx.x];
      abv[threadIdx.x] = t;
    }
    __syncthreads();
  }
  float ov[4];
  gdn_delta_rw_rows_from<4>(GDN_RAW_ARGS, m, row0, sp, s, ov, abw != nullptr ? abv : nullptr);
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
