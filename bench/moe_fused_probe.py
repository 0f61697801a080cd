"""moe_fused alone on the 35B-A3B's first MoE layer (synthetic weights, the step's own launch, buffers as the last step
left them): its time (CUDA events over repeated launches) and where it goes (each block's %globaltimer at the phase
boundaries: norm done, router + shared gate|up done, barrier 1, top-k done, routed gate|up + staging done, barrier 2,
down done), on the defaults (MOE_FUSED_OPTS; with MOE_FUSED_O the "norm" phase holds the o-projection and its barrier).

    python bench/moe_fused_probe.py [--geometry qwen3.6-35b-a3b] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import cupy as cp
import numpy as np

PHASES = ("norm", "router + shared", "barrier 1", "top-k", "routed + stage", "barrier 2", "down")


def probe(ex, n: int = 200) -> dict:
    from engine.ops import kernels as K

    def first():
        return next(op for op in ex.ops if K.op_name(op).startswith("moe_fused<"))

    ex.moe_tstamp = None
    ex.ops = ex._plan()
    go = first()
    for _ in range(5):
        go()
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record()
    for _ in range(n):
        go()
    e1.record()
    e1.synchronize()
    us = cp.cuda.get_elapsed_time(e0, e1) * 1e3 / n
    grid = go.grid[0]
    ts = cp.zeros((grid, 8), dtype=cp.uint64)
    ex.moe_tstamp = ts
    ex.ops = ex._plan()
    tgo = first()
    rows = []
    for _ in range(20):
        tgo()
        cp.cuda.Device().synchronize()
        t = ts.get().astype(np.int64)
        rows.append(t - t[:, 0].min())
    ex.moe_tstamp = None
    ex.ops = ex._plan()
    t = np.median(np.stack(rows), axis=0)
    phases = {nm: dict(first_us=round(float(t[:, i].min()) / 1e3, 2), last_us=round(float(t[:, i].max()) / 1e3, 2))
              for nm, i in zip(PHASES, range(1, 8))}
    return dict(name=go.name, grid=grid, us=round(us, 2), start_spread_us=round(float(t[:, 0].max()) / 1e3, 2),
                phases=phases)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--geometry", default="qwen3.6-35b-a3b")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    from engine.synthetic import build_engine

    eng = build_engine(a.geometry, max_context=4096)
    ex = eng.model.executor
    ex.MOE_FUSED = 1
    eng.decode_greedy(5, 4)
    out = []
    for opts in (ex.MOE_FUSED_OPTS,):
        ex.MOE_FUSED_OPTS = opts
        r = probe(ex)
        r["opts"] = opts
        out.append(r)
        ph = "  ".join(f"{k} {v['first_us']}-{v['last_us']}" for k, v in r["phases"].items())
        print(f"{r['name']} opts {opts}: {r['us']} us a launch (grid {r['grid']}, starts spread {r['start_spread_us']} us); "
              f"phases end (first-last block, us): {ph}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
