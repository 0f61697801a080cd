"""The tensor-core prefill's GEMM weights as fp16 (`CudaQwen35Prefill` takes it as a base): each packed
matrix dequantized once per chunk (`dequant_rs`) into one of a ring of fp16 buffers, dense models' on a
second stream ahead of their GEMMs. The methods use the executor's `cp`, `layers`, `args` and
`_gdn_chunked_form`; the executor calls `_init_weights16` once its `_wbufs` are allocated (or shared),
`_weights16_run_start` / `_weights16_run_end` around each chunk's run, `_weights16` before each GEMM and
`_gemm_issued` after it, and puts `_dq_window_op()` before each GDN layer's in-order pass."""
from __future__ import annotations

import numpy as np

from engine.gpu.memory import PREFILL_DQ_BUFS
from engine.gpu import launch as K


def dequant_rows(w, *, out, ld: int) -> None:
    """Launched at once: dequant_rs<format>, the row-split matrix w as fp16 out [w.n, ld] (its first w.k columns), a
    block a row."""
    K.now(f"dequant_rs<{K.FMT_IDS[w.fmt]}>", (w.n,), (np.uint64(w.ptr(w.base)), np.uint64(w.ptr(w.high)),
                                                       np.uint64(w.ptr(w.scales)), np.int32(w.gpr), np.int32(w.k), out,
                                                       np.int32(ld)))


class PrefillWeights16:
    # Dense models: the GEMMs' weights are dequantized to fp16 on a second stream ahead of their GEMMs (the
    # chunk's weight order recorded on its first run); the GEMMs are bound by the tensor cores, the
    # dequantization by DRAM. GEMM i reads fp16 buffer i % DQ_BUFS, so weight j is dequantized once GEMM
    # j - DQ_BUFS is done with it. Each GEMM issues the next one's (it runs beside that GEMM); with 3 buffers
    # a GDN layer's o-projection, gate|up and down weights wait for its window just before its in-order pass
    # (_dq_window_op: an event there, as the host runs far ahead of the GPU), which leaves 36 of the 27B's
    # 132 SMs idle (27B pp8192: beside prep_cols, that kernel took 33 ms against 17.5); with 5,
    # the next layer's first two too. In one process: 0.792 s with 3 buffers, 0.808 with 2,
    # 0.793 with 5. Never across an attention layer's flash kernel, which it slowed more than it saved
    # (27B pp8192: 68.8 -> 76.0 ms): that layer's o-projection weights are dequantized in place, after it.
    DQ_BUFS = PREFILL_DQ_BUFS

    def _dq_bufs(self) -> int:
        """fp16 weight buffers: DQ_BUFS for a dense model, 1 for MoE (its experts are dequantized together)."""
        return self.DQ_BUFS if not self.args.is_moe else 1

    def _weights16(self, w):
        """w as fp16 [n, k] for the next GEMM (which the caller issues, then calls _gemm_issued)."""
        nbuf = len(self._wbufs)
        if nbuf == 1:
            return self._dequant(w)
        i, seq = self._wpos, self._wseq
        self._wpos += 1
        self._wlog.append(w)
        main = self.cp.cuda.get_current_stream()
        if seq is None or i >= len(seq) or seq[i] is not w:  # recording (the first run), or off the record
            self._wseq, self._issued = None, 1 << 62
            for ev in self._dq_done:  # (nothing of the side in flight)
                K.wait_join(main, ev)
            return self._dequant(w, self._buf(i))
        if i == 0:
            # a chunk's first GEMM: whatever the side stream still had in flight lands first, and the side
            # stream starts after everything the main stream holds so far -- the GEMMs of an executor that
            # ran before this one on the same buffers (`share`) read them without this one's events
            for ev in self._dq_done:
                K.wait_join(main, ev)
            self._chunk_start.record(main)
            K.wait_join(self._dq_stream, self._chunk_start)
            self._issued = 0
        if i >= self._issued:  # not launched ahead: in place
            self._dequant(w, self._buf(i))
            self._issued = i + 1
        else:
            K.wait_join(main, self._dq_done[i % nbuf])
        self._issue_ahead(i + 2)  # the next one (further at a window: _dq_window_op)
        return self._buf(i)[: w.n * w.k].reshape(w.n, w.k)

    def _issue_ahead(self, end: int, window: bool = False):
        """Weights [_issued, end) of the recorded order dequantized on the side stream, each after GEMM
        j - nbuf, its buffer's last reader (issued before: end <= the last GEMM issued + nbuf + 1; its event
        in slot j % nbuf); stopping at an attention layer's o-projection, and, but at a window, at a GDN
        layer's (left to its window)."""
        nbuf, seq = len(self._wbufs), self._wseq
        side, j = self._dq_stream, self._issued
        while (j < min(end, len(seq)) and id(seq[j]) not in self._no_ahead
               and (window or id(seq[j]) not in self._window_o)):
            K.wait_join(side, self._gemm_done[j % nbuf])
            with side:
                self._dequant(seq[j], self._buf(j))
            self._dq_done[j % nbuf].record(side)
            j += 1
        self._issued = j

    def _buf(self, i: int):
        return self._wbufs[i % len(self._wbufs)]

    def _gemm_issued(self):
        if len(self._wbufs) > 1:
            self._gemm_done[(self._wpos - 1) % len(self._wbufs)].record(self.cp.cuda.get_current_stream())

    def _dequant(self, w, buf=None):
        cp = self.cp
        out = (self._w16 if buf is None else buf)[: w.n * w.k].reshape(w.n, w.k)
        if w.fmt == "bf16":
            bits = w.buf[w.base: w.base + 2 * w.n * w.k].view(cp.uint16).reshape(w.n, w.k)
            out[...] = cp.left_shift(bits.astype(cp.uint32), 16).view(cp.float32)
        elif w.fmt == "fp32":
            out[...] = w.buf[w.base: w.base + 4 * w.n * w.k].view(cp.float32).reshape(w.n, w.k)
        else:
            dequant_rows(w, out=out, ld=w.k)
        return out

    def _init_weights16(self):
        """The ring's state, once `_wbufs` holds this executor's fp16 buffers (its own or `share`'s)."""
        cp = self.cp
        self._w16 = self._wbufs[0]
        nbuf = len(self._wbufs)
        self._wseq, self._wlog, self._wpos = None, [], 0  # the chunk's GEMM weights in order
        self._dq_stream = cp.cuda.Stream(non_blocking=True) if nbuf > 1 else None
        self._issued = 0  # this run's weights [0, _issued) of _wseq are dequantized (ahead or in place)
        self._no_ahead = {id(L["o"]) for L in self.layers if L["kind"] == "full_attention"}
        self._window_o = ({id(L["o"]) for L in self.layers if L["kind"] != "full_attention"}
                          if self._dq_bufs() > 2 and self._gdn_chunked_form() is not None else set())
        self._dq_done = [cp.cuda.Event(disable_timing=True) for _ in range(nbuf)]
        self._gemm_done = [cp.cuda.Event(disable_timing=True) for _ in range(nbuf)]
        self._chunk_start = cp.cuda.Event(disable_timing=True)
        self._window_ev = cp.cuda.Event(disable_timing=True)

    def _weights16_run_start(self):
        self._wpos, self._wlog = 0, []

    def _weights16_run_end(self):
        if self._wseq is None and self._wlog:  # the first run's order, for the later runs
            self._wseq = self._wlog

    def _dq_window_op(self):
        """Before a GDN layer's in-order pass: the next weights dequantized on the side stream as far ahead
        as the buffers allow (see the class comment)."""
        def window():  # (GEMM _wpos - 1 issued: up to weight _wpos - 1 + nbuf; the o-projection's included)
            if self._wseq is not None and self._wpos > 0 and self._issued < len(self._wseq):
                # the side stream starts them here in GPU time too (the host is far ahead of the GPU: a
                # GEMM's event alone would let them start as soon as that GEMM is done)
                self._window_ev.record(self.cp.cuda.get_current_stream())
                K.wait_join(self._dq_stream, self._window_ev)
                self._issue_ahead(self._wpos + len(self._wbufs), window=True)
        window.name = "dequantize ahead (window)"
        return window
