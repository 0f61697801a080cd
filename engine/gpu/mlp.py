"""The dense MLP block of the CUDA decode step (`CudaQwen35` takes it as a base): one persistent launch (the
post-attention norm, gate|up, the down's staging and down; the layer's o-projection first), or gate|up with SwiGLU,
staging, down into split-K partials. The methods build graph ops from the executor's buffers (`_alloc`) and helpers
(`_plan_gemv`, `_stage`, `_splits`)."""
from __future__ import annotations

import numpy as np

from engine.gpu import launch as K
from engine.gpu.gemv import mlp_fused_help_words, mlp_fused_launch


def stage_amax(*, x, k: int, kpad: int, xh, xinv, slot, blocks: int = 16) -> K.Launch:
    """stage_x_amax: one row's first k values (x [1, >= k]) as the GEMVs' int16 pairs (xh [kpad / 2]) with the scale of
    the row maximum the gate|up GEMV folded into slot (2 uint32: max bits, block tickets; left at zero), xinv [1] its
    inverse; `blocks` blocks of 1,024, each its slice."""
    return K.prepared("stage_x_amax", (blocks,), (x, k, kpad, xh, xinv, slot), block=1024)


def swiglu_rows(*, gu, inter: int, rows: int, out16) -> None:
    """Launched at once: out16 [rows, inter] (fp16) = silu(gate) * up of the rows of gu (fp32 or fp16 [gate | up], any
    row stride): swiglu_rows_h or swiglu_rows_f16."""
    name = "swiglu_rows_h" if gu.dtype == np.float16 else "swiglu_rows_f16"
    K.now(name, (max(1, min(-(-rows * inter // 4 // 256), K.sm_count() * 16)),),
          (gu, np.int64(gu.shape[1]), np.int32(inter), np.int32(rows), out16))


class MlpOps:
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

    def _chunk_scales(self):
        """mlp_fused's chunk scales (a float a 32-value chunk of the SwiGLU row)."""
        if getattr(self, "xsc_act", None) is None:
            self.xsc_act = self.cp.zeros(self.kpad_act // 32, dtype=self.cp.float32)
        return self.xsc_act

    def _ffn_fused_ops(self, L, splits: int, oproj=None):
        """(ops, partial planes) of the post-attention norm and the dense MLP as one mlp_fused launch, or None where
        the plan has it off or its rules do not hold (one token row, q4 gate|up and q5 down, H <= 8,192).
        oproj: (o, xh_o, xsc_o, chunked): the layer's o-projection first in the same launch (its own barrier counter
        and help words; chunked False: xsc_o is the row's one inverse scale)."""
        gu, dn = L["gate_up"], L["down"]
        if not (self.plan.mlp_fused and self.M == 1 and self.H <= 8 * 1024):
            return None
        x_in, x_out = self._res
        H = self.H
        norm = (x_in, x_out, self.part, splits, self.M * H, L["post_norm"], H, float(self.args.rms_norm_eps), self.kpad_h)
        scales = self._chunk_scales()
        sfx = "_o" if oproj is not None else ""  # (launches with the o-projection: two barriers, their own counters)
        if getattr(self, "mlp_bar" + sfx, None) is None:
            setattr(self, "mlp_bar" + sfx, self.cp.zeros(1, dtype=self.cp.uint64))
        if getattr(self, "mlp_help" + sfx, None) is None:  # (its own barrier counter: the helpers' counts follow it)
            setattr(self, "mlp_bar_help" + sfx, self.cp.zeros(1, dtype=self.cp.uint64))
            # (a grid of up to 2 blocks a multiprocessor; mlp_fused_launch checks the size)
            setattr(self, "mlp_help" + sfx,
                    self.cp.zeros(mlp_fused_help_words(K.sm_count() * 2, gu), dtype=self.cp.uint32))
        help_ = getattr(self, "mlp_help" + sfx)
        o_arg = None
        if oproj is not None:
            o, xh_o, xsc_o, chunked = oproj
            o_arg = (o, xh_o, xsc_o, self.MLP_FUSED_O_SPLITS, chunked, self.MLP_FUSED_OU)

        def launch(chunk_scales):
            return mlp_fused_launch(gu, dn, norm, self.act, self.kpad_act, self.xh_act, self.xinv_act,
                                    self.stage_slot, self.part, self.MLP_FUSED_SPLITS,
                                    getattr(self, ("mlp_bar_help" if chunk_scales is not None else "mlp_bar") + sfx),
                                    local_stage=True, chunk_scales=chunk_scales, help=help_, oproj=o_arg,
                                    xw_early=True, light_bar=2)
        try:  # chunked first; where a block would own more chunks than its shared row holds, one scale for the row
            got = launch(scales) or (launch(None) if oproj is None else None)
        except RuntimeError:  # (no block of it fits on this GPU: the four kernels)
            return None
        if got is None or got[1] > self.max_splits:
            return None
        self._res = (x_out, x_in)
        return [got[0]], got[1]

    def _ffn_ops(self, L, xn) -> tuple[list, int]:
        """The dense MLP's ops (gate|up with SwiGLU folding the row's largest |value|, stage_x_amax staging the row
        with it, down into partials) and the partial planes the next norm sums."""
        gu, dn = L["gate_up"], L["down"]
        gu_plan = self._plan_gemv(gu, self.xn, self.act, "swiglu", 1, xn, amax_out=self.stage_slot)
        d_plan = self._plan_gemv(dn, self.act, self.part, "partial", self._splits(dn), (self.xh_act, self.xinv_act))
        ops = [gu_plan.launch]
        if gu_plan.tracks_amax:
            ops.append(stage_amax(x=self.act, k=self.inter, kpad=self.kpad_act, xh=self.xh_act, xinv=self.xinv_act,
                                  slot=self.stage_slot, blocks=self.NORM_BLOCKS))
        else:
            ops.append(self._stage(self.act, self.inter, self.kpad_act, self.xh_act, self.xinv_act))
        return ops + [d_plan.launch], d_plan.splits
