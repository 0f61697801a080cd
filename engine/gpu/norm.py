"""The residual norms of the CUDA decode step (`CudaQwen35` takes it as a base): x += the split-K partial planes the
last projection left, then rmsnorm(x) (1 + w), pre-staged as the next GEMVs' pairs, in the plan's form: the cluster
form on sm_90 (cuda/norm_cluster.cu: a cluster of 8 blocks a row, each block its slice of the row and of every plane,
the sums of squares pushed into every block's shared memory before one cluster barrier), else residual_rmsnorm_mb2
(rows of at most 2,048 values: 8 partial planes a round of loads), residual_rmsnorm_mb5_1r (rows of up to 5,120: 5
values a thread, every plane in the first round of loads) or residual_rmsnorm_mb (cuda/norm.cu: each of the row's
blocks reduces the whole row and stages its slice). The method uses the executor's buffers (`_alloc`: part, xn, xh_n,
xinv_n; the residual pair _res, which it swaps)."""
from __future__ import annotations

from engine.gpu import launch as K


class NormOps:
    NORM_BLOCKS = 16  # blocks a token row of the multi-block norms and stagings (each reduces the whole row)
    NORM_CL = 8  # (cuda/norm_cluster.cu NORM_CL: blocks a cluster)

    def _norm(self, splits, w):
        """x += split-K partials; xn = rmsnorm(x) (1 + w), also pre-staged as int16 pairs for the GEMVs."""
        if self.H > 8 * 1024:  # residual_rmsnorm_mb holds a row in registers: 8 values a thread
            raise NotImplementedError(f"hidden size {self.H} > 8192 in the CUDA norm kernel")
        x_in, x_out = self._res
        self._res = (x_out, x_in)
        args = (x_in, x_out, self.part, splits, self.M * self.H, w, self.xn, self.H, float(self.args.rms_norm_eps), 1,
                self.xh_n, self.xinv_n, self.kpad_h)
        name = self.plan.norm
        if name == "residual_rmsnorm_cl":
            return K.prepared(name, (self.NORM_CL, self.M), args, block=256)
        return K.prepared(name, (self.NORM_BLOCKS, self.M), args, block=1024)
