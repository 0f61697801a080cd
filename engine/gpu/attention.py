"""The attention of the CUDA decode step (`CudaQwen35` takes it as a base): the split-K partials'
allocation and the core op (the plan's decode attention kernel over the paged cache; the combine with the
sigmoid gate follows it in `CudaQwen35._plan`). The methods use the executor's buffers (`_alloc`: qbuf,
page_table, qpos, att, the layers' caches)."""
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
                     v_scales=None) -> K.Launch:
    """Split-K decode attention `name` (the plan's attn: attn_decode_mma or attn_decode_split) of `rows` token rows:
    q [rows, Hq * 256] over the paged caches (k_cache, v_cache [pages, 64, kv_heads, 256]; int8: k_scales, v_scales
    [pages, 64, kv_heads, 4] fp16), the positions `pos` [rows] and pages page_table (row r's at r * pt_stride), each
    split of `chunk` tokens into the partials ml [rows, Hq, nsplit, 2] (max, sum) and acc [rows, Hq, nsplit, 256].
    Grid (kv_heads x the query group's blocks, nsplit, rows)."""
    gs = int(name[:-1].split(",")[2]) if name.startswith("attn_decode_split<") and name.count(",") == 2 else 1
    args = (q, k_cache, v_cache, pos, page_table, pt_stride, kv_heads, chunk, float(scale), ml, acc, nsplit,
            _ptr(k_scales), _ptr(v_scales))
    return K.prepared(name, (kv_heads * gs, nsplit, rows), args, block=threads, smem=smem)


def combine_stage(*, ml, acc, nsplit: int, gate, ld_gate: int, out, ld_out: int, heads: int, k: int, kpad: int, xh,
                  xinv, amax, tickets, rows: int) -> K.Launch:
    """attn_combine_stage: the splits' partials combined, times sigmoid(gate) (its first heads * 256 columns), into out
    [rows, ld_out]; the row's last head stages its first k values as the o-projection's int16 pairs with one scale
    (xh [rows, kpad / 2], xinv [rows]) from the row maximum in amax [rows] (tickets [rows]; both left at zero)."""
    return K.prepared("attn_combine_stage", (heads, rows),
                      (ml, acc, nsplit, gate, ld_gate, out, ld_out, heads, k, kpad, xh, xinv, amax, tickets))


def combine_chunks(*, ml, acc, nsplit: int, gate, ld_gate: int, out, ld_out: int, heads: int, k: int, kpad: int, xh,
                   xinv, xsc, pos, round_to: int, rows: int) -> K.Launch:
    """attn_combine_chunks_b: combine_stage's combine over the splits that hold tokens (split s: the tokens of
    ceil(L / nsplit) rounded up to `round_to`, L = pos + 1), each 32-value chunk of the output staged with its own
    power-of-two scale (xsc [rows, kpad / 32] their inverses, xinv 1)."""
    return K.prepared("attn_combine_chunks_b", (heads, rows),
                      (ml, acc, nsplit, gate, ld_gate, out, ld_out, heads, k, kpad, xh, xinv, xsc, pos, round_to),
                      block=256)


class AttentionOps:
    # The decode attention is the plan's (engine.gpu.plan.attention_form): attn_decode_mma, a KV head's query group as
    # one m16 tile, 16 tokens a warp a round through two MMA chains, the next rounds' K/V in flight through cp.async,
    # in the first form that fits the device's shared memory (int8 KV on sm_90: K's and V's codes straight into the
    # MMAs); the split kernel (CUDA cores, a warp a token) for query groups it is not compiled for.

    def _attn_mma(self):
        """(kernel name, threads, dynamic shared memory) of the plan's attention when it is attn_decode_mma, else
        None (the split kernels)."""
        if not self.plan.attn.startswith("attn_decode_mma<"):
            return None
        return self.plan.attn, self.plan.attn_threads, self.plan.attn_smem

    def _alloc_attention(self):
        """Split-K attention partials (per token row, query head and split): as many splits as fill the SMs
        once with attn_decode_mma's resident blocks (one an SM), two waves' worth of the split kernels."""
        cp, M, f32 = self.cp, self.M, self.cp.float32
        self._set_nsplit()
        cap = self.nsplit
        self.attn_ml = cp.zeros((M, self.Hq, cap, 2), dtype=f32)
        self.attn_acc = cp.zeros((M, self.Hq, cap, ATTN_HEAD_DIM), dtype=f32)

    def _set_nsplit(self):
        """nsplit (and chunk) for the attention form the plan takes: its resident blocks an SM's worth of splits."""
        mma = self._attn_mma()
        waves = K.blocks_per_sm(*mma) if mma is not None else 2
        self.nsplit = max(1, min(self.max_context // KV_PAGE, (waves * K.sm_count()) // max(self.Hkv, 1)))
        if getattr(self, "attn_ml", None) is not None:
            self.nsplit = min(self.nsplit, self.attn_ml.shape[2])
        self.chunk = -(-self.max_context // self.nsplit)

    def _attn_core_ops(self, L, ldb, buf_b=None):
        """Attention of each token row over its sequence's cache (q in qbuf, K/V already written) into the split-K
        partials (attn_ml, attn_acc) that the combine after it reduces (with the sigmoid gate, the first Hq*256
        columns of buf_b)."""
        self._set_nsplit()  # (the combine after this takes the same nsplit)
        p = self.plan
        return [decode_attention(p.attn, threads=p.attn_threads, smem=p.attn_smem, q=self.qbuf, k_cache=L["kc"],
                                 v_cache=L["vc"], pos=self.qpos, page_table=self.page_table, pt_stride=self.pt_stride,
                                 kv_heads=self.Hkv, chunk=self.chunk, scale=1.0 / math.sqrt(ATTN_HEAD_DIM),
                                 ml=self.attn_ml, acc=self.attn_acc, nsplit=self.nsplit, rows=self.M,
                                 k_scales=L["ks"], v_scales=L["vs"])]
