"""The columns step: T consecutive tokens of lane 0's sequence through the model in one CUDA graph.

Every projection reads its weights once for the T tokens (the GEMVs take T rows of x); the GDN layers
run the T tokens through the recurrence with the state row in registers; attention gives token t the
positions up to its own (the K/V of all T tokens are written first, so the mask is causal by position).
This serves prefill in chunks of T, and is the shape speculative verification of K+1 drafted tokens
needs. It shares weights, KV pool, GDN state, position and stream with the decode executor.
"""
from __future__ import annotations

import numpy as np

from engine.gpu.gemv import GemvPlan
from engine.gpu.decode import CudaQwen35
from engine.gpu.gdn import delta_bufs, delta_step, gdn_conv_tail, gdn_prep, prep_bufs
from engine.gpu.sampling import advance_positions, column_positions


def last_row_head(head, *, xn, xh, xinv, logits):
    """The head GEMV of the last of T normed rows (xn [T, H], staged as xh, xinv) into logits[0]: the columns step's
    and the prefill's logits."""
    T = xn.shape[0]
    return GemvPlan(head, xn[T - 1:], xn.shape[1], logits[:1], logits.shape[1], m=1, unroll=2,
                    xpre=(xh[T - 1:], xinv[T - 1:])).launch


class CudaQwen35Columns(CudaQwen35):
    """T-token step over the sequence of `decode` (a one-lane CudaQwen35)."""

    def __init__(self, decode: CudaQwen35, cols: int):
        if decode.M != 1:
            raise ValueError("the columns step extends a one-lane decode executor")
        if decode.args.is_moe:
            raise NotImplementedError("the columns step does not run MoE models yet")
        self.decode = decode
        self.stream = decode.stream
        super().__init__(decode.args, {}, max_context=decode.max_context, lanes=cols, gemv_cfg=None,
                         kv=decode.kv, plan=decode.plan)

    def _build_weights(self, w):
        d = self.decode
        self.embed, self.head, self.final_norm, self.layers = d.embed, d.head, d.final_norm, d.layers

    def _alloc_state(self):
        d = self.decode
        self.pos, self.step, self.history, self.page_table = d.pos, d.step, d.history, d.page_table
        self.posc = self.cp.zeros(self.M, dtype=self.cp.int32)
        self.qpos, self.pt_stride = self.posc, 0  # every column reads lane 0's page table

    def _pre_ops(self):
        return [column_positions(pos=self.pos, out=self.posc, tokens=self.M)]

    PREP_SPLIT = 1  # token slices of gdn_prep_cols (grid.y); more than one leaves the conv state to gdn_conv_tail
    DELTA_ROWS = 1  # GDN state rows a warp in the recurrence (gdn_delta_rows for > 1)

    def _gdn_core_ops(self, L, lda, ldb):
        T = self.M
        split = max(1, min(self.PREP_SPLIT, T // 8))
        prep = [gdn_prep(**prep_bufs(self, L, lda, ldb), rows=1, tokens=T, slices=split)]
        if split > 1:
            prep.append(gdn_conv_tail(qk=self.buf_a, ld_qk=lda, v=self.buf_b, ld_v=ldb, conv_state=L["conv_state"],
                                      k_heads=self.Hk, v_heads=self.Hv, tokens=T))
        return prep + [delta_step(**delta_bufs(self, L), rows=1, tokens=T, rows_a_warp=self.DELTA_ROWS)]

    def _tail_ops(self):
        """Logits of the last column only; then the position advances by T."""
        head = last_row_head(self.head, xn=self.xn, xh=self.xh_n, xinv=self.xinv_n, logits=self.logits)
        return [head, advance_positions(pos=self.pos, tokens=self.M)]

    def run_chunk(self, token_ids) -> None:
        """Queue one T-token step on the shared stream (no sync)."""
        self.tokens.set(np.asarray(token_ids, dtype=np.int32), stream=self.stream)
        self.graph.launch(self.stream)
