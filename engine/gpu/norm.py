"""The residual norms of the CUDA decode step (`NormBlock`, held by `CudaQwen35`): x += the split-K partial planes the
last projection left, then rmsnorm(x) (1 + w), pre-staged as the next GEMVs' pairs, in the plan's form: the cluster
form on sm_90 (cuda/norm_cluster.cu: a cluster of 8 blocks a row, each block its slice of the row and of every plane,
the sums of squares pushed into every block's shared memory before one cluster barrier), else residual_rmsnorm_mb2
(rows of at most 2,048 values: 8 partial planes a round of loads), residual_rmsnorm_mb5_1r (rows of up to 5,120: 5
values a thread, every plane in the first round of loads) or residual_rmsnorm_mb (cuda/norm.cu: each of the row's
blocks reduces the whole row and stages its slice). The block uses the step's shared buffers (engine.gpu.step: part,
xn, xh_n, xinv_n; the residual pair, which it swaps)."""
from __future__ import annotations

from engine.gpu import launch as K


NORM_CL = 8  # (cuda/norm_cluster.cu NORM_CL: blocks a cluster)


def residual_norm(name: str, *, x_in, x_out, planes, nplanes: int, plane_stride: int, weight, out, hidden: int,
                  eps: float, xh, xinv, kpad: int, rows: int, blocks: int = 16, offset: int = 1,
                  xpk=None) -> K.Launch:
    """One residual norm launch of form `name` (engine.gpu.plan.NORMS) over `rows` token rows:
    x_out = x_in + the first `nplanes` split-K planes (planes [S, rows, hidden], `plane_stride` floats apart),
    out = rmsnorm(x_out) (offset + weight), also staged as the GEMVs' int16 pairs (xh [rows, kpad / 2], xinv [rows]).
    x_in and x_out differ (other blocks still read x_in). The cluster form runs NORM_CL blocks of 256 threads a row,
    the multi-block forms `blocks` of 1,024. xpk: the pairs' packed twin (StepContext.twin) also written, or None."""
    args = (x_in, x_out, planes, nplanes, plane_stride, weight, out, hidden, float(eps), offset, xh, xinv, kpad,
            K.or_null(xpk))
    if name == "residual_rmsnorm_cl":
        return K.prepared(name, (NORM_CL, rows), args, block=256)
    return K.prepared(name, (blocks, rows), args, block=1024)


def stage_rows(*, x, ld: int, k: int, kpad: int, xh, ldh: int, xinv, rows: int, blocks: int = 16,
               xpk=None) -> K.Launch:
    """stage_x_mb: the first k values of each of `rows` rows of x (row stride ld) as the GEMVs' int16 pairs, kpad values
    a row (xh [rows, ldh] pairs, zero past k), one inverse scale a row (xinv [rows]); `blocks` blocks of 1,024 a row,
    each reducing the whole row and staging its slice; xpk: the pairs' packed twin (whole rows only), or None."""
    return K.prepared("stage_x_mb", (blocks, rows), (x, ld, k, kpad, xh, ldh, xinv, K.or_null(xpk)), block=1024)


class NormBlock:
    """The step's residual norms over the shared buffers of `c` (a StepContext: the split-K planes, the residual pair,
    the normed row xn and its staged pairs xh_n, xinv_n), in the plan's form."""

    NORM_CL = NORM_CL

    def __init__(self, c):
        if c.H > 8 * 1024:  # residual_rmsnorm_mb holds a row in registers: 8 values a thread
            raise NotImplementedError(f"hidden size {c.H} > 8192 in the CUDA norm kernel")
        self.c = c

    def op(self, splits: int, w) -> K.Launch:
        """x += the first `splits` split-K partials; xn = rmsnorm(x) (1 + w), also pre-staged as int16 pairs for the
        GEMVs."""
        c = self.c
        x_in, x_out = c.swap_residual()
        return residual_norm(c.plan.norm, x_in=x_in, x_out=x_out, planes=c.part, nplanes=splits,
                             plane_stride=c.M * c.H, weight=w, out=c.xn, hidden=c.H, eps=c.args.rms_norm_eps,
                             xh=c.xh_n, xinv=c.xinv_n, kpad=c.kpad_h, rows=c.M, blocks=c.NORM_BLOCKS, xpk=c.xpk_n)
