"""What the blocks of one CUDA step share (`StepContext`): the dimensions, the plan, the GEMV table, the streams, the
sequence's device state (positions, page table, step counter, history ring) and the static activation buffers every
block reads or writes (the residual pair, the normed row and its staged pairs, the projections' output rows, the
split-K planes, the logits), with the helpers that build their GEMV launches. The executor (engine.gpu.decode) makes
one and hands it to each block it holds; a block keeps the buffers only it uses."""
from __future__ import annotations

from engine.gpu import kernel_names as KN
from engine.gpu import launch as K
from engine.gpu.attention import ATTN_HEAD_DIM
from engine.gpu.gdn import GDN_HEAD_DIM, gdn_rows
from engine.gpu.gemv import GemvPlan, pair_launch
from engine.gpu.norm import stage_rows


def padded(k: int) -> int:
    """k rounded up to whole slot-major blocks of the staged pairs."""
    return -(-k // K.XPAD) * K.XPAD


class StepContext:
    """The shared state of a step over M token rows (`rows`): see the module docstring. `alloc(layers)` makes the
    activation buffers; the executor fills in the sequence state (pos, step, history, hist_len, page_table, qpos,
    pt_stride) and `stream`."""

    NORM_BLOCKS = 16  # blocks a token row of the multi-block norms and stagings (each reduces the whole row)

    def __init__(self, cp, args, plan, *, rows: int, max_context: int, kv: str, gemv_cfg: dict):
        a = args
        self.cp, self.args, self.plan, self.M, self.kv = cp, args, plan, rows, kv
        self.max_context, self.gemv_cfg = max_context, gemv_cfg
        self.H, self.V = a.hidden_size, a.vocab_size
        self.Hq, self.Hkv = a.num_attention_heads, a.num_key_value_heads
        self.Hk, self.Hv = a.linear_num_key_heads, a.linear_num_value_heads
        self.inter = max(a.moe_intermediate_size, a.shared_expert_intermediate_size) if a.is_moe \
            else a.intermediate_size
        self.stream = None  # the step's stream (made at the first capture, or another executor's)
        self.side_stream = None  # Concurrent ops' second stream (made with the first)
        self.res = None  # (x_in, x_out): the residual pair the next norm reads and writes (swapped by each)
        self.buf_qkvz = None
        self.xsc_att = None

    def alloc(self, layers) -> None:
        """The static activation buffers for the step over `layers` (their projections' widths)."""
        cp, M, H = self.cp, self.M, self.H
        f32 = cp.float32
        self.layers = layers
        self.tokens = cp.zeros(M, dtype=cp.int32)
        self.x = cp.zeros((M, H), dtype=f32)
        self.x2 = cp.zeros((M, H), dtype=f32)  # residual ping-pong: a norm reads one and writes the other
        self.xn = cp.zeros((M, H), dtype=f32)
        # split-K partial planes: those of a GEMV, or the MoE block's routed slots and shared expert
        self.max_splits = max(8, self.args.num_experts_per_tok + 1) if self.args.is_moe else 8
        if M > 1:  # (and the slices gemv_tc's table gives a matrix's planes)
            self.max_splits = max([self.max_splits] + [f[3] or 1 for f in KN.GEMV_TC_TABLE.values() if len(f) > 3])
        self.part = cp.zeros((self.max_splits, M, H), dtype=f32)
        widths = [L["qk"].n for L in layers] + [L.get("gv", L.get("vz")).n for L in layers]
        self.buf_a = cp.zeros((M, max(widths)), dtype=f32)
        self.buf_b = cp.zeros((M, max(widths)), dtype=f32)
        self.ab = cp.zeros((M, 2 * max(self.Hv, 1)), dtype=f32)
        self.act = cp.zeros((M, self.inter), dtype=f32)
        att_w = max(self.Hq * ATTN_HEAD_DIM, self.Hv * GDN_HEAD_DIM)
        self.att = cp.zeros((M, att_w), dtype=f32)
        self.att2 = cp.zeros((M, att_w), dtype=f32)
        self.qbuf = cp.zeros((M, self.Hq * ATTN_HEAD_DIM), dtype=f32)
        self.logits = cp.zeros((M, self.V), dtype=f32)
        # x pre-staged as fp16 pairs for the q4/q5/q6 GEMVs (written once by the producer kernel)
        self.kpad_h, self.kpad_att, self.kpad_act = padded(H), padded(att_w), padded(self.inter)
        self.xh_n, self.xinv_n = cp.zeros((M, self.kpad_h // 2), dtype=cp.uint32), cp.ones(M, dtype=f32)
        self.xh_att, self.xinv_att = cp.zeros((M, self.kpad_att // 2), dtype=cp.uint32), cp.ones(M, dtype=f32)
        self.xh_act, self.xinv_act = cp.zeros((M, self.kpad_act // 2), dtype=cp.uint32), cp.ones(M, dtype=f32)
        # their packed twins where gemv_tc reads one (2..4 rows, kernel_names.gemv_tc_packs): each producer of the
        # pairs also writes the twin (common.cuh pk_word), the q4-q6 GEMVs read it
        self.xpk_n, self.xpk_att, self.xpk_act = (self._twin(k) for k in (self.kpad_h, self.kpad_att, self.kpad_act))
        self.stage_slot = cp.zeros(2 * M, dtype=cp.uint32)  # the SwiGLU's fused staging: max bits, tickets a row
        # gdn_prep's outputs, the delta rule's inputs (engine.gpu.gdn.prep_bufs, delta_bufs)
        self.gdn_q, self.gdn_k, self.gdn_v, self.gdn_g, self.gdn_beta = gdn_rows(cp, M, self.Hk, self.Hv)

    def _twin(self, kpad: int):
        """The packed twin of M rows of kpad staged values (groups of 64 values, 512 bytes each, and the 4 past the
        last that a run of gemv_tc may read), or None where no gemv_tc reads one."""
        if not KN.gemv_tc_packs(0, self.M):
            return None
        return self.cp.zeros((kpad // 64 + 4) * 512, dtype=self.cp.uint8)

    def twin(self, xh):
        """The packed twin of the staged pairs xh (xh_n, xh_att, xh_act), or None."""
        for h, t in ((self.xh_n, self.xpk_n), (self.xh_att, self.xpk_att), (self.xh_act, self.xpk_act)):
            if xh is h:
                return t
        return None

    # ---- the residual pair -----------------------------------------------------------------------
    def swap_residual(self) -> tuple:
        """(x_in, x_out) for the launch that sums the residual next; the one after it reads x_out."""
        x_in, x_out = self.res
        self.res = (x_out, x_in)
        return x_in, x_out

    # ---- GEMV launches -------------------------------------------------------------------------
    def gemv(self, w, x, y, epi="store", splits=1, y_offset=0, xpre=None, conv=None):
        """The launch of y = w x over the M rows, in the form the GEMV table gives (w's format, N, K)."""
        cfg = self.gemv_cfg.get((w.fmt, w.n, w.k), {})
        return GemvPlan(w, x, x.shape[-1], y, y.shape[-1], m=self.M, epi=epi,
                        splits=1 if conv else cfg.get("splits", splits), rows=cfg.get("rows"),
                        unroll=cfg.get("unroll", 2), y_offset=y_offset, xpre=xpre, pre2=cfg.get("pre2", False),
                        conv=conv).launch

    def plan_gemv(self, w, x, y, epi, splits, xpre, amax_out=None, xs=None) -> GemvPlan:
        """gemv's plan itself (its splits, whether it takes chunk scales or tracks the row maximum)."""
        cfg = self.gemv_cfg.get((w.fmt, w.n, w.k), {})
        return GemvPlan(w, x, x.shape[-1], y, y.shape[-1], m=self.M, epi=epi, splits=cfg.get("splits", splits),
                        rows=cfg.get("rows"), unroll=cfg.get("unroll", 2), xpre=xpre, pre2=cfg.get("pre2", False),
                        amax_out=amax_out, xs=xs)

    def pair(self, a, b):
        """Two of gemv's launches (of one x) as one gemv_rs_pre_pair grid (the plan's gemv_pair), or None (they do
        not qualify: gemv.pair_launch)."""
        if not self.plan.gemv_pair or self.M != 1:
            return None
        return pair_launch(a.__self__, b.__self__)

    def splits(self, w) -> int:
        """Split-K planes of a GEMV into the partials: the table's, else as many as fill the SMs twice."""
        cfg = self.gemv_cfg.get((w.fmt, w.n, w.k), {})
        if "splits" in cfg:
            return cfg["splits"]
        blocks = -(-w.n // (2 * K.WARPS))
        return max(1, min(self.max_splits, (2 * K.sm_count()) // max(blocks, 1)))

    def stage(self, x, k, kpad, xh, xinv, ldh=None):
        """x[:, :k] as the int16 pairs of kpad values (ldh pairs a row of xh: kpad / 2 unless a slice)."""
        return stage_rows(x=x, ld=x.strides[0] // x.itemsize, k=k, kpad=kpad, xh=xh,
                          ldh=kpad // 2 if ldh is None else ldh, xinv=xinv, rows=self.M, blocks=self.NORM_BLOCKS,
                          xpk=self.twin(xh) if ldh is None else None)

    def concurrent(self, main: list, side: list) -> list:
        """The ops of `main` (the larger work) and `side` as one Concurrent op (on two streams), or in order where the
        plan's `branches` is off."""
        if not self.plan.branches:
            return side + main
        if self.side_stream is None:
            self.side_stream = self.cp.cuda.Stream(non_blocking=True)
        return [K.Concurrent(self.cp, self.side_stream, main, side)]

    def merged_buf(self):
        """The output rows of the merged projections (q|k|v|z, q|k|gate|v): one [M, widest] buffer for every layer,
        allocated once (a launch keeps its pointer)."""
        if self.buf_qkvz is None:
            n = max(L[k].n for L in self.layers for k in ("qkvz", "qkgv") if k in L)
            self.buf_qkvz = self.cp.zeros((self.M, n), dtype=self.cp.float32)
        return self.buf_qkvz

    def gated_chunk_scales(self):
        """The o-projection's chunk scales (fp32, a value a 32-value chunk of its staged input row) or None (more than
        one token row): written by its stager (the gated norm, the attention combine), read by the o-projection."""
        if self.M != 1:
            return None
        if self.xsc_att is None:
            self.xsc_att = self.cp.zeros(self.xh_att.shape[-1] * 2 // 32, dtype=self.cp.float32)
        return self.xsc_att
