"""The Gated DeltaNet layers of the CUDA decode step (`GdnBlock`, held by `CudaQwen35`): the projections
(q|k, v|z and a|b on two streams; the causal conv + SiLU in their epilogue where that is fused; q|k|v|z as one
GEMV where they share a format), the delta rule, and the gated norm with the o-projection's staging, in the
plan's forms. The block uses the step's shared buffers (engine.gpu.step: buf_a, buf_b, ab, the gdn_* rows, att,
att2, xsc_att) and its GEMV helpers."""
from __future__ import annotations

import math

import numpy as np

from engine.gpu import launch as K

GDN_HEAD_DIM = 128


def gdn_prep(*, qk, ld_qk: int, v, ld_v: int, ab, ld_ab: int, conv_state, conv, a_log, dt_bias, q_out, k_out, v_out,
             g, beta, k_heads: int, v_heads: int, q_scale: float, rows: int, tokens: int | None = None,
             slices: int = 1, record=None) -> K.Launch:
    """gdn_prep (one token a row of `rows`) or, with `tokens`, gdn_prep_cols (that many consecutive tokens of one
    sequence, in `slices` token slices: grid.y): the causal conv over the conv history conv_state (weights `conv`) and
    SiLU of q|k (qk [., ld_qk]) and v (v [., ld_v]), q and k l2-normed (q times q_scale) into q_out, k_out, v into v_out,
    the gates g and beta from a|b (ab [., ld_ab], a_log, dt_bias). A warp a channel group of 128. `record` (with
    `tokens`, one slice: speculative verification's gdn_prep_verify, a warp a channel group and token): (conv records
    [2, tokens, C], ctl): each token's conv over the history as the fold leaves it (the last verification's ctl[0]
    columns shifted in, and written back), its conv inputs into half ctl[3] of the conv records, and k_out, v_out, g,
    beta [2, tokens, ...] written in that half."""
    args = (qk, ld_qk, v, ld_v, ab, ld_ab, conv_state, conv, a_log, dt_bias, q_out, k_out, v_out, g, beta, k_heads,
            v_heads, float(q_scale))
    grid_x = -(-(2 * k_heads + v_heads) // K.WARPS)
    if tokens is None:
        return K.prepared("gdn_prep", (grid_x, rows), args)
    if record is not None:  # (a warp a channel group and column: 8 // tokens groups a block)
        if not 1 <= tokens <= K.WARPS:
            raise ValueError(f"gdn_prep_verify takes 1 to {K.WARPS} columns, not {tokens}")
        hpb = K.WARPS // tokens
        return K.prepared("gdn_prep_verify", (-(-(2 * k_heads + v_heads) // hpb),), args + (tokens,) + tuple(record))
    return K.prepared("gdn_prep_cols", (grid_x, slices), args + (tokens,))


def gdn_conv_tail(*, qk, ld_qk: int, v, ld_v: int, conv_state, k_heads: int, v_heads: int, tokens: int) -> K.Launch:
    """gdn_conv_tail: the conv history after `tokens` columns (their last 3 q|k and v rows into conv_state), where
    gdn_prep_cols ran in more than one token slice."""
    return K.prepared("gdn_conv_tail", (-(-(2 * k_heads + v_heads) * GDN_HEAD_DIM // 256),),
                      (qk, ld_qk, v, ld_v, conv_state, k_heads, v_heads, tokens), block=256)


def delta_step(*, q, k, v, g, beta, state, o, k_heads: int, v_heads: int, rows: int, tokens: int | None = None,
               rows_a_warp: int = 1, write_state: bool = True, fold=None) -> K.Launch:
    """The delta rule from gdn_prep's outputs (q, k [., k_heads, 128], v [., v_heads, 128], g, beta [., v_heads]):
    state [., v_heads, 128, 128] updated and o [., v_heads * 128] written. gdn_delta: one token a row of `rows`; with
    `tokens`, that many consecutive tokens of one sequence, gdn_delta_cols (a state row a warp) or
    gdn_delta_rows<rows_a_warp>; write_state False (with tokens and `fold`, the round's ctl: speculative
    verification's gdn_delta_verify): the last verification's ctl[0] columns (half 1 - ctl[3] of k, v, g, beta [2,
    tokens, ...]) folded into the state first, then this one's (half ctl[3]) read from it, not written."""
    args = (q, k, v, g, beta, state, o, k_heads, v_heads, 0)
    if tokens is None:
        return K.prepared("gdn_delta", (-(-v_heads * GDN_HEAD_DIM // K.WARPS), rows), args)
    name = "gdn_delta_cols" if rows_a_warp == 1 else f"gdn_delta_rows<{rows_a_warp}>"
    if not write_state:
        if fold is None or rows_a_warp != 1:
            raise ValueError("the verification's delta rule takes the round's ctl (fold) and a state row a warp")
        return K.prepared("gdn_delta_verify", (-(-v_heads * GDN_HEAD_DIM // K.WARPS),), args + (tokens, fold))
    return K.prepared(name, (-(-v_heads * GDN_HEAD_DIM // (K.WARPS * rows_a_warp)),), args + (tokens,))


def gated_norm_stage(*, o, z, ld_z: int, weight, out, ld_out: int, v_heads: int, eps: float, k: int, kpad: int, xh,
                     xinv, rows: int, xpk=None) -> K.Launch:
    """gated_rmsnorm_stage: out = rmsnorm(o) w silu(z) a head (o [rows, v_heads * 128], z [rows, ld_z]), its first k
    values staged as the o-projection's int16 pairs with one scale a row (xh [rows, kpad / 2], xinv [rows]): a block
    of 1,024 a row; xpk: the pairs' packed twin, or None."""
    return K.prepared("gated_rmsnorm_stage", (rows,),
                      (o, z, ld_z, weight, out, ld_out, v_heads, float(eps), k, kpad, xh, xinv, K.or_null(xpk)),
                      block=1024)


def chunk_prep(*, q, k, v, g, beta, w, u, m, gamma, k_heads: int, v_heads: int, tokens: int) -> K.Launch:
    """gdn_chunk_prep, the chunked delta rule's first pass: for every 64-token piece of `tokens` at once, W and U'
    (w, u [pieces, v_heads, 64, 128]), M [pieces, v_heads, 64, 64] and the cumulative decay gamma [pieces, v_heads, 64]
    from gdn_prep's outputs (cuda/gdn_tc.cu)."""
    return K.prepared("gdn_chunk_prep", (-(-tokens // 64), v_heads),
                      (q, k, v, g, beta, w, u, m, gamma, k_heads, v_heads, 0, tokens), smem=K.GDN_PREP_SMEM)


def chunk_scan(form: str, *, q, k, w, u, m, gamma, state, o, k_heads: int, v_heads: int, tokens: int) -> K.Launch:
    """The chunked delta rule's in-order pass `form` (gdn_chunk_scan_tc<RB, 1>: RB state rows a block) over
    chunk_prep's pieces: state [v_heads, 128, 128] carried through them, o [tokens, v_heads * 128] written."""
    rb = int(form.split("<")[1].split(",")[0])
    return K.prepared(form, (v_heads, 128 // rb), (q, k, w, u, m, gamma, state, o, k_heads, v_heads, 0, tokens),
                      smem=K.gdn_scan_smem(rb))


def gdn_rows(cp, rows: int, k_heads: int, v_heads: int) -> tuple:
    """gdn_prep's outputs for `rows` token rows (fp32): q, k [rows, k_heads, 128], v [rows, v_heads, 128], g, beta
    [rows, v_heads]."""
    f32 = cp.float32
    return (cp.zeros((rows, k_heads, GDN_HEAD_DIM), dtype=f32), cp.zeros((rows, k_heads, GDN_HEAD_DIM), dtype=f32),
            cp.zeros((rows, v_heads, GDN_HEAD_DIM), dtype=f32), cp.zeros((rows, v_heads), dtype=f32),
            cp.zeros((rows, v_heads), dtype=f32))


def prep_bufs(ex, L, lda: int, ldb: int) -> dict:
    """gdn_prep's buffers in `ex` (a step's StepContext, or the prefill executor: buf_a, buf_b, ab, the gdn_* rows):
    layer L's projections in (row strides lda, ldb), its conv history, the delta rule's inputs out."""
    return dict(qk=ex.buf_a, ld_qk=lda, v=ex.buf_b, ld_v=ldb, ab=ex.ab, ld_ab=ex.ab.shape[1], conv_state=L["conv_state"],
                conv=L["conv"], a_log=L["a_log"], dt_bias=L["dt_bias"], q_out=ex.gdn_q, k_out=ex.gdn_k, v_out=ex.gdn_v,
                g=ex.gdn_g, beta=ex.gdn_beta, k_heads=ex.Hk, v_heads=ex.Hv, q_scale=1.0 / math.sqrt(GDN_HEAD_DIM))


def delta_bufs(ex, L) -> dict:
    """The delta rule's buffers after gdn_prep in `ex` (as prep_bufs takes it): its inputs, layer L's state, the
    output rows (att2)."""
    return dict(q=ex.gdn_q, k=ex.gdn_k, v=ex.gdn_v, g=ex.gdn_g, beta=ex.gdn_beta, state=L["state"], o=ex.att2,
                k_heads=ex.Hk, v_heads=ex.Hv)


def delta_rule(*, qk, ld_qk: int, v, ld_v: int, ab, ld_ab: int, a_log, dt_bias, q_scale: float, state, o,
               k_heads: int, v_heads: int, rows: int) -> K.Launch:
    """gdn_delta_raw_rw<4>: the delta rule from the projections' conv outputs (qk [rows, ld_qk]: q heads, then k
    heads; v [rows, ld_v]: v channels first; ab [rows, ld_ab]: a, then b), 4 state rows a warp: each warp normalizes its
    q and k head, computes the head's gates, updates state [rows, v_heads, 128, 128] and writes o [rows, v_heads * 128].
    """
    args = (qk, ld_qk, v, ld_v, ab, ld_ab, a_log, dt_bias, float(q_scale), state, o, k_heads, v_heads, 0)
    return K.prepared("gdn_delta_raw_rw<4>", (-(-v_heads * GDN_HEAD_DIM // (K.WARPS * 4)), rows), args)


def gated_norm_chunks(*, o, z, ld_z: int, weight, out, ld_out: int, v_heads: int, eps: float, k: int, kpad: int, xh,
                      xinv, xsc, rows: int) -> K.Launch:
    """gated_rmsnorm_chunks: out = rmsnorm(o) w silu(z) a head (a warp a head), its first k values staged as the
    o-projection's int16 pairs a 32-value chunk at a time with its own power-of-two scale (xh [rows, kpad / 2], xsc
    [rows, kpad / 32] their inverses, xinv 1)."""
    return K.prepared("gated_rmsnorm_chunks", (-(-v_heads // 8), rows),
                      (o, z, ld_z, weight, out, ld_out, v_heads, float(eps), k, kpad, xh, xinv, xsc), block=256)


def delta_gated_cl(*, qk, ld_qk: int, v, ld_v: int, ab, ld_ab: int, a_log, dt_bias, q_scale: float, state, o,
                   k_heads: int, v_heads: int, z, ld_z: int, weight, out, ld_out: int, eps: float, k: int, kpad: int,
                   xh, xinv, xsc, rows: int, state_early: bool = True, ab_weights=None, x=None, ld_x: int = 0,
                   hidden: int = 0) -> K.Launch:
    """gdn_delta_gated_cl (sm_90): delta_rule and gated_norm_chunks in one launch, a cluster of 4 blocks a value head
    (the same bits). state_early: each warp's state rows loaded before the PDL wait. ab_weights (the bf16 [a; b]
    weights' device pointer, with x [rows, ld_x] the fp32 normed row of `hidden` values): the head's a and b
    projections computed in the launch instead of read from ab."""
    delta = (qk, ld_qk, v, ld_v, ab, ld_ab, a_log, dt_bias, float(q_scale), state, o, k_heads, v_heads, 0)
    ab_in = ((np.uint64(ab_weights), x, ld_x, hidden) if ab_weights is not None
             else (np.uint64(0), np.uint64(0), 0, 0))
    return K.prepared("gdn_delta_gated_cl", (v_heads * 4, rows),
                      delta + (z, ld_z, weight, out, ld_out, float(eps), k, kpad, xh, xinv, xsc, int(state_early))
                      + ab_in, block=256)


class GdnBlock:
    """A Gated DeltaNet layer of the step over the shared buffers of `c` (a StepContext). The core after the
    projections (`core_ops`: conv, norms and gates, then the delta rule) is one token a row here; the columns and
    verification steps take a block of their own for it (engine.gpu.columns, engine.gpu.verify)."""

    # A GDN layer of the decode step: q|k, v|z (and a|b) projected from the normed row, one GEMV where q|k and v|z
    # share a row-split format (the 35B-A3B's w8: one [q|k|v|z] row), else two (a gemv_rs_pre_pair grid where the plan
    # pairs them); the causal conv and SiLU in the projections' epilogue (EPI_CONV); then the plan's delta rule: on
    # sm_90 gdn_delta_gated_cl (cuda/gdn_cluster.cu: the delta rule and the gated norm's chunk staging in one launch,
    # a cluster of 4 blocks a value head, each warp's state rows loaded before the PDL wait, the a|b projection
    # computed inside from its bf16 weights where the plan says gdn_ab_in), elsewhere gdn_delta_raw_rw<4> (4 state
    # rows a warp) and gated_rmsnorm_chunks (the o-projection's input a 32-value chunk at a time, a scale each).

    FUSES_PREP = True  # core_ops is this block's: the conv may go into the projections' epilogue (one token row)

    def __init__(self, c):
        self.c = c

    def _prep_fused(self) -> bool:
        """The GDN projections' epilogue applies the causal conv and SiLU, the delta rule the q/k norms and gates (no
        gdn_prep launch): one token row, this block's own core."""
        return self.c.M == 1 and self.FUSES_PREP

    def _cl_core(self, chunk: bool) -> bool:
        """Whether _raw_core takes gdn_delta_gated_cl (a cluster of 4 blocks a value head)."""
        return bool(chunk and self.c.plan.gdn == "gdn_delta_gated_cl")

    def _ab_in(self, L, chunk: bool) -> bool:
        """gdn_delta_gated_cl computes layer L's a|b projection (bf16, H <= 8,192; the plan's gdn_ab_in)."""
        ab, H = L["ab"], self.c.H
        return bool(self.c.plan.gdn_ab_in and self._cl_core(chunk) and ab.fmt == "bf16" and ab.k == H
                    and H % 8 == 0 and H <= 8192)

    def _raw_core(self, L, buf_a, lda, buf_b, ldb, att_stage, chunk: bool = False):
        """The delta rule over the projections' conv outputs, then the gated norm and staging (one cluster launch on
        sm_90 where the o input is staged by chunks)."""
        c = self.c
        Hv = c.Hv
        delta = dict(qk=buf_a, ld_qk=lda, v=buf_b, ld_v=ldb, ab=c.ab, ld_ab=c.ab.shape[1], a_log=L["a_log"],
                     dt_bias=L["dt_bias"], q_scale=1.0 / math.sqrt(GDN_HEAD_DIM), state=L["state"], o=c.att2,
                     k_heads=c.Hk, v_heads=Hv, rows=c.M)
        if self._cl_core(chunk):  # (a cluster of 4 blocks a value head)
            ab, ab_in = L["ab"], self._ab_in(L, chunk)
            k, kpad, xh, xinv = att_stage
            return [delta_gated_cl(**delta, z=buf_b[:, Hv * GDN_HEAD_DIM:], ld_z=ldb, weight=L["norm"], out=c.att,
                                   ld_out=c.att.shape[1], eps=c.args.rms_norm_eps, k=k, kpad=kpad, xh=xh,
                                   xinv=xinv, xsc=c.xsc_att, ab_weights=ab.ptr(ab.base) if ab_in else None,
                                   x=c.xn if ab_in else None, ld_x=c.xn.shape[1] if ab_in else 0,
                                   hidden=c.H if ab_in else 0)]
        return [delta_rule(**delta), self._gated_norm(L, ldb, Hv * GDN_HEAD_DIM, att_stage, buf_b, chunk=chunk)]

    def ops(self, L, xn, att_stage, chunk: bool = False) -> tuple[list, list]:
        """A GDN layer's (projection ops, core ops up to the o-projection's staged input) for one step; xn: the
        staged normed row (pairs, inverse scales), att_stage: the o-projection's staging arguments; chunk: staged a
        32-value chunk at a time into the context's chunk scales (xsc_att)."""
        c = self.c
        ops = []
        Hk, Hv = c.Hk, c.Hv
        lda, ldb = c.buf_a.shape[1], c.buf_b.shape[1]
        fuse_prep = self._prep_fused() and L["qk"].fmt in K.FMT_IDS and L["vz"].fmt in K.FMT_IDS
        buf_a, buf_b = c.buf_a, c.buf_b
        if fuse_prep:  # the conv + SiLU in the q|k and v projections' epilogue, the rest in the delta rule
            C, qkc = (2 * Hk + Hv) * GDN_HEAD_DIM, 2 * Hk * GDN_HEAD_DIM
            if "qkvz" in L and L["qk"].n == qkc:
                qkvz = L["qkvz"]
                buf_a = c.merged_buf()
                buf_b = buf_a[:, qkc:]
                lda = ldb = buf_a.shape[1]
                merged = c.gemv(qkvz, c.xn, buf_a, xpre=xn, epi="conv", conv=(L["conv"], L["conv_state"], C, 0, C))
                if self._ab_in(L, chunk):  # (the delta rule's launch computes a|b)
                    ops.append(merged)
                else:
                    ops.extend(c.concurrent([merged], [c.gemv(L["ab"], c.xn, c.ab)]))
            else:
                qk = c.gemv(L["qk"], c.xn, c.buf_a, xpre=xn, epi="conv", conv=(L["conv"], L["conv_state"], C, 0, qkc))
                vz = c.gemv(L["vz"], c.xn, c.buf_b, xpre=xn, epi="conv",
                            conv=(L["conv"], L["conv_state"], C, qkc, Hv * GDN_HEAD_DIM))
                pair = c.pair(vz, qk)  # (one grid for both)
                ab_gemv = [] if self._ab_in(L, chunk) else [c.gemv(L["ab"], c.xn, c.ab)]
                if pair is not None:
                    ops.extend(c.concurrent([pair], ab_gemv) if ab_gemv else [pair])
                else:
                    ops.extend(c.concurrent([vz], [qk] + ab_gemv))
        else:
            qk = c.gemv(L["qk"], c.xn, c.buf_a, xpre=xn)
            vz = c.gemv(L["vz"], c.xn, c.buf_b, xpre=xn)
            ops.extend(c.concurrent([vz], [qk, c.gemv(L["ab"], c.xn, c.ab)]))
        if fuse_prep:
            return ops, self._raw_core(L, buf_a, lda, buf_b, ldb, att_stage, chunk)
        core = self.core_ops(L, lda, ldb)
        core.append(self._gated_norm(L, ldb, Hv * GDN_HEAD_DIM, att_stage, chunk=chunk))
        return ops, core

    def _gated_norm(self, L, ldb, zoff, att_stage, buf_b=None, chunk: bool = False):
        """GDN output: gated norm and the o-projection's staging in one launch (one block a token row); z at
        column zoff of buf_b (the context's buf_b unless given)."""
        c = self.c
        buf_b = c.buf_b if buf_b is None else buf_b
        k, kpad, xh, xinv = att_stage
        if chunk:  # (a warp a head, each chunk with its own scale)
            return gated_norm_chunks(o=c.att2, z=buf_b[:, zoff:], ld_z=ldb, weight=L["norm"], out=c.att,
                                     ld_out=c.att.shape[1], v_heads=c.Hv, eps=c.args.rms_norm_eps, k=k,
                                     kpad=kpad, xh=xh, xinv=xinv, xsc=c.xsc_att, rows=c.M)
        return gated_norm_stage(o=c.att2, z=buf_b[:, zoff:], ld_z=ldb, weight=L["norm"], out=c.att,
                                ld_out=c.att.shape[1], v_heads=c.Hv, eps=c.args.rms_norm_eps, k=k, kpad=kpad,
                                xh=xh, xinv=xinv, rows=c.M, xpk=c.twin(xh))

    def core_ops(self, L, lda, ldb):
        """Conv + SiLU + norms + gates, then the delta rule: one token per lane row."""
        c = self.c
        return [gdn_prep(**prep_bufs(c, L, lda, ldb), rows=c.M), delta_step(**delta_bufs(c, L), rows=c.M)]
