"""Qwen3.5 hybrid decode on the GPU: packed weights, static buffers, one CUDA graph per step.

The step is shaped for M token rows (`lanes`; later also the K+1 columns of speculative
verification); wave one runs M = 1. Every buffer is allocated once here; the step is a fixed list of
prepared kernel launches captured into a CUDA graph; per-step scalars (input token, position, step
counter) live in device memory and are advanced by the last kernel, so a burst of greedy tokens needs
no host synchronisation at all. The NumPy model (`qwen3_5.py`) is the reference for every number here.
"""
from __future__ import annotations

import math

import numpy as np

from engine.gpu import plan as gpu_plan
from engine.gpu.weights import concat_rows
from engine.gpu import launch as K
from engine.gpu.gemv import GemvPlan, embed_rows, pair_launch
from engine.gpu.attention import (  # noqa: F401  (KV_PAGE: also imported from here)
    ATTN_HEAD_DIM, KV_PAGE, AttentionOps, combine_chunks, combine_stage, qk_norm_rope_kv)
from engine.gpu.gdn import GDN_HEAD_DIM, GdnOps
from engine.gpu.mlp import MlpOps
from engine.gpu.moe import MoeOps
from engine.gpu.norm import NormOps, stage_rows
from engine.gpu.sampling import SamplingOps, argmax_step


def _four_projections(cp, L: dict, parts: list, merged: str, second: str) -> None:
    """A layer's four projections of the normed row (q, k, then gate and v or v and z): where they share a row-split
    format and K, one object L[merged] with L["qk"] and L[second] its row views (one GEMV can project it); else the two
    pairs concatenated apart."""
    nqk = parts[0].n + parts[1].n
    if all(m.fmt in K.FMT_IDS and m.fmt == parts[0].fmt and m.k == parts[0].k for m in parts):
        L[merged] = concat_rows(cp, parts)
        L["qk"], L[second] = L[merged].row_slice(0, nqk), L[merged].row_slice(nqk, L[merged].n)
    else:
        L["qk"], L[second] = concat_rows(cp, parts[:2]), concat_rows(cp, parts[2:])


class CudaQwen35(NormOps, AttentionOps, GdnOps, MlpOps, MoeOps, SamplingOps):
    """Decode-step executor for Qwen3.5 dense models on one GPU.

    `weights` maps logical names (spec/container.md §2.3) to `DevMatrix` (projections, embedding,
    head) or 1-D/2-D CuPy float32 arrays (norms, conv, a_log, dt_bias). `plan` (engine.gpu.plan): the
    kernel and form of every op; by default the one this GPU takes for these weights (NINFER_PLAN applied).
    """

    def __init__(self, args, weights: dict, *, max_context: int = 4096, lanes: int = 1,
                 gemv_cfg: dict | None = None, kv: str = "bf16", plan: gpu_plan.DecodePlan | None = None):
        import cupy as cp  # noqa: PLC0415

        self.cp, self.args, self.M = cp, args, lanes
        if kv not in ("bf16", "int8"):
            raise ValueError(f"unknown KV format {kv!r}: bf16 or int8")
        self.kv = kv
        self.plan = plan if plan is not None else gpu_plan.plan_for(args, weights, kv)
        if self.plan.kv != kv:
            raise ValueError(f"the plan is for a {self.plan.kv} KV cache, not {kv}")
        K.require(self.plan.kernels)
        K.PDL = self.plan.pdl
        a = args
        if a.is_moe and lanes != 1:
            raise NotImplementedError("the GPU MoE decode path runs one lane for now")
        if a.head_dim != ATTN_HEAD_DIM or (a.linear_key_head_dim or GDN_HEAD_DIM) != GDN_HEAD_DIM:
            raise ValueError("GPU kernels need attention head_dim 256 and GDN head dims 128")
        self.H, self.V = a.hidden_size, a.vocab_size
        self.max_context = int(math.ceil(max_context / KV_PAGE) * KV_PAGE)
        # the table was measured for one token row; M > 1 (columns) keeps GemvPlan's defaults
        self.gemv_cfg = gemv_cfg if gemv_cfg else (self.plan.gemv_cfg() if lanes == 1 else {})
        self.Hq, self.Hkv = a.num_attention_heads, a.num_key_value_heads
        self.Hk, self.Hv = a.linear_num_key_heads, a.linear_num_value_heads
        self.inter = a.intermediate_size
        self.layer_types = a.layer_types
        self._build_weights(weights)
        self._alloc()
        self.graph = None
        self.ops = self._plan()

    # ---- weights -------------------------------------------------------------------------------
    def _build_weights(self, w):
        cp = self.cp
        self.embed = w["text/token_embedding"]
        self.head = w.get("text/output_head", self.embed)
        self.final_norm = w["text/final_norm"]
        self.layers = []
        for i, kind in enumerate(self.layer_types):
            p = f"text/layers/{i}/"
            L = {"kind": kind, "in_norm": w[p + "input_norm"], "post_norm": w[p + "post_attention_norm"]}
            if self.args.is_moe:
                E, m = self.args.num_experts, p + "moe/"
                L["router"] = concat_rows(cp, [w[m + "router"], w[m + "shared_score"]])
                L["experts_gu"] = concat_rows(cp, [w[f"{m}experts/{e}/{r}"] for e in range(E) for r in ("gate", "up")])
                L["experts_down"] = concat_rows(cp, [w[f"{m}experts/{e}/down"] for e in range(E)])
                L["shared_gu"] = concat_rows(cp, [w[m + "shared/gate"], w[m + "shared/up"]])
                L["shared_down"] = w[m + "shared/down"]
            else:
                L["gate_up"] = concat_rows(cp, [w[p + "mlp/gate"], w[p + "mlp/up"]])
                L["down"] = w[p + "mlp/down"]
            if kind == "full_attention":  # (q|k and gate|v: ATTN_MERGE projects their shared object in one GEMV)
                _four_projections(cp, L, [w[p + f"attention/{n}"] for n in ("query", "key", "gate", "value")],
                                  "qkgv", "gv")
                L["o"] = w[p + "attention/output"]
                L["qn"], L["kn"] = w[p + "attention/query_norm"], w[p + "attention/key_norm"]
            else:  # (q|k and v|z: GDN_MERGE projects their shared object in one GEMV)
                _four_projections(cp, L, [w[p + f"gdn/{n}"] for n in ("query", "key", "value", "z")], "qkvz", "vz")
                L["ab"] = concat_rows(cp, [w[p + "gdn/a_projection"], w[p + "gdn/b_projection"]])
                L["o"] = w[p + "gdn/output"]
                L["conv"] = w[p + "gdn/convolution"]
                L["a_log"], L["dt_bias"], L["norm"] = w[p + "gdn/a_log"], w[p + "gdn/dt_bias"], w[p + "gdn/norm"]
            self.layers.append(L)

    def _matrices(self):
        yield self.head
        if self.head is not self.embed:
            yield self.embed
        for L in self.layers:
            for key in ("qk", "gv", "vz", "ab", "o", "gate_up", "down", "router", "shared_gu", "shared_down",
                        "experts_gu", "experts_down"):
                if key in L:
                    yield L[key]

    def weight_bytes(self) -> int:
        """Packed weight bytes resident on the device."""
        return sum(m.nbytes for m in self._matrices())

    def weight_bytes_per_token(self) -> int:
        """Bytes of weights read per decoded token (the embedding gather reads one row; of the routed
        experts only top-k of E are read)."""
        total = self.weight_bytes() - (self.embed.nbytes - self.embed.nbytes // max(self.embed.n, 1))
        if self.head is self.embed:
            total = self.weight_bytes()
        for L in self.layers:
            if "experts_gu" in L:
                routed = L["experts_gu"].nbytes + L["experts_down"].nbytes
                total -= routed - int(routed * self.args.num_experts_per_tok / self.args.num_experts)
        return total

    def state_bytes(self) -> int:
        """One copy of the GDN recurrent + conv state (a decode step reads it and writes it back)."""
        n_gdn = sum(1 for t in self.layer_types if t != "full_attention")
        conv = 3 * (2 * self.Hk + self.Hv) * GDN_HEAD_DIM * 4
        return n_gdn * (self.Hv * GDN_HEAD_DIM * GDN_HEAD_DIM * 4 + conv)

    def kv_bytes_per_token(self) -> int:
        n_attn = sum(1 for t in self.layer_types if t == "full_attention")
        per_row = ATTN_HEAD_DIM * 2 if self.kv == "bf16" else ATTN_HEAD_DIM + ATTN_HEAD_DIM // 64 * 2
        return n_attn * self.Hkv * per_row * 2

    # ---- buffers -------------------------------------------------------------------------------
    def _alloc(self):
        cp, M, H = self.cp, self.M, self.H
        f32 = cp.float32
        self.tokens = cp.zeros(M, dtype=cp.int32)
        self.hist_len = 4096
        self.x = cp.zeros((M, H), dtype=f32)
        self.x2 = cp.zeros((M, H), dtype=f32)  # residual ping-pong: a norm reads one and writes the other
        self.xn = cp.zeros((M, H), dtype=f32)
        self.max_splits = 8
        self.part = cp.zeros((self.max_splits, M, H), dtype=f32)
        widths = [L["qk"].n for L in self.layers] + [L.get("gv", L.get("vz")).n for L in self.layers]
        self.buf_a = cp.zeros((M, max(widths)), dtype=f32)
        self.buf_b = cp.zeros((M, max(widths)), dtype=f32)
        self.ab = cp.zeros((M, 2 * max(self.Hv, 1)), dtype=f32)
        a = self.args
        if a.is_moe:
            self.topk, self.inter_e, self.inter_sh = a.num_experts_per_tok, a.moe_intermediate_size, \
                a.shared_expert_intermediate_size
            self.inter = max(self.inter_e, self.inter_sh)
            self.rlog = cp.zeros((M, a.num_experts + 1), dtype=f32)
            self.eidx = cp.zeros((M, self.topk), dtype=cp.int32)
            self.ewts = cp.zeros((M, self.topk + 1), dtype=f32)
            self.act_e = cp.zeros((self.topk, self.inter_e), dtype=f32)
            self.kpad_e = -(-self.inter_e // K.XPAD) * K.XPAD
            self.xh_e = cp.zeros((self.topk, self.kpad_e // 2), dtype=cp.uint32)
            self.xinv_e = cp.ones(self.topk, dtype=f32)
            self.max_splits = max(self.max_splits, self.topk + 1)
            self.part = cp.zeros((self.max_splits, M, H), dtype=f32)
        self.act = cp.zeros((M, self.inter), dtype=f32)
        att_w = max(self.Hq * ATTN_HEAD_DIM, self.Hv * GDN_HEAD_DIM)
        self.att = cp.zeros((M, att_w), dtype=f32)
        self.att2 = cp.zeros((M, att_w), dtype=f32)
        self.qbuf = cp.zeros((M, self.Hq * ATTN_HEAD_DIM), dtype=f32)
        self.logits = cp.zeros((M, self.V), dtype=f32)
        # x pre-staged as fp16 pairs for the q4/q5/q6 GEMVs (written once by the producer kernel)
        kp = lambda k: -(-k // K.XPAD) * K.XPAD  # noqa: E731  (whole slot-major blocks)
        self.kpad_h, self.kpad_att, self.kpad_act = kp(H), kp(att_w), kp(self.inter)
        self.xh_n, self.xinv_n = cp.zeros((M, self.kpad_h // 2), dtype=cp.uint32), cp.ones(M, dtype=f32)
        self.xh_att, self.xinv_att = cp.zeros((M, self.kpad_att // 2), dtype=cp.uint32), cp.ones(M, dtype=f32)
        self.xh_act, self.xinv_act = cp.zeros((M, self.kpad_act // 2), dtype=cp.uint32), cp.ones(M, dtype=f32)
        self.stage_slot = cp.zeros(2, dtype=cp.uint32)  # gemv_rs_pre fused staging: max bits, block tickets
        self.gdn_q = cp.zeros((M, self.Hk, GDN_HEAD_DIM), dtype=f32)
        self.gdn_k = cp.zeros((M, self.Hk, GDN_HEAD_DIM), dtype=f32)
        self.gdn_v = cp.zeros((M, self.Hv, GDN_HEAD_DIM), dtype=f32)
        self.gdn_g = cp.zeros((M, self.Hv), dtype=f32)
        self.gdn_beta = cp.zeros((M, self.Hv), dtype=f32)
        # gdn_delta_gated_stage: row max bits and head tickets a row, then block tickets a (row, head)
        self.gdn_tick = cp.zeros(2 * M + M * self.Hv, dtype=cp.uint32)
        self.attn_tick = cp.zeros(2 * M, dtype=cp.uint32)  # attn_combine_stage: row max bits, head tickets
        self._alloc_state()
        self._alloc_attention()

    def _alloc_state(self):
        """Per-lane sequence state: positions, the paged KV pool, GDN conv history and recurrent state."""
        cp, M, f32 = self.cp, self.M, self.cp.float32
        self.pos = cp.zeros(M, dtype=cp.int32)
        self.step = cp.zeros(M, dtype=cp.int32)
        self.history = cp.zeros((M, self.hist_len), dtype=cp.int32)
        # argmax_step_mb's per-block bests and per-row tickets (zero between launches)
        self.am_v = cp.zeros((M, self.ARGMAX_BLOCKS), dtype=cp.float32)
        self.am_i = cp.zeros((M, self.ARGMAX_BLOCKS), dtype=cp.int32)
        self.am_ticket = cp.zeros(M, dtype=cp.uint32)
        C = (2 * self.Hk + self.Hv) * GDN_HEAD_DIM
        pages_per_lane = self.max_context // KV_PAGE
        self.page_table = cp.arange(M * pages_per_lane, dtype=cp.int32).reshape(M, pages_per_lane)
        for L in self.layers:
            if L["kind"] == "full_attention":
                shape = (M * pages_per_lane, KV_PAGE, self.Hkv, ATTN_HEAD_DIM)
                if self.kv == "bf16":
                    L["kc"] = cp.zeros(shape, dtype=cp.uint16)
                    L["vc"] = cp.zeros(shape, dtype=cp.uint16)
                    L["ks"] = L["vs"] = None
                else:
                    L["kc"] = cp.zeros(shape, dtype=cp.int8)
                    L["vc"] = cp.zeros(shape, dtype=cp.int8)
                    L["ks"] = cp.zeros(shape[:-1] + (ATTN_HEAD_DIM // 64,), dtype=cp.float16)
                    L["vs"] = cp.zeros(shape[:-1] + (ATTN_HEAD_DIM // 64,), dtype=cp.float16)
            else:
                L["conv_state"] = cp.zeros((M, 3, C), dtype=f32)
                L["state"] = cp.zeros((M, self.Hv, GDN_HEAD_DIM, GDN_HEAD_DIM), dtype=f32)
        self.qpos, self.pt_stride = self.pos, pages_per_lane  # where each token row's position and pages are

    def reset(self):
        """Forget the sequence: zero caches and GDN state, position 0."""
        for L in self.layers:
            for key in ("conv_state", "state"):
                if key in L:
                    L[key].fill(0)
        self.pos.fill(0)
        self.step.fill(0)

    # ---- the step ------------------------------------------------------------------------------
    def _gemv(self, w, x, y, epi="store", splits=1, y_offset=0, xpre=None, conv=None):
        cfg = self.gemv_cfg.get((w.fmt, w.n, w.k), {})
        return GemvPlan(w, x, x.shape[-1], y, y.shape[-1], m=self.M, epi=epi,
                        splits=1 if conv else cfg.get("splits", splits), rows=cfg.get("rows"),
                        unroll=cfg.get("unroll", 2), y_offset=y_offset, xpre=xpre, pre2=cfg.get("pre2", False),
                        conv=conv).launch

    def _pair(self, a, b):
        """Two of _gemv's launches (of one x) as one gemv_rs_pre_pair grid (the plan's gemv_pair), or None (they do
        not qualify: gemv.pair_launch)."""
        if not self.plan.gemv_pair or self.M != 1:
            return None
        return pair_launch(a.__self__, b.__self__)

    def _plan_gemv(self, w, x, y, epi, splits, xpre, amax_out=None, xs=None):
        cfg = self.gemv_cfg.get((w.fmt, w.n, w.k), {})
        return GemvPlan(w, x, x.shape[-1], y, y.shape[-1], m=self.M, epi=epi, splits=cfg.get("splits", splits),
                        rows=cfg.get("rows"), unroll=cfg.get("unroll", 2), xpre=xpre, pre2=cfg.get("pre2", False),
                        amax_out=amax_out, xs=xs)

    ARGMAX_BLOCKS = 64  # blocks a row of the greedy argmax over the vocabulary

    def _prep_fused(self) -> bool:
        """The GDN projections' epilogue applies the causal conv and SiLU, the delta rule the q/k norms and gates (no
        gdn_prep launch): one token row, the decode step's own core and GEMVs."""
        return (self.M == 1 and type(self)._gdn_core_ops is CudaQwen35._gdn_core_ops
                and type(self)._gemv is CudaQwen35._gemv)

    def _moe_splits(self) -> int:
        """Partial planes the MoE block leaves for the next norm to sum: the routed slots and the shared expert.
        (One kernel summing the slots measured slower: 35B-A3B 338.9 against 345.1 tok/s.)"""
        return self.topk + 1

    def _stage(self, x, k, kpad, xh, xinv, ldh=None):
        """x[:, :k] as the int16 pairs of kpad values (ldh pairs a row of xh: kpad / 2 unless a slice)."""
        return stage_rows(x=x, ld=x.strides[0] // x.itemsize, k=k, kpad=kpad, xh=xh,
                          ldh=kpad // 2 if ldh is None else ldh, xinv=xinv, rows=self.M, blocks=self.NORM_BLOCKS)

    def _splits(self, w) -> int:
        cfg = self.gemv_cfg.get((w.fmt, w.n, w.k), {})
        if "splits" in cfg:
            return cfg["splits"]
        blocks = -(-w.n // (2 * K.WARPS))
        return max(1, min(self.max_splits, (2 * K.sm_count()) // max(blocks, 1)))

    def _plan(self):
        a, M, H = self.args, self.M, self.H
        eps = float(a.rms_norm_eps)
        ops = self._pre_ops() + self._embed_ops()
        prev_splits = 0
        self._res = (self.x, self.x2)
        log2_theta = float(math.log2(a.rope_theta))
        rot = a.rotary_dim
        for L in self.layers:
            ops.append(self._norm(prev_splits, L["in_norm"]))
            xn = (self.xh_n, self.xinv_n)
            att_k = L["o"].k
            att_kpad = -(-att_k // K.XPAD) * K.XPAD  # per layer: the staged row stride the o-projection's K implies
            att_stage = (att_k, att_kpad, self.xh_att, self.xinv_att)
            o_gemv = lambda xs=None: self._plan_gemv(L["o"], self.att, self.part, "partial",  # noqa: E731
                                                     self._splits(L["o"]), (self.xh_att, self.xinv_att), xs=xs)
            moe_chunk = self.args.is_moe and self._moe_o_chunked(L)  # (the o-phase of moe_fused takes chunk scales)
            staged_chunks = False  # (this layer's o input staged by chunks)
            if L["kind"] == "full_attention":
                qw = self.Hq * ATTN_HEAD_DIM
                buf_a, buf_b = self.buf_a, self.buf_b
                lda, ldb = buf_a.shape[1], buf_b.shape[1]
                if "qkgv" in L:  # (q|k and gate|v as one GEMV over their shared object)
                    buf_a = self._merged_buf()
                    buf_b = buf_a[:, L["qk"].n:]
                    lda = ldb = buf_a.shape[1]
                    ops.append(self._gemv(L["qkgv"], self.xn, buf_a, xpre=xn))
                else:
                    qk = self._gemv(L["qk"], self.xn, buf_a, xpre=xn)
                    gv = self._gemv(L["gv"], self.xn, buf_b, xpre=xn)
                    pair = self._pair(gv, qk)  # (one grid for both)
                    ops.extend([pair] if pair is not None else self._concurrent([gv], [qk]))
                core = [qk_norm_rope_kv(q=buf_a, ld_q=lda, k=buf_a[:, qw:], ld_k=lda, v=buf_b[:, qw:], ld_v=ldb,
                                        q_norm=L["qn"], k_norm=L["kn"], pos=self.qpos, page_table=self.page_table,
                                        pt_stride=self.pt_stride, k_cache=L["kc"], v_cache=L["vc"], q_out=self.qbuf,
                                        q_heads=self.Hq, kv_heads=self.Hkv, rotary_dim=rot, log2_theta=log2_theta,
                                        eps=eps, rows=M, k_scales=L["ks"], v_scales=L["vs"])]
                core += self._attn_core_ops(L, ldb, buf_b)
                # the combine stages the o-projection's input itself: a 32-value chunk at a time (over the splits
                # that hold tokens) where the o-projection (or the fused MLP's o-phase) takes chunk scales, else
                # with one scale for the row (its last head)
                o_plan = o_gemv(self._gated_chunk_scales())
                comb = dict(ml=self.attn_ml, acc=self.attn_acc, nsplit=self.nsplit, gate=buf_b, ld_gate=ldb,
                            out=self.att, ld_out=self.att.shape[1], heads=self.Hq, k=att_k, kpad=att_kpad,
                            xh=self.xh_att, xinv=self.xinv_att, rows=M)
                if o_plan.xs or moe_chunk:
                    staged_chunks = True
                    core.append(combine_chunks(**comb, xsc=self.xsc_att, pos=self.qpos,
                                               round_to=16 if self._attn_mma() else 1))
                else:
                    core.append(combine_stage(**comb, amax=self.attn_tick[:M], tickets=self.attn_tick[M:]))
            else:
                # the o-projection reads the gated norm's output staged a chunk at a time where its GEMV takes chunk
                # scales
                o_plan = o_gemv(self._gated_chunk_scales())
                staged_chunks = bool(o_plan.xs or moe_chunk)
                proj, core = self._gdn_ops(L, xn, att_stage, chunk=staged_chunks)
                ops.extend(proj)
            ops.extend(core)
            o_in = None  # (the o-projection inside the fused MLP: its input pairs and scales)
            if not self.args.is_moe:
                if o_plan.xs:
                    o_in = (self.xh_att, self._gated_chunk_scales(), True)
                elif L["kind"] == "full_attention":
                    o_in = (self.xh_att, self.xinv_att, False)
            if o_in is not None:
                fused = self._ffn_fused_ops(L, 0, oproj=(L["o"],) + o_in)
                if fused is not None:
                    ops.extend(fused[0])
                    prev_splits = fused[1]
                    continue
            if self.args.is_moe and not o_plan.xs:  # (the o-projection inside moe_fused)
                fused = self._moe_fused_ops(L, 0, oproj=(L["o"], self.xh_att, self.xinv_att,
                                                         self.xsc_att if staged_chunks else None))
                if fused is not None:
                    ops.extend(fused[0])
                    prev_splits = fused[1]
                    continue
            if staged_chunks and not o_plan.xs:
                raise RuntimeError("the o-projection's input was staged by chunks for a launch that did not take it")
            ops.append(o_plan.launch)
            one_launch = self._moe_fused_ops(L, o_plan.splits) if self.args.is_moe else \
                self._ffn_fused_ops(L, o_plan.splits)
            if one_launch is not None:  # (the post-attention norm inside the fused MLP launch)
                ops.extend(one_launch[0])
                prev_splits = one_launch[1]
                continue
            ops.append(self._norm(o_plan.splits, L["post_norm"]))
            if self.args.is_moe:
                ops.extend(self._moe_ops(L, xn))
                prev_splits = self._moe_splits()
            else:
                ffn, prev_splits = self._ffn_ops(L, xn)
                ops.extend(ffn)
        ops.append(self._norm(prev_splits, self.final_norm))
        ops.extend(self._tail_ops())
        return ops

    def _concurrent(self, main: list, side: list) -> list:
        """The ops of `main` (the larger work) and `side` as one Concurrent op (on two streams), or in order where the
        plan's `branches` is off."""
        if not self.plan.branches:
            return side + main
        if getattr(self, "side_stream", None) is None:
            self.side_stream = self.cp.cuda.Stream(non_blocking=True)
        return [K.Concurrent(self.cp, self.side_stream, main, side)]

    def _merged_buf(self):
        """The output rows of the merged projections (q|k|v|z, q|k|gate|v): one [M, widest] buffer for every layer,
        allocated once (a launch keeps its pointer)."""
        if getattr(self, "buf_qkvz", None) is None:
            n = max(L[k].n for L in self.layers for k in ("qkvz", "qkgv") if k in L)
            self.buf_qkvz = self.cp.zeros((self.M, n), dtype=self.cp.float32)
        return self.buf_qkvz

    def _pre_ops(self):
        return []

    def _embed_ops(self, out=None):
        """The token rows' embeddings into x (`out`: another [M, H] buffer; the MTP head's executor puts its
        own input stage here)."""
        return [embed_rows(self.embed, tokens=self.tokens, out=self.x if out is None else out, ld=self.H,
                           rows=self.M)]

    def _tail_ops(self):
        """Head and device argmax: the next input token, the position and the history advance."""
        M = self.M
        self._argmax_op = argmax_step(logits=self.logits, ld=self.V, vocab=self.V, best_v=self.am_v, best_i=self.am_i,
                                      tickets=self.am_ticket, tokens=self.tokens, pos=self.pos, history=self.history,
                                      step=self.step, hist_len=self.hist_len, rows=M, blocks=self.ARGMAX_BLOCKS)
        return [self._gemv(self.head, self.xn, self.logits, xpre=(self.xh_n, self.xinv_n)), self._argmax_op]

    def run_eager(self):
        for op in self.ops:
            op()

    def capture(self):
        """Capture the step into a CUDA graph (the step is run once eagerly first, then state reset)."""
        self.graph = self._capture(self.ops)

    def _capture(self, ops):
        cp = self.cp
        if getattr(self, "stream", None) is None:
            self.stream = cp.cuda.Stream(non_blocking=True)
        with self.stream:
            for op in ops:
                op()
            self.stream.synchronize()
            self.reset()
            self.stream.begin_capture()
            for op in ops:
                op()
            graph = self.stream.end_capture()
            graph.upload(self.stream)
        self.stream.synchronize()
        return graph

    def step_async(self):
        if self.graph is None:
            self.capture()
        self.graph.launch(self.stream)

    # ---- the engine protocol -------------------------------------------------------------------
    def set_token(self, token: int):
        self.tokens.set(np.full(self.M, token, dtype=np.int32), stream=self.stream if self.graph else None)

    def prefill(self, token_ids) -> np.ndarray:
        """Run the prompt one token at a time through the decode graph; return the last logits."""
        if self.graph is None:
            self.capture()
        for t in token_ids:
            self.set_token(int(t))
            self.graph.launch(self.stream)
        self.stream.synchronize()
        return self.logits[0].get()

    def decode_step(self, token: int) -> np.ndarray:
        return self.prefill([token])

    def decode_greedy(self, first_token: int, n: int) -> list[int]:
        """n greedy tokens after `first_token`, the loop kept on the device (argmax feeds the next step)."""
        if self.graph is None:
            self.capture()
        return self._burst(self.graph, first_token, n)

    @property
    def position(self) -> int:
        return int(self.pos[0].get())
