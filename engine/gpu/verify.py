"""Speculative decoding on the CUDA engine: the verification of K + 1 columns, the fold, the MTP head, one graph a
round (the semantics: spec/runtime.md §3.5-3.6; the NumPy form: engine/speculative.py, engine/models/replay_ssm.py).

A round is one CUDA graph on the decode executor's stream:
1. the position moves by the previous round's accepted columns (`spec_advance`);
2. the MTP head catches up over those columns (one columns pass: each column's final hidden state and the token
   after it), then drafts K tokens one row each by greedy argmax of its proposal head, or of the target's head
   where the weights carry none (its own one-layer KV cache);
3. the verification: the columns step over [t, d_1..d_K] whose GDN layers first fold the previous round's accepted
   columns into their state and conv history in place (ReplaySSM: the delta rule over the recorded key, value, g and
   beta), then read that state and record this round's columns (`gdn_prep_verify`, `gdn_delta_verify`; the records
   are two halves, one written while the other is folded), the head over every column, the target's own pick a
   column (the argmax, or a device sampler's draw with the coin plain decode takes at that position), the accept
   (`spec_accept`: m, the emitted tokens, the next round's first id), all on the device.
The host reads [m, picks] once a round. A consumer that stops inside a round commits the columns it took:
the fold graph alone (`gdn_fold`, `gdn_conv_fold`) runs with that count. The kernels: cuda/spec.cu.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from engine.gpu import gemv_tuning
from engine.gpu import kernel_names as KN
from engine.gpu import launch as K
from engine.gpu import mtp_prompt
from engine.gpu.columns import ColumnsAttention, CudaQwen35Columns, columns_kernels
from engine.gpu.moe import columns_kernels as moe_columns_kernels
from engine.gpu.decode import GDN_HEAD_DIM, CudaQwen35
from engine.gpu.gdn import GdnBlock, delta_step, gdn_prep
from engine.gpu.gemv import GemvPlan
from engine.gpu.sampling import ARGMAX_BLOCKS, TOPK_MAX, TOPK_TILE, Sampler, argmax_step

NULL = np.uint64(0)


def row_kernel_names(mats, rows: int) -> list[str]:
    """The GEMV instantiations for `rows` token rows over matrices `mats` (compiled beside the plan's own)."""
    fmts = {m.fmt for m in mats}
    rs = sorted(K.FMT_IDS[f] for f in fmts if f in K.FMT_IDS)
    return KN.gemv_names(rs, (rows,), pair=False, bf16="bf16" in fmts, conv=[], xs=[])


def copy_rows(src, dst, n: int):
    return K.prepared("spec_copy_f32", (-(-n // 256),), (src, dst, n), block=256)


def copy_ints(src, dst, n: int):
    return K.prepared("spec_copy_i32", (1,), (src, dst, n), block=32)


class VerifyGdn(GdnBlock):
    """The GDN layers of the verified columns: each first folds the last verification's accepted columns (ctl[0]) into
    its state and conv history, then reads that state and records, a row a column, what the next fold needs (conv
    inputs, normed key, value, g, beta) into the half ctl[3] of its records, the state left as the fold made it."""

    FUSES_PREP = False

    def __init__(self, c):
        super().__init__(c)
        self.records = {}

    def record(self, L) -> dict:
        """What the fold of GDN layer L needs, a row a column, in two halves (a verification writes half ctl[3]; the
        fold reads the other): conv inputs, normed key, value, g, beta."""
        if id(L) not in self.records:
            c = self.c
            cp, T, f32 = c.cp, c.M, c.cp.float32
            C = (2 * c.Hk + c.Hv) * GDN_HEAD_DIM
            self.records[id(L)] = {"conv": cp.zeros((2, T, C), dtype=f32),
                                   "k": cp.zeros((2, T, c.Hk, GDN_HEAD_DIM), dtype=f32),
                                   "v": cp.zeros((2, T, c.Hv, GDN_HEAD_DIM), dtype=f32),
                                   "g": cp.zeros((2, T, c.Hv), dtype=f32), "beta": cp.zeros((2, T, c.Hv), dtype=f32)}
        return self.records[id(L)]

    def core_ops(self, L, lda, ldb):
        c = self.c
        Hk, Hv, T = c.Hk, c.Hv, c.M
        r = self.record(L)
        prep = gdn_prep(qk=c.buf_a, ld_qk=lda, v=c.buf_b, ld_v=ldb, ab=c.ab, ld_ab=c.ab.shape[1],
                        conv_state=L["conv_state"], conv=L["conv"], a_log=L["a_log"], dt_bias=L["dt_bias"],
                        q_out=c.gdn_q, k_out=r["k"], v_out=r["v"], g=r["g"], beta=r["beta"], k_heads=Hk,
                        v_heads=Hv, q_scale=1.0 / math.sqrt(GDN_HEAD_DIM), rows=T, tokens=T,
                        record=(r["conv"], c.spec_ctl))
        delta = delta_step(q=c.gdn_q, k=r["k"], v=r["v"], g=r["g"], beta=r["beta"], state=L["state"], o=c.att2,
                           k_heads=Hk, v_heads=Hv, rows=T, tokens=T, write_state=False, fold=c.spec_ctl)
        return [prep, delta]


class CudaVerify(CudaQwen35Columns):
    """The K + 1 verified columns over the decode executor's sequence, GDN state read only and recorded."""

    GDN = VerifyGdn
    ATTN = ColumnsAttention  # (two verified columns a tile)

    def __init__(self, decode: CudaQwen35, k: int):
        self.k = k
        K.require(row_kernel_names(decode._matrices(), k + 1))
        super().__init__(decode, k + 1)

    def _alloc_state(self):
        super()._alloc_state()
        cp, T, i32 = self.cp, self.M, self.cp.int32
        self.am_out = cp.zeros(T, dtype=i32)  # the target's pick after each column
        # [columns to fold, MTP rows to catch up, the round's first position, the records' half the next verification
        # writes]; the GDN layers' verification reads it (VerifyGdn)
        self.ctl = self.ctx.spec_ctl = cp.zeros(4, dtype=i32)
        self.out = cp.zeros(1 + T, dtype=i32)  # [m, picks]: what the host reads
        self.ovr = cp.zeros(1 + self.k, dtype=i32)  # host drafts: [set, d_1..d_K]
        # each column's pick commits into rings of its own (am_out, at the column's position), not the sequence's
        self.am_pos, self.am_step, self.am_hist = cp.zeros(T, i32), cp.zeros(T, i32), cp.zeros((T, 1), i32)

    def _sampler(self):
        return Sampler(self.ctx, commit=(self.am_out, self.am_pos, self.am_hist, self.am_step, 1))

    def _tail_ops(self):
        """The head over every column, the greedy pick a column, the accept."""
        T, c = self.M, self.ctx
        head = GemvPlan(self.head, c.xn, self.H, self.logits, self.V, m=T, unroll=2, xpre=(c.xh_n, c.xinv_n, c.xpk_n))
        self._accept = K.prepared("spec_accept", (1,), (self.am_out, self.tokens, T, self.out, self.ctl, self.pos),
                                  block=32)
        self._greedy_tail = [self.sampler.argmax_op(), self._accept]
        return [head.launch] + self._greedy_tail

    def tails(self) -> dict:
        """The verification's ops for each way a column picks its token: "greedy" (the argmax), "sample" (the histogram
        sampler) and, where the vocabulary allows, "topk"; the draws are keyed by each column's own position (the
        coin plain decode takes there), so m counts the drafts equal to the target's own draws."""
        body = self.ops[:-len(self._greedy_tail)]
        at = copy_ints(self.posc, self.am_pos, self.M)  # (the samplers advance their positions)
        out = {"greedy": self.ops, "sample": body + [at] + self.sampler.sample_ops() + [self._accept]}
        if self.sampler.domain() <= 32 * TOPK_TILE:
            topk = self.sampler.topk_ops()  # (its penalties read a row of counts a column: spec_counts keeps them)
            counts = [K.prepared("spec_counts", (1,), (self.sampler.sp_counts, self.V, self.tokens, self.am_out,
                                                       self.out, self.M, fix), block=32) for fix in (0, 1)]
            out["topk"] = body + [at, counts[0]] + topk + [self._accept, counts[1]]
        return out

    def fold_ops(self) -> list:
        """The fold alone (the round's verification folds inside its GDN layers): ctl[0] columns of the last
        verification's records into every GDN layer's state and conv history; the position moves by as many, and
        ctl[0] becomes 0 (nothing left for the next round to fold)."""
        Hk, Hv = self.ctx.Hk, self.ctx.Hv
        C = (2 * Hk + Hv) * GDN_HEAD_DIM
        ops = []
        for L in self.layers:
            if L["kind"] == "full_attention":
                continue
            r = self.gdn.record(L)
            ops += [K.prepared("gdn_fold", (-(-Hv * GDN_HEAD_DIM // K.WARPS),),
                               (r["k"], r["v"], r["g"], r["beta"], L["state"], Hk, Hv, 0, self.M, self.ctl)),
                    K.prepared("gdn_conv_fold", (-(-C // 256),), (r["conv"], L["conv_state"], C, self.M, self.ctl),
                               block=256)]
        return ops + [self.advance_op(settle=True)]

    def advance_op(self, settle: bool = False):
        """spec_advance: the position moves by ctl[0] (settle: ctl[0] becomes 0, the fold alone having run)."""
        return K.prepared("spec_advance", (1,), (self.pos, self.ctl, int(settle)), block=32)


class CudaMtp(CudaQwen35):
    """The MTP head: input stage [rmsnorm(embedding), rmsnorm(hidden)] -> input projection, its full-attention block,
    its final norm; the catch-up over the verified columns as one columns pass (`CudaMtpColumns`), each draft a
    one-row step whose head is the proposal head (a shortlist of the target's head rows, its argmax mapped to the
    row's token id) where the weights carry one, else the target's head and argmax. Shares the target's embedding
    and head; its KV cache is its own, at the target's positions."""

    def __init__(self, verify: CudaVerify, weights: dict):
        d = verify.decode
        self.verify, self.T, self.k = verify, verify.M, verify.k
        self._draft = 2  # (the draft whose row `_plan` builds: 2..K)
        self.fc = weights["mtp/input_projection"]
        self.e_norm, self.h_norm = weights["mtp/embedding_norm"], weights["mtp/hidden_norm"]
        self.phead, self.pids = weights.get("proposal/head"), weights.get("proposal/token_ids")
        if (self.phead is None) != (self.pids is None):
            raise ValueError("a proposal head needs both proposal/head and proposal/token_ids")
        w = {"text/" + n[4:]: v for n, v in weights.items() if n.startswith("mtp/layers/0/")}
        w.update({"text/token_embedding": d.embed, "text/output_head": d.head, "text/final_norm": weights["mtp/final_norm"]})
        args = dataclasses.replace(d.args, num_hidden_layers=1, layer_types=("full_attention",))
        K.require(row_kernel_names([self.fc], 1))
        # the drafts' GEMV forms: the one-token table, whose entries cover the MTP layer's own shapes too (q8 in the
        # published 27B; `bench/gemv_columns.py --mtp --one-rows`), under the plan's (the target's shapes)
        cfg = {**gemv_tuning.default_cfg(), **d.plan.gemv_cfg()}
        # (pages past the target's context: rows past the last real one, the prompt passes' padding and the catch-up
        # rows past ctl[1], write their K/V there at most)
        super().__init__(args, w, max_context=d.max_context + mtp_prompt.GEMM_ROWS, lanes=1, kv=d.kv, plan=d.plan,
                         gemv_cfg=cfg)
        self.ctx.stream = d.stream
        # the catch-up: the verified columns' final hidden rows (read in place) and the target's pick after each
        self.cols = mtp_prompt.CudaMtpColumns(self, cols=self.T, hid=verify.ctx.xn)

    def _alloc_state(self):
        super()._alloc_state()
        cp, H, f32 = self.cp, self.H, self.cp.float32
        self.e_raw, self.cat, self.g = cp.zeros((1, H), f32), cp.zeros((1, 2 * H), f32), cp.zeros((1, H), f32)
        self.cat_staged = mtp_prompt.staged_input(cp, 1, H)  # (the input projection reads its row pre-staged)
        if self.phead is not None:
            self.plogits = cp.zeros((1, self.phead.n), f32)
            self.prow = cp.zeros(1, dtype=cp.int32)  # (the proposal head's pick: a row of its shortlist)

    def _embed_ops(self, out=None):
        j = self._draft  # draft j >= 2: the last draft's hidden state and id, a position further
        v = self.verify
        setup = K.prepared("spec_mtp_setup", (1,), (NULL, self.tokens, v.pos, j - 2, self.pos), block=32)
        stage = mtp_prompt.mtp_input(e=self.e_raw, h=self.g, mtp=self, rows=1, out=self.cat, staged=self.cat_staged)
        fc = self.ctx.gemv(self.fc, self.cat, self.ctx.x, xpre=self.cat_staged)
        return [setup] + super()._embed_ops(out=self.e_raw) + [stage, fc]

    def _draft_tail(self, i: int, x, xpre) -> list:
        """Head and argmax of one MTP row: draft i into the verified ids and the next MTP step's input."""
        s = self.sampler
        if self.phead is None:
            head = GemvPlan(self.head, x, self.H, self.logits, self.V, m=1, unroll=2, xpre=xpre)
            return [head.launch, s.argmax_op(), copy_ints(self.tokens, self.verify.tokens[i:], 1)]
        R = self.phead.n
        head = GemvPlan(self.phead, x, self.H, self.plogits, R, m=1, unroll=2, xpre=xpre)
        _, pos, history, step, hist_len = s.commit
        pick = argmax_step(logits=self.plogits, ld=R, vocab=R, best_v=s.am_v, best_i=s.am_i, tickets=s.am_ticket,
                           tokens=self.prow, pos=pos, history=history, step=step, hist_len=hist_len, rows=1,
                           blocks=ARGMAX_BLOCKS)
        return [head.launch, pick, K.prepared("spec_map_id", (1,), (self.prow, self.pids, self.tokens,
                                                                    self.verify.tokens[i:]), block=32)]

    def _tail_ops(self):
        c = self.ctx
        return [copy_rows(c.xn, self.g, self.H)] + self._draft_tail(self._draft, c.xn, (c.xh_n, c.xinv_n))

    def catch_up_ops(self) -> list:
        """The MTP over the T verified columns in one pass: column j's final hidden state and the target's pick after
        it, at the round's positions ctl[2] + j (those past ctl[1] compute what a later pass overwrites)."""
        v, c = self.verify, self.cols
        setup = K.prepared("spec_mtp_setup", (1,), (NULL, self.tokens, v.ctl[2:], 0, self.pos), block=32)
        return [setup, copy_ints(v.am_out, c.tokens, self.T)] + c._plan()

    def round_ops(self) -> list:
        """The catch-up, the first draft from its row ctl[1] - 1, drafts 2..K."""
        ops = self.catch_up_ops()
        ops.append(K.prepared("spec_gather_row", (-(-self.H // 256),), (self.cols.ctx.xn, self.H, self.verify.ctl,
                                                                        self.g), block=256))
        ops += self._draft_tail(1, self.g, None)
        for i in range(2, self.k + 1):
            self._draft = i
            ops += self._plan()
        return ops


class Speculator:
    """The round graphs (one for each way the columns pick: greedy, sampled, top-k) and the fold graph of MTP
    speculation with K drafts over a one-lane decode executor."""

    def __init__(self, decode: CudaQwen35, mtp_weights: dict, k: int, prefill=None):
        """prefill: the target's largest tensor-core prefill executor (the MTP's prompt chunks share its scratch)."""
        self.k, self.decode = k, decode
        # (every instantiation its executors take, asked for at once: one module compiled for them)
        mtp_mats = [decode.head, decode.embed] + [w for n, w in mtp_weights.items()
                                                  if hasattr(w, "fmt") and n.startswith("mtp/")]
        moe = "mtp/layers/0/moe/"  # (the MTP layer's MoE block, where it has one: its column form's routed down)
        mtp_moe = (moe_columns_kernels(mtp_weights[moe + "experts/0/down"].fmt, mtp_weights[moe + "shared/down"].fmt)
                   if moe + "shared/down" in mtp_weights else [])
        K.require(row_kernel_names(list(decode._matrices()), k + 1) + row_kernel_names(mtp_mats, 1)
                  + row_kernel_names(mtp_mats, k + 1) + row_kernel_names(mtp_mats, mtp_prompt.COLS)
                  + [f"dequant_rs<{K.FMT_IDS[m.fmt]}>" for m in mtp_mats if m.fmt in K.FMT_IDS]
                  + columns_kernels(decode, k + 1) + mtp_moe)
        self.verify = v = CudaVerify(decode, k)
        self.mtp = CudaMtp(v, mtp_weights)
        override = K.prepared("spec_override", (1,), (v.ovr, v.tokens, k), block=32)
        self.drafted = decode.cp.zeros(k, dtype=decode.cp.int32)  # the MTP head's drafts of the last round
        head = [v.advance_op()] + self.mtp.round_ops() + [copy_ints(v.tokens[1:], self.drafted, k), override]
        self.graphs = {kind: v._capture(head + ops) for kind, ops in v.tails().items()}
        self.graph = self.graphs["greedy"]
        self.fold_graph = v._capture(v.fold_ops())
        self.catch_up_graph = v._capture(self.mtp.catch_up_ops())
        self.prompt = mtp_prompt.MtpPrompt(self.mtp, share=prefill)
        self.cache = None  # the engine cache whose sequence the MTP's pool follows
        self._first = K.prepared("spec_first", (1,), (decode.ctx.xn, v.ctx.xn, decode.H, decode.tokens, v.am_out,
                                                      v.tokens, v.ctl, decode.pos), block=256)
        self.stream = decode.stream
        self._host_drafts = False

    def start(self) -> None:
        """After a plain decode step: the first round catches the MTP up on that step's row."""
        with self.stream:
            self._first()

    def round_graph(self, params=None):
        """The round graph that picks as `params` (engine.device_sampling.pack_params; None: greedy) asks, its
        parameters written to the columns' sampler."""
        from engine import device_sampling as ds  # noqa: PLC0415

        if params is None:
            return self.graph
        settings = ds.unpack_params(params)
        if not settings["temperature"] > 0.0:
            return self.graph
        kind = "topk" if 0 < settings["top_k"] <= TOPK_MAX and "topk" in self.graphs else "sample"
        if (settings["presence"] or settings["frequency"]) and kind != "topk":
            raise ValueError("the verified columns draw with penalties only through the top-k sampler")
        self.verify.sampler.set_sampling(params)
        return self.graphs[kind]

    def penalties(self, params) -> bool:
        """Whether the rounds can draw with the penalties of `params` (the top-k sampler's rounds take them)."""
        from engine import device_sampling as ds  # noqa: PLC0415

        s = ds.unpack_params(params)
        return 0 < s["top_k"] <= TOPK_MAX and "topk" in self.graphs

    def set_counts(self, counts) -> None:
        """The generated-token counts so far ({id: count}) into every verified column's row, before a stream's first
        round with penalties (the rounds keep them after that: spec_counts)."""
        self.verify.sampler.set_counts(counts)

    def round(self, drafts=None, params=None) -> tuple[int, list[int]]:
        """One round (drafts: K host ids in place of the MTP's; params: the draws', None for greedy); returns (m,
        the target's picks)."""
        v = self.verify
        graph = self.round_graph(params)
        if drafts is not None or self._host_drafts:  # (the flag word stays off while the MTP's drafts stand)
            v.ovr.set(np.asarray([0] * (1 + self.k) if drafts is None else [1, *drafts], dtype=np.int32),
                      stream=self.stream)
            self._host_drafts = drafts is not None
        graph.launch(self.stream)
        out = v.out.get(stream=self.stream)
        return int(out[0]), [int(t) for t in out[1:]]

    def commit(self, m: int) -> None:
        """Fold m columns of the last verification (fewer than it accepted: a consumer stopped inside it)."""
        v = self.verify
        v.ctl[:1].set(np.asarray([m], dtype=np.int32), stream=self.stream)
        self.fold_graph.launch(self.stream)
        self.stream.synchronize()

    def finish(self, m: int, position: int) -> None:
        """The end of a stream: fold m columns of the last verification and run the MTP's rows over them, so its pool
        covers the sequence (now `position` long) for the next prompt that extends it."""
        v = self.verify
        v.ctl[:2].set(np.asarray([m, m], dtype=np.int32), stream=self.stream)
        self.fold_graph.launch(self.stream)
        self.catch_up_graph.launch(self.stream)
        self.stream.synchronize()
        self.prompt.base = self.prompt.done = position
        self.prompt.toks = []

    def follows(self, engine) -> bool:
        """Whether the MTP's pool holds a row for every position of the engine's sequence."""
        p = self.prompt
        return engine.cache is self.cache and not p.lost and p.done == engine.position
