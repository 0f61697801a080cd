// The MoE block of one decode token as one persistent launch (the plan's moe_fused):
//
//   [planes = o att (the o-projection, MOE_FUSED_O); --- grid barrier ---]
//   x_out = x_in + planes;  xn = rmsnorm(x_out) (1 + w)        every block, into its own shared memory
//   logits = router xn (bf16, E + 1 rows: the experts', then the shared expert's gate)   a warp a row
//   act_s = silu(sgate xn) * (sup xn)                         the shared expert's gate|up, a warp a row pair
//   --- grid barrier ---
//   top-k of the logits                                       warp 0 of every block, into its shared memory
//   act_e[z] = silu(gate_e xn) * (up_e xn), e = eidx[z]        the routed gate|up, a warp a row pair; a block's
//                                                              32-value chunks of act_e and act_s staged as int16
//                                                              pairs with a scale each (mlp_fused's CHUNK form)
//   --- grid barrier ---
//   y[z] = wts[z] down_e act_e[z]; y[k] = wts[k] sdown act_s   a half-warp DR rows (moe_down's), k + 1 planes
//
// Why: the kernel-per-op MoE step is a chain of five dependent launches a layer (norm, router GEMV beside the shared
// gate|up, top-k, routed gate|up, moe_down), each ~1-3 MB of weights: their ramps, tails and boundaries cost more than
// the bytes (measured: ~21 us a layer for ~6 MB). Here the blocks stay resident across the chain; every
// warp's phase-1 weights are in flight before the norm, and each step starts at a grid barrier instead of a launch.
// Not the kernels' bits (the router's rows summed by one warp, the down's input staged by chunks, int16 pairs and
// dp2a where moe_down takes fp32 products); the planes are those moe_down writes, so the next norm is unchanged. The top-k runs in every block (256 logits, cheap).
// Grid: every block resident (the occupancy calculator's grid, a cooperative launch); a barrier that waits ~2 s traps.
// (Written without device time first; see docs/performance.md.)
#include "common.cuh"
#include "persistent.cu"

#define MOE_MAX_TOPK 16
// opts (kernel_names.MOE_FUSED_OPTS): the norm's first two planes loaded with x and w in one round; the top-k by
// route_row_redux; the grid barriers' light form (persistent.cu). (4, the down's weights prefetched into L2 after
// the top-k, measured slower twice: removed in 8dfe9a2.)
#define MOE_OPT_PLANES2 1
#define MOE_OPT_REDUX 2
#define MOE_OPT_LIGHT_BAR 8
#define MOE_OPT_RED 32  // the grid barriers' red form (persistent.cu: grid_arrive_red), light waits
#define MOE_CHUNKS 16
#define MOE_OT 4  // the o-projection's 16-byte chunks a lane a slice at most   // 32-value chunks of the routed SwiGLU row a block at most (warp 31 packs a shared chunk)

// R rows (row0.., nrows of them real) of a row-split [N, K] matrix against chunk-scaled staged pairs (xp4 / xsc, the
// row's first 32-value chunk at cb), a half-warp per row group (moe_down's half_warp_rows on staged x): lane hl takes
// chunks hl, hl + 16, ... of each row, its weight loads issued first. Row sums in every lane of the half.
template <int FMT, int R>
__device__ __forceinline__ void half_rows_staged(const unsigned char* __restrict__ base,
                                                 const unsigned char* __restrict__ high,
                                                 const __half* __restrict__ scales, int gpr, long long row0, int nrows,
                                                 const uint4* __restrict__ xp4, const float* __restrict__ xsc, int cb,
                                                 float (&acc)[R]) {
  constexpr int U = Fmt<FMT>::VPU == 16 ? 2 : 1;
  const int hl = threadIdx.x & 15, u4 = gpr * 2;
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  for (int j0 = hl; j0 < u4; j0 += 16 * U) {
    uint4 w[U][R];
    uint2 hb[U][R];
    float sc[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (j0 + 16 * u < u4)
          load_chunk<FMT>(base, high, scales, gpr, u4, (size_t)(row0 + (r < nrows ? r : 0)), j0 + 16 * u, w[u][r],
                          sc[u][r], hb[u][r]);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + 16 * u;
      if (j >= u4) continue;
      if constexpr (FMT == FMT_W8) {  // (a 16-code chunk is half of the staged 32-value chunk J)
        const int J = cb + (j >> 1);
        const uint4* xq = xp4 + ((J >> 5) << 7) + 64 * (j & 1) + (J & 31);
        const uint4 s0 = __ldg(xq), s1 = __ldg(xq + 32);
        const float xs = __ldg(xsc + J);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] += (sc[u][r] * xs) * dot_w8_i16(w[u][r], s0, s1);
      } else {
        const int J = cb + j;
        const uint4* xq = xp4 + ((J >> 5) << 7) + (J & 31);
        uint4 xv[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) xv[c] = __ldg(xq + 32 * c);
        const float xs = __ldg(xsc + J);
#pragma unroll
        for (int r = 0; r < R; ++r)
          acc[r] += (sc[u][r] * xs) * dot_i16<FMT>(w[u][r], hb[u][r], [&](int c) { return xv[c]; });
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
}

// FGU / FDN: the routed experts' gate|up ([E x 2 ie, H]: expert e's gate rows, then its up rows) and down ([E x H, ie])
// formats; FSG / FSD: the shared expert's ([2 si, H], [H, si]); VPT: the norm's values a thread (H <= 1,024 VPT); DR:
// the down's rows a half-warp. part: the norm's nplanes input planes and the k + 1 output planes (part_stride apart).
template <int FGU, int FDN, int FSG, int FSD, int VPT, int DR>
__global__ void __launch_bounds__(MLP_THREADS, 1) moe_fused(
    const float* __restrict__ x_in, float* __restrict__ x_out, float* part, int nplanes, int part_stride,
    const float* __restrict__ norm_w, int H, float eps, int kpad_h, const unsigned short* __restrict__ rw, int E,
    int topk, float* __restrict__ rlog, int* __restrict__ eidx, float* __restrict__ ewts,
    const unsigned char* __restrict__ gbase, const unsigned char* __restrict__ ghigh, const __half* __restrict__ gscales,
    int ggpr, int ie, unsigned int* __restrict__ xh, float* __restrict__ xsc, const unsigned char* __restrict__ sgbase,
    const unsigned char* __restrict__ sghigh, const __half* __restrict__ sgscales, int sggpr, int si,
    float* __restrict__ act_s, const unsigned char* __restrict__ dbase, const unsigned char* __restrict__ dhigh,
    const __half* __restrict__ dscales, int dgpr, const unsigned char* __restrict__ sdbase,
    const unsigned char* __restrict__ sdhigh, const __half* __restrict__ sdscales, int sdgpr,
    unsigned long long* __restrict__ bar, unsigned long long* __restrict__ tstamp, int opts,
    const unsigned char* __restrict__ obase, const __half* __restrict__ oscales, int ogpr, int osplits, int ou4ps,
    const unsigned int* __restrict__ xh_o, const float* __restrict__ xinv_o, const float* __restrict__ xsc_o) {
  extern __shared__ __align__(16) unsigned char moe_smem[];
  __shared__ float red[64];
  __shared__ int s_idx[MOE_MAX_TOPK];
  __shared__ float s_wts[MOE_MAX_TOPK + 1];
  __shared__ float cvals[MOE_CHUNKS * 32];  // (this block's routed SwiGLU chunks)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int nwarps = gridDim.x * (MLP_THREADS / 32), gw = warp * gridDim.x + blockIdx.x;
  // OPROJ: a warp's first o item's weights and scales are loaded before the PDL wait (weights depend on no kernel;
  // under a programmatic launch, K.COOP_PDL, they arrive while the kernel before drains)
  const bool oproj = obase != nullptr;
  const int ou4 = ogpr * 2, oitems = H * osplits;
  uint4 ow[MOE_OT];
  float osc[MOE_OT];
  auto oload = [&](int it) {
    const int row = it / osplits, js = (it - row * osplits) * ou4ps, je = min(js + ou4ps, ou4);
#pragma unroll
    for (int t = 0; t < MOE_OT; ++t) {
      const int j = js + lane + 32 * t;
      if (j < je) {
        ow[t] = ldw(reinterpret_cast<const uint4*>(obase) + (size_t)row * ou4 + j);
        osc[t] = __half2float(oscales[(size_t)row * ogpr + (j >> 1)]);
      }
    }
  };
  if (oproj && gw < oitems) oload(gw);
  NI_PDL_ENTRY();
  auto stamp = [&](int i) { phase_stamp(tstamp, i); };
  stamp(0);
  __shared__ unsigned long long bar_next;
  GridBar gb(bar, opts & MOE_OPT_RED, opts & MOE_OPT_LIGHT_BAR, &bar_next);
  const bool light = gb.light;
  auto arrive = [&]() { return gb.arrive(); };
  // OPROJ (obase != nullptr): the layer's w8 o-projection first, its input the one-scale staged
  // pairs (xh_o, xinv_o[0]: gated_rmsnorm_stage's / attn_combine_stage's) or, with xsc_o, the chunk-scaled ones
  // (gated_rmsnorm_chunks' / attn_combine_chunks': the scale of 32-value chunk J at xsc_o[J], xinv_o[0] = 1; not
  // gemv_rs_pre's bits then), item = (row, split-K slice of ou4ps chunks)
  // over every warp (gemv_rs_pre's w8 arithmetic), its osplits planes into part where the norm reads them (nplanes =
  // osplits); then a grid barrier, with the norm's x and w and each warp's phase-1 weights loaded between its arrival
  // and its wait
  unsigned long long o_target = 0;
  if (oproj) {
    const float oinv = __ldg(xinv_o);
    const uint4* xo4 = reinterpret_cast<const uint4*>(xh_o) + 64 * (lane & 1);
    for (int it = gw; it < oitems; it += nwarps) {
      const int row = it / osplits, s = it - row * osplits, js = s * ou4ps, je = min(js + ou4ps, ou4);
      if (it != gw) oload(it);
      float acc = 0.f;
#pragma unroll
      for (int t = 0; t < MOE_OT; ++t) {
        const int j = js + lane + 32 * t;
        if (j < je) {  // (chunk j: the staged 32-value chunk J = j / 2, slots 2 (j & 1) and + 1)
          const int J = j >> 1;
          const uint4* xq = xo4 + ((J >> 5) << 7) + (J & 31);
          const float ws = xsc_o != nullptr ? osc[t] * __ldg(xsc_o + J) : osc[t];
          acc += ws * dot_w8_i16(ow[t], __ldg(xq), __ldg(xq + 32));
        }
      }
      acc = warp_sum(acc);
      if (lane == 0) part[(size_t)s * part_stride + row] = acc * oinv;
    }
    o_target = arrive();
  }
  RowNorm<VPT> nm;
  const bool planes2 = oproj || (opts & MOE_OPT_PLANES2);
  if (oproj) {
    nm.load_xw(x_in, norm_w, H);
  } else if (planes2) {  // x_in, 1 + w and the first two planes in one round of loads
    nm.load_xw(x_in, norm_w, H);
    nm.load_planes2(part, nplanes, part_stride, H);
  } else {
    nm.load(x_in, norm_w, part, nplanes, H);
  }

  // phase 1: item it < E + 1 is router row it (bf16, H / 8 uint4 a row), else shared pair it - E - 1 (rows g, g + si).
  // The first item's weights are loaded before the norm (its x is not needed to load them): P4 uint4 a lane either way.
  using FS = Fmt<FSG>;
  constexpr int P4 = 4 * VPT;                          // router: H / 256 <= 4 VPT; shared: 2 rows x H / (32 VPU)
  constexpr int ST = FS::VPU == 16 ? 2 * VPT : VPT;    // the shared rows' chunks a lane, at most
  const int n1 = E + 1 + si, rn4 = H / 8, sn4 = sggpr * 2;
  uint4 pw[P4];
  float psc[2][ST];
  uint2 phb[2][ST];
  auto load1 = [&](int it) {
    if (it <= E) {
      const uint4* wr = reinterpret_cast<const uint4*>(rw + (size_t)it * H);
#pragma unroll
      for (int t = 0; t < P4; ++t)
        if (lane + 32 * t < rn4) pw[t] = ldw(wr + lane + 32 * t);
    } else {
      const int g = it - E - 1;
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int t = 0; t < ST; ++t)
          if (lane + 32 * t < sn4)
            load_chunk<FSG>(sgbase, sghigh, sgscales, sggpr, sn4, (size_t)(g + r * si), lane + 32 * t, pw[r * ST + t],
                            psc[r][t], phb[r][t]);
    }
  };
  int it1 = gw;
  if (it1 < n1) load1(it1);
  if (oproj) {  // (the loads above issued after arriving: the arrival does not wait for them)
    grid_wait(bar, o_target, light);
    nm.load_planes2(part, nplanes, part_stride, H);
  }

  const float inv = nm.finish(part, nplanes, part_stride, H, eps, kpad_h, x_out, red, moe_smem, planes2 ? 2 : 1);
  const uint4* xs4 = reinterpret_cast<const uint4*>(moe_smem);
  const float* xf = reinterpret_cast<const float*>(moe_smem + (size_t)kpad_h * 2);
  stamp(1);
  while (it1 < n1) {
    if (it1 <= E) {
      float acc = 0.f;
#pragma unroll
      for (int t = 0; t < P4; ++t) {
        const int j = lane + 32 * t;
        if (j < rn4) {
          const uint4 v = pw[t];
          const float4 a = reinterpret_cast<const float4*>(xf)[2 * j], b = reinterpret_cast<const float4*>(xf)[2 * j + 1];
          acc += bf16_lo(v.x) * a.x + bf16_hi(v.x) * a.y + bf16_lo(v.y) * a.z + bf16_hi(v.y) * a.w +
                 bf16_lo(v.z) * b.x + bf16_hi(v.z) * b.y + bf16_lo(v.w) * b.z + bf16_hi(v.w) * b.w;
        }
      }
      acc = warp_sum(acc);
      if (lane == 0) rlog[it1] = acc;
    } else {
      float acc[2] = {0.f, 0.f};
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int t = 0; t < ST; ++t) {
          const int j = lane + 32 * t;
          if (j < sn4) {
            float d;
            if constexpr (FSG == FMT_W8) {  // (a 16-code chunk is half of the staged 32-value block j / 2)
              const int J = j >> 1;
              const uint4* xq = xs4 + 64 * (j & 1) + (J >> 5) * 128 + (J & 31);
              d = dot_w8_i16(pw[r * ST + t], xq[0], xq[32]);
            } else {
              const uint4* xq = xs4 + (j >> 5) * 128 + (j & 31);
              d = dot_core<FSG>(pw[r * ST + t], phb[r][t], [&](int c) { return xq[c * 32]; }, 0);
            }
            acc[r] += psc[r][t] * d;
          }
        }
      const float o = silu(warp_sum(acc[0]) * inv * 1.f) * (warp_sum(acc[1]) * inv * 1.f);
      if (lane == 0) act_s[it1 - E - 1] = o;
    }
    it1 += nwarps;
    if (it1 < n1) load1(it1);
  }
  stamp(2);
  grid_wait(bar, arrive(), light);
  stamp(3);

  // phase 2: the top-k in every block (warp 0, from the logits in L2), then the routed gate|up: the SwiGLU row of the
  // k slots (slot z at z ie) in 32-value chunks, block b owning chunks b, b + grid, ..., warp w value w of each; each
  // block packs its chunks with a power-of-two scale each (mlp_fused's chunk-scaled staging) into xh / xsc, and block b
  // < si / 32 the shared expert's chunk b (act_s, phase 1) after them: the down's input, staged before the barrier
  if (warp == 0) {
    if (!(opts & MOE_OPT_REDUX)) route_row<true>(rlog, E, topk, s_idx, s_wts, topk + 1, 0);
    else if (E <= 256) route_row_redux<8, true>(rlog, E, topk, s_idx, s_wts, topk + 1, 0);
    else route_row_redux<16, true>(rlog, E, topk, s_idx, s_wts, topk + 1, 0);
  }
  __syncthreads();
  const int half = (tid >> 4) & 1, ng = (H + DR - 1) / DR, wps = (ng + 1) / 2, n3 = (topk + 1) * wps;
  if (blockIdx.x == 0 && tid <= topk) {  // (the routing as moe_route leaves it, for the tests)
    if (tid < topk) eidx[tid] = s_idx[tid];
    ewts[tid] = s_wts[tid];
  }
  stamp(4);
  const int nch2 = topk * ie / 32;  // (ie % 32 == 0)
  WarpRows<FGU, 2, 2> gu;
  const int g_iters = ggpr * 2 > lane ? (ggpr * 2 - lane + 31) >> 5 : 0;
  auto gu_start = [&](int c) {
    const int it = c * 32 + warp, z = it / ie, g = it - z * ie, r0 = s_idx[z] * 2 * ie + g;
    const int rows[2] = {r0, r0 + ie};
    gu.start(gbase, ghigh, gscales, ggpr, rows, lane, g_iters);
    gu.load();
  };
  int c2 = blockIdx.x, k2 = 0;
  if (c2 < nch2) gu_start(c2);
  while (c2 < nch2) {
    float acc[2];
    gu.run(acc, [&](int i, int c) { return xs4[lane + i * 128 + c * 32]; });
    const int nxt = c2 + gridDim.x;
    if (nxt < nch2) gu_start(nxt);
    const float o = silu(warp_sum(acc[0]) * inv * 1.f) * (warp_sum(acc[1]) * inv * 1.f);
    if (lane == 0) cvals[k2 * 32 + warp] = o;
    c2 = nxt;
    ++k2;
  }
  __syncthreads();
  auto pack = [&](float v, int C) {  // (attn_combine_chunks' packing: chunk C of the staged row)
    const float sc = pow2_scale(warp_max(fabsf(v)));
    const int cs = (lane >> 2) & 3, jp = lane & 3, ka = 8 * cs + stage_a(jp);
    const float va = __shfl_sync(0xffffffffu, v, ka), vb = __shfl_sync(0xffffffffu, v, ka + STAGE_GAP);
    if (lane < 16) xh[(C >> 5) * 512 + cs * 128 + (C & 31) * 4 + jp] = stage_pack(va * sc, vb * sc);
    if (lane == 0) xsc[C] = 1.f / sc;
  };
  if (warp < k2) pack(cvals[warp * 32 + lane], blockIdx.x + warp * gridDim.x);
  else if (warp == 31 && (int)blockIdx.x < si / 32) pack(__ldcg(act_s + blockIdx.x * 32 + lane), nch2 + blockIdx.x);
  stamp(5);
  grid_wait(bar, arrive(), light);
  stamp(6);

  // phase 3: the down-projections as moe_down: warp item = (slot z, two half-warp row groups of DR rows); slots < topk
  // routed (expert s_idx[z]'s rows, x = the staged chunks of slot z), slot topk the shared expert (x = its chunks
  // after the routed ones); y[z] = acc * wts[z]
  const uint4* xp4 = reinterpret_cast<const uint4*>(xh);
  for (int it = gw; it < n3; it += nwarps) {
    const int z = it / wps, grp = (it - z * wps) * 2 + half;
    const int row0 = grp * DR < H ? grp * DR : 0, nrows = grp * DR < H ? min(DR, H - row0) : 0;
    float acc[DR];
    if (z < topk)
      half_rows_staged<FDN, DR>(dbase, dhigh, dscales, dgpr, (long long)s_idx[z] * H + row0, nrows, xp4, xsc,
                                z * (ie >> 5), acc);
    else
      half_rows_staged<FSD, DR>(sdbase, sdhigh, sdscales, sdgpr, row0, nrows, xp4, xsc, nch2, acc);
    if ((tid & 15) == 0) {
      const float wt = s_wts[z];
#pragma unroll
      for (int r = 0; r < DR; ++r)
        if (r < nrows) part[(size_t)z * part_stride + row0 + r] = acc[r] * wt;
    }
  }
  stamp(7);
}
