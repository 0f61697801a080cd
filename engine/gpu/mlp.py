"""The dense MLP block of the CUDA decode step (`MlpBlock`, held by `CudaQwen35`): one persistent launch (the
post-attention norm, gate|up, the down's staging and down; the layer's o-projection first), or gate|up with SwiGLU,
staging, down into split-K partials. The block builds graph ops from the step's shared buffers and GEMV helpers
(engine.gpu.step)."""
from __future__ import annotations

import numpy as np

from engine.gpu import launch as K
from engine.gpu.gemv import mlp_fused_help_words, mlp_fused_launch


def stage_amax(*, x, k: int, kpad: int, xh, xinv, slot, blocks: int = 16, rows: int = 1, xpk=None) -> K.Launch:
    """stage_x_amax: the first k values of each of `rows` rows of x ([rows, >= k]) as the GEMVs' int16 pairs (xh
    [rows, kpad / 2]) with the scale of the row maximum the gate|up GEMV folded into slot (2 uint32 a row: max bits,
    block tickets; left at zero), xinv [rows] its inverse; `blocks` blocks of 1,024 a row, each its slice; xpk: the
    pairs' packed twin, or None."""
    ldx = x.strides[0] // x.itemsize if x.ndim > 1 else 0
    ldh = xh.strides[0] // xh.itemsize if xh.ndim > 1 else 0
    return K.prepared("stage_x_amax", (blocks, rows), (x, ldx, k, kpad, xh, ldh, xinv, slot, K.or_null(xpk)),
                      block=1024)


def swiglu_rows(*, gu, inter: int, rows: int, out16) -> None:
    """Launched at once: out16 [rows, inter] (fp16) = silu(gate) * up of the rows of gu (fp32 or fp16 [gate | up], any
    row stride): swiglu_rows_h or swiglu_rows_f16."""
    name = "swiglu_rows_h" if gu.dtype == np.float16 else "swiglu_rows_f16"
    K.now(name, (max(1, min(-(-rows * inter // 4 // 256), K.sm_count() * 16)),),
          (gu, np.int64(gu.shape[1]), np.int32(inter), np.int32(rows), out16))


class MlpBlock:
    """The dense MLP of the step over the shared buffers of `c` (a StepContext); it holds the fused launch's chunk
    scales, grid barrier counters and help words."""

    # The post-attention norm and the dense MLP as one persistent launch where the plan's mlp_fused is on
    # (cuda/mlp_fused.cu): every block stages the normed row itself while its first gate|up loads are in flight, and
    # its own 32-value chunks of the SwiGLU row with a power-of-two scale each before a grid barrier (the down
    # multiplies a chunk scale in; the chunks left over after an equal share a block are spread over every warp of the
    # launch in 32-lane slices, summed by their owners); the down-projection's first loads between its arrival and
    # its wait, into 3 split-K planes. The layer's o-projection goes first in the same launch (split-K items over
    # every warp, 2 planes, 3 loads a lane in flight, a grid barrier with the norm's x and weight loaded before its
    # wait): from the gated norm's chunk-scaled pairs (GDN layers) or the attention combine's one-scale pairs. The
    # grid barriers in their red form (arrivals by a release reduction: cuda/persistent.cu).
    MLP_FUSED_SPLITS = 3
    MLP_FUSED_O_SPLITS = 2
    MLP_FUSED_OU = 3

    def __init__(self, c):
        self.c = c
        self.xsc_act = None
        self.barriers = {}  # (with the o-projection or not) -> (barrier, the chunked form's barrier, help words)

    def _chunk_scales(self):
        """mlp_fused's chunk scales (a float a 32-value chunk of the SwiGLU row)."""
        if self.xsc_act is None:
            self.xsc_act = self.c.cp.zeros(self.c.kpad_act // 32, dtype=self.c.cp.float32)
        return self.xsc_act

    def _barrier_words(self, with_o: bool, gu):
        """The grid barrier counters (one a form: the helpers' counts follow it) and help words of the launches with
        the o-projection or without (two barriers, their own counters)."""
        if with_o not in self.barriers:
            cp = self.c.cp
            bar, bar_help = cp.zeros(1, dtype=cp.uint64), cp.zeros(1, dtype=cp.uint64)
            # (a grid of up to 2 blocks a multiprocessor; mlp_fused_launch checks the size)
            self.barriers[with_o] = bar, bar_help, cp.zeros(mlp_fused_help_words(K.sm_count() * 2, gu),
                                                             dtype=cp.uint32)
        return self.barriers[with_o]

    def fused_ops(self, L, splits: int, oproj=None):
        """(ops, partial planes) of the post-attention norm and the dense MLP as one mlp_fused launch, or None where
        the plan has it off or its rules do not hold (one token row, q4 gate|up and q5 down, H <= 8,192).
        oproj: (o, xh_o, xsc_o, chunked): the layer's o-projection first in the same launch (its own barrier counter
        and help words; chunked False: xsc_o is the row's one inverse scale)."""
        c = self.c
        gu, dn = L["gate_up"], L["down"]
        if not (c.plan.mlp_fused and c.M == 1 and c.H <= 8 * 1024):
            return None
        x_in, x_out = c.res
        H = c.H
        norm = (x_in, x_out, c.part, splits, c.M * H, L["post_norm"], H, float(c.args.rms_norm_eps), c.kpad_h)
        scales = self._chunk_scales()
        bar, bar_help, help_ = self._barrier_words(oproj is not None, gu)
        o_arg = None
        if oproj is not None:
            o, xh_o, xsc_o, chunked = oproj
            o_arg = (o, xh_o, xsc_o, self.MLP_FUSED_O_SPLITS, chunked, self.MLP_FUSED_OU)

        def launch(chunk_scales):
            return mlp_fused_launch(gu, dn, norm, c.act, c.kpad_act, c.xh_act, c.xinv_act, c.stage_slot, c.part,
                                    self.MLP_FUSED_SPLITS, bar_help if chunk_scales is not None else bar,
                                    local_stage=True, chunk_scales=chunk_scales, help=help_, oproj=o_arg,
                                    xw_early=True, light_bar=2)
        try:  # chunked first; where a block would own more chunks than its shared row holds, one scale for the row
            got = launch(scales) or (launch(None) if oproj is None else None)
        except RuntimeError:  # (no block of it fits on this GPU: the four kernels)
            return None
        if got is None or got[1] > c.max_splits:
            return None
        c.swap_residual()
        return [got[0]], got[1]

    def ops(self, L, xn) -> tuple[list, int]:
        """The dense MLP's ops (gate|up with SwiGLU folding the row's largest |value|, stage_x_amax staging the row
        with it, down into partials) and the partial planes the next norm sums."""
        c = self.c
        gu, dn = L["gate_up"], L["down"]
        gu_plan = c.plan_gemv(gu, c.xn, c.act, "swiglu", 1, xn, amax_out=c.stage_slot)
        d_plan = c.plan_gemv(dn, c.act, c.part, "partial", c.splits(dn), (c.xh_act, c.xinv_act, c.xpk_act))
        ops = [gu_plan.launch]
        if gu_plan.tracks_amax:
            ops.append(stage_amax(x=c.act, k=c.inter, kpad=c.kpad_act, xh=c.xh_act, xinv=c.xinv_act,
                                  slot=c.stage_slot, blocks=c.NORM_BLOCKS, rows=c.M, xpk=c.xpk_act))
        else:
            ops.append(c.stage(c.act, c.inter, c.kpad_act, c.xh_act, c.xinv_act))
        return ops + [d_plan.launch], d_plan.splits
