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
        M = self.M
        self._set_nsplit()  # (the combine after this takes the same nsplit)
        args = (self.qbuf, L["kc"], L["vc"], self.qpos, self.page_table, self.pt_stride, self.Hkv, self.chunk,
                float(1.0 / math.sqrt(ATTN_HEAD_DIM)), self.attn_ml, self.attn_acc, self.nsplit, _ptr(L["ks"]),
                _ptr(L["vs"]))
        name, block, smem = self.plan.attn, self.plan.attn_threads, self.plan.attn_smem
        gs = int(name[:-1].split(",")[2]) if name.startswith("attn_decode_split<") and name.count(",") == 2 else 1
        grid = (self.Hkv, self.nsplit, M) if self._attn_mma() else (self.Hkv * gs, self.nsplit, M)
        return [K.prepared(name, grid, args, block=block, smem=smem)]
