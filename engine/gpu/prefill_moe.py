"""The MoE block of the tensor-core prefill (`CudaQwen35Prefill` takes it as a base): the chunk's router
GEMM and top-k, the (token, slot) pairs counted and placed by expert on the device, every routed expert's
weights dequantized in one launch and multiplied in one strided-batched GEMM per projection (or a GEMM
pair per expert), the weighted sum back into token rows, the shared expert as plain GEMMs (35B-A3B pp8192
12,935 tok/s against ~337 token by token through the decode graph). The methods use the executor's
buffers and its GEMM helpers (`_matmul`, `_gemm16`, `_gemm16_batched`, `_dequant`)."""
from __future__ import annotations

import numpy as np

from engine.gpu import launch as K
from engine.gpu.mlp import swiglu_rows


# The chunk's MoE kernels are launched at once (their arguments change every chunk: launch.now).

def route_rows(*, logits, ld: int, experts: int, topk: int, eidx, ewts, ld_w: int, rows: int) -> None:
    """moe.moe_route's top-k over the chunk's `rows` token rows, a warp (a block of 32) a row."""
    I = np.int32
    K.now("moe_route", (rows,), (logits, I(ld), I(experts), I(topk), eidx, ewts, I(ld_w)), block=32)


def count_pairs(*, eidx, pairs: int, counts, rank) -> None:
    """moe_count: the (token, slot) pairs of eidx (the first `pairs`) counted by expert into counts [E] (zeroed
    first), each pair's rank among its expert's into rank [pairs]."""
    K.now("moe_count", (max(1, -(-pairs // 256)),), (eidx, np.int32(pairs), counts, rank))


def place_pairs(*, eidx, pairs: int, topk: int, rank, base, rows, inverse) -> None:
    """moe_place: pair p of expert e at row base[e] + rank[p] of the expert-sorted order: rows [.] its token (-1:
    padding, set first), inverse [pairs] its sorted row."""
    K.now("moe_place", (max(1, -(-pairs // 256)),),
          (eidx, np.int32(pairs), np.int32(topk), rank, base, rows, inverse))


def gather_rows(*, x, ld: int, index, n: int, hidden: int, out16) -> None:
    """moe_gather_f16: out16 [n, hidden] (fp16) = the token rows index [n] of x (fp32, row stride ld; -1: zeros)."""
    K.now("moe_gather_f16", (max(1, n),), (x, np.int32(ld), index, np.int32(hidden), out16))


def combine_rows(*, y, ld_y: int, inverse, ewts, ld_w: int, topk: int, out, ld_out: int, tokens: int) -> None:
    """moe_combine: out[t] += the weighted sum (ewts [tokens, ld_w]) of token t's topk expert rows of y (sorted rows
    inverse[t * topk + s])."""
    I = np.int32
    K.now("moe_combine", (tokens,), (y, I(ld_y), inverse, ewts, I(ld_w), I(topk), out, I(ld_out)))


class PrefillMoeOps:
    def _ffn(self, gu, dn, x, n: int, y):
        """y[:n] = down(silu(gate x) * up x) for the first n rows of x (fp32): a GEMM, the one-pass SwiGLU
        into the fp16 input of the second GEMM, a GEMM."""
        self._matmul(gu, x, self._gu, self._gu.shape[1], rows=n)
        self._swiglu(gu.n // 2, n, self.act)
        self._matmul(dn, self.act, y, y.shape[1], rows=n)

    def _moe_ops(self, L):
        """The chunk's MoE block (`_moe_chunk`): router GEMM and top-k, the (token, slot) pairs grouped by
        expert on the device, every expert's weights dequantized in one launch, the experts' GEMMs, the
        weighted sum back into token rows; the shared expert as plain GEMMs. All of it lands in partial
        0, the only one the next norm reads (`_moe_splits`)."""
        def go():
            self._moe_chunk(L)
        go.name = "moe (router, grouped experts, shared)"
        return [go]

    def _moe_splits(self) -> int:
        return 1  # (_moe_chunk puts the whole block into partial 0)

    # Routed experts through one strided-batched GEMM per projection when padding every expert to the
    # busiest one's row count costs at most this many rows per (token, slot) pair (else a GEMM pair per
    # expert).
    MOE_PAD_WASTE = 1.5
    moe_marks = None  # bench/prefill_profile.py: a list that collects (phase, CUDA event) inside the MoE op

    def _moe_mark(self, name):
        if self.moe_marks is not None:
            e = self.cp.cuda.Event()
            e.record(self.stream)
            self.moe_marks.append((name, e))

    def _moe_chunk(self, L):
        cp, T, H, E, k, ie = self.cp, self.M, self.H, self.args.num_experts, self.topk, self.inter_e
        self._moe_mark("start")
        self._matmul(L["router"], self.xn, self.rlog, self.rlog.shape[1])
        route_rows(logits=self.rlog, ld=E + 1, experts=E, topk=k, eidx=self.eidx, ewts=self.ewts, ld_w=k + 1, rows=T)
        self._moe_mark("router + top-k")
        # the pairs counted by expert on the device; the E counts come back while the shared expert and
        # the routed experts' gate|up dequantization run (the only host sync of the layer)
        n = T * k
        if getattr(self, "_moe_cnt", None) is None:
            self._moe_cnt = cp.zeros(E, dtype=cp.int32)
            self._moe_base = cp.zeros(E, dtype=cp.int32)
            self._moe_rank = cp.zeros(n, dtype=cp.int32)
            self._moe_inv = cp.zeros(n, dtype=cp.int32)
            self._moe_rows = cp.zeros(3 * n // 2, dtype=cp.int32)
            self._cnt_host = np.frombuffer(cp.cuda.alloc_pinned_memory(4 * E), dtype=np.int32, count=E)
            self._cnt_ready = cp.cuda.Event(disable_timing=True)
        cp.cuda.runtime.memsetAsync(self._moe_cnt.data.ptr, 0, 4 * E, self.stream.ptr)
        count_pairs(eidx=self.eidx, pairs=n, counts=self._moe_cnt, rank=self._moe_rank)
        cp.asnumpy(self._moe_cnt, stream=self.stream, out=self._cnt_host, blocking=False)
        self._cnt_ready.record(self.stream)
        out = self.part[0]
        self._ffn(L["shared_gu"], L["shared_down"], self.xn, T, out)
        cp.multiply(out, self.ewts[:, k: k + 1], out=out)  # the shared expert's sigmoid gate
        self._moe_mark("shared expert")
        w16 = self._dequant(L["experts_gu"])  # every routed expert's gate|up at once
        self._cnt_ready.synchronize()
        counts = self._cnt_host.astype(np.int64)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        # Every expert padded to the same row count C, when that wastes little (MOE_PAD_WASTE): then one
        # strided-batched GEMM per projection over all experts, else a GEMM pair per expert.
        cap = -(-int(counts.max()) // 8) * 8
        batched = E * cap <= self.MOE_PAD_WASTE * n
        nr = E * cap if batched else n
        if self._moe_rows.size < nr:
            self._moe_rows = cp.zeros(nr, dtype=cp.int32)
        self._moe_base.set((np.arange(E) * cap if batched else bounds[:-1]).astype(np.int32), stream=self.stream)
        cp.cuda.runtime.memsetAsync(self._moe_rows.data.ptr, 0xFF, 4 * nr, self.stream.ptr)  # -1: padding
        place_pairs(eidx=self.eidx, pairs=n, topk=k, rank=self._moe_rank, base=self._moe_base, rows=self._moe_rows,
                    inverse=self._moe_inv)
        bufs = self._moe_bufs  # (shared by the executors of one engine, grown to the largest need)
        if bufs.get("rows", -1) < nr:
            bufs["rows"] = r = max(nr, 3 * n // 2)  # (the memory plan counts 1.5 rows a pair)
            bufs["x"] = cp.empty((r, H), dtype=cp.float16)  # the pairs' input rows, sorted
            bufs["gu"] = cp.empty((r, 2 * ie), dtype=cp.float16)  # gate|up products
            bufs["act"] = cp.empty((r, ie), dtype=cp.float16)  # SwiGLU
            bufs["y"] = cp.empty((r, H), dtype=cp.float32)  # expert outputs, sorted
        xs16, gus, acts16, ys = bufs["x"], bufs["gu"], bufs["act"], bufs["y"]
        gather_rows(x=self.xn, ld=self.xn.shape[1], index=self._moe_rows, n=nr, hidden=H, out16=xs16)
        live = [(int(e), int(bounds[e]), int(bounds[e + 1])) for e in np.flatnonzero(counts)]
        if batched:
            self._gemm16_batched(w16, 2 * ie, H, xs16, cap, gus, E)
        else:
            for e, a, b in live:
                self._gemm16(w16[e * 2 * ie:(e + 1) * 2 * ie], xs16[a:b], gus[a:], 2 * ie)
        swiglu_rows(gu=gus, inter=ie, rows=nr, out16=acts16)
        w16 = self._dequant(L["experts_down"])
        if batched:
            self._gemm16_batched(w16, H, ie, acts16, cap, ys, E)
        else:
            for e, a, b in live:
                self._gemm16(w16[e * H:(e + 1) * H], acts16[a:b], ys[a:], H)
        combine_rows(y=ys, ld_y=H, inverse=self._moe_inv, ewts=self.ewts, ld_w=self.ewts.shape[1], topk=k, out=out,
                     ld_out=H, tokens=T)
        self._moe_mark("routed experts (count, place, gather, dequant, GEMMs, combine)")
