"""Launch the 27B's main decode GEMVs twice each with plain launches, for Nsight Compute
(`bash bench/gpu_profile.sh` runs it under ncu). Each shape runs with the engine's tuning table
(`engine.gpu.gemv_tuning`), x pre-staged as in decode. NCU_MMA="t,kw,u" launches gemv_mma instead,
NCU_TMA=NW gemv_tma (sm_90, NW consumer warps); NCU_SHAPES="mlp gate|up,..." picks shapes.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cupy as cp  # noqa: E402

from engine.gpu.weights import random_matrix  # noqa: E402
from engine.gpu import launch as K  # noqa: E402
from engine.gpu.gemv import GemvPlan  # noqa: E402
from engine.gpu.gemv_tuning import default_cfg  # noqa: E402

SHAPES = [("mlp gate|up", "q4_g64_fp16", 34816, 5120, "swiglu"), ("mlp down", "q5_g64_fp16", 5120, 17408, "partial"),
          ("gdn v|z", "q5_g64_fp16", 12288, 5120, "store")]


def main():
    cfg = default_cfg()
    only = os.environ.get("NCU_SHAPES")  # e.g. "mlp gate|up"
    rng = cp.random.default_rng(0)
    for name, fmt, n, k, epi in SHAPES:
        if only and name not in only.split(","):
            continue
        w = random_matrix(cp, rng, fmt, n, k)
        x = cp.asarray(np.random.default_rng(1).standard_normal((1, k)).astype(np.float32))
        pad = getattr(K, "XPAD", 128)  # the executor's padding of staged x
        kpad = -(-k // pad) * pad
        xpre = (cp.zeros((1, kpad // 2), dtype=cp.uint32), cp.zeros(1, dtype=cp.float32))
        K.prepared("stage_x", (1,), (x, k, k, kpad, xpre[0], xpre[1]), block=1024)()
        out_n = n // 2 if epi == "swiglu" else n
        c = cfg.get((fmt, n, k), {})
        y = cp.zeros((8, out_n), cp.float32)
        mma = tuple(int(v) for v in os.environ["NCU_MMA"].split(",")) if os.environ.get("NCU_MMA") else None
        tma = int(os.environ["NCU_TMA"]) if os.environ.get("NCU_TMA") else None
        plan = GemvPlan(w, x, k, y, out_n, epi=epi, splits=c.get("splits", 1), rows=c.get("rows"),
                        unroll=c.get("unroll", 2), xpre=xpre, mma=mma, pre2=c.get("pre2", False), tma=tma)
        for _ in range(2):
            plan.launch()
        cp.cuda.Device().synchronize()
        print(name, fmt, n, k, c, flush=True)


if __name__ == "__main__":
    main()
