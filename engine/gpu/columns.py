"""The columns step: T consecutive tokens of lane 0's sequence through the model in one CUDA graph.

Every projection reads its weights once for the T tokens (the GEMVs take T rows of x); the GDN layers
run the T tokens through the recurrence with the state row in registers; attention gives token t the
positions up to its own (the K/V of all T tokens are written first, so the mask is causal by position).
This serves prefill in chunks of T, and is the shape speculative verification of K+1 drafted tokens
needs. It shares weights, KV pool, GDN state, position and stream with the decode executor.
"""
from __future__ import annotations

import numpy as np

from engine.gpu import kernel_names as KN
from engine.gpu import launch as K
from engine.gpu.attention import AttentionBlock
from engine.gpu.gemv import GemvPlan
from engine.gpu.decode import CudaQwen35
from engine.gpu.moe import columns_kernels as moe_columns_kernels
from engine.gpu.gdn import GdnBlock, delta_bufs, delta_step, gdn_conv_tail, gdn_prep, prep_bufs
from engine.gpu.sampling import advance_positions, column_positions


def last_row_head(head, *, xn, xh, xinv, logits):
    """The head GEMV of the last of T normed rows (xn [T, H], staged as xh, xinv) into logits[0]: the columns step's
    and the prefill's logits."""
    T = xn.shape[0]
    return GemvPlan(head, xn[T - 1:], xn.shape[1], logits[:1], logits.shape[1], m=1, unroll=2,
                    xpre=(xh[T - 1:], xinv[T - 1:])).launch


class ColumnsGdn(GdnBlock):
    """The GDN layers over T consecutive tokens of one sequence: gdn_prep_cols, then the recurrence through the T
    tokens with the state row in registers."""

    FUSES_PREP = False
    PREP_SPLIT = 1  # token slices of gdn_prep_cols (grid.y); more than one leaves the conv state to gdn_conv_tail
    DELTA_ROWS = 1  # GDN state rows a warp in the recurrence (gdn_delta_rows for > 1)

    def core_ops(self, L, lda, ldb):
        c = self.c
        T = c.M
        split = max(1, min(self.PREP_SPLIT, T // 8))
        prep = [gdn_prep(**prep_bufs(c, L, lda, ldb), rows=1, tokens=T, slices=split)]
        if split > 1:
            prep.append(gdn_conv_tail(qk=c.buf_a, ld_qk=lda, v=c.buf_b, ld_v=ldb, conv_state=L["conv_state"],
                                      k_heads=c.Hk, v_heads=c.Hv, tokens=T))
        return prep + [delta_step(**delta_bufs(c, L), rows=1, tokens=T, rows_a_warp=self.DELTA_ROWS)]


class ColumnsAttention(AttentionBlock):
    """The decode attention over T consecutive columns of one sequence (the verified columns, the MTP's catch-up):
    attn_decode_mma with two columns' query groups in a tile (its C), so that each key and value is read once for
    both, where a group fits twice in the m16 tile and T is even; else the decode's, a column a block."""

    @staticmethod
    def columns_form(attn: str, T: int) -> tuple[str, int]:
        """(kernel name, columns a block) for the plan's attention `attn` over T columns."""
        two = attn.startswith("attn_decode_mma<") and 2 * KN.attn_group(attn) <= 16 and T % 2 == 0
        return KN.attn_columns_name(attn, 2 if two else 1), 2 if two else 1

    def form(self) -> tuple[str, int]:
        return self.columns_form(self.c.plan.attn, self.c.M)


def columns_kernels(decode: CudaQwen35, cols: int, two: bool = True) -> list[str]:
    """The kernels a columns step of `cols` over `decode` takes beyond its plan's: the attention's two-column form
    (two: where it takes it) and the MoE block's column form of the routed down."""
    names = [ColumnsAttention.columns_form(decode.plan.attn, cols)[0]] if two else []
    L = next((L for L in decode.layers if "experts_down" in L), None)
    return names + (moe_columns_kernels(L["experts_down"].fmt, L["shared_down"].fmt) if L is not None else [])


class CudaQwen35Columns(CudaQwen35):
    """T-token step over the sequence of `decode` (a one-lane CudaQwen35)."""

    GDN = ColumnsGdn

    def __init__(self, decode: CudaQwen35, cols: int):
        if decode.M != 1:
            raise ValueError("the columns step extends a one-lane decode executor")
        self.decode = decode
        K.require(columns_kernels(decode, cols, two=self.ATTN is ColumnsAttention))
        super().__init__(decode.args, {}, max_context=decode.max_context, lanes=cols, gemv_cfg=None,
                         kv=decode.kv, plan=decode.plan)

    def _build_weights(self, w):
        d = self.decode
        self.embed, self.head, self.final_norm, self.layers = d.embed, d.head, d.final_norm, d.layers

    def _alloc_state(self):
        """The decode executor's sequence (positions, history, page table, stream); each column's position its own."""
        c, d = self.ctx, self.decode.ctx
        c.pos, c.step, c.hist_len, c.history, c.page_table = d.pos, d.step, d.hist_len, d.history, d.page_table
        c.stream = d.stream
        self.posc = self.cp.zeros(self.M, dtype=self.cp.int32)
        c.qpos, c.pt_stride = self.posc, 0  # every column reads lane 0's page table

    def _sampler(self):
        return None

    def _pre_ops(self):
        return [column_positions(pos=self.pos, out=self.posc, tokens=self.M)]

    def _tail_ops(self):
        """Logits of the last column only; then the position advances by T."""
        c = self.ctx
        head = last_row_head(self.head, xn=c.xn, xh=c.xh_n, xinv=c.xinv_n, logits=self.logits)
        return [head, advance_positions(pos=self.pos, tokens=self.M)]

    def run_chunk(self, token_ids) -> None:
        """Queue one T-token step on the shared stream (no sync)."""
        self.tokens.set(np.asarray(token_ids, dtype=np.int32), stream=self.stream)
        self.graph.launch(self.stream)
