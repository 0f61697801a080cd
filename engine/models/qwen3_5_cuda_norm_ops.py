"""The residual norms of the CUDA decode step (`CudaQwen35` takes it as a base): x += the split-K partial planes the
last projection left, then rmsnorm(x) (1 + w), pre-staged as the next GEMVs' pairs, with the switches that pick the
kernel (residual_rmsnorm_mb and its mb2 / mb5 / _1r forms in cuda/norm.cu, the cluster form in cuda/norm_cluster.cu).
The method uses the executor's buffers (`_alloc`: part, xn, xh_n, xinv_n; the residual pair _res, which it swaps)."""
from __future__ import annotations

import os

from engine.ops import kernels as K


class NormOps:
    # blocks a token row of the norms and stagings (each reduces the whole row, stages its slice)
    NORM_BLOCKS = int(os.environ.get("NINFER_NORM_BLOCKS", "16"))
    # rows of at most 2,048 values (the 35B-A3B): residual_rmsnorm_mb2, 8 partial planes a round of loads instead
    # of 2 (the MoE norm sums 9), the same bits (tests/gpu: test_residual_rmsnorm_and_gated,
    # test_norm_mb2_gives_the_same_logits). H200, session 12, in one process: 35B-A3B 401.6 / 401.1 tok/s
    # against 385.3 / 385.0 (NINFER_NORM_MB2=0 for the 2-plane form).
    NORM_MB2 = os.environ.get("NINFER_NORM_MB2", "1") != "0"
    # rows of 2,049-5,120 values (the 27B): residual_rmsnorm_mb5, 5 values a thread and 4 partial planes a round (the
    # fused MLP's 3 down planes in the first round with x_in and w, not 2 rounds), the same bits. Session 16, 27B in one
    # process, two calls: 150.5 / 150.4 against 150.4 / 150.3 (s16b), 151.1 / 151.1 against 151.0 / 151.0 (s16c);
    # NINFER_NORM_MB5=0 for residual_rmsnorm_mb.
    NORM_MB5 = os.environ.get("NINFER_NORM_MB5", "1") != "0"
    # NINFER_NORM_1R (on by default): residual_rmsnorm_mb5 with every partial plane in the first round of loads
    # (residual_rmsnorm_mb5_1r: the SASS of mb5 loaded the 27B's 3 planes a round each after x_in and w), the same
    # bits. Session 18 (s18b, one process, two passes): 27B 154.7 / 154.6 against 153.9 / 153.9 tok/s. (mb2's 9 planes
    # in one round lost on the 35B-A3B, 474.4 against 475.1: removed.)
    NORM_1R = os.environ.get("NINFER_NORM_1R", "1") != "0"
    # NINFER_NORM_CLUSTER (on by default where clusters launch: sm_90, rows of kpad <= 8,192): residual_rmsnorm_cl, a
    # cluster of 8 blocks a row, each block its slice of the row and of every plane, the sums of squares pushed into
    # every block's shared memory before one cluster barrier (the mb forms' blocks each read the whole row and its
    # planes); x_out the same bits, out and the staged pairs within fp32 rounding (GPU tests: the kernel against
    # residual_rmsnorm_mb, the MoE engine's greedy tokens). Session 19, one process, two passes: session 18's form (the
    # pairs read through DSMEM between two barriers), s19a: 35B-A3B 485.1 / 485.4 against 479.9 / 479.7 tok/s, 27B
    # 158.0 / 158.0 against 156.1 / 156.2 (the 27B's norm 3.41 us against 4.44); this one against that, s19c: 35B-A3B
    # 496.2 / 495.9 against 492.6 / 492.4, 27B 159.1 / 159.3 against 158.5 / 158.5. NINFER_NORM_CLUSTER=0 for the mb
    # forms.
    NORM_CLUSTER = os.environ.get("NINFER_NORM_CLUSTER", "1") != "0"
    NORM_CL = 8  # (cuda/norm_cluster.cu NORM_CL, NORM_CL_CHUNKS: blocks a cluster, 32-value chunks a block at most)
    NORM_CL_CHUNKS = 32

    def _norm(self, splits, w):
        """x += split-K partials; xn = rmsnorm(x) (1 + w), also pre-staged as fp16 pairs for the GEMVs."""
        if self.H > 8 * 1024:  # residual_rmsnorm_mb holds a row in registers: 8 values a thread
            raise NotImplementedError(f"hidden size {self.H} > 8192 in the CUDA norm kernel")
        x_in, x_out = self._res
        self._res = (x_out, x_in)
        args = (x_in, x_out, self.part, splits, self.M * self.H, w, self.xn, self.H, float(self.args.rms_norm_eps), 1,
                self.xh_n, self.xinv_n, self.kpad_h)
        if self.NORM_CLUSTER and K.cluster_capable() and self.kpad_h // 32 <= self.NORM_CL * self.NORM_CL_CHUNKS:
            return K.prepared("residual_rmsnorm_cl", (self.NORM_CL, self.M), args, block=256)
        name = ("residual_rmsnorm_mb2" if self.NORM_MB2 and self.H <= 2 * 1024
                else "residual_rmsnorm_mb5" if self.NORM_MB5 and self.H <= 5 * 1024 else "residual_rmsnorm_mb")
        if self.NORM_1R and name == "residual_rmsnorm_mb5":
            name += "_1r"
        return K.prepared(name, (self.NORM_BLOCKS, self.M), args, block=1024)
