"""The attention of the CUDA decode step (`CudaQwen35` takes it as a base): the split-K partials'
allocation and the core ops (one decode attention kernel over the paged cache, then the combine with the
sigmoid gate), with the switches that pick the kernel. The methods use the executor's buffers (`_alloc`:
qbuf, page_table, qpos, att, the layers' caches)."""
from __future__ import annotations

import math
import os

import numpy as np

from engine.ops import kernels as K

KV_PAGE = 64
ATTN_HEAD_DIM = 256


def _ptr(a) -> np.uint64:
    """Device pointer of an optional array (0 for None), as a kernel argument."""
    return np.uint64(0 if a is None else a.data.ptr)


class AttentionOps:
    # Attention decode: attn_combine + the o-projection's staging as one kernel (attn_combine_stage, the last
    # head of a row stages it); NINFER_ATTN_FUSED=0 for the two. Session 8 on the H200 (s8, in-process A/B,
    # twice each): 27B 127.0 / 127.0 against 126.9 / 126.9 tok/s, 35B-A3B 336.8 / 336.6 against 336.4 / 336.5.
    ATTN_FUSED = os.environ.get("NINFER_ATTN_FUSED", "1") != "0"
    # NINFER_ATTN_CHUNK=1 (with ATTN_FUSED and GATED_CHUNK): attn_combine_chunks, the combine over the splits that hold
    # tokens only (at a short context most of the nsplit are empty) with its output staged a 32-value chunk at a time
    # (no row maximum, no last block), where the o-projection takes chunk scales. Session 17 (s17a, H200, in-process
    # A/B, two passes): 27B 153.9 / 153.9 against 153.1 / 153.2 tok/s. NINFER_ATTN_CHUNK=0 for attn_combine_stage.
    ATTN_CHUNK = int(os.environ.get("NINFER_ATTN_CHUNK", "1"))
    # NINFER_ATTN_COMBINE_B (on by default, with ATTN_CHUNK): attn_combine_chunks_b, the same combine with its loads
    # batched (the first 16 splits' partials, the gate and the position in one round; the split loop took a round a 4
    # splits), the same bits. Session 18 (s18b, one process, two passes each): 35B-A3B 480.1 / 480.2 against 475.2 /
    # 475.0 tok/s, 27B 154.8 / 154.8 against 153.9 / 153.9, 27B at 32768 (int8 KV) 144.7 against 143.5.
    ATTN_COMBINE_B = int(os.environ.get("NINFER_ATTN_COMBINE_B", "1"))
    # NINFER_ATTN_MERGE (on by default): attention layers whose q, k, gate and v share a row-split format (the 35B-A3B's
    # w8) hold them as one object and project it in one GEMV into one [q|k|gate|v] row (GdnOps.GDN_MERGE's form), not
    # two GEMVs on two branches. The same bits (GPU test). Session 19 (s19e, one process, two passes): 35B-A3B 497.4 /
    # 496.6 against 496.9 / 496.8 tok/s, flat; kept (one launch and one fork fewer; the session's bench ran with it).
    # NINFER_ATTN_MERGE=0 for the two.
    ATTN_MERGE = os.environ.get("NINFER_ATTN_MERGE", "1") != "0"
    # Decode attention: tokens a warp a round; NINFER_ATTN_TT=4 takes attn_decode_tt (4 tokens' K/V asked for at
    # once), 1 attn_decode_split (the kernel of sessions 2-6), the default until 4 is measured on a GPU.
    ATTN_TT = int(os.environ.get("NINFER_ATTN_TT", "1"))
    # Decode attention: a KV head's query group cut over this many blocks (attn_decode_split<G / GS, KV8, GS>;
    # kernels.ATTN_GSPLIT lists the compiled cuts): the 27B's 6 heads a KV head take 156 registers a thread,
    # one 256-thread block an SM, 8 warps to hide each token's dependent loads and shuffles (~115 us a layer
    # at 32K against ~17 us of bytes); 3 heads take 80. Session 9 on the H200 (gsplit, in-process A/B, twice
    # each): 27B at depth 32768 (int8 KV) 104.6 / 104.5 tok/s against 103.6 / 103.6 (GS 4: 103.6), at depth 0
    # 128.4 against 128.0; 35B-A3B 342.1 / 342.2 against 341.4 / 341.6 (GS 4: 342.2 / 342.5). 2 by default.
    ATTN_GSPLIT = int(os.environ.get("NINFER_ATTN_GSPLIT", "2"))
    # Decode attention on tensor cores (attn_decode_mma<G, KV8>: a KV head's query group as one m16 tile, 16
    # tokens a warp a round through two MMA chains, the next rounds' K/V in flight through cp.async;
    # kernels.ATTN_MMA_G compiled; 211 KB of shared memory: H100/H200 class, elsewhere the split kernel).
    # Session 10 on the H200 (in-process A/B, twice each): its first form (no loads ahead) 27B depth 32768
    # int8 110.6 against 105.4 tok/s, depth 0 128.3 against 128.7; with the loads ahead (s10a) 118.1 / 118.1
    # against 105.2 / 105.2, depth 0 128.8 / 128.9 against 128.7 / 128.7, 35B-A3B 342.2 / 342.1 against
    # 342.1 / 342.0. On by default; NINFER_ATTN_MMA=0 for the split kernel.
    ATTN_MMA = os.environ.get("NINFER_ATTN_MMA", "1") != "0"
    # Which attn_decode_mma form (an index into kernels.ATTN_MMA_FORMS[int8 KV]): -1 the first that fits the
    # device's shared memory; 1 and 2 (the A100-class and 99 KB forms) can be tried on an H200 this way.
    ATTN_MMA_FORM = int(os.environ.get("NINFER_ATTN_MMA_FORM", "-1"))
    # int8 KV: K's codes straight into the MMAs (attn_decode_mma<..., true>: Q staged with a dim permutation, the
    # codes PRMT-ed to 1152 + code, the group scales and offsets applied to the scores; only V is decoded to fp16)
    # where the first int8 form runs. Measured (session 13, H200, 27B depth 32768 int8 KV, one process): 138.1
    # against 134.0 tok/s; `ninfer bench` 138.69 against 134.49. On by default; NINFER_ATTN_KRAW=0 decodes K.
    # (dev/emu_attn_kraw.py checks the permutation and the combine; tests/gpu: test_attention_decode.)
    ATTN_KRAW = os.environ.get("NINFER_ATTN_KRAW", "1") != "0"
    # Which raw-K form (an index into kernels.ATTN_MMA_KRAW_FORMS: (W, NS) 0 (4, 4), 1 (6, 3), 2 (8, 2), 3 (5, 4)): the
    # room the K tile left taken by more warps a block (written for session 21's depth breakdown: 33.7 us a layer for
    # the 68 MB of 32K int8 rows, ~2 TB/s). Session 21 (s21b, 27B at depth 32768 int8, one process, two passes): 1
    # 152.3 / 152.3, 2 153.2 / 153.2, 3 151.0 / 151.0 against 152.7 / 152.7 tok/s (more warps barely pay: not the
    # warps' math). 2 by default (W 8, NS 2), where its 211,200 bytes fit; the first form elsewhere.
    ATTN_KRAW_FORM = int(os.environ.get("NINFER_ATTN_KRAW_FORM", "2"))
    # With raw K, V's codes into the MMAs too (attn_decode_mma<..., true, true>: O's dims permuted so that a lane's B
    # fragments are 32-bit shared loads of 4 tokens' codes, PRMT-ed to fp16 and made exact by one HSUB2; the group
    # scales on P): 0 off, 1 / 2 form 0 / 1 of kernels.ATTN_MMA_VRAW_FORMS ((W, NS) (8, 3), (8, 2)). The attention
    # alone at 32K (bench/attn_probe.py, fin21): the raw-K forms read 2.1-2.3 TB/s against bf16's 3.3, so the
    # int8 work a token bounds it. Session 21 (s21d): the attention alone 27.2 us (form 2) and 28.5 (form 1) against
    # 29.9 for raw K (8, 2); the 27B at depth 32768 int8 (one process, two passes) 153.1 / 153.1 (2), 152.6 / 152.6
    # (1) against 152.7 / 152.7 tok/s. 2 by default; NINFER_ATTN_VRAW=0 decodes V (the raw-K form ATTN_KRAW_FORM).
    ATTN_VRAW = int(os.environ.get("NINFER_ATTN_VRAW", "2"))
    # int8 KV: the transposed form (attn_decode_mma_t: the tokens as the MMAs' 16 rows and the G <= 8 query heads one n8
    # tile, so half the MMAs and 64 accumulator registers of attn_decode_mma's 16-row tile; raw K and V codes; P^T into
    # B fragments by movmatrix): 0 off, N form N - 1 of kernels.ATTN_MMA_T_FORMS ((W, NS, blocks an SM)). Written for
    # session 21's Nsight read (VRAW: 8 warps an SM, 0.4 instructions a cycle, 224 registers); the split count follows
    # the form's blocks an SM. Unmeasured (written without device time): off until it is.
    ATTN_TR = int(os.environ.get("NINFER_ATTN_TR", "0"))

    def _attn_mma(self):
        """(kernel name, threads, dynamic shared memory) of the attn_decode_mma form the decode attention runs,
        or None for the split kernels (switched off, the query group not compiled, no mma.sync, or no form
        fits the shared memory)."""
        g = self.Hq // max(self.Hkv, 1)
        if not (self.ATTN_MMA and g in K.ATTN_MMA_G and K.mma_ok()):
            return None
        kv8 = self.kv == "int8"
        if kv8 and self.ATTN_TR:
            if not 0 < self.ATTN_TR <= len(K.ATTN_MMA_T_FORMS):
                raise ValueError(f"NINFER_ATTN_TR={self.ATTN_TR}: 0 (off) or a form 1..{len(K.ATTN_MMA_T_FORMS)}")
            w, ns, _minb = K.ATTN_MMA_T_FORMS[self.ATTN_TR - 1]
            if K.attn_mma_t_smem(w, ns) <= K.smem_optin():
                return K.attn_mma_t_name(g, self.ATTN_TR - 1), 32 * w, K.attn_mma_t_smem(w, ns)
        form = K.attn_mma_form(kv8, K.smem_optin(), self.ATTN_MMA_FORM)
        if form is None:
            return None
        w, ns = form
        if kv8 and self.ATTN_KRAW and (w, ns) == K.ATTN_MMA_FORMS[True][0]:
            v = self.ATTN_VRAW
            if not 0 <= v <= len(K.ATTN_MMA_VRAW_FORMS):
                raise ValueError(f"NINFER_ATTN_VRAW={v}: 0 (off) or a form 1..{len(K.ATTN_MMA_VRAW_FORMS)}")
            if v and K.attn_mma_smem(True, *K.ATTN_MMA_VRAW_FORMS[v - 1], vraw=True) <= K.smem_optin():
                w, ns = K.ATTN_MMA_VRAW_FORMS[v - 1]
                return K.attn_mma_vraw_name(g, v - 1), 32 * w, K.attn_mma_smem(True, w, ns, vraw=True)
            f = self.ATTN_KRAW_FORM
            if not 0 <= f < len(K.ATTN_MMA_KRAW_FORMS):
                raise ValueError(f"NINFER_ATTN_KRAW_FORM={f}: the forms are 0..{len(K.ATTN_MMA_KRAW_FORMS) - 1}")
            w, ns = K.ATTN_MMA_KRAW_FORMS[f]
            if K.attn_mma_smem(True, w, ns, kraw=True) <= K.smem_optin():
                return K.attn_mma_kraw_name(g, f), 32 * w, K.attn_mma_smem(True, w, ns, kraw=True)
            w, ns = K.ATTN_MMA_KRAW_FORMS[0]
            return K.attn_mma_kraw_name(g), 32 * w, K.attn_mma_smem(True, w, ns, kraw=True)
        return f"attn_decode_mma<{g},{str(kv8).lower()},{w},{ns}>", 32 * w, K.attn_mma_smem(kv8, w, ns)

    def _alloc_attention(self):
        """Split-K attention partials (per token row, query head and split): as many splits as fill the SMs
        once with attn_decode_mma's resident blocks (its automatic form: one an SM), two waves' worth of the
        split kernels."""
        cp, M, f32 = self.cp, self.M, self.cp.float32
        self._set_nsplit()
        # (room for the most splits a form can ask for, four blocks an SM: the plan sets nsplit by the form it takes)
        cap = max(self.nsplit, min(self.max_context // KV_PAGE, (4 * K.sm_count()) // max(self.Hkv, 1)))
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
        """Attention of each token row over its sequence's cache (q in qbuf, K/V already written), times
        the sigmoid gate (the first Hq*256 columns of buf_b: self.buf_b unless given), into att: split-K decode
        attention."""
        M = self.M
        buf_b = self.buf_b if buf_b is None else buf_b
        g = self.Hq // self.Hkv
        self._set_nsplit()  # (the combine after this takes the same nsplit)
        kv8 = "true" if self.kv == "int8" else "false"
        gs = self.ATTN_GSPLIT if (g // max(self.ATTN_GSPLIT, 1), self.ATTN_GSPLIT) in K.ATTN_GSPLIT else 1
        args = (self.qbuf, L["kc"], L["vc"], self.qpos, self.page_table, self.pt_stride, self.Hkv, self.chunk,
                float(1.0 / math.sqrt(ATTN_HEAD_DIM)), self.attn_ml, self.attn_acc, self.nsplit, _ptr(L["ks"]),
                _ptr(L["vs"]))
        mma = self._attn_mma()
        if mma is not None:
            name, block, smem = mma
            split = K.prepared(name, (self.Hkv, self.nsplit, M), args, block=block, smem=smem)
        else:
            if self.ATTN_TT in K.ATTN_TT:
                name = f"attn_decode_tt<{g},{kv8},{self.ATTN_TT}>"
                gs = 1
            else:
                name = f"attn_decode_split<{g // gs},{kv8},{gs}>" if gs > 1 else f"attn_decode_split<{g},{kv8}>"
            split = K.prepared(name, (self.Hkv * gs, self.nsplit, M), args)
        return [split,
                K.prepared("attn_combine", (self.Hq, M),
                           (self.attn_ml, self.attn_acc, self.nsplit, buf_b, ldb, self.att,
                            self.att.shape[1], self.Hq))]
