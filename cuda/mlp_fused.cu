// The dense MLP of one decode token as one persistent launch (the plan's mlp_fused):
//
//   x_out = x_in + planes;  xn = rmsnorm(x_out) (1 + w)            every block, into its own shared memory
//   act = silu(gate xn) * (up xn), its largest |value| folded      gate|up, a warp a row pair (gemv_rs_pre's)
//   --- grid barrier ---  act staged as the down input's int16 pairs (stage_x_amax's): local_stage, by every block
//                         into its own shared memory; else a slice a block into global memory, then a second barrier
//   y[s] = down[:, slice s] pairs                                   split-K planes (gemv_rs_pre's)
//
// CHUNK (the default): each block owns whole 32-value chunks of act and packs them with a scale
// each before the barrier (no maximum, no staging after it; the down multiplies the chunk scale in: not the four
// kernels' bits); with help, the chunks left over after an equal share a block are computed by every warp in slices.
//
// Why: the kernel-per-op step pays, a layer, a norm launch (4.4 us), a staging launch (2.3 us), three graph
// boundaries (~0.55 us each) and the ramp of two GEMVs whose first weight loads wait for the launch. Here the
// blocks are resident for the whole MLP (one a multiprocessor, 32 warps: the occupancy the register GEMVs run at),
// so every warp issues its first weight loads before the dependent step in front of them (the norm, the
// barriers), and the next row group's loads before the current one's reduction. Without CHUNK the arithmetic is
// the kernels' it replaces, in the same order: the planes it writes are bit-identical to residual_rmsnorm_mb ->
// gemv_rs_pre (SwiGLU, amax) -> stage_x_amax -> gemv_rs_pre (partial).
// The grid barrier needs every block resident at once: the launch takes the occupancy calculator's grid, and
// nothing runs beside it in the decode graph (it sits on the main chain between joins). A barrier that waits
// ~2 s (a block that never became resident) traps instead of hanging.
#include "common.cuh"
#include "persistent.cu"

#define MLP_CHUNKS 16  // chunk-scaled down input: 32-value chunks a block at most (gemv_plan checks)

// FGU: gate|up's format (rows g and g + I of a [gate; up] object, I = inter); FDN, DROWS: the down-projection's
// format and rows a warp; VPT: the norm's values a thread (H <= 1,024 VPT). kpad_h / kpad_i: the staged widths (H and
// I rounded up to 1,024). Dynamic shared memory: kpad_h x 6 bytes (the normed row's pairs, then its fp32 values), or
// kpad_i x 2 (the down's pairs) where local_stage needs more.
#define MLP_FUSED_PARAMS                                                                                          \
  const float* __restrict__ x_in, float* __restrict__ x_out, const float* __restrict__ part, int nplanes,        \
      int part_stride, const float* __restrict__ norm_w, int H, float eps, int kpad_h,                           \
      const unsigned char* __restrict__ gbase, const unsigned char* __restrict__ ghigh,                          \
      const __half* __restrict__ gscales, int ggpr, float* __restrict__ act, int inter, int kpad_i,              \
      __half2* __restrict__ xh_act, float* __restrict__ xinv_act, unsigned int* __restrict__ slot,               \
      const unsigned char* __restrict__ dbase, const unsigned char* __restrict__ dhigh,                          \
      const __half* __restrict__ dscales, int dgpr, int du4ps, int dsplits, float* __restrict__ y, int plane,    \
      unsigned long long* __restrict__ bar, unsigned long long* __restrict__ tstamp, int local_stage,            \
      float* __restrict__ xsc, unsigned int* __restrict__ help, const unsigned char* __restrict__ obase,         \
      const unsigned char* __restrict__ ohigh, const __half* __restrict__ oscales, int ogpr, int ou4ps,          \
      int osplits, const __half2* __restrict__ xh_o, const float* __restrict__ xsc_o, int o_chunked
// OPROJ (with CHUNK): the layer's o-projection first, in FDN's format, its input the gated
// norm's chunk-scaled pairs (xh_o, xsc_o: gated_rmsnorm_chunks'), split-K items over the launch's warps as the down's,
// its osplits planes written where the norm reads them (part, part_stride apart; nplanes = osplits); then a grid
// barrier, with each warp's first gate|up loads issued between its arrival and its wait, and the norm. Two barriers a
// launch: its counter must serve OPROJ launches only (the help counts follow the launch number). XW (with OPROJ): the
// norm's x_in and 1 + w loaded before the barrier's wait, its first two planes together after it (one L2 round, not two).
// o_chunked: xsc_o holds a scale a 32-value chunk (gated_rmsnorm_chunks'); 0: one for the row, xsc_o[0] (the attention
// layers' staging, attn_combine_stage's xinv). OU: the o-projection's 16-byte loads a lane in flight a row.
template <int FGU, int FDN, int DROWS, int VPT, bool CHUNK = false, bool OPROJ = false, bool XW = false, int OU = 2>
__global__ void __launch_bounds__(MLP_THREADS, 1) mlp_fused(MLP_FUSED_PARAMS) {
  extern __shared__ __align__(16) unsigned char mlp_smem[];
  __shared__ float red[64];
  __shared__ float cvals[MLP_CHUNKS * 32];  // (xsc: this block's SwiGLU values, MLP_CHUNKS chunks at most)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // warp w of block b is warp w x grid + b of the launch: a round's last, partial pass spreads over every block
  const int nwarps = gridDim.x * (MLP_THREADS / 32), gw = warp * gridDim.x + blockIdx.x;
  // OPROJ: a warp's first o item's weight loads are issued before the PDL wait (weights depend on no kernel; under a
  // programmatic launch, K.COOP_PDL, they arrive while the kernel before drains)
  const int oitems = OPROJ ? ((H + DROWS - 1) / DROWS) * osplits : 0;
  WarpRows<FDN, DROWS, OU> op;
  auto o_start = [&](int it) { op.start_item(obase, ohigh, oscales, ogpr, H, it, osplits, ou4ps, lane); };
  if (OPROJ && gw < oitems) o_start(gw);
  NI_PDL_ENTRY();
  // (the grid barriers' light form; bit 4 their red form, light waits: persistent.cu)
  __shared__ unsigned long long bar_next;
  GridBar gb(bar, local_stage & 4, local_stage & 2, &bar_next);
  const bool light = gb.light;
  auto arrive = [&]() { return gb.arrive(); };
  auto stamp = [&](int i) { phase_stamp(tstamp, i); };
  stamp(0);
  // help (CHUNK): the launch's number on this barrier counter (one barrier a launch: the counter at the start over
  // the grid; no block of this launch can have passed it yet), for the helpers' counters below
  __shared__ unsigned int launch_no;
  if (CHUNK && help != nullptr && tid == 0) {
    unsigned long long c;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(c) : "l"(bar) : "memory");
    launch_no = (unsigned int)(c / ((unsigned long long)gridDim.x * (OPROJ ? 2 : 1)));
  }

  // the norm's loads first (x_in, 1 + w, the first partial plane), then the first gate|up group's weight loads, so
  // that the norm's values do not queue behind the weights
  const uint4* xs = reinterpret_cast<const uint4*>(mlp_smem);
  RowNorm<VPT> nm;
  if constexpr (!OPROJ) nm.load(x_in, norm_w, part, nplanes, H);
  // gate|up: group g is SwiGLU output g (gate row g, up row g + inter); every lane walks the whole row
  WarpRows<FGU, 2, 2> gu;
  const int g_iters = ggpr * 2 > lane ? (ggpr * 2 - lane + 31) >> 5 : 0;
  // CHUNK (chunk-scaled down input): block b owns the 32-value chunks [cb0, cb1) of the SwiGLU row (the down
  // rows' chunk count, dgpr x 2), warp w group w of each; else warp gw takes groups gw, gw + nwarps, ...
  // help (CHUNK): block b owns chunks [b q, (b + 1) q) (q = chunks / grid) and, for b < nextra (the remainder), chunk
  // grid q + b, whose 32 row pairs every warp of the launch computes a 32-lane slice of each after its own rows (the
  // helpers) and the owner sums: the remainder's round spread over the grid instead of run by nextra blocks alone
  const int nch_d = dgpr * 2;
  const bool helped = CHUNK && help != nullptr;
  const int q = nch_d / gridDim.x, nextra = helped ? nch_d - q * gridDim.x : 0;
  const int cb0 = helped ? blockIdx.x * q : (int)((long long)blockIdx.x * nch_d / gridDim.x);
  const int cb1 = helped ? cb0 + q : (int)((long long)(blockIdx.x + 1) * nch_d / gridDim.x);
  int g = CHUNK ? cb0 * 32 + warp : gw;
  const int g_step = CHUNK ? 32 : nwarps, g_end = CHUNK ? min(cb1 * 32, inter) : inter;
  unsigned long long o_target = 0;
  if constexpr (OPROJ) {
    static_assert(CHUNK, "the o-projection phase runs with the chunk-scaled form");
    // item = row group x split-K slice of the o-projection, warp gw takes gw, gw + nwarps, ...; the next item's
    // loads in flight during this one's reduction; x pairs and chunk scales from global memory (L1)
    float* const oplanes = const_cast<float*>(part);  // (read back by the norm after the barrier, through L2)
    const uint4* xo4 = reinterpret_cast<const uint4*>(xh_o);
    int oi = gw;
    while (oi < oitems) {
      const int grp = oi / osplits, s = oi - grp * osplits;
      const uint4* xl = xo4 + ((s * ou4ps) >> 5) * 128 + lane;
      const float* xsl = xsc_o + (o_chunked ? s * ou4ps + lane : 0);
      const int xstep = o_chunked ? 32 : 0;
      float acc[DROWS];
      op.template run<true>(acc, [&](int it, int c) { return __ldg(xl + it * 128 + c * 32); },
                            [&](int it) { return __ldg(xsl + xstep * it); });
      const int nxt = oi + nwarps;
      if (nxt < oitems) o_start(nxt);
#pragma unroll
      for (int r = 0; r < DROWS; ++r) {
        const float v = warp_sum(acc[r]);
        const int row = grp * DROWS + r;
        if (lane == 0 && row < H) oplanes[(size_t)s * part_stride + row] = v;
      }
      oi = nxt;
    }
    o_target = arrive();
  }
  if (g < g_end) {
    const int rows[2] = {g, g + inter};
    gu.start(gbase, ghigh, gscales, ggpr, rows, lane, g_iters);
    gu.load();
  }
  int s_from = 1;
  if constexpr (OPROJ) {  // (the gate|up loads above issued after arriving: the arrival's fence does not wait for them)
    if constexpr (XW) nm.load_xw(x_in, norm_w, H);
    grid_wait(bar, o_target, light);
    stamp(6);
    if constexpr (XW) {
      nm.load_planes2(part, nplanes, part_stride, H);
      s_from = 2;
      stamp(7);
    } else {
      nm.load(x_in, norm_w, part, nplanes, H);
    }
  }

  // the norm (residual_rmsnorm_mb's operations in its order, so the same bits), into this block's pairs
  const float gu_inv = nm.finish(part, nplanes, part_stride, H, eps, kpad_h, x_out, red, mlp_smem, s_from);

  stamp(1);
  // gate|up + SwiGLU, x from shared memory
  float wrote = 0.f;
  {
    const uint4* xl = xs + lane;
    auto xat = [&](int it, int c) { return xl[it * 128 + c * 32]; };
    const float inv[1] = {gu_inv};
    // help: item (leftover row pair ge, 32-lane slice pp) of the helpers' loop below (`hit`: this warp's next valid
    // one); the first one's loads go in flight during the warp's last own reduction
    const int P = (ggpr * 2 + 31) >> 5, nitems = nextra * 32 * P;
    auto help_pair = [&](int it) { const int ge = it / P; return (gridDim.x * q + (ge >> 5)) * 32 + (ge & 31); };
    auto next_valid = [&](int it) {
      while (it < nitems && help_pair(it) >= inter) it += nwarps;
      return it;
    };
    auto help_start = [&](int it) {
      const int gg = help_pair(it), js = (it % P) * 32;
      const int rows[2] = {gg, gg + inter};
      gu.start(gbase, ghigh, gscales, ggpr, rows, js + lane, js + lane < ggpr * 2 ? 1 : 0);
      gu.load();
    };
    int hit = next_valid(gw);
    bool preloaded = false;
    while (g < g_end) {
      float acc[2];
      gu.run(acc, xat);
      const int gn = g + g_step;
      if (gn < g_end) {  // the next group's loads in flight during this one's reduction
        const int rows[2] = {gn, gn + inter};
        gu.start(gbase, ghigh, gscales, ggpr, rows, lane, g_iters);
        gu.load();
      } else if (hit < nitems) {
        help_start(hit);
        preloaded = true;
      }
      if constexpr (CHUNK) {  // (gemv_store's SwiGLU, the value also kept for the block's chunk staging)
        const float o = silu(warp_sum(acc[0]) * inv[0] * 1.f) * (warp_sum(acc[1]) * inv[0] * 1.f);
        if (lane == 0) {
          act[g] = o;
          cvals[g - cb0 * 32] = o;
        }
      } else {
        float a2[2][1] = {{acc[0]}, {acc[1]}};
        wrote = fmaxf(wrote, gemv_store<2, 1, true>(a2, g, 2 * inter, inter, EPI_SWIGLU, inv, 1.f, act, 0, lane,
                                                     ConvEpi{nullptr, nullptr, 0, 0, 0}));
      }
      g = gn;
    }
    if constexpr (CHUNK) {
      if (nextra > 0) {
        // the helpers: item (extra row pair ge, 32-lane slice pp), its two partial sums into hpart, then a count
        float2* hpart = reinterpret_cast<float2*>(help + gridDim.x * 32);
        for (; hit < nitems; hit = next_valid(hit + nwarps)) {
          const int ge = hit / P, pp = hit - ge * P, js = pp * 32;
          if (!preloaded) help_start(hit);
          preloaded = false;
          float acc[2];
          const uint4* xh0 = xl + (js >> 5) * 128;
          gu.run(acc, [&](int i2, int c) { return xh0[i2 * 128 + c * 32]; });
          const float gs = warp_sum(acc[0]), us = warp_sum(acc[1]);
          if (lane == 0) {
            hpart[(size_t)ge * P + pp] = make_float2(gs, us);
            __threadfence();
            atomicAdd(help + ge, 1u);
          }
        }
        // the owner: its warp w waits for row pair w's P counts of this launch, sums the slices in order
        const int gg = (gridDim.x * q + blockIdx.x) * 32 + warp;
        if ((int)blockIdx.x < nextra && gg < inter && lane == 0) {
          const int ge = blockIdx.x * 32 + warp;
          const unsigned int target = (launch_no + 1u) * (unsigned int)P;
          const long long t0 = clock64();
          unsigned int cur;
          do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(cur) : "l"(help + ge) : "memory");
            if (clock64() - t0 > (1ll << 32)) __trap();
          } while ((int)(cur - target) < 0);
          float gs = 0.f, us = 0.f;
          for (int pp = 0; pp < P; ++pp) {
            const float2 hv = __ldcg(hpart + (size_t)ge * P + pp);
            gs += hv.x;
            us += hv.y;
          }
          const float o = silu(gs * inv[0] * 1.f) * (us * inv[0] * 1.f);
          act[gg] = o;
          cvals[q * 32 + warp] = o;
        }
      }
    }
  }

  // the down-projection's first loads (weights depend on nothing), then the two barriers around the staging
  const int dgroups = (H + DROWS - 1) / DROWS, items = dgroups * dsplits;
  WarpRows<FDN, DROWS, 2> dn;
  int item = gw;
  auto dn_start = [&](int it) { dn.start_item(dbase, dhigh, dscales, dgpr, H, it, dsplits, du4ps, lane); };
  stamp(2);
  if constexpr (CHUNK) {  // each chunk of the block staged with its own power-of-two scale, warp w chunk cb0 + w
    __syncthreads();      // (and with help, warp q the extra chunk)
    const int nown = cb1 - cb0 + ((int)blockIdx.x < nextra ? 1 : 0);
    const int c = warp < cb1 - cb0 ? cb0 + warp : gridDim.x * q + blockIdx.x;
    if (warp < nown) {
      const float* cv = cvals + warp * 32;
      auto val = [&](int k) { return c * 32 + k < inter ? cv[k] : 0.f; };
      const float sc = pow2_scale(warp_max(fabsf(val(lane))));
      if (lane < 16) {
        const int cs = lane >> 2, jp = lane & 3, ka = 8 * cs + stage_a(jp);
        reinterpret_cast<unsigned int*>(xh_act)[(c >> 5) * 512 + cs * 128 + (c & 31) * 4 + jp] =
            stage_pack(val(ka) * sc, val(ka + STAGE_GAP) * sc);
      }
      if (lane == 0) xsc[c] = 1.f / sc;
    }
  } else {
    const float bmax = block_max(wrote, red);
    if (tid == 0 && bmax > 0.f) atomicMax(slot, __float_as_uint(bmax));
  }
  const unsigned long long t1 = arrive();
  if (item < items) dn_start(item);  // (issued after arriving: the arrival's fence does not wait for them)
  grid_wait(bar, t1, light);
  stamp(3);
  float dinv = 1.f;
  if constexpr (CHUNK) {
  } else if (local_stage & 1) {
    if (tid == 0) red[0] = __uint_as_float(__ldcg(slot));
    __syncthreads();
    const float dsc = pow2_scale(red[0]);
    dinv = 1.f / dsc;  // every block stages the whole row into its own shared memory: no second barrier
    stage_row_cg(act, inter, kpad_i, reinterpret_cast<uint4*>(mlp_smem), dsc);
    if (tid == 0 && atomicAdd(slot + 1, 1u) == gridDim.x - 1) {  // (every block has read slot[0])
      slot[0] = 0u;
      slot[1] = 0u;
    }
    if (blockIdx.x == 0 && tid == 0) *xinv_act = dinv;
    __syncthreads();
  } else {  // each block a slice of the pairs in global memory, then a second barrier
    if (tid == 0) red[0] = __uint_as_float(__ldcg(slot));
    __syncthreads();
    const float dsc = pow2_scale(red[0]);
    dinv = 1.f / dsc;
    const int nch = kpad_i / 32, per = (nch + gridDim.x - 1) / gridDim.x;
    const int c0 = min((int)blockIdx.x * per, nch), c1 = min(c0 + per, nch);
    stage_slice<true>(act, inter, c0, c1, xh_act, dsc);
    grid_wait(bar, arrive(), light);
    if (blockIdx.x == 0 && tid == 0) {  // (every block read slot[0] before the second barrier)
      *xinv_act = dinv;
      slot[0] = 0u;
      slot[1] = 0u;
    }
  }
  stamp(4);

  // down: item = row group x split-K slice; x pairs of the slice from shared memory or global memory (L1)
  auto down = [&](const uint4* x4, auto ld) {
    while (item < items) {
      const int grp = item / dsplits, s = item - grp * dsplits;
      const uint4* xl = x4 + ((s * du4ps) >> 5) * 128 + lane;
      float acc[DROWS];
      if constexpr (CHUNK) {
        const float* xsl = xsc + s * du4ps + lane;
        dn.template run<true>(acc, [&](int it, int c) { return ld(xl + it * 128 + c * 32); },
                              [&](int it) { return __ldg(xsl + 32 * it); });
      } else {
        dn.run(acc, [&](int it, int c) { return ld(xl + it * 128 + c * 32); });
      }
      const int nxt = item + nwarps;
      if (nxt < items) dn_start(nxt);
#pragma unroll
      for (int r = 0; r < DROWS; ++r) {
        const float v = warp_sum(acc[r]) * dinv * 1.f;
        const int row = grp * DROWS + r;
        if (lane == 0 && row < H) y[(size_t)s * plane + row] = v;
      }
      item = nxt;
    }
  };
  if ((local_stage & 1) && xsc == nullptr) down(reinterpret_cast<const uint4*>(mlp_smem), [](const uint4* p) { return *p; });
  else down(reinterpret_cast<const uint4*>(xh_act), [](const uint4* p) { return __ldg(p); });
  stamp(5);
}
