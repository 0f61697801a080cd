"""The attention layers of the CUDA decode step (`AttentionBlock`, held by `CudaQwen35`): the projections, the q/k
norm with RoPE and the paged KV write, the plan's decode attention kernel over the paged cache into split-K partials,
the combine with the sigmoid gate. The block holds its partials and uses the step's shared buffers (engine.gpu.step:
buf_a, buf_b, qbuf, att, the positions and page table) and the layers' caches."""
from __future__ import annotations

import math

import numpy as np

from engine.gpu import launch as K

KV_PAGE = 64
ATTN_HEAD_DIM = 256


def _ptr(a) -> np.uint64:
    """Device pointer of an optional array (0 for None), as a kernel argument."""
    return np.uint64(0 if a is None else a.data.ptr)


def qk_norm_rope_kv(*, q, ld_q: int, k, ld_k: int, v, ld_v: int, q_norm, k_norm, pos, page_table, pt_stride: int,
                    k_cache, v_cache, q_out, q_heads: int, kv_heads: int, rotary_dim: int, log2_theta: float, eps: float,
                    rows: int, k_scales=None, v_scales=None) -> K.Launch:
    """qk_norm_rope_kv: each of `rows` token rows' q heads (q [rows, ld_q]) and k heads rmsnormed (q_norm, k_norm
    [256]) and rotated (the first rotary_dim dims, theta = 2 ** log2_theta) at position pos[r]; q into q_out
    [rows, q_heads * 256], k and v (v [rows, ld_v]) into the paged caches at that position (pages page_table, row r's
    at r * pt_stride; int8: with k_scales, v_scales). A warp a head."""
    return K.prepared("qk_norm_rope_kv", (-(-(q_heads + kv_heads) // K.WARPS), rows),
                      (q, ld_q, k, ld_k, v, ld_v, q_norm, k_norm, pos, page_table, pt_stride, k_cache, v_cache, q_out,
                       q_heads, kv_heads, rotary_dim, float(log2_theta), float(eps), _ptr(k_scales), _ptr(v_scales)))


def decode_attention(name: str, *, threads: int, smem: int, q, k_cache, v_cache, pos, page_table, pt_stride: int,
                     kv_heads: int, chunk: int, scale: float, ml, acc, nsplit: int, rows: int, k_scales=None,
                     v_scales=None, cols: int = 1) -> K.Launch:
    """Split-K decode attention `name` (the plan's attn: attn_decode_mma or attn_decode_split) of `rows` token rows:
    q [rows, Hq * 256] over the paged caches (k_cache, v_cache [pages, 64, kv_heads, 256]; int8: k_scales, v_scales
    [pages, 64, kv_heads, 4] fp16), the positions `pos` [rows] and pages page_table (row r's at r * pt_stride), each
    split of `chunk` tokens into the partials ml [rows, Hq, nsplit, 2] (max, sum) and acc [rows, Hq, nsplit, 256].
    Grid (kv_heads x the query group's blocks, nsplit, rows), or with cols > 1 (cols consecutive rows of one sequence
    a block: attn_decode_mma's C, kernel_names.attn_columns_name; rows a multiple of it) (kv_heads x rows / cols,
    nsplit, 1): the tiles beside the KV heads, so that every tile's first splits run in the first wave."""
    gs = int(name[:-1].split(",")[2]) if name.startswith("attn_decode_split<") and name.count(",") == 2 else 1
    args = (q, k_cache, v_cache, pos, page_table, pt_stride, kv_heads, chunk, float(scale), ml, acc, nsplit,
            _ptr(k_scales), _ptr(v_scales))
    if rows % cols:
        raise ValueError(f"{rows} rows do not split into tiles of {cols} columns")
    grid = (kv_heads * (rows // cols), nsplit, 1) if cols > 1 else (kv_heads * gs, nsplit, rows)
    return K.prepared(name, grid, args, block=threads, smem=smem)


def combine_stage(*, ml, acc, nsplit: int, gate, ld_gate: int, out, ld_out: int, heads: int, k: int, kpad: int, xh,
                  xinv, amax, tickets, rows: int, xpk=None) -> K.Launch:
    """attn_combine_stage: the splits' partials combined, times sigmoid(gate) (its first heads * 256 columns), into out
    [rows, ld_out]; the row's last head stages its first k values as the o-projection's int16 pairs with one scale
    (xh [rows, kpad / 2], xinv [rows]) from the row maximum in amax [rows] (tickets [rows]; both left at zero); xpk:
    the pairs' packed twin, or None."""
    return K.prepared("attn_combine_stage", (heads, rows),
                      (ml, acc, nsplit, gate, ld_gate, out, ld_out, heads, k, kpad, xh, xinv, amax, tickets,
                       K.or_null(xpk)))


def combine_chunks(*, ml, acc, nsplit: int, gate, ld_gate: int, out, ld_out: int, heads: int, k: int, kpad: int, xh,
                   xinv, xsc, pos, round_to: int, rows: int) -> K.Launch:
    """attn_combine_chunks_b: combine_stage's combine over the splits that hold tokens (split s: the tokens of
    ceil(L / nsplit) rounded up to `round_to`, L = pos + 1), each 32-value chunk of the output staged with its own
    power-of-two scale (xsc [rows, kpad / 32] their inverses, xinv 1)."""
    return K.prepared("attn_combine_chunks_b", (heads, rows),
                      (ml, acc, nsplit, gate, ld_gate, out, ld_out, heads, k, kpad, xh, xinv, xsc, pos, round_to),
                      block=256)


class AttentionBlock:
    """A full-attention layer of the step over the shared buffers of `c` (a StepContext): the q|k and gate|v
    projections, q/k norm + RoPE + the paged KV write, the plan's decode attention into split-K partials (held here),
    and the combine with the sigmoid gate that stages the o-projection's input."""

    # The decode attention is the plan's (engine.gpu.plan.attention_form): attn_decode_mma, a KV head's query group as
    # one m16 tile, 16 tokens a warp a round through two MMA chains, the next rounds' K/V in flight through cp.async,
    # in the first form that fits the device's shared memory (int8 KV on sm_90: K's and V's codes straight into the
    # MMAs); the split kernel (CUDA cores, a warp a token) for query groups it is not compiled for.

    def __init__(self, c):
        """Split-K attention partials (per token row, query head and split): as many splits as fill the SMs
        once with attn_decode_mma's resident blocks (one an SM), two waves' worth of the split kernels."""
        cp, M, f32 = c.cp, c.M, c.cp.float32
        self.c = c
        self.attn_ml = None
        self._set_nsplit()
        cap = self.nsplit
        self.attn_ml = cp.zeros((M, c.Hq, cap, 2), dtype=f32)
        self.attn_acc = cp.zeros((M, c.Hq, cap, ATTN_HEAD_DIM), dtype=f32)
        self.attn_tick = cp.zeros(2 * M, dtype=cp.uint32)  # attn_combine_stage: row max bits, head tickets

    def mma(self):
        """(kernel name, threads, dynamic shared memory) of the plan's attention when it is attn_decode_mma, else
        None (the split kernels)."""
        p = self.c.plan
        if not p.attn.startswith("attn_decode_mma<"):
            return None
        return p.attn, p.attn_threads, p.attn_smem

    def form(self) -> tuple[str, int]:
        """(the attention kernel's name, consecutive rows a block): the plan's, a row a block."""
        return self.c.plan.attn, 1

    def _set_nsplit(self):
        """nsplit (and chunk) for the attention form the plan takes: its resident blocks an SM's worth of splits."""
        c, mma = self.c, self.mma()
        waves = K.blocks_per_sm(*mma) if mma is not None else 2
        self.nsplit = max(1, min(c.max_context // KV_PAGE, (waves * K.sm_count()) // max(c.Hkv, 1)))
        if self.attn_ml is not None:
            self.nsplit = min(self.nsplit, self.attn_ml.shape[2])
        self.chunk = -(-c.max_context // self.nsplit)

    def core_ops(self, L, ldb, buf_b=None):
        """Attention of each token row over its sequence's cache (q in qbuf, K/V already written) into the split-K
        partials (attn_ml, attn_acc) that the combine after it reduces (with the sigmoid gate, the first Hq*256
        columns of buf_b)."""
        self._set_nsplit()  # (the combine after this takes the same nsplit)
        c, p = self.c, self.c.plan
        name, cols = self.form()
        return [decode_attention(name, threads=p.attn_threads, smem=p.attn_smem, q=c.qbuf, k_cache=L["kc"],
                                 v_cache=L["vc"], pos=c.qpos, page_table=c.page_table, pt_stride=c.pt_stride,
                                 kv_heads=c.Hkv, chunk=self.chunk, scale=1.0 / math.sqrt(ATTN_HEAD_DIM),
                                 ml=self.attn_ml, acc=self.attn_acc, nsplit=self.nsplit, rows=c.M,
                                 k_scales=L["ks"], v_scales=L["vs"], cols=cols)]

    def ops(self, L, xn, att_stage, chunk: bool = False) -> tuple[list, list]:
        """Layer L's (projection ops, core ops up to the o-projection's staged input): xn the staged normed row
        (pairs, inverse scales), att_stage (k, kpad, xh, xinv) the o-projection's staging; chunk: the combine stages
        a 32-value chunk at a time (over the splits that hold tokens) into the context's chunk scales, where the
        o-projection (or the fused MLP's o-phase) takes them, else with one scale for the row (its last head)."""
        c, M = self.c, self.c.M
        a = c.args
        qw = c.Hq * ATTN_HEAD_DIM
        buf_a, buf_b = c.buf_a, c.buf_b
        lda, ldb = buf_a.shape[1], buf_b.shape[1]
        if "qkgv" in L:  # (q|k and gate|v as one GEMV over their shared object)
            buf_a = c.merged_buf()
            buf_b = buf_a[:, L["qk"].n:]
            lda = ldb = buf_a.shape[1]
            proj = [c.gemv(L["qkgv"], c.xn, buf_a, xpre=xn)]
        else:
            qk = c.gemv(L["qk"], c.xn, buf_a, xpre=xn)
            gv = c.gemv(L["gv"], c.xn, buf_b, xpre=xn)
            pair = c.pair(gv, qk)  # (one grid for both)
            proj = [pair] if pair is not None else c.concurrent([gv], [qk])
        core = [qk_norm_rope_kv(q=buf_a, ld_q=lda, k=buf_a[:, qw:], ld_k=lda, v=buf_b[:, qw:], ld_v=ldb,
                                q_norm=L["qn"], k_norm=L["kn"], pos=c.qpos, page_table=c.page_table,
                                pt_stride=c.pt_stride, k_cache=L["kc"], v_cache=L["vc"], q_out=c.qbuf,
                                q_heads=c.Hq, kv_heads=c.Hkv, rotary_dim=a.rotary_dim,
                                log2_theta=float(math.log2(a.rope_theta)), eps=float(a.rms_norm_eps), rows=M,
                                k_scales=L["ks"], v_scales=L["vs"])]
        core += self.core_ops(L, ldb, buf_b)
        k, kpad, xh, xinv = att_stage
        comb = dict(ml=self.attn_ml, acc=self.attn_acc, nsplit=self.nsplit, gate=buf_b, ld_gate=ldb, out=c.att,
                    ld_out=c.att.shape[1], heads=c.Hq, k=k, kpad=kpad, xh=xh, xinv=xinv, rows=M)
        if chunk:
            core.append(combine_chunks(**comb, xsc=c.xsc_att, pos=c.qpos, round_to=16 if self.mma() else 1))
        else:
            core.append(combine_stage(**comb, amax=self.attn_tick[:M], tickets=self.attn_tick[M:], xpk=c.twin(xh)))
        return proj, core
