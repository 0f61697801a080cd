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
from mlp_fused_probe import launch_us, phase_stamps, phase_table  # (bench/ is the script's directory)

PHASES = ("norm", "router + shared", "barrier 1", "top-k", "routed + stage", "barrier 2", "down")


def probe(ex, n: int = 200) -> dict:
    from engine.gpu import launch as K

    def first():
        return next(op for op in ex.ops if K.op_name(op).startswith("moe_fused<"))

    ex.moe_tstamp = None
    ex.ops = ex._plan()
    go = first()
    us = launch_us(go, n)
    grid = go.grid[0]
    ts = cp.zeros((grid, 8), dtype=cp.uint64)
    ex.moe_tstamp = ts
    ex.ops = ex._plan()
    t = phase_stamps(first(), ts)
    ex.moe_tstamp = None
    ex.ops = ex._plan()
    return dict(name=go.name, grid=grid, us=round(us, 2), start_spread_us=round(float(t[:, 0].max()) / 1e3, 2),
                phases=phase_table(t, PHASES, range(1, 8)))


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
    r = dict(probe(ex), opts=ex.MOE_FUSED_OPTS)
    ph = "  ".join(f"{k} {v['first_us']}-{v['last_us']}" for k, v in r["phases"].items())
    print(f"{r['name']} opts {r['opts']}: {r['us']} us a launch (grid {r['grid']}, starts spread {r['start_spread_us']} "
          f"us); phases end (first-last block, us): {ph}", flush=True)
    out = [r]
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
