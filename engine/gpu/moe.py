"""The MoE block of the CUDA decode step (`MoeBlock`, held by `CudaQwen35`): one persistent launch (the layer's
o-projection, the post-attention norm, router and top-k, routed experts by slot, the shared expert, every
down-projection), or the router GEMV and top-k, the routed gate|up by slot and moe_down (the shared expert beside
them). The block builds graph ops from the step's shared buffers and GEMV helpers (engine.gpu.step) and its own
routing buffers."""
from __future__ import annotations

import numpy as np

from engine.gpu import kernel_names as KN
from engine.gpu import launch as K
from engine.gpu.gemv import GemvPlan


def moe_route(*, logits, ld: int, experts: int, topk: int, eidx, ewts, ld_w: int, rows: int) -> K.Launch:
    """moe_route: each of `rows` rows' top-k of the router logits [rows, ld] (the first `experts`; column `experts` the
    shared expert's gate logit), their ids into eidx [rows, topk] and softmax weights into ewts [rows, ld_w] (column
    topk: the shared expert's sigmoid gate). A warp a row."""
    return K.prepared("moe_route", (rows,), (logits, ld, experts, topk, eidx, ewts, ld_w))


def moe_down(routed, shared, *, eidx, act_routed, act_shared, planes, plane_stride: int, ewts, topk: int,
             name: str | None = None, with_shared: bool = True) -> K.Launch | None:
    """moe_down (cuda/moe.cu): every down-projection of an MoE block in one launch, grid.z a slot: the routed stack
    `routed` [E * H, I] for the topk slots (expert eidx [1, topk], its fp32 SwiGLU row act_routed [topk, I]) and the
    shared expert's `shared` [H, I_s] (its row the first I_s values of act_shared [1, .]), each into its partial plane
    planes[z] (plane_stride floats apart) weighted by ewts [1, topk + 1]; rows a half-warp as `name` says (the
    compiled form for the two formats by default), or None where none is compiled. with_shared False: the routed
    slots only (the verified columns' shared expert runs over all their rows beside it)."""
    name = name or K.moe_down_name(K.FMT_IDS[routed.fmt], K.FMT_IDS[shared.fmt])
    if not name:
        return None
    r = int(name.split(",")[2])
    P = lambda m, a: np.uint64(m.ptr(a))  # noqa: E731
    return K.prepared(name, (-(-shared.n // (2 * K.WARPS * r)), 1, topk + int(with_shared)),
                      (P(routed, routed.base), P(routed, routed.high), P(routed, routed.scales), routed.gpr, eidx,
                       act_routed, routed.k, P(shared, shared.base), P(shared, shared.high), P(shared, shared.scales),
                       shared.gpr, act_shared, shared.k, shared.n, routed.k, planes, plane_stride, ewts, topk))


def columns_kernels(routed_fmt: str, shared_fmt: str) -> list[str]:
    """What column_ops launches beyond the plan's kernels, for routed and shared down formats."""
    if routed_fmt not in K.FMT_IDS or shared_fmt not in K.FMT_IDS:
        return []
    name = KN.moe_down_cols_name(K.FMT_IDS[routed_fmt], K.FMT_IDS[shared_fmt])
    return [name] if name else []


def moe_fused(form, *, x_in, x_out, planes, nplanes: int, plane_stride: int, norm, eps: float, kpad: int, router,
              experts: int, topk: int, logits, eidx, ewts, gate_up, inter: int, xh, xsc, shared_gu, shared_inter: int,
              act, down, shared_down, barrier, tstamp=None, oproj: tuple | None = None) -> K.Launch:
    """moe_fused (cuda/moe_fused.cu) in `form` (MoeBlock.fused_form: name, grid, shared memory): one token's
    post-attention norm (x_out = x_in + the first nplanes planes, normed by `norm`), bf16 router and top-k (logits,
    eidx, ewts), the routed experts' gate|up (staged by chunks into xh, xsc) and the shared expert's (its SwiGLU row
    into act), and every down-projection into moe_down's topk + 1 planes, in one persistent launch with grid barriers
    (`barrier`); tstamp: a probe's phase timestamps or None. oproj: the o-projection's 8 arguments (its w8 matrix
    first, then the norm: MoeBlock.fused_ops) or None. Launched programmatically without the cooperative
    attribute (mode 2): its grid is sized to be resident."""
    name, grid, smem = form
    P, I = (lambda m, a: np.uint64(m.ptr(a))), np.int32
    rw, gu, sg, dn, sd = router, gate_up, shared_gu, down, shared_down
    o_args = oproj if oproj is not None else (np.uint64(0), np.uint64(0), I(0), I(0), I(0), np.uint64(0),
                                              np.uint64(0), np.uint64(0))
    args = (x_in, x_out, planes, I(nplanes), I(plane_stride), norm, I(rw.k), np.float32(eps), I(kpad),
            P(rw, rw.base), I(experts), I(topk), logits, eidx, ewts, P(gu, gu.base), P(gu, gu.high), P(gu, gu.scales),
            I(gu.gpr), I(inter), xh, xsc, P(sg, sg.base), P(sg, sg.high), P(sg, sg.scales), I(sg.gpr), I(shared_inter),
            act, P(dn, dn.base), P(dn, dn.high), P(dn, dn.scales), I(dn.gpr), P(sd, sd.base), P(sd, sd.high),
            P(sd, sd.scales), I(sd.gpr), barrier, np.uint64(0) if tstamp is None else tstamp,
            I(K.MOE_FUSED_OPTS)) + o_args
    return K.prepared(name, (grid,), args, block=1024, smem=smem, cooperative=True, coop_pdl=2)


class MoeBlock:
    """The MoE block of the step (one token row) over the shared buffers of `c` (a StepContext); it holds the router's
    logits, the top-k ids and weights, the routed SwiGLU rows, and the persistent launch's barrier and staged rows."""

    # MoE decode outside the persistent launch (formats it is not compiled for): the router GEMV and the top-k, the
    # routed experts' gate|up by slot, then every down-projection (the routed slots' and the shared expert's) in one
    # moe_down launch (cuda/moe.cu: a half-warp a row, the fp32 SwiGLU rows read directly, no staging; 3 rows a
    # half-warp for the 35B-A3B's formats, one wave), else the routed and shared down GEMVs on two branches.

    # The post-attention norm and the MoE block of one token as one persistent launch where the plan's moe_fused is on
    # (cuda/moe_fused.cu: the layer's w8 o-projection first (split-K items over every warp, at least 2 planes, a slice at
    # most 4 chunks a lane; its input staged a 32-value chunk at a time with a scale each), a grid barrier, the norm,
    # router + shared gate|up, a grid barrier, top-k in every block + routed gate|up staged by chunks, a grid barrier,
    # every down-projection into moe_down's k + 1 planes, down rows 2 a half-warp): no launch ramp before the routed
    # weights.
    MOE_FUSED_O_SPLITS = 2
    tstamp = None  # (a probe's 8 uint64 a block of phase timestamps)

    def __init__(self, c):
        a, cp, M, f32 = c.args, c.cp, c.M, c.cp.float32
        self.c = c
        self.topk, self.inter_e, self.inter_sh = a.num_experts_per_tok, a.moe_intermediate_size, \
            a.shared_expert_intermediate_size
        self.rlog = cp.zeros((M, a.num_experts + 1), dtype=f32)
        self.eidx = cp.zeros((M, self.topk), dtype=cp.int32)
        self.ewts = cp.zeros((M, self.topk + 1), dtype=f32)
        self.act_e = cp.zeros((M * self.topk, self.inter_e), dtype=f32)  # (M rows: slot z = j * M + r)
        self.bar = self.xh = self.xsc = None  # (the persistent launch's, made with its first launch)
        if M > 1:  # the routed slots of M rows in slot order, each with its row's staged x (moe_cols_prep)
            n, W = M * self.topk, c.xh_n.shape[1]
            self.eidx_t, self.ewts_t = cp.zeros(n, dtype=cp.int32), cp.zeros(n, dtype=f32)
            self.xrep, self.xinv_rep = cp.zeros((n, W), dtype=cp.uint32), cp.ones(n, dtype=f32)

    def splits(self) -> int:
        """Partial planes the MoE block leaves for the next norm to sum: the routed slots and the shared expert.
        (One kernel summing the slots measured slower: 35B-A3B 338.9 against 345.1 tok/s.)"""
        return self.topk + 1

    def _down_op(self, dn, sd):
        """The moe_down launch for the routed stack `dn` and the shared down-projection `sd`, or None where its
        rules do not hold (one token row, row-split formats, whole 32-value chunks, the same output width)."""
        c = self.c
        H, k = c.H, self.topk
        if not (c.M == 1 and dn.fmt in K.FMT_IDS and sd.fmt in K.FMT_IDS
                and dn.k % 32 == 0 and sd.k % 32 == 0 and sd.n == H and c.act.shape[1] % 4 == 0):
            return None
        return moe_down(dn, sd, eidx=self.eidx, act_routed=self.act_e, act_shared=c.act, planes=c.part,
                        plane_stride=c.M * H, ewts=self.ewts, topk=k)

    def fused_form(self, L):
        """(kernel name, grid, shared memory) of the layer's moe_fused launch, or None where the plan has it off or its
        rules do not hold (one token, int16 pairs, the compiled formats, a bf16 router of E + 1 rows, widths on 32-value
        chunks, every block's routed chunks in its shared memory). No side effects."""
        c = self.c
        rw, gu, dn, sg, sd = (L[k] for k in ("router", "experts_gu", "experts_down", "shared_gu", "shared_down"))
        H, E, k, ie, si = c.H, c.args.num_experts, self.topk, self.inter_e, self.inter_sh
        fmts = [K.FMT_IDS.get(m.fmt) for m in (gu, dn, sg, sd)]
        vpt = min((v for v in K.MOE_FUSED_VPT if v * 1024 >= H), default=0)
        name = f"moe_fused<{','.join(map(str, fmts))},{vpt},2>"
        if not (c.plan.moe_fused and c.M == 1 and name in K.MOE_FUSED_NAMES and rw.fmt == "bf16"
                and rw.n == E + 1 and rw.k == H and H % 256 == 0 and ie % 32 == 0 and si % 32 == 0 and k <= 16
                and E <= 512 and gu.n == E * 2 * ie and dn.n == E * H and dn.k == ie and sg.n == 2 * si
                and sd.n == H and sd.k == si):
            return None
        smem = c.kpad_h * 6  # (the normed row's pairs and fp32 values)
        grid = K.sm_count() * K.resident_blocks(name, 1024, smem)
        if -(-(k * ie // 32) // grid) > K.MOE_FUSED_CHUNKS or si // 32 > grid:
            return None
        return name, grid, smem

    def _o_slices(self, o):
        """(16-value chunks a slice, slices) of the w8 o-projection inside moe_fused, or None where it cannot go in
        (another format or width, more slices than partial planes). A slice: whole 64-chunk blocks, at most
        MOE_FUSED_OT chunks a lane."""
        if o.fmt != "q8_g32_fp16" or o.n != self.c.H:
            return None
        ou4 = o.gpr * 2
        ou4ps = min(-(-(-(-ou4 // max(1, self.MOE_FUSED_O_SPLITS))) // 64) * 64, 32 * K.MOE_FUSED_OT)
        splits = -(-ou4 // ou4ps)
        return None if splits > self.c.max_splits else (ou4ps, splits)

    def o_chunked(self, L) -> bool:
        """Whether the layer's o-projection runs inside moe_fused from chunk-scaled pairs: its stager (the gated norm,
        the attention combine) then stages a chunk at a time."""
        return bool(self.c.gated_chunk_scales() is not None and self.fused_form(L) is not None
                    and self._o_slices(L["o"]) is not None)

    def fused_ops(self, L, splits: int, oproj=None):
        """(ops, partial planes) of the post-attention norm and the MoE block as one moe_fused launch, or None where
        `fused_form` says it does not apply. oproj: (o, xh_o, xinv_o, xsc_o), the layer's w8 o-projection [H, K]
        first, from one-scale staged pairs (xsc_o None) or chunk-scaled ones."""
        form = self.fused_form(L)
        if form is None:
            return None
        c = self.c
        rw, gu, dn, sg, sd = (L[k] for k in ("router", "experts_gu", "experts_down", "shared_gu", "shared_down"))
        H, E, k, ie, si = c.H, c.args.num_experts, self.topk, self.inter_e, self.inter_sh
        o_args = None
        if oproj is not None:
            o, xh_o, xinv_o, xsc_o = oproj
            sl = self._o_slices(o)
            if sl is None:
                return None
            ou4ps, splits = sl
            o_args = (np.uint64(o.ptr(o.base)), np.uint64(o.ptr(o.scales)), np.int32(o.gpr), np.int32(splits),
                      np.int32(ou4ps), xh_o, xinv_o, np.uint64(0) if xsc_o is None else xsc_o)
        cp = c.cp
        if self.bar is None:
            self.bar = cp.zeros(1, dtype=cp.uint64)
            kp = -(-(k * ie + si) // K.XPAD) * K.XPAD  # (the down's staged input: the k slots', then the shared one)
            self.xh = cp.zeros(kp // 2, dtype=cp.uint32)
            self.xsc = cp.zeros(kp // 32, dtype=cp.float32)
        x_in, x_out = c.swap_residual()
        launch = moe_fused(form, x_in=x_in, x_out=x_out, planes=c.part, nplanes=splits, plane_stride=c.M * H,
                           norm=L["post_norm"], eps=c.args.rms_norm_eps, kpad=c.kpad_h, router=rw, experts=E,
                           topk=k, logits=self.rlog, eidx=self.eidx, ewts=self.ewts, gate_up=gu, inter=ie,
                           xh=self.xh, xsc=self.xsc, shared_gu=sg, shared_inter=si, act=c.act, down=dn,
                           shared_down=sd, barrier=self.bar, tstamp=self.tstamp, oproj=o_args)
        return [launch], k + 1

    def ops(self, L, xn) -> tuple[list, int]:
        """Router -> top-k on the device -> routed experts (grid.z = slot) writing weighted partials
        part[0..k), shared expert into part[k]; the next norm sums the k + 1 partials (the second of the pair)."""
        c = self.c
        if c.M > 1:
            return self.column_ops(L, xn)
        E, k, H, ie = c.args.num_experts, self.topk, c.H, self.inter_e
        rw = L["router"]
        route = [c.gemv(rw, c.xn, self.rlog),
                 moe_route(logits=self.rlog, ld=E + 1, experts=E, topk=k, eidx=self.eidx, ewts=self.ewts, ld_w=k + 1,
                           rows=c.M)]
        gu, dn = L["experts_gu"], L["experts_down"]
        gu1, dn1 = gu.row_slice(0, 2 * ie), dn.row_slice(0, H)  # expert 0's rows (the kernel offsets by eidx)
        routed = [GemvPlan(gu1, c.xn, H, self.act_e, ie, epi="swiglu", unroll=2, xpre=xn,
                           experts=(self.eidx, 2 * ie, 0, ie, None, k)).launch]
        shared_gu = c.gemv(L["shared_gu"], c.xn, c.act, epi="swiglu", xpre=xn)
        down = self._down_op(dn, L["shared_down"])
        if down is not None:  # routed gate|up, then every down-projection in one launch
            return c.concurrent(route, [shared_gu]) + routed + [down], self.splits()
        # each block of the routed down-projection stages its slot's fp32 row itself
        routed.append(GemvPlan(dn1, self.act_e, ie, c.part, H, epi="store", unroll=2, rows=1,
                               experts=(self.eidx, H, ie * 4, c.M * H, self.ewts, k)).launch)
        # the shared expert beside the routed ones: its gate|up beside the router and top-k, its
        # down-projection (weighted by what moe_route computes) beside the routed experts
        shared_down = GemvPlan(L["shared_down"], c.act, c.act.shape[1], c.part[k], H, epi="store",
                               unroll=2, experts=(None, 0, 0, 0, self.ewts[0, k:], 1)).launch
        return c.concurrent(route, [shared_gu]) + c.concurrent(routed, [shared_down]), self.splits()

    def column_ops(self, L, xn) -> tuple[list, int]:
        """The block over M token rows (the verified columns): router GEMV and top-k for every row, moe_cols_prep (the
        M * k routed slots in slot order z = j * M + r, each with its row's staged x; the shared expert's rows scaled by
        its gate), the routed gate|up (a GEMV by slot) and down (moe_down) launches over all the slots (grid.z: each
        expert of the rows' union is read by the slots that chose it), the shared expert's down over the M rows beside
        them (K.require: `columns_kernels`). Partials as `ops`:
        slot j of every row into part[j], the shared expert into part[k]."""
        c = self.c
        E, k, H, ie, M = c.args.num_experts, self.topk, c.H, self.inter_e, c.M
        rw, gu, dn, sd = L["router"], L["experts_gu"], L["experts_down"], L["shared_down"]
        route = [c.gemv(rw, c.xn, self.rlog),
                 moe_route(logits=self.rlog, ld=E + 1, experts=E, topk=k, eidx=self.eidx, ewts=self.ewts, ld_w=k + 1,
                           rows=M)]
        shared_gu = c.gemv(L["shared_gu"], c.xn, c.act, epi="swiglu", xpre=xn)
        W = self.xrep.shape[1]
        prep = K.prepared("moe_cols_prep", (M * k,), (self.eidx, self.ewts, k, M, self.eidx_t, self.ewts_t, c.act,
                                                      c.act.shape[1], self.inter_sh, xn[0], W, xn[1], self.xrep,
                                                      self.xinv_rep), block=256)
        gu1, dn1 = gu.row_slice(0, 2 * ie), dn.row_slice(0, H)  # expert 0's rows (the kernel offsets by eidx)
        routed = [GemvPlan(gu1, self.xrep, H, self.act_e, ie, epi="swiglu", unroll=2, xpre=(self.xrep, self.xinv_rep),
                           experts=(self.eidx_t, 2 * ie, W * 4, ie, None, M * k)).launch]
        # the routed down: moe_down over the M * k slots in its columns' form (kernel_names.moe_down_cols_name; slot z
        # into plane z // M, row z % M), else a GEMV by slot
        down = None
        if dn.fmt in K.FMT_IDS and sd.fmt in K.FMT_IDS and dn.k % 32 == 0:
            down = moe_down(dn, sd, eidx=self.eidx_t, act_routed=self.act_e, act_shared=c.act, planes=c.part,
                            plane_stride=H, ewts=self.ewts_t, topk=M * k, with_shared=False,
                            name=KN.moe_down_cols_name(K.FMT_IDS[dn.fmt], K.FMT_IDS[sd.fmt]))
        routed.append(down or GemvPlan(dn1, self.act_e, ie, c.part, H, epi="store", unroll=2, rows=1,
                                       experts=(self.eidx_t, H, ie * 4, H, self.ewts_t, M * k)).launch)
        shared_down = GemvPlan(sd, c.act, c.act.shape[1], c.part[k], H, m=M, epi="store").launch
        return c.concurrent(route, [shared_gu]) + [prep] + c.concurrent(routed, [shared_down]), self.splits()
