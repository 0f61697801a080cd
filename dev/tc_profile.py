"""One multi-column GEMV (gemv_tc) over a random packed matrix, for a profiler (GPU machine only):

    ncu --clock-control none --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
        --section SourceCounters --section MemoryWorkloadAnalysis \
        --metrics 'regex:smsp__pcsamp_warps_issue_stalled_[a-z_]*$,l1tex__t_sector_hit_rate.pct,smsp__inst_executed.sum' \
        -k regex:gemv_tc -c 1 python dev/tc_profile.py [--fmt q4_g64_fp16] [--n 34816] [--k 5120] [--cols 4]

x pre-staged as the producers stage it (stage_x_mb); the launch runs --iters times after one warm-up, and the mean
time is printed.
"""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fmt", default="q4_g64_fp16")
    ap.add_argument("--n", type=int, default=34816)
    ap.add_argument("--k", type=int, default=5120)
    ap.add_argument("--cols", type=int, default=4)
    ap.add_argument("--iters", type=int, default=3)
    a = ap.parse_args(argv)
    import cupy as cp

    from engine.gpu import kernel_names as KN
    from engine.gpu import launch as K
    from engine.gpu.gemv import GemvPlan
    from engine.gpu.norm import stage_rows
    from engine.gpu.weights import random_matrix

    M = a.cols
    K.require(KN.gemv_names(range(4), (M,), pair=False, bf16=False, conv=[], xs=[]))
    w = random_matrix(cp, cp.random.default_rng(0), a.fmt, a.n, a.k)
    kpad = -(-w.k // K.XPAD) * K.XPAD
    x = cp.random.default_rng(1).standard_normal((M, w.k), dtype=cp.float32)
    xh, xinv = cp.zeros((M, kpad // 2), dtype=cp.uint32), cp.zeros(M, dtype=cp.float32)
    stage_rows(x=x, ld=w.k, k=w.k, kpad=kpad, xh=xh, ldh=kpad // 2, xinv=xinv, rows=M, blocks=3)()
    y = cp.zeros((M, w.n), dtype=cp.float32)
    plan = GemvPlan(w, None, w.k, y, w.n, m=M, xpre=(xh, xinv))
    plan.launch()
    cp.cuda.Device().synchronize()
    a0, b0 = cp.cuda.Event(), cp.cuda.Event()
    a0.record()
    for _ in range(a.iters):
        plan.launch()
    b0.record()
    b0.synchronize()
    ms = cp.cuda.get_elapsed_time(a0, b0) / a.iters
    print(f"{plan.kname} {a.fmt} {a.n}x{a.k} x{M}: {ms * 1e3:.1f} us, {w.nbytes / ms / 1e6:.0f} GB/s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
