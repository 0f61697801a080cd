"""The MTP head's rows over what the target prefills (spec/runtime.md §3.6: the MTP layer reads the target's final
hidden state at every position, so its KV pool must hold the prompt's rows too; engine.speculative.MTPDrafter is the
NumPy form).

The target's prefill hands each chunk's final hidden rows to `MtpPrompt.absorb` (CudaModel.hidden_sink), which stages
them with the token after each; the prompt's last row waits for the first sampled token (`flush`). The staged rows run
through the MTP head as a tensor-core prefill chunk (`CudaMtpPrefill`, GEMM_ROWS rows, fewer padded) where there are
at least GEMM_MIN of them, else 8 positions a pass (`CudaMtpColumns`, the columns step's GEMVs): the MTP input stage
[rmsnorm(embedding of the next token), rmsnorm(hidden)], the input projection, the MTP's full-attention block (its
K/V into the MTP's pool at those positions) and its final norm; no head.
"""
from __future__ import annotations

import numpy as np

from engine.gpu import launch as K
from engine.gpu.columns import ColumnsAttention, CudaQwen35Columns
from engine.gpu.gemv import GemvPlan, embed_rows
from engine.gpu.memory import MTP_PROMPT_ROWS
from engine.gpu.prefill import CudaQwen35Prefill

GEMM_ROWS = MTP_PROMPT_ROWS  # rows a tensor-core MTP chunk (its padding's K/V: the MTP pool's pages past the context)
GEMM_MIN = 64  # staged rows worth a tensor-core chunk (fewer: 8-position passes)
COLS = 8  # positions a columns pass
INPUT_BLOCKS = 4  # mtp_input's blocks a row where it stages the row (each stages a quarter)


def mtp_input(*, e, h, mtp, rows: int, out, staged=None) -> K.Launch:
    """mtp_input (cuda/spec.cu): rows of [rmsnorm(e) (1 + we), rmsnorm(h) (1 + wh)] into out [rows, 2H]; staged: (xh
    [rows, kpad / 2] uint32, xinv [rows]) where the input projection's GEMV reads the rows pre-staged (`staged_input`),
    else None."""
    xh, xinv = staged if staged is not None else (None, None)
    null = np.uint64(0)
    stage = (xh, xinv, xh.shape[1] * 2) if xh is not None else (null, null, 0)
    return K.prepared("mtp_input", (INPUT_BLOCKS if xh is not None else 1, rows),
                      (e, h, mtp.e_norm, mtp.h_norm, mtp.H, float(mtp.args.rms_norm_eps), out) + stage, block=1024)


def staged_input(cp, rows: int, H: int) -> tuple:
    """Buffers for `rows` MTP input rows (2H values) staged as the GEMVs' int16 pairs: (pairs, inverse scales)."""
    kpad = -(-2 * H // K.XPAD) * K.XPAD
    return cp.zeros((rows, kpad // 2), dtype=cp.uint32), cp.zeros(rows, dtype=cp.float32)


class CudaMtpColumns(CudaQwen35Columns):
    """The MTP head over COLS consecutive target positions: row t takes the target's final hidden state at position
    pos + t (`hid`) and the token after it (`tokens`). The decode executor it extends is the MTP's (engine.gpu.verify
    CudaMtp): its layer, pool and position."""

    ATTN = ColumnsAttention  # (two caught-up columns a tile)

    def __init__(self, mtp, cols: int = COLS, hid=None):
        """hid: the hidden rows [cols, H] to read in place (the verified columns' own, in a round); None: its own
        buffer, which the caller fills."""
        self.mtp, self._hid = mtp, hid
        super().__init__(mtp, cols)

    def _alloc_state(self):
        super()._alloc_state()
        cp, T, H, f32 = self.cp, self.M, self.H, self.cp.float32
        self.hid = cp.zeros((T, H), f32) if self._hid is None else self._hid
        self.e_raw, self.cat = cp.zeros((T, H), f32), cp.zeros((T, 2 * H), f32)
        self.cat_staged = staged_input(cp, T, H)

    def _embed_ops(self, out=None):
        fc = GemvPlan(self.mtp.fc, self.cat, 2 * self.H, self.ctx.x, self.H, m=self.M, xpre=self.cat_staged).launch
        return super()._embed_ops(out=self.e_raw) + [
            mtp_input(e=self.e_raw, h=self.hid, mtp=self.mtp, rows=self.M, out=self.cat, staged=self.cat_staged), fc]

    def _tail_ops(self):
        return []


class CudaMtpPrefill(CudaQwen35Prefill):
    """The MTP head over GEMM_ROWS consecutive target positions as a tensor-core prefill chunk (the MTP's one layer,
    its weights dequantized once a chunk), the hidden rows in `hid`; `share`: the target's largest prefill executor,
    whose fp16 scratch it uses too."""

    def __init__(self, mtp, rows: int = GEMM_ROWS, share=None):
        self.mtp = mtp
        super().__init__(mtp, rows, share=share if share is not None and share.M >= rows else None)
        if self._x16.size < self.M * 2 * self.H:  # (the input projection's K is 2H)
            self._x16 = self.cp.empty(self.M * 2 * self.H, dtype=self.cp.float16)

    def _alloc(self, d):
        super()._alloc(d)
        cp, M, H, f32 = self.cp, self.M, self.H, self.cp.float32
        self.hid, self.e_raw, self.cat = cp.zeros((M, H), f32), cp.zeros((M, H), f32), cp.zeros((M, 2 * H), f32)

    def _plan(self) -> list:
        ops = super()._plan()  # [positions, the embedding, the layer ...]: the embedding gives way to the input stage
        T, H = self.M, self.H
        stage = [embed_rows(self.embed, tokens=self.tokens, out=self.e_raw, ld=H, rows=T),
                 mtp_input(e=self.e_raw, h=self.hid, mtp=self.mtp, rows=T, out=self.cat),
                 self._gemm(self.mtp.fc, self.cat, self.x)]
        return ops[:1] + stage + ops[2:]

    def _tail_ops(self):
        return []


class MtpPrompt:
    """The staged rows and their passes. `done`: the target positions whose MTP rows are in its pool or staged, for
    the sequence it follows; `lost`: a chunk did not continue that sequence (the caller then prefills again)."""

    def __init__(self, mtp, share=None):
        self.mtp = mtp
        self.cols = CudaMtpColumns(mtp)
        self.cols.capture()
        self.gemm = CudaMtpPrefill(mtp, share=share)
        self.stage = self.gemm.hid  # (the staged rows; a columns pass copies its 8 from here)
        self.restart()

    def restart(self) -> None:
        self.done, self.base, self.toks, self.lost = 0, 0, [], False  # staged: positions base.., their next tokens

    def absorb(self, xn, rows: int, position: int, nxt) -> None:
        """Stage rows [0, rows) of xn [., H] (the target's final hidden states at positions position..), each with
        the token after it (nxt[r]; past its end: not known yet)."""
        if position == 0:
            self.restart()
        if self.lost or position != self.base + len(self.toks) or (self.toks and self.toks[-1] is None):
            self.lost = True
            return
        G, r = self.stage.shape[0], 0
        while r < rows:
            n = min(rows - r, G - len(self.toks))
            self._copy(self.stage[len(self.toks):], xn[r:], n)
            self.toks += [int(t) for t in nxt[r:r + n]] + [None] * (n - len(nxt[r:r + n]))
            r += n
            if len(self.toks) == G and self.toks[-1] is not None:
                self._run()
        self.done = self.base + len(self.toks)

    def flush(self, token: int) -> None:
        """The staged rows through the MTP, the last one's next token `token` (the first one sampled)."""
        if self.lost or not self.toks:
            return
        if self.toks[-1] is None:
            self.toks[-1] = int(token)
        self._run()

    def _copy(self, dst, src, rows: int) -> None:
        cp = self.mtp.cp
        cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, rows * self.mtp.H * 4,
                                    cp.cuda.runtime.memcpyDeviceToDevice, self.mtp.stream.ptr)

    def _run(self) -> None:
        n, stream = len(self.toks), self.mtp.stream
        pos = self.mtp.pos
        if n >= GEMM_MIN:
            g = self.gemm
            pos[:1].set(np.asarray([self.base], dtype=np.int32), stream=stream)
            g.run_chunk(self.toks + [0] * (g.M - n), self.base, valid=None if n == g.M else n)
        else:
            c = self.cols
            for j in range(0, n, c.M):
                m = min(c.M, n - j)
                self._copy(c.hid, self.stage[j:], m)
                c.tokens.set(np.asarray(self.toks[j:j + m] + [0] * (c.M - m), dtype=np.int32), stream=stream)
                pos[:1].set(np.asarray([self.base + j], dtype=np.int32), stream=stream)
                c.graph.launch(stream)
        self.base += n
        self.toks = []
        self.done = self.base
