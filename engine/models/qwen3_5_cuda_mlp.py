"""The MLP block of the CUDA decode step (`CudaQwen35` takes it as a base): the dense SwiGLU MLP
(gate|up with SwiGLU, staging, down into split-K partials; optionally in two halves) and the MoE
block (router and top-k, routed experts by slot, the shared expert beside them). The methods build
graph ops from the executor's buffers (`_alloc`) and helpers (`_gemv`, `_plan_gemv`, `_stage`,
`_splits`, `_concurrent`)."""
from __future__ import annotations

import os

import numpy as np

from engine.ops import kernels as K
from engine.ops.gemv_plan import GemvPlan, mlp_fused_help_words, mlp_fused_launch


class MlpOps:
    # MoE decode: the routed experts' SwiGLU rows staged for the down-projection by every block of it from
    # the fp32 rows (a launch and a kernel boundary less a layer, each block reading its slot's 2 KB row),
    # or by one stage_x_mb launch (NINFER_MOE_STAGE=1). Session 6 on the H200, 35B-A3B: 335.2 and 335.0
    # tok/s in the kernel against 332.6 with the launch (same call).
    MOE_STAGE = os.environ.get("NINFER_MOE_STAGE", "0") != "0"

    # MoE decode: the router GEMV and the top-k routing in one launch (router_route, the last block routes),
    # with NINFER_MOE_ROUTE_FUSED=1. Off: H200, session 12, in one process: 35B-A3B 421.1 / 421.2 tok/s against
    # 423.1 / 423.0.
    MOE_ROUTE_FUSED = os.environ.get("NINFER_MOE_ROUTE_FUSED", "0") != "0"
    # (Session 12 also measured the top-k inside every block of the routed gate|up, `moe_gate_up`: 426.6 against
    # 427.8 tok/s, and the router + top-k inside the post-attention norm, `norm_route`: 423.6 against 430.4; both
    # bit-exact or within their tests, both slower, removed; in git history at 018601e, NINFER_MOE_ROUTE_GU and
    # NINFER_NORM_ROUTE.)

    # MoE decode: the routed experts' gate|up through gemv_rs_pre (x through the read-only path, row pointers
    # advanced by constants; faster than gemv_rs on most of the 27B's shapes with int16 x) with
    # NINFER_MOE_PRE2=1. Off: no gain in the step (H200, session 12, in one process: 35B-A3B 384.1 / 384.0 tok/s
    # against 385.3 / 385.0), though the isolated sweep has it 3% faster (4.92 against 5.08 us).
    MOE_PRE2 = os.environ.get("NINFER_MOE_PRE2", "0") != "0"
    # Rows a warp of the routed down-projection GEMV (the path without MOE_DOWN). The session-12 sweep of the
    # 35B-A3B's routed shapes: rows 2 7.83 us against rows 1 8.92 (unroll 2); not yet A/B'd in the step.
    MOE_ROUTED_ROWS = int(os.environ.get("NINFER_MOE_ROUTED_ROWS", "1"))

    # MoE decode: the routed experts' down-projections and the shared expert's in one launch (moe_down in
    # cuda/moe.cu: a half-warp a row, fp32 x read directly, no staging), after the routed gate|up instead of
    # beside it (NINFER_MOE_DOWN=0: the routed GEMV and the shared one on a branch). H200, session 12, in one
    # process (bench/results/s12b_*): 35B-A3B 427.2 / 427.4 tok/s with 3 rows a half-warp (80 registers, one
    # wave), 423.1 / 423.0 with 4, against 401.1 / 401.0 without; int16 pairs and dp2a (MOE_DOWN_I16) 426.5 /
    # 426.2 at 3 rows, 422.6 / 422.4 at 4: the fp32 products stay.
    MOE_DOWN = os.environ.get("NINFER_MOE_DOWN", "1") != "0"
    MOE_DOWN_ROWS = int(os.environ.get("NINFER_MOE_DOWN_ROWS", "3"))
    MOE_DOWN_I16 = os.environ.get("NINFER_MOE_DOWN_I16", "0") != "0"  # int16 pairs and dp2a instead of fp32

    def _moe_down_op(self, dn, sd):
        """The moe_down launch for the routed stack `dn` and the shared down-projection `sd`, or None where its
        rules do not hold (one token row, row-split formats, whole 32-value chunks, the same output width)."""
        H, k = self.H, self.topk
        if not (self.MOE_DOWN and self.M == 1 and dn.fmt in K.FMT_IDS and sd.fmt in K.FMT_IDS
                and dn.k % 32 == 0 and sd.k % 32 == 0 and sd.n == H and self.act.shape[1] % 4 == 0):
            return None
        fr, fs = K.FMT_IDS[dn.fmt], K.FMT_IDS[sd.fmt]
        r, i16 = self.MOE_DOWN_ROWS, str(bool(self.MOE_DOWN_I16)).lower()
        name = f"moe_down<{fr},{fs},{r},{i16}>"
        if name not in K.MOE_DOWN_NAMES:  # (a form compiled for the 35B-A3B's formats only: the default one)
            r, name = 4, f"moe_down<{fr},{fs},4,{i16}>"
        if name not in K.MOE_DOWN_NAMES:
            return None
        rows_per_block = 2 * K.WARPS * r
        return K.prepared(name, (-(-H // rows_per_block), 1, k + 1),
                          (np.uint64(dn.ptr(dn.base)), np.uint64(dn.ptr(dn.high)), np.uint64(dn.ptr(dn.scales)),
                           dn.gpr, self.eidx, self.act_e, self.inter_e,
                           np.uint64(sd.ptr(sd.base)), np.uint64(sd.ptr(sd.high)), np.uint64(sd.ptr(sd.scales)),
                           sd.gpr, self.act, sd.k, H, dn.k, self.part, self.M * H, self.ewts, k))

    # NINFER_MOE_FUSED=1: the post-attention norm and the MoE block of one token as one persistent launch
    # (cuda/moe_fused.cu: norm, router + shared gate|up, a grid barrier, top-k in every block + routed gate|up staged by
    # chunks, a grid barrier, every down-projection into moe_down's k + 1 planes): three barriers' worth of launches
    # fewer a layer and no launch ramp before the routed weights. NINFER_MOE_FUSED_DR: the down's rows a half-warp
    # (2 or 3). Session 17 (s17b, H200, 35B-A3B, in-process A/B, two passes): 438.9 / 438.3 tok/s (DR 2), 433.3 /
    # 433.3 (DR 3) against 429.3 / 429.4; NINFER_MOE_FUSED=0 for the kernels. NINFER_MOE_FUSED_OPTS (bits, the same
    # bits out): 1 the norm's first two planes in x and w's round of loads, 2 the top-k on redux.sync
    # (route_row_redux), 8 the grid barriers' light form. Session 17, one process, two passes each: s17c against 437.5 /
    # 438.0: 1 439.8 / 439.6, 2 448.0 / 448.4 (the top-k phase 3.3 -> 2.0 us); s17d against 3's 447.2 / 447.2: 11
    # 452.2 / 452.3. (4, the down's weights prefetched into L2, lost in both: 430.9, then 442.9 behind the gate|up
    # loads; removed.) 32: the barriers' red form (arrivals by a release reduction; persistent.cu): session 18 (s18b,
    # one process, two passes), 43 477.8 / 477.8 against 11's 475.2 / 475.0; with ATTN_COMBINE_B 482.2 / 481.9 (and
    # NORM_1R, lost alone). Default 43.
    MOE_FUSED = int(os.environ.get("NINFER_MOE_FUSED", "1"))
    MOE_FUSED_DR = int(os.environ.get("NINFER_MOE_FUSED_DR", "2"))
    MOE_FUSED_OPTS = int(os.environ.get("NINFER_MOE_FUSED_OPTS", "43"))
    moe_tstamp = None  # (bench/: 8 uint64 a block of phase timestamps, read by a probe)
    # NINFER_MOE_FUSED_O=1: the layer's w8 o-projection inside the moe_fused launch too (split-K items over every warp,
    # MOE_FUSED_O_SPLITS planes or more, so that a slice is at most 4 chunks a lane; a grid barrier before the norm):
    # one launch and the o GEMV's tail fewer a layer. Session 17 (s17e, 35B-A3B, one process, two passes): 464.1 / 463.9
    # tok/s (2 splits), 457.8 / 457.2 (4) against 453.3 / 453.3; ninfer bench 471.03. 0: the o GEMV before the launch.
    MOE_FUSED_O = int(os.environ.get("NINFER_MOE_FUSED_O", "1"))
    MOE_FUSED_O_SPLITS = int(os.environ.get("NINFER_MOE_FUSED_O_SPLITS", "2"))
    # NINFER_MOE_FUSED_O_CHUNK=1 (with MOE_FUSED_O and GATED_CHUNK): the o-projection's input staged a 32-value chunk at
    # a time with a scale each (gated_rmsnorm_chunks, a warp a head, in place of the one-block gated_rmsnorm_stage;
    # attn_combine_chunks with ATTN_CHUNK), the o-phase multiplying the chunk scale in. Session 17 (s17f, 35B-A3B, one
    # process, two passes): 477.6 / 477.5 against 465.2 / 465.1 tok/s; ninfer bench 483.39. 0: one scale for the row.
    MOE_FUSED_O_CHUNK = int(os.environ.get("NINFER_MOE_FUSED_O_CHUNK", "1"))

    def _moe_fused_form(self, L):
        """(kernel name, grid, shared memory) of the layer's moe_fused launch, or None where MOE_FUSED is off or its
        rules do not hold (one token, int16 pairs, the compiled formats, a bf16 router of E + 1 rows, widths on 32-value
        chunks, every block's routed chunks in its shared memory). No side effects."""
        rw, gu, dn, sg, sd = (L[k] for k in ("router", "experts_gu", "experts_down", "shared_gu", "shared_down"))
        H, E, k, ie, si = self.H, self.args.num_experts, self.topk, self.inter_e, self.inter_sh
        fmts = [K.FMT_IDS.get(m.fmt) for m in (gu, dn, sg, sd)]
        vpt = min((v for v in K.MOE_FUSED_VPT if v * 1024 >= H), default=0)
        name = f"moe_fused<{','.join(map(str, fmts))},{vpt},{self.MOE_FUSED_DR}>"
        if not (self.MOE_FUSED and self.M == 1 and K.XI16 and name in K.MOE_FUSED_NAMES and rw.fmt == "bf16"
                and rw.n == E + 1 and rw.k == H and H % 256 == 0 and ie % 32 == 0 and si % 32 == 0 and k <= 16
                and E <= 512 and gu.n == E * 2 * ie and dn.n == E * H and dn.k == ie and sg.n == 2 * si
                and sd.n == H and sd.k == si):
            return None
        smem = self.kpad_h * 6  # (the normed row's pairs and fp32 values)
        grid = K.sm_count() * K.resident_blocks(name, 1024, smem)
        if -(-(k * ie // 32) // grid) > K.MOE_FUSED_CHUNKS or si // 32 > grid:
            return None
        return name, grid, smem

    def _moe_o_slices(self, o):
        """(16-value chunks a slice, slices) of the w8 o-projection inside moe_fused, or None where it cannot go in
        (another format or width, more slices than partial planes). A slice: whole 64-chunk blocks, at most
        MOE_FUSED_OT chunks a lane."""
        if o.fmt != "q8_g32_fp16" or o.n != self.H:
            return None
        ou4 = o.gpr * 2
        ou4ps = min(-(-(-(-ou4 // max(1, self.MOE_FUSED_O_SPLITS))) // 64) * 64, 32 * K.MOE_FUSED_OT)
        splits = -(-ou4 // ou4ps)
        return None if splits > self.max_splits else (ou4ps, splits)

    def _moe_o_chunked(self, L) -> bool:
        """Whether the layer's o-projection runs inside moe_fused from chunk-scaled pairs (MOE_FUSED_O_CHUNK): its
        stager (the gated norm, the attention combine) then stages a chunk at a time."""
        return bool(self.args.is_moe and self.MOE_FUSED_O and self.MOE_FUSED_O_CHUNK
                    and self._gated_chunk_scales() is not None and self._moe_fused_form(L) is not None
                    and self._moe_o_slices(L["o"]) is not None)

    def _moe_fused_ops(self, L, splits: int, oproj=None):
        """(ops, partial planes) of the post-attention norm and the MoE block as one moe_fused launch, or None where
        `_moe_fused_form` says it does not apply. oproj: (o, xh_o, xinv_o, xsc_o), the layer's w8 o-projection [H, K]
        first, from one-scale staged pairs (xsc_o None) or chunk-scaled ones (MOE_FUSED_O, MOE_FUSED_O_CHUNK)."""
        form = self._moe_fused_form(L)
        if form is None:
            return None
        name, grid, smem = form
        rw, gu, dn, sg, sd = (L[k] for k in ("router", "experts_gu", "experts_down", "shared_gu", "shared_down"))
        H, E, k, ie, si = self.H, self.args.num_experts, self.topk, self.inter_e, self.inter_sh
        o_args = (np.uint64(0), np.uint64(0), np.int32(0), np.int32(0), np.int32(0), np.uint64(0), np.uint64(0),
                  np.uint64(0))
        if oproj is not None:
            o, xh_o, xinv_o, xsc_o = oproj
            sl = self._moe_o_slices(o)
            if sl is None:
                return None
            ou4ps, splits = sl
            o_args = (np.uint64(o.ptr(o.base)), np.uint64(o.ptr(o.scales)), np.int32(o.gpr), np.int32(splits),
                      np.int32(ou4ps), xh_o, xinv_o, np.uint64(0) if xsc_o is None else xsc_o)
        cp = self.cp
        if getattr(self, "moe_bar", None) is None:
            self.moe_bar = cp.zeros(1, dtype=cp.uint64)
            kp = -(-(k * ie + si) // K.XPAD) * K.XPAD  # (the down's staged input: the k slots', then the shared one)
            self.moe_xh = cp.zeros(kp // 2, dtype=cp.uint32)
            self.moe_xsc = cp.zeros(kp // 32, dtype=cp.float32)
        x_in, x_out = self._res
        self._res = (x_out, x_in)
        P, I = (lambda m, a: np.uint64(m.ptr(a))), np.int32
        args = (x_in, x_out, self.part, I(splits), I(self.M * H), L["post_norm"], I(H),
                np.float32(self.args.rms_norm_eps), I(self.kpad_h), P(rw, rw.base), I(E), I(k), self.rlog, self.eidx,
                self.ewts, P(gu, gu.base), P(gu, gu.high), P(gu, gu.scales), I(gu.gpr), I(ie), self.moe_xh,
                self.moe_xsc, P(sg, sg.base), P(sg, sg.high), P(sg, sg.scales), I(sg.gpr), I(si), self.act,
                P(dn, dn.base), P(dn, dn.high), P(dn, dn.scales), I(dn.gpr),
                P(sd, sd.base), P(sd, sd.high), P(sd, sd.scales), I(sd.gpr), self.moe_bar,
                np.uint64(0) if self.moe_tstamp is None else self.moe_tstamp, I(self.MOE_FUSED_OPTS)) + o_args
        # (programmatic, without the cooperative attribute: K.COOP_PDL's mode 2; its grid is sized to be resident)
        return [K.prepared(name, (grid,), args, block=1024, smem=smem, cooperative=True, coop_pdl=2)], k + 1

    def _moe_ops(self, L, xn):
        """Router -> top-k on the device -> routed experts (grid.z = slot) writing weighted partials
        part[0..k), shared expert into part[k]; the next norm sums the k + 1 partials."""
        E, k, H, ie = self.args.num_experts, self.topk, self.H, self.inter_e
        rw = L["router"]
        if self.MOE_ROUTE_FUSED and rw.fmt == "bf16" and rw.k % 8 == 0:
            if getattr(self, "route_ticket", None) is None:
                self.route_ticket = self.cp.zeros(1, dtype=self.cp.uint32)
            route = [K.prepared(f"router_route<{self.M}>", (rw.n,),
                                (np.uint64(rw.ptr(rw.base)), rw.n, rw.k, self.xn, self.xn.shape[1], self.rlog, E + 1,
                                 E, k, self.eidx, self.ewts, k + 1, self.route_ticket))]
        else:
            route = [self._gemv(rw, self.xn, self.rlog),
                     K.prepared("moe_route", (self.M,), (self.rlog, E + 1, E, k, self.eidx, self.ewts, k + 1))]
        gu, dn = L["experts_gu"], L["experts_down"]
        gu1, dn1 = gu.row_slice(0, 2 * ie), dn.row_slice(0, H)  # expert 0's rows (the kernel offsets by eidx)
        routed = [GemvPlan(gu1, self.xn, H, self.act_e, ie, epi="swiglu", unroll=2, xpre=xn, pre2=self.MOE_PRE2,
                           experts=(self.eidx, 2 * ie, 0, ie, None, k)).launch]
        shared_gu = self._gemv(L["shared_gu"], self.xn, self.act, epi="swiglu", xpre=xn)
        down = self._moe_down_op(dn, L["shared_down"])
        if down is not None:  # routed gate|up, then every down-projection in one launch
            return self._concurrent(route, [shared_gu]) + routed + [down]
        if self.MOE_STAGE:
            routed.append(K.prepared("stage_x_mb", (self.NORM_BLOCKS, k), (self.act_e, ie, ie, self.kpad_e, self.xh_e,
                                                                           self.kpad_e // 2, self.xinv_e),
                                     block=1024))
            routed.append(GemvPlan(dn1, self.act_e, ie, self.part, H, epi="store", unroll=2, rows=1,
                                   xpre=(self.xh_e, self.xinv_e),
                                   experts=(self.eidx, H, self.kpad_e * 2, self.M * H, self.ewts, k)).launch)
        else:  # each block of the routed down-projection stages its slot's fp32 row itself
            routed.append(GemvPlan(dn1, self.act_e, ie, self.part, H, epi="store", unroll=2, rows=self.MOE_ROUTED_ROWS,
                                   experts=(self.eidx, H, ie * 4, self.M * H, self.ewts, k)).launch)
        # the shared expert beside the routed ones: its gate|up beside the router and top-k, its
        # down-projection (weighted by what moe_route computes) beside the routed experts
        shared_down = GemvPlan(L["shared_down"], self.act, self.act.shape[1], self.part[k], H, epi="store",
                               unroll=2, experts=(None, 0, 0, 0, self.ewts[0, k:], 1)).launch
        return (self._concurrent(route, [shared_gu])
                + self._concurrent(routed, [shared_down]))

    # NINFER_FFN_SPLIT=1: the MLP in two halves of the intermediate width, the second half's gate|up
    # beside the first half's staging and down-projection (a GEMV streams while the other chain's light
    # kernel runs). Off: slower on the H200 (session 6, 27B: 116.5 against 120.6 tok/s, twice; the two
    # concurrent GEMVs share the bandwidth, 76 MB in 30.7 us, no better than one after the other).
    # Subclasses whose GEMVs are not kernels (cuBLAS prefill) never split.
    FFN_SPLIT = os.environ.get("NINFER_FFN_SPLIT", "0") != "0"

    def _ffn_split_at(self, w_down) -> int:
        """Where the MLP splits (values of the intermediate row, on a 1,024-value block): the down
        projection's split-K boundary into two slices; 0 when the row has fewer than two blocks."""
        blocks = w_down.k // K.XPAD
        return 0 if blocks < 2 or w_down.k % K.XPAD or w_down.fmt not in K.FMT_IDS or w_down.fmt == "q8_g32_fp16" \
            else -(-blocks // 2) * K.XPAD

    # The down projection's input: pre-staged by a stage_x launch (1), or staged by each of its blocks from
    # the fp32 SwiGLU row (NINFER_STAGE_DOWN=0: a launch a layer fewer, as the MoE's routed down does).
    STAGE_DOWN = os.environ.get("NINFER_STAGE_DOWN", "1") != "0"

    # The down projection's staging reads the SwiGLU row's largest |value| from the gate|up GEMV (gemv_rs_pre
    # folds it into a slot as it writes the row; one token) instead of reducing the whole row in each of its
    # blocks: stage_x_amax, the same pairs. NINFER_STAGE_AMAX=0: stage_x_mb. Session 11 on the H200 (in-process
    # A/B, twice): 27B 146.8 against 143.5 tok/s (the staging 5.1 -> 2.3 us a layer).
    STAGE_AMAX = os.environ.get("NINFER_STAGE_AMAX", "1") != "0"

    # The dense MLP on gemv_tma (cuda/gemv_tma.cu, sm_90; NINFER_MLP_TMA=1): two launches a layer instead of four.
    # gate|up stages the post-attention norm itself (every block, while its producer warp already streams the
    # weights: no norm kernel, no boundary before the weights move) and folds its SwiGLU row's largest |value|;
    # down stages that row from the folded maximum itself (no stage_x_amax). MLP_TMA_NW: its consumer warps.
    # Off: slower on the H200 (session 13, 27B, in one process, two passes each; bench/results/s13c-s13e): with
    # the prologues' loads one at a time 140.7 against 147.0 tok/s; batched 146.4 against 146.9 (s13d), 145.0
    # against 146.8 (s13e, another machine); a gate|up group over 2 / 4 warps 143.4 / 115.6, down in 4 pieces
    # 142.3. gemv_tma alone loses to gemv_rs_pre on the big shapes (fast sweep s13c: gate|up 27.2 against 25.8 us,
    # down 19.2 against 17.8), so the saved norm, staging and two boundaries (~8 us a layer) are spent again.
    # NINFER_MLP_TMA=2: the down-projection only (its staging inside it; the norm and gate|up kernels as before):
    # 144.2 / 144.1 against 147.0 / 146.9 tok/s (s13g): the staging kernel it saves costs less than gemv_tma loses.
    MLP_TMA = int(os.environ.get("NINFER_MLP_TMA", "0"))
    MLP_TMA_NW = int(os.environ.get("NINFER_MLP_TMA_NW", "16"))
    # pieces a gate|up group (its gate and up rows) is split into over consumer warps (smaller stages, more
    # of them), and the down-projection's least pieces (its split-K planes)
    MLP_TMA_GU_P = int(os.environ.get("NINFER_MLP_TMA_GU_P", "1"))
    MLP_TMA_DOWN_P = int(os.environ.get("NINFER_MLP_TMA_DOWN_P", "1"))

    def _ffn_tma_ops(self, L, splits: int):
        """(ops, partial planes) of the post-attention norm and the dense MLP as two gemv_tma launches, or None
        where MLP_TMA is off or its rules do not hold (one token row, sm_90, int16 pairs, gemv_tma's shapes)."""
        gu, dn = L["gate_up"], L["down"]
        if not (self.MLP_TMA and self.M == 1 and K.XI16 and not self.FFN_SPLIT and K.tma_capable()
                and all(GemvPlan._tma_ok(w, (self.xh_n, self.xinv_n), 1, e, None, None, None, 0)
                        for w, e in ((gu, "swiglu"), (dn, "partial")))):
            return None
        H, nw = self.H, self.MLP_TMA_NW
        kp_h, kp_i = self.xh_n.shape[1] * 2, self.xh_act.shape[1] * 2
        dsplits = max(self._splits(dn), self.MLP_TMA_DOWN_P)
        if H > nw * 512 or GemvPlan.tma_geometry(gu, "swiglu", self.MLP_TMA_GU_P, nw, kp_h * 10) is None \
                or GemvPlan.tma_geometry(dn, "partial", dsplits, nw, kp_i * 2) is None:
            return None
        d_plan = GemvPlan(dn, self.act, self.act.shape[1], self.part, H, epi="partial", splits=dsplits,
                          xpre=(self.xh_act, self.xinv_act), tma=nw,
                          tma_pro=("amax", self.act, self.inter, self.stage_slot))
        if d_plan.splits > self.max_splits:  # (rows too long for two stages of nw / max_splits rows)
            return None
        if self.MLP_TMA == 2:  # down only: the norm kernel, gate|up on the register kernel folding its maximum
            gcfg = self.gemv_cfg.get((gu.fmt, gu.n, gu.k), {})
            gu_plan = GemvPlan(gu, self.xn, H, self.act, self.act.shape[1], epi="swiglu", rows=gcfg.get("rows"),
                               unroll=gcfg.get("unroll", 2), xpre=(self.xh_n, self.xinv_n), pre2=True,
                               amax_out=self.stage_slot)  # (gemv_rs_pre folds the maximum)
            if not gu_plan.tracks_amax:
                return None
            return [self._norm(splits, L["post_norm"]), gu_plan.launch, d_plan.launch], d_plan.splits
        x_in, x_out = self._res
        norm = ("norm", x_in, x_out, self.part, splits, self.M * H, L["post_norm"], H, float(self.args.rms_norm_eps))
        gu_plan = GemvPlan(gu, self.xn, H, self.act, self.act.shape[1], epi="swiglu", xpre=(self.xh_n, self.xinv_n),
                           tma=nw, tma_pro=norm, amax_out=self.stage_slot, splits=self.MLP_TMA_GU_P)
        self._res = (x_out, x_in)
        return [gu_plan.launch, d_plan.launch], d_plan.splits

    # The post-attention norm and the dense MLP as one persistent launch (cuda/mlp_fused.cu, NINFER_MLP_FUSED=1): every
    # block stages the normed row itself while its first gate|up loads are in flight, gate|up folds its SwiGLU
    # maximum, a grid barrier, the down-projection's first loads issued between its arrival and its wait. The same
    # planes, bit for bit, as the norm, gate|up, stage_x_amax and down kernels it replaces. MLP_FUSED_LOCAL: every
    # block stages the whole down input into its own shared memory (else a slice each, between two barriers).
    # MLP_FUSED_SPLITS: the down's split-K slices (0: its table entry). H200, session 14, in one process
    # (bench/results/*_20261130n*): see bench/NOTES-decode.md. Also measured and removed: the next norm in the same
    # launch after a third barrier, and each warp's first down item copied into shared memory (cp.async) during the
    # barriers (git history at this file's session-14 commits).
    MLP_FUSED = int(os.environ.get("NINFER_MLP_FUSED", "1"))
    MLP_FUSED_LOCAL = int(os.environ.get("NINFER_MLP_FUSED_LOCAL", "1"))
    MLP_FUSED_SPLITS = int(os.environ.get("NINFER_MLP_FUSED_SPLITS", "3"))
    # NINFER_MLP_FUSED_CHUNK (on by default): each block stages its own 32-value chunks of the SwiGLU row with a
    # power-of-two scale each before the barrier (no global maximum, no staging after it; the down multiplies a chunk
    # scale in). Session 15: 149.1 vs 147.9 tok/s in one process (bench/results/s15a_*); 0 gives the four kernels'
    # bits back (one scale for the row).
    MLP_FUSED_CHUNK = int(os.environ.get("NINFER_MLP_FUSED_CHUNK", "1"))
    # NINFER_MLP_FUSED_HELP (chunk-scaled form, on by default): the chunks left over after an equal share a block (the
    # 27B on 132 SMs: 544 = 4 x 132 + 16) spread over every warp of the launch in 32-lane slices, summed by their
    # owners, instead of a fifth round run by 16 blocks alone (gemv_plan's help). Session 15: 149.0 against 148.2
    # tok/s in one process (bench/results/s15d_*); 0: the leftover chunks' blocks compute them alone.
    MLP_FUSED_HELP = int(os.environ.get("NINFER_MLP_FUSED_HELP", "1"))
    # NINFER_MLP_FUSED_O=1 (chunk-scaled form): a GDN layer's o-projection, where the gated norm stages its input by
    # chunks (GATED_CHUNK), inside the same launch before the norm (split-K items over every warp, MLP_FUSED_O_SPLITS
    # planes, a grid barrier with the first gate|up loads in flight across it): one launch boundary and the
    # o-projection's tail fewer a layer. Not the separate GEMV's bits (its planes). Session 16 (s16b, 27B, one
    # process, two passes): splits 2 150.7 / 150.7 against 150.4 / 150.3 tok/s; splits 3 150.3 / 150.3; 6 146.6.
    # 0: the o-projection GEMV before the launch.
    MLP_FUSED_O = int(os.environ.get("NINFER_MLP_FUSED_O", "1"))
    MLP_FUSED_O_SPLITS = int(os.environ.get("NINFER_MLP_FUSED_O_SPLITS", "2"))
    # NINFER_MLP_FUSED_XW=1 (with MLP_FUSED_O): the norm's x_in and weight loaded before the o-projection's barrier
    # wait, its first two planes together after it (one L2 round after the barrier instead of two). Session 16 (s16d,
    # 27B, one process, two passes): 152.1 / 152.1 against 150.9 / 150.9 tok/s; 0: their loads after the barrier.
    MLP_FUSED_XW = int(os.environ.get("NINFER_MLP_FUSED_XW", "1"))
    # NINFER_MLP_FUSED_OU (with XW): the o-projection's loads a lane in flight a row, 3 (its 3-iteration slices at 2
    # splits in one round) or 2. NINFER_MLP_FUSED_O_ATTN: the attention layers' o-projection inside their launch too
    # (its input staged with one scale, attn_combine_stage's), 1 or 0. Session 16 (s16e, 27B, one process, two
    # passes): OU 3 152.4 / 152.4, O_ATTN 152.8 / 152.9, both 153.3 / 153.3 against 152.1 / 152.0 tok/s.
    MLP_FUSED_OU = int(os.environ.get("NINFER_MLP_FUSED_OU", "3"))
    MLP_FUSED_O_ATTN = int(os.environ.get("NINFER_MLP_FUSED_O_ATTN", "1"))
    # NINFER_MLP_FUSED_LIGHT_BAR (on by default): the launch's grid barriers in their light form (a release atomic to
    # arrive, no fence after the acquire load: cuda/persistent.cu; the same bits). Session 17 (s17d, 27B, one process,
    # two passes): 155.7 / 155.7 against 154.6 / 154.6 tok/s; 0 for the fenced form. 2 (the default): their red form
    # (arrivals by a release reduction, no atomic's return to wait for before polling; persistent.cu). Session 18
    # (s18b, one process, two passes): 154.1 / 154.2 against 153.9 / 153.9; with NORM_1R and ATTN_COMBINE_B 155.8 /
    # 155.7. 1 for the light form.
    MLP_FUSED_LIGHT_BAR = int(os.environ.get("NINFER_MLP_FUSED_LIGHT_BAR", "2"))

    def _chunk_scales(self):
        """mlp_fused's chunk scales (a float a 32-value chunk of the SwiGLU row), or None with MLP_FUSED_CHUNK off."""
        if not self.MLP_FUSED_CHUNK:
            return None
        if getattr(self, "xsc_act", None) is None:
            self.xsc_act = self.cp.zeros(self.kpad_act // 32, dtype=self.cp.float32)
        return self.xsc_act

    def _ffn_fused_ops(self, L, splits: int, oproj=None):
        """(ops, partial planes) of the post-attention norm and the dense MLP as one mlp_fused launch, or None where
        MLP_FUSED is off or its rules do not hold (one token row, int16 pairs, q4 gate|up and q5 down, H <= 8,192).
        oproj: (o, xh_o, xsc_o, chunked): the layer's o-projection first in the same launch (MLP_FUSED_O; chunk-scaled
        form only, its own barrier counter and help words; chunked False: xsc_o is the row's one inverse scale)."""
        gu, dn = L["gate_up"], L["down"]
        if not (self.MLP_FUSED and self.M == 1 and K.XI16 and not self.FFN_SPLIT and self.H <= 8 * 1024):
            return None
        x_in, x_out = self._res
        H = self.H
        norm = (x_in, x_out, self.part, splits, self.M * H, L["post_norm"], H, float(self.args.rms_norm_eps), self.kpad_h)
        scales, help_ = self._chunk_scales(), None
        if oproj is not None and scales is None:
            return None
        sfx = "_o" if oproj is not None else ""  # (launches with the o-projection: two barriers, their own counters)
        if getattr(self, "mlp_bar" + sfx, None) is None:
            setattr(self, "mlp_bar" + sfx, self.cp.zeros(1, dtype=self.cp.uint64))
        if scales is not None and self.MLP_FUSED_HELP:  # (its own barrier counter: the helpers' counts follow it)
            if getattr(self, "mlp_help" + sfx, None) is None:
                setattr(self, "mlp_bar_help" + sfx, self.cp.zeros(1, dtype=self.cp.uint64))
                # (a grid of up to 2 blocks a multiprocessor; mlp_fused_launch checks the size)
                setattr(self, "mlp_help" + sfx,
                        self.cp.zeros(mlp_fused_help_words(K.sm_count() * 2, gu), dtype=self.cp.uint32))
            help_ = getattr(self, "mlp_help" + sfx)
        o_arg = None
        if oproj is not None:
            o, xh_o, xsc_o, chunked = oproj
            o_arg = (o, xh_o, xsc_o, self.MLP_FUSED_O_SPLITS, chunked, self.MLP_FUSED_OU)

        def launch(chunk_scales):
            return mlp_fused_launch(gu, dn, norm, self.act, self.kpad_act, self.xh_act, self.xinv_act,
                                    self.stage_slot, self.part, self.MLP_FUSED_SPLITS or self._splits(dn),
                                    getattr(self, ("mlp_bar_help" if help_ is not None and chunk_scales is not None
                                                   else "mlp_bar") + sfx), local_stage=bool(self.MLP_FUSED_LOCAL),
                                    chunk_scales=chunk_scales, help=help_, oproj=o_arg,
                                    xw_early=bool(self.MLP_FUSED_XW), light_bar=min(int(self.MLP_FUSED_LIGHT_BAR), 2))
        try:  # chunked first; where a block would own more chunks than its shared row holds, one scale for the row
            got = launch(scales) if scales is not None else None
            got = got or (launch(None) if oproj is None else None)
        except RuntimeError:  # (no block of it fits on this GPU: the four kernels)
            return None
        if got is None or got[1] > self.max_splits:
            return None
        self._res = (x_out, x_in)
        return [got[0]], got[1]

    def _ffn_ops(self, L, xn) -> tuple[list, int]:
        """The dense MLP's ops (gate|up with SwiGLU, staging, down into partials) and the partial planes
        the next norm sums."""
        gu, dn = L["gate_up"], L["down"]
        s = self._ffn_split_at(dn) if self.FFN_SPLIT else 0
        if not s:
            pre = self.STAGE_DOWN
            gu_plan = self._plan_gemv(gu, self.xn, self.act, "swiglu", 1, xn,
                                      stage_out=(self.xh_act, self.xinv_act, self.kpad_act, self.stage_slot),
                                      amax_out=self.stage_slot if self.STAGE_AMAX and pre else None)
            pre = gu_plan.stages_out or pre
            d_plan = self._plan_gemv(dn, self.act, self.part, "partial", self._splits(dn),
                                     (self.xh_act, self.xinv_act) if pre else None)
            ops = [gu_plan.launch]
            if gu_plan.tracks_amax:
                ops.append(K.prepared("stage_x_amax", (self.NORM_BLOCKS,),
                                      (self.act, self.inter, self.kpad_act, self.xh_act, self.xinv_act, self.stage_slot),
                                      block=1024))
            elif not gu_plan.stages_out and pre:  # (gemv_rs_pre with fuse_stage in its tuning entry stages it itself)
                ops.append(self._stage(self.act, self.inter, self.kpad_act, self.xh_act, self.xinv_act))
            return ops + [d_plan.launch], d_plan.splits
        inter, M, H = dn.k, self.M, self.H
        gcfg = self.gemv_cfg.get((gu.fmt, gu.n, gu.k), {})
        dcfg = self.gemv_cfg.get((dn.fmt, dn.n, dn.k), {})
        if getattr(self, "xinv_act2", None) is None:
            self.xinv_act2 = self.cp.ones(M, dtype=self.cp.float32)
        halves = []
        for h, (a, b) in enumerate(((0, s), (s, inter))):
            xinv = self.xinv_act if h == 0 else self.xinv_act2
            xh = self.xh_act[:, a // 2:]  # (uint32 pairs: a // 2 of them before the slice)
            gu_h = GemvPlan(gu.swiglu_slice(a, b), self.xn, self.xn.shape[1], self.act, self.act.shape[1], m=M,
                            epi="swiglu", rows=gcfg.get("rows"), unroll=gcfg.get("unroll", 2), y_offset=a, xpre=xn,
                            pf=gcfg.get("pf"), pre2=gcfg.get("pre2", False), pair_stride=gu.n // 2).launch
            kpad = -(-(b - a) // K.XPAD) * K.XPAD
            stage = self._stage(self.act[:, a:], b - a, kpad, xh, xinv, ldh=self.kpad_act // 2)
            down = GemvPlan(dn.col_slice(a, b), self.act, self.act.shape[1], self.part[h], H, m=M, epi="partial",
                            rows=dcfg.get("rows", 1), unroll=dcfg.get("unroll", 2), xpre=(xh, xinv),
                            pf=dcfg.get("pf"), k_chunks=kpad // 32).launch
            halves.append((gu_h, stage, down))
        (gu_a, st_a, dn_a), (gu_b, st_b, dn_b) = halves
        return [gu_a] + self._concurrent([gu_b], [st_a, dn_a]) + [st_b, dn_b], 2
