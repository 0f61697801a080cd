"""Is gemv_mma bound by its DRAM access pattern or by its own work? Times the register kernel and the
MMA variants on weights that stay in L2 (one 10 MB copy replayed) and on weights streamed from DRAM
(copies rotating through more than the L2 holds). GPU machine: python bench/mma_probe.py"""
import cupy as cp
import numpy as np

from bench.gemv_sweep import time_plans
from engine.gpu.weights import random_matrix
from engine.gpu import launch as K
from engine.gpu.gemv import GemvPlan


def main():
    rng = cp.random.default_rng(0)
    for fmt in ("q4_g64_fp16", "q5_g64_fp16"):
        n, k = 4096, 5120
        copies = [random_matrix(cp, rng, fmt, n, k) for _ in range(8)]
        x = cp.asarray(np.random.default_rng(1).standard_normal((1, k)).astype(np.float32))
        xpre = (cp.zeros((1, k // 2), dtype=cp.uint32), cp.zeros(1, dtype=cp.float32))
        K.prepared("stage_x", (1,), (x, k, k, k, xpre[0], xpre[1]), block=1024)()
        y = cp.zeros((8, n), cp.float32)
        variants = [dict(rows=4, unroll=2), dict(rows=2, unroll=2), dict(mma=(1, 8, 2)), dict(mma=(1, 4, 4)),
                    dict(mma=(1, 8, 8))]
        for v in variants:
            out = []
            for label, ws in (("L2", copies[:1] * 8), ("DRAM", copies)):
                us = time_plans([GemvPlan(w, x, k, y, n, epi="store", xpre=xpre, **v) for w in ws]) * 1e3
                out.append(f"{label} {us:6.2f} us ({copies[0].nbytes / us / 1e3:6.0f} GB/s)")
            print(f"{fmt} {n}x{k} {v}: " + ", ".join(out), flush=True)


if __name__ == "__main__":
    main()
