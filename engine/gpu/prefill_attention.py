"""Causal GQA attention over the gathered paged cache through cuBLAS: the paged cache gathered into rows
(`kv_rows`) and `attention_cublas`, the GPU tests' reference for the flash prefill kernel (attn_prefill_fa),
with the cuBLAS constants the prefill's GEMMs use too."""
from __future__ import annotations

import numpy as np

from engine.gpu import launch as K
from engine.gpu.attention import ATTN_HEAD_DIM, _ptr

# cublas / library_types constants
_OP_N, _OP_T = 0, 1
_R_16F, _R_32F = 2, 0
_COMPUTE_32F = 68
_GEMM_DEFAULT = -1
SCORE_BYTES = 1 << 30  # bound on one query block's scores (fp32 and fp16)


def _r(y) -> int:
    """cuBLAS data type of a GEMM output: fp16 or fp32."""
    return _R_16F if y.dtype == np.float16 else _R_32F


def flash_attention(*, q, ld_q: int, k_cache, v_cache, k_scales, v_scales, page_table, q_heads: int, kv_heads: int,
                    start: int, tokens: int, gate, ld_gate: int, out, ld_out: int, kv8: bool,
                    warps: int = 4) -> K.Launch:
    """attn_prefill_fa<warps, kv8>: out[t, h*256:(h+1)*256] = causal attention of query t < tokens (q [tokens,
    q_heads * 256] fp32, row stride ld_q, at position start + t) over cache positions 0..start + t (pages page_table[0..],
    the paged caches, int8 scales or None), times sigmoid(gate[t, h*256 + d]); a block of `warps` warps a query head
    and 16 * warps queries."""
    if ATTN_HEAD_DIM != 256 or warps not in (4, 8):
        raise NotImplementedError("attn_prefill_fa takes head_dim 256 and 4 or 8 warps")
    return K.prepared(f"attn_prefill_fa<{warps},{'true' if kv8 else 'false'}>", (q_heads, -(-tokens // (16 * warps))),
                      (q, ld_q, k_cache, v_cache, _ptr(k_scales), _ptr(v_scales), page_table, q_heads, kv_heads,
                       int(start), int(tokens), float(1.0 / np.sqrt(ATTN_HEAD_DIM)), gate, ld_gate, out, ld_out),
                      block=32 * warps, smem=K.flash_smem(warps))


def kv_rows(xp, codes, scales, pages, length: int):
    """Rows [0, length) of one layer's paged K or V cache as fp32 [length, Hkv, D]: bf16 bit patterns
    (uint16) or int8-g64 codes with their fp16 scales."""
    c = codes[pages]  # [npages, KV_PAGE, Hkv, D]
    c = c.reshape((-1,) + c.shape[2:])[:length]
    if scales is None:
        return xp.left_shift(c.astype(xp.uint32), 16).view(xp.float32)  # (the ufunc: no cupyx import)
    s = scales[pages].reshape((-1,) + scales.shape[2:])[:length].astype(xp.float32)
    d = c.shape[-1]
    return (c.astype(xp.float32).reshape(c.shape[:-1] + (d // 64, 64)) * s[..., None]).reshape(c.shape)


def attention_cublas(cp, q, k16, v16, gate, start: int, score_bytes: int = SCORE_BYTES, out=None):
    """Causal GQA attention of T queries at positions start.. on tensor cores, times sigmoid(gate).

    q [T, Hq, D] fp32; k16, v16 [Hkv, n, D] fp16 contiguous (n >= start + T); gate [T, Hq*D].
    Per KV head and query block: S = scale Q K^T (cuBLAS, batched over the head's query heads with K
    shared), `causal_softmax_f16` to fp16 P, O = P V (fp32 out). A block holds grp x tb x n scores in
    fp32 and fp16, under `score_bytes`. Returns [T, Hq*D] fp32 (`out` when given: rows of any stride)."""
    from cupy_backends.cuda.libs import cublas  # noqa: PLC0415

    t, hq, d = q.shape
    hkv = k16.shape[0]
    grp = hq // hkv
    n_max = start + t
    qg = q.reshape(t, hkv, grp, d).transpose(1, 2, 0, 3).astype(cp.float16, order="C")  # [Hkv, grp, T, D]
    og = cp.empty((hkv, grp, t, d), dtype=cp.float32)
    tb = max(1, min(t, score_bytes // max(1, 6 * grp * n_max)))
    s = cp.empty(grp * tb * n_max, dtype=cp.float32)
    p = cp.empty(grp * tb * n_max, dtype=cp.float16)
    handle = cp.cuda.device.get_cublas_handle()
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)  # alpha and beta live on the host
    scale = np.array(1.0 / np.sqrt(d), dtype=np.float32)
    one, zero = np.array(1.0, dtype=np.float32), np.array(0.0, dtype=np.float32)
    for h in range(hkv):
        for b0 in range(0, t, tb):
            m = min(t, b0 + tb) - b0
            nk = start + b0 + m  # the keys the block's last query sees
            q_ptr = qg.data.ptr + ((h * grp) * t + b0) * d * 2
            # per query head g: column-major S_g [nk, m] = K (op T of [D, nk]) . Q_g (op N of [D, m])
            cublas.gemmStridedBatchedEx(handle, _OP_T, _OP_N, nk, m, d, scale.ctypes.data,
                                        k16[h].data.ptr, _R_16F, d, 0, q_ptr, _R_16F, d, t * d,
                                        zero.ctypes.data, s.data.ptr, _R_32F, nk, m * nk, grp, _COMPUTE_32F,
                                        _GEMM_DEFAULT)
            K.now("causal_softmax_f16", (grp * m,), (s, p, np.int32(nk), np.int32(m), np.int32(start + b0)))
            # O_g [D, m] (column-major) = V (op N of [D, nk]) . P_g (op N of [nk, m])
            cublas.gemmStridedBatchedEx(handle, _OP_N, _OP_N, d, m, nk, one.ctypes.data,
                                        v16[h].data.ptr, _R_16F, d, 0, p.data.ptr, _R_16F, nk, m * nk,
                                        zero.ctypes.data, og.data.ptr + ((h * grp) * t + b0) * d * 4, _R_32F, d,
                                        t * d, grp, _COMPUTE_32F, _GEMM_DEFAULT)
    if out is None:
        out = cp.empty((t, hq * d), dtype=cp.float32)
    n = t * hq * d
    K.now("gate_heads", (min(-(-n // 256), K.sm_count() * 16),),
          (og, np.int32(t), np.int32(hq), np.int32(d), gate, np.int32(gate.strides[0] // 4), out,
           np.int32(out.strides[0] // 4)))
    return out
