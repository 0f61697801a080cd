"""Prefill in large chunks: T prompt tokens per pass, projections on tensor cores.

The columns step (8 tokens per CUDA graph, GEMV kernels) reads every weight once per 8 tokens. Past a
few dozen tokens the projections are better done as GEMMs: each packed matrix is dequantized to fp16
once per chunk (`dequant_rs`) and multiplied by the chunk's activations with cuBLAS (`gemmEx`, fp16
inputs, fp32 accumulate and output). Attention runs over the gathered cache with causal masking
(`prefill_attention`: fp16 products on tensor cores, fp32 softmax, query blocks sized to bound the
score memory). Everything else is the columns
step's: norms, the GDN conv and recurrence over the T tokens (`gdn_prep_cols`, `gdn_delta_cols`), the
q/k norm + RoPE + paged KV write, and the head on the chunk's last row.

Not graph-captured (cuBLAS calls cannot be captured through CuPy); one chunk is a few hundred launches.
Written without device time to check it: off unless NINFER_PREFILL_GEMM is set (the chunk length), until
tests/gpu/test_prefill.py has passed on a GPU.
"""
from __future__ import annotations

import numpy as np

from engine.ops import kernels as K
from engine.ops import ref
from engine.models.qwen3_5_cuda import ATTN_HEAD_DIM, KV_PAGE
from engine.models.qwen3_5_cuda_cols import CudaQwen35Columns

# cublas / library_types constants
_OP_N, _OP_T = 0, 1
_R_16F, _R_32F = 2, 0
_COMPUTE_32F = 68
_GEMM_DEFAULT = -1
SCORE_BYTES = 1 << 30  # bound on one query block's fp32 scores


def kv_rows(xp, codes, scales, pages, length: int):
    """Rows [0, length) of one layer's paged K or V cache as fp32 [length, Hkv, D]: bf16 bit patterns
    (uint16) or int8-g64 codes with their fp16 scales."""
    c = codes[pages]  # [npages, KV_PAGE, Hkv, D]
    c = c.reshape((-1,) + c.shape[2:])[:length]
    if scales is None:
        return (c.astype(xp.uint32) << 16).view(xp.float32)
    s = scales[pages].reshape((-1,) + scales.shape[2:])[:length].astype(xp.float32)
    d = c.shape[-1]
    return (c.astype(xp.float32).reshape(c.shape[:-1] + (d // 64, 64)) * s[..., None]).reshape(c.shape)


def _attention_f16(xp, q, k, v, scale: float, q_start: int):
    """ref.attention with both products on fp16 inputs (tensor cores under CuPy), softmax in fp32;
    k and v come in as fp16."""
    t, hq, d = q.shape
    n, hkv, _ = k.shape
    grp = hq // hkv
    f16, f32 = xp.float16, xp.float32
    qg = (q * f32(scale)).astype(f16).reshape(t, hkv, grp, d).transpose(1, 2, 0, 3).reshape(hkv, grp * t, d)
    scores = xp.matmul(qg, k.transpose(1, 2, 0)).astype(f32).reshape(hkv, grp, t, n)
    visible = xp.arange(n)[None, :] <= (q_start + xp.arange(t))[:, None]
    scores = xp.where(visible, scores, f32(-np.inf))
    p = ref.softmax(scores, axis=-1).astype(f16).reshape(hkv, grp * t, n)
    o = xp.matmul(p, v.transpose(1, 0, 2)).astype(f32).reshape(hkv, grp, t, d)
    return o.transpose(2, 0, 1, 3).reshape(t, hq, d)


def prefill_attention(xp, q, k, v, gate, start: int, score_bytes: int = SCORE_BYTES, half: bool = False):
    """Causal GQA attention of T queries at positions start.. over k/v [start+T, Hkv, D], times
    sigmoid(gate [T, Hq*D]); returns [T, Hq*D] fp32. Query blocks keep each block's scores under
    `score_bytes`. half: fp16 inputs to both products (the prefill's choice; fp32 softmax)."""
    t, hq, d = q.shape
    scale = 1.0 / np.sqrt(d)
    out = xp.empty((t, hq * d), dtype=xp.float32)
    tb = max(1, min(t, score_bytes // max(1, 4 * hq * (start + t))))
    if half:  # once for every query block
        k, v = k.astype(xp.float16), v.astype(xp.float16)
    for b0 in range(0, t, tb):
        b1 = min(t, b0 + tb)
        n = start + b1
        if half:
            o = _attention_f16(xp, q[b0:b1], k[:n], v[:n], scale, start + b0)
        else:
            o = ref.attention(q[b0:b1], k[:n], v[:n], scale, q_start=start + b0)
        out[b0:b1] = o.reshape(b1 - b0, -1) * ref.sigmoid(gate[b0:b1])
    return out


class CudaQwen35Prefill(CudaQwen35Columns):
    """T-token prefill chunks over the sequence of `decode` (a one-lane CudaQwen35)."""

    def __init__(self, decode, chunk: int):
        self._w16 = None
        super().__init__(decode, chunk)
        cp = self.cp
        n_max = max(L[key].n * L[key].k for L in self.layers for key in ("qk", "gv", "vz", "ab", "o", "gate_up", "down")
                    if key in L)
        self._w16 = cp.empty(n_max, dtype=cp.float16)
        k_max = max(self.H, self.att.shape[1], self.inter)
        self._x16 = cp.empty(self.M * k_max, dtype=cp.float16)
        n_gu = max((L["gate_up"].n for L in self.layers if "gate_up" in L), default=0)
        self._gu = cp.empty((self.M, n_gu), dtype=cp.float32)
        self._one = np.array(1.0, dtype=np.float32)
        self._zero = np.array(0.0, dtype=np.float32)
        self.start = 0

    # ---- allocation hooks: no split-K attention partials, one logits row ----
    def _alloc_attention(self):
        self.nsplit, self.chunk, self.attn_ml, self.attn_acc = 1, self.max_context, None, None

    def _logit_rows(self) -> int:
        return 1

    # ---- the projections: dequantize once per chunk, then one tensor-core GEMM ----
    def _dequant(self, w):
        cp = self.cp
        out = self._w16[: w.n * w.k].reshape(w.n, w.k)
        if w.fmt == "bf16":
            bits = w.buf[w.base: w.base + 2 * w.n * w.k].view(cp.uint16).reshape(w.n, w.k)
            out[...] = (bits.astype(cp.uint32) << 16).view(cp.float32)
        elif w.fmt == "fp32":
            out[...] = w.buf[w.base: w.base + 4 * w.n * w.k].view(cp.float32).reshape(w.n, w.k)
        else:
            K.kernel(f"dequant_rs<{K.FMT_IDS[w.fmt]}>")(
                (w.n,), (256,), (np.uint64(w.ptr(w.base)), np.uint64(w.ptr(w.high)), np.uint64(w.ptr(w.scales)),
                                 np.int32(w.gpr), np.int32(w.k), out, np.int32(w.k)))
        return out

    def _matmul(self, w, x, y, ldy: int):
        """y[:, :w.n] (row stride ldy, fp32) = x[:, :w.k] @ W^T over the chunk's T rows."""
        from cupy_backends.cuda.libs import cublas  # noqa: PLC0415

        cp, T = self.cp, self.M
        x16 = self._x16[: T * w.k].reshape(T, w.k)
        x16[...] = x[:, : w.k]
        w16 = self._dequant(w)
        handle = cp.cuda.device.get_cublas_handle()
        cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)  # alpha and beta live on the host
        # row-major y[T, N] = x[T, K] W[N, K]^T is column-major C[N, T] = W^T(op T of [K, N]) x(op N of [K, T])
        cublas.gemmEx(handle, _OP_T, _OP_N, w.n, T, w.k, self._one.ctypes.data, w16.data.ptr, _R_16F, w.k,
                      x16.data.ptr, _R_16F, w.k, self._zero.ctypes.data, y.data.ptr, _R_32F, ldy,
                      _COMPUTE_32F, _GEMM_DEFAULT)

    def _gemv(self, w, x, y, epi="store", splits=1, y_offset=0, xpre=None):
        cp = self.cp  # (the head on the chunk's last row stays a GEMV: the columns step's _tail_ops)

        if epi == "swiglu":
            def go():
                n = w.n // 2
                self._matmul(w, x, self._gu, self._gu.shape[1])
                g, u = self._gu[:, :n], self._gu[:, n: 2 * n]
                y[:, :n] = g / (1 + cp.exp(-g)) * u
            go.name = f"gemm+swiglu {w.fmt} {w.n}x{w.k}"
            return go
        if epi != "store" or y_offset:
            raise NotImplementedError(f"prefill GEMM epilogue {epi!r}")
        return self._named(lambda: self._matmul(w, x, y, y.shape[1]), f"gemm {w.fmt} {w.n}x{w.k}")

    @staticmethod
    def _named(fn, name: str):
        fn.name = name  # what bench/prefill_profile.py groups op times by
        return fn

    def _plan_gemv(self, w, x, y, epi, splits, xpre):
        """Out- and down-projections: the whole sum into split 0 of the partials (the next norm adds it)."""
        plan = type("PrefillPlan", (), {})()
        plan.splits = 1
        plan.launch = self._named(lambda: self._matmul(w, x, y[0], y.shape[-1]), f"gemm {w.fmt} {w.n}x{w.k}")
        return plan

    def _stage(self, x, k, kpad, xh, xinv):
        return lambda: None  # the GEMMs read fp32 rows; nothing to stage

    def _attn_core_ops(self, L, ldb):
        cp, T = self.cp, self.M
        hq = self.Hq
        qw = hq * ATTN_HEAD_DIM

        def go():
            n = self.start + T
            pages = self.page_table[0, : -(-n // KV_PAGE)]
            k = kv_rows(cp, L["kc"], L["ks"], pages, n)
            v = kv_rows(cp, L["vc"], L["vs"], pages, n)
            q = self.qbuf[:, :qw].reshape(T, hq, ATTN_HEAD_DIM)
            self.att[:, :qw] = prefill_attention(cp, q, k, v, self.buf_b[:, :qw], self.start, half=True)
        go.name = "attention (gather + fp16 products)"
        return [go]

    def run_chunk(self, token_ids, start: int) -> None:
        """One T-token chunk at positions start.. (eager launches on the shared stream)."""
        self.start = int(start)
        with self.stream:
            self.tokens.set(np.asarray(token_ids, dtype=np.int32), stream=self.stream)
            self.run_eager()

    def capture(self):
        raise RuntimeError("the GEMM prefill runs eagerly (cuBLAS through CuPy is not stream-captured)")
