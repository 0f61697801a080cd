"""Prefill in large chunks: T prompt tokens per pass, projections on tensor cores.

The columns step (8 tokens per CUDA graph, GEMV kernels) reads every weight once per 8 tokens. Past a
few dozen tokens the projections are better done as GEMMs: each packed matrix is dequantized to fp16
once per chunk (`dequant_rs`; ahead of its GEMM on a second stream: engine.gpu.prefill_weights) and
multiplied by the chunk's activations with cuBLAS (`gemmEx`, fp16 inputs, fp32 accumulation). Attention is
one flash kernel over the paged cache (`flash_attention`, the plan's warps a block), the GDN recurrence
the chunked form on tensor cores (`gdn_chunk_prep`, the plan's `gdn_scan`), or token by token where that
does not fit the GPU's shared memory (`gdn_delta_rows`). The rest are the decode step's kernels over T
columns: the GDN conv and gates over the T tokens (`gdn_prep_cols`), the q/k norm + RoPE + paged KV write,
and the head on the chunk's last row; the norms write the GEMMs' fp16 input. The executor is its own (no
decode step inherited): it holds the decode executor and reads its weights, KV pool, GDN state, position
and stream.

Not graph-captured (cuBLAS calls cannot be captured through CuPy); one chunk is a few hundred launches.
On by default where the free memory allows (`engine.gpu_engine.PREFILL_GEMM`), with smaller chunks for
the rest of a prompt (`PREFILL_TAILS`).
"""
from __future__ import annotations

import math

import numpy as np

from engine.gpu import launch as K
from engine.gpu.attention import ATTN_HEAD_DIM, _ptr, qk_norm_rope_kv
from engine.gpu.columns import last_row_head
from engine.gpu.gdn import (GDN_HEAD_DIM, chunk_prep, chunk_scan, delta_bufs, delta_step, gdn_conv_tail, gdn_prep,
                            gdn_rows, prep_bufs)
from engine.gpu.gemv import embed_rows
from engine.gpu.mlp import swiglu_rows
from engine.gpu.norm import residual_norm
from engine.gpu.sampling import advance_positions, column_positions
from engine.gpu.prefill_attention import (  # noqa: F401 (kv_rows, attention_cublas: the GPU tests' reference)
    _COMPUTE_32F, _GEMM_DEFAULT, _OP_N, _OP_T, _R_16F, _r, attention_cublas, flash_attention, kv_rows)
from engine.gpu.prefill_weights import PrefillWeights16
from engine.gpu.prefill_moe import PrefillMoeOps


def residual_norm_f16(*, x_in, x_out, planes, nplanes: int, plane_stride: int, weight, out16, hidden: int, eps: float,
                      rows: int, out=None, offset: int = 1) -> K.Launch:
    """residual_rmsnorm_f16: norm.residual_norm's residual sum and rmsnorm of `rows` rows (a block of 256 a row), the
    normed rows written as the next GEMM's fp16 input out16 [rows, hidden] (and in fp32 into out where given: the
    MoE's routed gather reads them)."""
    return K.prepared("residual_rmsnorm_f16", (rows,),
                      (x_in, x_out, planes, nplanes, plane_stride, weight, _ptr(out) if out is None else out, out16,
                       hidden, float(eps), offset), block=256)


def gated_norm_f16(*, o, z, ld_z: int, weight, out16, v_heads: int, eps: float, rows: int) -> K.Launch:
    """gated_rmsnorm_f16: rmsnorm(o) w silu(z) a head (a warp a head) of `rows` rows, written as the o-projection
    GEMM's fp16 input out16 [rows, v_heads * 128]."""
    return K.prepared("gated_rmsnorm_f16", (-(-v_heads // K.WARPS), rows),
                      (o, z, ld_z, weight, out16, v_heads, float(eps)))


class CudaQwen35Prefill(PrefillWeights16, PrefillMoeOps):
    """T-token prefill chunks over the sequence of `decode` (a one-lane CudaQwen35): an executor of its own (GEMMs and
    the prefill's kernels, run eagerly) on the decode executor's weights, KV pool, GDN state, position and stream."""

    PREP_SPLIT = 64  # token slices of the GDN conv/norm kernel (16 tokens each at T = 1024)
    # state rows a warp in the token-by-token recurrence (where the chunked form does not fit). 27B pp8192 at
    # chunk 8192 (H200): 1 row 363 ms, 2 rows 287 ms, 4 rows 471 ms (the recurrence's total)
    DELTA_ROWS = 2
    # The delta rule in its chunked (WY) form, two passes (gdn_chunk_prep over every 64-token piece at once, the
    # plan's gdn_scan in order; 3xTF32 mma.sync, cuda/gdn_tc.cu; QS and M U, which reach only the output, 1xTF32):
    # 27B pp8192 on the H200, the recurrence's 48 layers, 295 ms token by token against 53 + 78 ms. Its scratch (W,
    # U' [P][Hv][64][128], M [P][Hv][64][64], G [P][Hv][64], fp32) is shared by the tails.

    def __init__(self, decode, chunk: int, share: "CudaQwen35Prefill | None" = None):
        """`share`: a larger-chunk executor over the same sequence whose fp16 weight, fp16 input and
        gate|up scratch this one uses too (the executors of one engine never run at the same time)."""
        if decode.M != 1:
            raise ValueError("the prefill chunks extend a one-lane decode executor")
        self.decode = d = decode
        self.cp, self.args, self.plan, self.kv, self.M = d.cp, d.args, d.plan, d.kv, int(chunk)
        c = d.ctx
        self.H, self.V, self.Hq, self.Hkv, self.Hk, self.Hv = d.H, d.V, c.Hq, c.Hkv, c.Hk, c.Hv
        # the sequence: weights, KV pool, GDN state and position are the decode executor's
        self.layers, self.embed, self.head, self.final_norm = d.layers, d.embed, d.head, d.final_norm
        self.pos, self.page_table, self.stream = d.pos, c.page_table, d.stream
        self._alloc(d)
        self._gdn_scratch = share._gdn_scratch if share is not None and share.M >= chunk else None
        self._moe_bufs = share._moe_bufs if share is not None else {}
        cp = self.cp
        if share is not None and share.M >= chunk:
            self._wbufs, self._x16, self._gu = share._wbufs, share._x16, share._gu[:chunk]
        else:
            n_max = max(L[key].n * L[key].k for L in self.layers
                        for key in ("qk", "gv", "vz", "ab", "o", "gate_up", "down", "router", "shared_gu",
                                    "shared_down") if key in L)
            if self.args.is_moe:  # every routed expert's gate|up, then every one's down (_moe_chunk)
                n_max = max([n_max] + [L[key].n * L[key].k for L in self.layers
                                       for key in ("experts_gu", "experts_down") if key in L])
            self._wbufs = [cp.empty(n_max, dtype=cp.float16) for _ in range(self._dq_bufs())]
            k_max = max(self.H, self.att.shape[1], self.inter)
            self._x16 = cp.empty(self.M * k_max, dtype=cp.float16)
            n_gu = max([L["gate_up"].n for L in self.layers if "gate_up" in L] + [2 * self.inter])
            self._gu = cp.empty((self.M, n_gu), dtype=cp.float16)
        self._x16_of = None  # the fp32 rows whose fp16 copy _x16 holds (set by the SwiGLU kernel)
        self._init_weights16()
        self._valid = self.M  # the chunk's prompt tokens (run_chunk)
        self._one = np.array(1.0, dtype=np.float32)
        self._zero = np.array(0.0, dtype=np.float32)
        self.start = 0
        self.ops = self._plan()

    def _alloc(self, d):
        """The chunk's rows of the decode step's buffers (engine.gpu.memory.workspace_bytes counts them), one logits
        row; the positions of its T columns (posc)."""
        cp, M, H, f32 = self.cp, self.M, self.H, self.cp.float32
        c = d.ctx
        self.tokens, self.posc = cp.zeros(M, dtype=cp.int32), cp.zeros(M, dtype=cp.int32)
        self.x, self.x2, self.xn = (cp.zeros((M, H), dtype=f32) for _ in range(3))
        self.inter = c.inter
        self.part = cp.zeros((c.part.shape[0], M, H), dtype=f32)
        self.buf_a = cp.zeros((M, c.buf_a.shape[1]), dtype=f32)
        self.buf_b = cp.zeros((M, c.buf_b.shape[1]), dtype=f32)
        self.ab = cp.zeros((M, c.ab.shape[1]), dtype=f32)
        if self.args.is_moe:
            self.topk, self.inter_e = d.moe.topk, d.moe.inter_e
            self.rlog = cp.zeros((M, d.moe.rlog.shape[1]), dtype=f32)
            self.eidx = cp.zeros((M, self.topk), dtype=cp.int32)
            self.ewts = cp.zeros((M, self.topk + 1), dtype=f32)
        self.act = cp.zeros((M, self.inter), dtype=f32)
        self.att = cp.zeros((M, c.att.shape[1]), dtype=f32)
        self.att2 = cp.zeros((M, c.att.shape[1]), dtype=f32)
        self.qbuf = cp.zeros((M, c.qbuf.shape[1]), dtype=f32)
        self.logits = cp.zeros((1, self.V), dtype=f32)
        self.kpad_h = c.kpad_h
        self.xh_n, self.xinv_n = cp.zeros((M, self.kpad_h // 2), dtype=cp.uint32), cp.ones(M, dtype=f32)
        self.gdn_q, self.gdn_k, self.gdn_v, self.gdn_g, self.gdn_beta = gdn_rows(cp, M, self.Hk, self.Hv)

    # ---- the chunk's op list ----
    def _plan(self) -> list:
        """Positions and embedding; each layer's norm, projections, core and o-projection, norm, MLP or MoE; the final
        norm, the head on the last valid row and the position advance."""
        a, T, H = self.args, self.M, self.H
        ops = [column_positions(pos=self.pos, out=self.posc, tokens=T),
               embed_rows(self.embed, tokens=self.tokens, out=self.x, ld=H, rows=T)]
        self._res = (self.x, self.x2)
        splits = 0
        for L in self.layers:
            ops.append(self._norm(splits, L["in_norm"]))
            if L["kind"] == "full_attention":
                ops += [self._gemm(L["qk"], self.xn, self.buf_a), self._gemm(L["gv"], self.xn, self.buf_b)]
                ops += self._attention_ops(L)
            else:
                ops += [self._gemm(L["qk"], self.xn, self.buf_a), self._gemm(L["ab"], self.xn, self.ab),
                        self._gemm(L["vz"], self.xn, self.buf_b)]
                ops += self._gdn_core_ops(L, self.buf_a.shape[1], self.buf_b.shape[1])
                ops.append(self._gated_norm(L, self.buf_b.shape[1], self.Hv * GDN_HEAD_DIM))
            ops.append(self._residual_gemm(L["o"], self.att))
            ops.append(self._norm(self._out_splits(), L["post_norm"]))
            if a.is_moe:
                ops += self._moe_ops(L)
                splits = self._moe_splits()
            else:
                ops += [self._gemm_swiglu(L["gate_up"], self.xn), self._residual_gemm(L["down"], self.act)]
                splits = self._out_splits()
        ops.append(self._norm(splits, self.final_norm))
        return ops + self._tail_ops()

    def _gemm(self, w, x, y):
        """y[:, :w.n] = x @ W^T over the chunk's rows: one tensor-core GEMM."""
        return self._named(lambda: self._matmul(w, x, y, y.shape[1]), f"gemm {w.fmt} {w.n}x{w.k}")

    def _gemm_swiglu(self, w, x):
        """gate|up GEMM (fp32), then SwiGLU in one pass straight into the fp16 input of the next GEMM, the down
        projection over `act` (not itself written: nothing else reads it)."""
        if (w.n // 2) % 4:
            raise NotImplementedError(f"prefill SwiGLU needs the intermediate size a multiple of 4, not {w.n // 2}")

        def go():
            self._matmul(w, x, self._gu, self._gu.shape[1])
            self._swiglu(w.n // 2, self.M, self.act)
        go.name = f"gemm+swiglu {w.fmt} {w.n}x{w.k}"
        return go

    def _residual_gemm(self, w, x):
        """The out- and down-projections: their product added to the residual stream x itself (beta = 1,
        `_residual_in_place`: the next norm reads no partial), else put into partial 0 (the next norm adds it)."""
        if self._residual_in_place():
            return self._named(lambda: self._matmul(w, x, self.x, self.x.shape[1], acc=True),
                               f"gemm {w.fmt} {w.n}x{w.k}")
        return self._named(lambda: self._matmul(w, x, self.part[0], self.part.shape[-1]), f"gemm {w.fmt} {w.n}x{w.k}")

    def _out_splits(self) -> int:
        """Partial planes an out- or down-projection leaves for the next norm."""
        return 0 if self._residual_in_place() else 1

    # The norms write the GEMMs' fp16 input rows themselves (residual_rmsnorm_f16, gated_rmsnorm_f16): no
    # staged pairs, no fp32 normed rows (but for the MoE's routed gather), no fp32 -> fp16 cast before the
    # projections. The final norm keeps the decode step's kernel (the head is a GEMV of its staged last
    # row). The gate|up GEMMs (dense, shared and routed experts) write their product in fp16 (fp32
    # accumulation): half the bytes for the GEMM to write and the SwiGLU pass to read.

    def _norm(self, splits: int, w):
        H = self.H
        if self._residual_in_place():  # (the final norm, the decode step's kernel, writes the other buffer)
            self._res = (self.x, self.x2) if w is self.final_norm else (self.x, self.x)
        x_in, x_out = self._res
        self._res = (x_out, x_in)
        norm = dict(x_in=x_in, x_out=x_out, planes=self.part, nplanes=splits, plane_stride=self.M * H, weight=w,
                    hidden=H, eps=self.args.rms_norm_eps, rows=self.M)
        if w is self.final_norm or H % 4 or H > 4 * 256 * 8:
            if H > 8 * 1024:  # residual_rmsnorm_mb holds a row in registers: 8 values a thread
                raise NotImplementedError(f"hidden size {H} > 8192 in the CUDA norm kernel")
            # (one block a row: T rows give the norm its parallelism; more blocks a row would re-read it)
            return residual_norm(self.plan.norm, **norm, out=self.xn, xh=self.xh_n, xinv=self.xinv_n, kpad=self.kpad_h,
                                 blocks=1)
        return self._writes_x16(residual_norm_f16(**norm, out=self.xn if self.args.is_moe else None, out16=self._x16),
                                self.xn, "residual_rmsnorm_f16")

    def _gated_norm(self, L, ldb: int, zoff: int):
        return self._writes_x16(gated_norm_f16(o=self.att2, z=self.buf_b[:, zoff:], ld_z=ldb, weight=L["norm"],
                                               out16=self._x16, v_heads=self.Hv, eps=self.args.rms_norm_eps,
                                               rows=self.M), self.att, "gated_rmsnorm_f16")

    def _writes_x16(self, launch, of, name: str):
        """An op whose kernel (`launch`, kept as the op's .launch) writes _x16 as the fp16 copy of `of`."""
        def go():
            launch()
            self._x16_of = of
        go.launch = launch
        return self._named(go, name)

    def _attention_ops(self, L) -> list:
        """The q/k norms, RoPE and the paged K/V write of the chunk's columns, then the flash kernel over the cache (the
        gate's columns: the first Hq * 256 of buf_b)."""
        a, qw = self.args, self.Hq * ATTN_HEAD_DIM
        lda, ldb = self.buf_a.shape[1], self.buf_b.shape[1]
        rope = qk_norm_rope_kv(q=self.buf_a, ld_q=lda, k=self.buf_a[:, qw:], ld_k=lda, v=self.buf_b[:, qw:], ld_v=ldb,
                               q_norm=L["qn"], k_norm=L["kn"], pos=self.posc, page_table=self.page_table, pt_stride=0,
                               k_cache=L["kc"], v_cache=L["vc"], q_out=self.qbuf, q_heads=self.Hq, kv_heads=self.Hkv,
                               rotary_dim=a.rotary_dim, log2_theta=math.log2(a.rope_theta), eps=a.rms_norm_eps,
                               rows=self.M, k_scales=L["ks"], v_scales=L["vs"])
        warps = self.plan.flash_warps  # (8 where their shared memory fits, else 4)

        def flash():
            # the chunk's valid rows only (a padded chunk's other rows of att are never read for the prompt: causal
            # attention, GDN state stopping at the valid rows)
            flash_attention(q=self.qbuf, ld_q=self.qbuf.shape[1], k_cache=L["kc"], v_cache=L["vc"],
                            k_scales=L["ks"], v_scales=L["vs"], page_table=self.page_table, q_heads=self.Hq,
                            kv_heads=self.Hkv, start=self.start, tokens=self._valid, gate=self.buf_b, ld_gate=ldb,
                            out=self.att, ld_out=self.att.shape[1], kv8=self.kv == "int8", warps=warps)()
        flash.name = "attention (flash kernel over the paged cache)"
        return [rope, flash]

    def _gdn_core_ops(self, L, lda: int, ldb: int) -> list:
        """The conv and gates over the chunk's columns (gdn_prep_cols in token slices, gdn_conv_tail), then the delta
        rule token by token (gdn_delta_rows) or, with the plan's chunked form, in 64-token pieces (gdn_chunk_prep,
        gdn_scan); the conv history and the delta rule over the chunk's valid tokens only (run_chunk's `valid`)."""
        T, Hk, Hv = self.M, self.Hk, self.Hv
        split = max(1, min(self.PREP_SPLIT, T // 8))
        ops = [gdn_prep(**prep_bufs(self, L, lda, ldb), rows=1, tokens=T, slices=split)]
        if split > 1:
            ops.append(self._valid_len(gdn_conv_tail(qk=self.buf_a, ld_qk=lda, v=self.buf_b, ld_v=ldb,
                                                     conv_state=L["conv_state"], k_heads=Hk, v_heads=Hv, tokens=T)))
        form = self._gdn_chunked_form()
        if form is None:
            return ops + [self._valid_len(delta_step(**delta_bufs(self, L), rows=1, tokens=T,
                                                     rows_a_warp=self.DELTA_ROWS))]
        cp, pieces = self.cp, -(-T // 64)
        if getattr(self, "_gdn_scratch", None) is None:  # one set for every layer (they run in turn)
            self._gdn_scratch = (cp.empty(pieces * Hv * 64 * 128, dtype=cp.float32),
                                 cp.empty(pieces * Hv * 64 * 128, dtype=cp.float32),
                                 cp.empty(pieces * Hv * 64 * 64, dtype=cp.float32),
                                 cp.empty(pieces * Hv * 64, dtype=cp.float32))
        w, u, m, g = self._gdn_scratch
        ops.append(self._valid_len(chunk_prep(q=self.gdn_q, k=self.gdn_k, v=self.gdn_v, g=self.gdn_g,
                                              beta=self.gdn_beta, w=w, u=u, m=m, gamma=g, k_heads=Hk, v_heads=Hv,
                                              tokens=T)))
        if self._dq_bufs() > 2:
            ops.append(self._dq_window_op())  # (before the in-order pass)
        ops.append(self._valid_len(chunk_scan(form, q=self.gdn_q, k=self.gdn_k, w=w, u=u, m=m, gamma=g,
                                              state=L["state"], o=self.att2, k_heads=Hk, v_heads=Hv, tokens=T)))
        return ops

    def _tail_ops(self):
        """The head on the chunk's last valid row (a padded chunk's is copied to row T - 1, where the head reads, first)
        and the position advance by the valid rows."""
        T = self.M

        def last_row():
            v = self._valid
            if v < T:
                for a in (self.xn, self.xh_n, self.xinv_n):
                    a[T - 1] = a[v - 1]
        last_row.name = "last valid row"
        head = last_row_head(self.head, xn=self.xn, xh=self.xh_n, xinv=self.xinv_n, logits=self.logits)
        return [last_row, head, self._valid_len(advance_positions(pos=self.pos, tokens=T))]

    # ---- the projections: dequantize once per chunk (PrefillWeights16), then one tensor-core GEMM ----
    def _matmul(self, w, x, y, ldy: int, rows: int | None = None, acc: bool = False):
        """y[:, :w.n] (row stride ldy, fp32) = x[:, :w.k] @ W^T over the chunk's T rows (or `rows`); acc: +=."""
        T = self.M if rows is None else int(rows)
        x16 = self._x16[: T * w.k].reshape(T, w.k)
        if self._x16_of is not x:  # (a norm or the SwiGLU kernel wrote it: `_norm`, `_gated_norm`, `_swiglu`)
            x16[...] = x[:, : w.k]
        # the normed rows stay there for the layer's other projections of them (only a norm rewrites xn,
        # and it writes _x16 too); any other fp32 input is rewritten later without a word to _x16
        self._x16_of = x if x is self.xn else None
        self._gemm16(self._weights16(w), x16, y, ldy, acc)
        self._gemm_issued()

    def _gemm16(self, w16, x16, y, ldy: int, acc: bool = False):
        """y[:rows, :n] (fp32 or fp16, row stride ldy) = x16 [rows, k] @ w16 [n, k]^T, both fp16 and contiguous
        (fp32 accumulation either way)."""
        from cupy_backends.cuda.libs import cublas  # noqa: PLC0415

        n, kk = w16.shape
        handle = self.cp.cuda.device.get_cublas_handle()
        cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)  # alpha and beta live on the host
        # row-major y[T, N] = x[T, K] W[N, K]^T is column-major C[N, T] = W^T(op T of [K, N]) x(op N of [K, T])
        cublas.gemmEx(handle, _OP_T, _OP_N, n, x16.shape[0], kk, self._one.ctypes.data, w16.data.ptr, _R_16F, kk,
                      x16.data.ptr, _R_16F, kk, (self._one if acc else self._zero).ctypes.data, y.data.ptr, _r(y), ldy,
                      _COMPUTE_32F, _GEMM_DEFAULT)

    def _gemm16_batched(self, w16, n: int, kk: int, x16, rows: int, y, batch: int):
        """For b < batch: y[b*rows:(b+1)*rows, :n] (fp32, contiguous) = x16[b*rows:(b+1)*rows, :kk] @
        W_b^T, W_b = w16's rows [b*n, (b+1)*n) (fp16 [n, kk]): one strided-batched cuBLAS call."""
        from cupy_backends.cuda.libs import cublas  # noqa: PLC0415

        handle = self.cp.cuda.device.get_cublas_handle()
        cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
        cublas.gemmStridedBatchedEx(handle, _OP_T, _OP_N, n, rows, kk, self._one.ctypes.data, w16.data.ptr,
                                    _R_16F, kk, n * kk, x16.data.ptr, _R_16F, kk, rows * kk,
                                    self._zero.ctypes.data, y.data.ptr, _r(y), n, rows * n, batch,
                                    _COMPUTE_32F, _GEMM_DEFAULT)

    @staticmethod
    def _named(fn, name: str):
        fn.name = name  # what bench/prefill_profile.py groups op times by
        return fn


    def _residual_in_place(self) -> bool:
        """The residual stream stays in one buffer (x) through the chunk: the out- and down-projection GEMMs add
        into it, the norms read it in place (no partial plane written and read back, no copy to a second buffer)."""
        return self.H % 4 == 0 and self.H <= 4 * 256 * 8

    def _swiglu(self, inter: int, rows: int, of):
        """SwiGLU of `rows` rows of the gate|up product (_gu) into _x16 as the fp16 input of the next GEMM,
        which takes it for `of` (the rows it stands for; never written)."""
        swiglu_rows(gu=self._gu, inter=inter, rows=rows, out16=self._x16)
        self._x16_of = of

    def _valid_len(self, launch):
        """`launch` (whose last argument is the token count) with the chunk's valid length instead, for a
        padded chunk; a whole chunk launches it as prepared."""
        def go():
            if self._valid == self.M:
                launch()
                return
            launch.fn(launch.grid, (launch.block,), launch.args[:-1] + (np.int32(self._valid),),
                      shared_mem=launch.smem)
        go.name = launch.name
        return go

    def _gdn_chunked_form(self):
        """The chunked GDN's in-order pass this plan runs (engine.gpu.plan.gdn_scan_form), or None for the token-by-token
        recurrence."""
        return self.plan.gdn_scan or None

    def run_eager(self):
        for op in self.ops:
            op()

    def run_chunk(self, token_ids, start: int, valid: int | None = None) -> None:
        """One T-token chunk at positions start.. (eager launches on the shared stream). `valid`: only the
        first `valid` tokens are the prompt's, the rest padding: the GDN state and conv history stop
        there, the position advances by `valid`, the logits are row valid - 1's. The padding's K/V land
        past the prompt, where decode writes over them before it reads them (the caller checks room)."""
        self.start = int(start)
        self._valid = self.M if valid is None else int(valid)
        self._x16_of = None  # (_x16 may be another executor's too)
        self._weights16_run_start()
        with self.stream:
            self.tokens.set(np.asarray(token_ids, dtype=np.int32), stream=self.stream)
            self.run_eager()
        self._weights16_run_end()

    def capture(self):
        raise RuntimeError("the GEMM prefill runs eagerly (cuBLAS through CuPy is not stream-captured)")
