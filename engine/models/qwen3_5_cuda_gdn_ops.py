"""The Gated DeltaNet layers of the CUDA decode step (`CudaQwen35` takes it as a base): the projections
(q|k, v|z and a|b on two streams; the causal conv + SiLU in their epilogue where that is fused; q|k|v|z as one
GEMV where they share a format), the delta rule, and the gated norm with the o-projection's staging, with the
switches that pick them. The methods use the executor's buffers (`_alloc`: buf_a, buf_b, ab, the gdn_*
buffers, att, att2) and helpers (`_gemv`, `_concurrent`, `_prep_fused`)."""
from __future__ import annotations

import math
import os

import numpy as np

from engine.ops import kernels as K

GDN_HEAD_DIM = 128


class GdnOps:
    # GDN decode: gdn_delta + gated_rmsnorm_stage as one kernel (gdn_delta_gated_stage: gdn_delta's blocks, the
    # last block of a head applies its gated norm, the last head stages the row) with NINFER_GDN_FUSED=1.
    # Off until measured: its first form (a 1024-thread block a head) took 7.7 us a layer on the H200 against
    # 3.1 + 4.2 for the two (27B 127.1 tok/s either way; 35B-A3B 332.1 against 338.2); this one is unmeasured.
    GDN_FUSED = os.environ.get("NINFER_GDN_FUSED", "0") != "0"
    # GDN decode: q|k and v|z (one format: the 35B-A3B's w8) as one GEMV over their shared object, its output one
    # [q|k|v|z] row, instead of two GEMVs on two branches (which the H200 ran one after the other: 11.9 us a
    # layer against 7.1 + 4.6 alone). H200, session 12, in one process: 35B-A3B 430.0 / 430.0 tok/s against
    # 428.1 / 427.4 (NINFER_GDN_MERGE=0 for the two). Mixed formats (the 27B's q4 q|k, q5 v|z) keep two.
    GDN_MERGE = os.environ.get("NINFER_GDN_MERGE", "1") != "0"
    # GDN decode without the gdn_prep launch: the q|k and v projections' epilogue applies the causal conv and
    # SiLU (EPI_CONV), gdn_delta_raw the q/k norms and the gates; NINFER_GDN_PREP_FUSED=0 for the launch.
    GDN_PREP_FUSED = os.environ.get("NINFER_GDN_PREP_FUSED", "1") != "0"
    # GDN decode, one token: the gated norm stages the o-projection's input a 32-value chunk at a time with a scale
    # each (gated_rmsnorm_chunks, a warp a head, no row maximum) and the o-projection multiplies them in
    # (gemv_rs_pre<..., XS>), where its GEMV is one of those. Session 16 (s16a, one process, two passes): 27B 148.6
    # against 147.2 tok/s, 35B-A3B flat (429.5 / 429.3 against 429.7 / 429.3); NINFER_GATED_CHUNK=0 for the one-scale
    # staging (gated_rmsnorm_stage).
    GATED_CHUNK = int(os.environ.get("NINFER_GATED_CHUNK", "1"))
    # NINFER_GDN_DELTA_RW=2 / 4: gdn_delta_raw_rw<RW>, RW state rows a warp (their loads first; the head's q/k norms and
    # gates once a warp, not once a row), the same bits; 1: gdn_delta_raw. Session 17 (s17a, H200, in-process A/B, two
    # passes): 27B 153.8 / 153.8 (4), 153.7 / 153.7 (2) against 153.1 / 153.2 tok/s; 35B-A3B 432.3 / 432.1 (4),
    # 432.5 / 432.3 (2) against 431.3 / 431.3. Default 4.
    GDN_DELTA_RW = int(os.environ.get("NINFER_GDN_DELTA_RW", "4"))
    # NINFER_GDN_GATED_CL (on by default where clusters launch: sm_90, with GDN_DELTA_RW 4 and GATED_CHUNK):
    # gdn_delta_gated_cl (cuda/gdn_cluster.cu), the delta rule and the gated norm's chunk staging in one launch, a
    # cluster of 4 blocks a value head, the head's outputs pushed into its first block's shared memory before one
    # cluster barrier: the bits of gdn_delta_raw_rw<4> + gated_rmsnorm_chunks, one launch fewer a GDN layer. Session 19,
    # one process, two passes: the first form (warp 0 reading the outputs through DSMEM between two barriers), s19b:
    # 35B-A3B 491.2 / 491.4 against 485.9 / 485.9 tok/s, 27B 158.4 / 158.4 against 157.7 / 157.7 (the kernel 4.95 us
    # against 3.05 + 2.41 for the two); this one against that, s19c: 35B-A3B 495.1 / 494.5 against 492.6 / 492.4, 27B
    # 158.9 / 159.1 against 158.5 / 158.5. (GDN_CONV_PF, the conv epilogue's history and taps prefetched into L1 as a
    # row group starts, lost: 484.6 / 157.2; removed.) NINFER_GDN_GATED_CL=0 for the two launches.
    GDN_GATED_CL = os.environ.get("NINFER_GDN_GATED_CL", "1") != "0"
    # NINFER_GDN_STATE_EARLY (gdn_delta_gated_cl): each warp's state rows loaded before the PDL wait, while the kernels
    # ahead of it in the step still run (the step's only writer of a layer's state is that layer's launch). 0: after it.
    GDN_STATE_EARLY = int(os.environ.get("NINFER_GDN_STATE_EARLY", "1"))
    # NINFER_GDN_AB_IN (gdn_delta_gated_cl; on by default): each head's a and b gate projections computed inside the
    # launch from the bf16 weights (loaded before the PDL wait) and the fp32 normed row (gemv_bf16's kw-8 order), so the
    # layer's a|b GEMV, its branch and the join before the delta rule go. Session 20 (fin20, H200, one process, two
    # passes): 27B 162.4 / 162.4 against 160.1 / 160.1 tok/s; 35B-A3B 517.8 / 517.4 against 517.8 / 516.9 (flat).
    # Not bit-identical to the GEMV (within fp32 rounding: GPU tests). 0: the a|b GEMV on the side branch.
    GDN_AB_IN = int(os.environ.get("NINFER_GDN_AB_IN", "1"))

    def _cl_core(self, chunk: bool) -> bool:
        """Whether _raw_core takes gdn_delta_gated_cl (a cluster of 4 blocks a value head)."""
        rw = self.GDN_DELTA_RW if self.GDN_DELTA_RW in K.GDN_DELTA_RW else 1
        return bool(chunk and rw == 4 and self.GDN_GATED_CL and K.cluster_capable())

    def _ab_in(self, L, chunk: bool) -> bool:
        """GDN_AB_IN applies to layer L: gdn_delta_gated_cl computes its a|b projection (bf16, H <= 8,192)."""
        ab = L["ab"]
        return bool(self.GDN_AB_IN and self._cl_core(chunk) and ab.fmt == "bf16" and ab.k == self.H
                    and self.H % 8 == 0 and self.H <= 8192)

    def _gated_chunk_scales(self):
        """The o-projection's chunk scales (fp32, a value a 32-value chunk of the staged row) or None (off)."""
        if not (self.GATED_CHUNK and self.M == 1 and not self.GDN_FUSED):
            return None
        if getattr(self, "xsc_att", None) is None:
            self.xsc_att = self.cp.zeros(self.xh_att.shape[-1] * 2 // 32, dtype=self.cp.float32)
        return self.xsc_att

    def _raw_core(self, L, buf_a, lda, buf_b, ldb, att_stage, chunk: bool = False):
        """The delta rule over the projections' conv outputs (gdn_delta_raw), then the gated norm and staging."""
        Hk, Hv, M = self.Hk, self.Hv, self.M
        rw = self.GDN_DELTA_RW if self.GDN_DELTA_RW in K.GDN_DELTA_RW else 1
        args = (buf_a, lda, buf_b, ldb, self.ab, self.ab.shape[1], L["a_log"], L["dt_bias"],
                float(1.0 / math.sqrt(GDN_HEAD_DIM)), L["state"], self.att2, Hk, Hv, 0)
        if self._cl_core(chunk):  # (a cluster of 4 blocks a value head)
            ab = L["ab"]
            ab_in = ((np.uint64(ab.ptr(ab.base)), self.xn, self.xn.shape[1], self.H) if self._ab_in(L, chunk)
                     else (np.uint64(0), np.uint64(0), 0, 0))
            return [K.prepared("gdn_delta_gated_cl", (Hv * 4, M),
                               args + (buf_b[:, Hv * GDN_HEAD_DIM:], ldb, L["norm"], self.att, self.att.shape[1],
                                       float(self.args.rms_norm_eps)) + att_stage
                               + (self.xsc_att, 1 if self.GDN_STATE_EARLY else 0) + ab_in, block=256)]
        return [K.prepared("gdn_delta_raw" if rw == 1 else f"gdn_delta_raw_rw<{rw}>",
                           (-(-Hv * GDN_HEAD_DIM // (K.WARPS * rw)), M), args),
                self._gated_norm(L, ldb, Hv * GDN_HEAD_DIM, att_stage, buf_b, chunk=chunk)]

    def _gdn_ops(self, L, xn, att_stage, chunk: bool = False) -> tuple[list, list]:
        """A GDN layer's (projection ops, core ops up to the o-projection's staged input) for one decode step;
        xn: the staged normed row (pairs, inverse scales), att_stage: the o-projection's staging arguments; chunk:
        staged a 32-value chunk at a time into xsc_att's scales (GATED_CHUNK)."""
        M, eps = self.M, float(self.args.rms_norm_eps)
        ops = []
        Hk, Hv = self.Hk, self.Hv
        lda, ldb = self.buf_a.shape[1], self.buf_b.shape[1]
        fuse_prep = self._prep_fused() and L["qk"].fmt in K.FMT_IDS and L["vz"].fmt in K.FMT_IDS
        buf_a, buf_b = self.buf_a, self.buf_b
        if fuse_prep:  # the conv + SiLU in the q|k and v projections' epilogue, the rest in the delta rule
            C, qkc = (2 * Hk + Hv) * GDN_HEAD_DIM, 2 * Hk * GDN_HEAD_DIM
            if self.GDN_MERGE and "qkvz" in L and L["qk"].n == qkc:
                qkvz = L["qkvz"]
                buf_a = self._merged_buf()
                buf_b = buf_a[:, qkc:]
                lda = ldb = buf_a.shape[1]
                merged = self._gemv(qkvz, self.xn, buf_a, xpre=xn, epi="conv",
                                    conv=(L["conv"], L["conv_state"], C, 0, C))
                if self._ab_in(L, chunk):  # (the delta rule's launch computes a|b)
                    ops.append(merged)
                else:
                    ops.extend(self._concurrent([merged], [self._gemv(L["ab"], self.xn, self.ab)]))
            else:
                qk = self._gemv(L["qk"], self.xn, self.buf_a, xpre=xn, epi="conv",
                                conv=(L["conv"], L["conv_state"], C, 0, qkc))
                vz = self._gemv(L["vz"], self.xn, self.buf_b, xpre=xn, epi="conv",
                                conv=(L["conv"], L["conv_state"], C, qkc, Hv * GDN_HEAD_DIM))
                pair = self._pair(vz, qk)  # (GEMV_PAIR: one grid for both)
                ab_gemv = [] if self._ab_in(L, chunk) else [self._gemv(L["ab"], self.xn, self.ab)]
                if pair is not None:
                    ops.extend(self._concurrent([pair], ab_gemv) if ab_gemv else [pair])
                else:
                    ops.extend(self._concurrent([vz], [qk] + ab_gemv))
        else:
            qk = self._gemv(L["qk"], self.xn, self.buf_a, xpre=xn)
            vz = self._gemv(L["vz"], self.xn, self.buf_b, xpre=xn)
            ops.extend(self._concurrent([vz], [qk, self._gemv(L["ab"], self.xn, self.ab)]))
        if fuse_prep:
            return ops, self._raw_core(L, buf_a, lda, buf_b, ldb, att_stage, chunk)
        core = self._gdn_core_ops(L, lda, ldb)
        zoff = Hv * GDN_HEAD_DIM
        if self.GDN_FUSED and type(self)._gdn_core_ops is GdnOps._gdn_core_ops:
            # the delta rule, gated norm and staging in one launch (the last block stages)
            tk = self.gdn_tick
            core[1:] = [K.prepared("gdn_delta_gated_stage", (-(-Hv * GDN_HEAD_DIM // K.WARPS), M),
                                   (self.gdn_q, self.gdn_k, self.gdn_v, self.gdn_g, self.gdn_beta, L["state"],
                                    self.att2, self.buf_b[:, zoff:], ldb, L["norm"], self.att,
                                    self.att.shape[1], Hk, Hv, 0, eps) + att_stage
                                   + (tk[:M], tk[M:2 * M], tk[2 * M:]))]
        else:
            core.append(self._gated_norm(L, ldb, zoff, att_stage, chunk=chunk))
        return ops, core

    def _gated_norm(self, L, ldb, zoff, att_stage, buf_b=None, chunk: bool = False):
        """GDN output: gated norm and the o-projection's staging in one launch (one block a token row); z at
        column zoff of buf_b (self.buf_b unless given). (A form with 2 heads a warp staged from registers, the same
        bits, measured flat on the 27B and slower on the 35B-A3B in session 12: 422.3 against 427.7 tok/s; in git
        history at 018601e, gated_rmsnorm_stage2.)"""
        buf_b = self.buf_b if buf_b is None else buf_b
        if chunk:  # (a warp a head, each chunk with its own scale: GATED_CHUNK)
            return K.prepared("gated_rmsnorm_chunks", (-(-self.Hv // 8), self.M),
                              (self.att2, buf_b[:, zoff:], ldb, L["norm"], self.att, self.att.shape[1], self.Hv,
                               float(self.args.rms_norm_eps)) + att_stage + (self.xsc_att,), block=256)
        return K.prepared("gated_rmsnorm_stage", (self.M,),
                          (self.att2, buf_b[:, zoff:], ldb, L["norm"], self.att, self.att.shape[1], self.Hv,
                           float(self.args.rms_norm_eps)) + att_stage, block=1024)

    def _gdn_core_ops(self, L, lda, ldb):
        """Conv + SiLU + norms + gates, then the delta rule: one token per lane row."""
        Hk, Hv, M = self.Hk, self.Hv, self.M
        return [K.prepared("gdn_prep", (-(-(2 * Hk + Hv) // K.WARPS), M),
                           (self.buf_a, lda, self.buf_b, ldb, self.ab, self.ab.shape[1], L["conv_state"], L["conv"],
                            L["a_log"], L["dt_bias"], self.gdn_q, self.gdn_k, self.gdn_v, self.gdn_g, self.gdn_beta,
                            Hk, Hv, float(1.0 / math.sqrt(GDN_HEAD_DIM)))),
                K.prepared("gdn_delta", (-(-Hv * GDN_HEAD_DIM // K.WARPS), M),
                           (self.gdn_q, self.gdn_k, self.gdn_v, self.gdn_g, self.gdn_beta, L["state"], self.att2,
                            Hk, Hv, 0))]
