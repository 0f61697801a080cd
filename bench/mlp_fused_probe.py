"""mlp_fused alone on the 27B's first dense layer (synthetic weights): the launch's time (CUDA events over repeated
launches) and where it goes (each block's %globaltimer at the phase boundaries: start, norm done, gate|up done,
barrier 1, staging (and barrier 2) done, down done), the norm summing 3 planes as in the step: the down's input staged
by every block for itself (local) or by chunks with a scale each before the barrier (chunk), the latter with the
leftover chunks computed in slices by every warp (help); then with a GDN layer's o-projection first (MLP_FUSED_O, 2
splits, 3 loads a lane in flight: its barrier's end is a phase) with the norm's x and weight loaded before that barrier
(MLP_FUSED_XW: the planes' arrival is a phase), the defaults.

    python bench/mlp_fused_probe.py [--geometry qwen3.8-27b] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import cupy as cp
import numpy as np

from engine.gpu.gemv import mlp_fused_help_words, mlp_fused_launch

PHASES = ("norm", "gate|up", "barrier 1", "stage (+ barrier 2)", "down")


def launch_us(go, n: int = 200) -> float:
    """Microseconds a launch of `go` (CUDA events over n back-to-back launches, after 5 to warm up)."""
    for _ in range(5):
        go()
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record()
    for _ in range(n):
        go()
    e1.record()
    e1.synchronize()
    return cp.cuda.get_elapsed_time(e0, e1) * 1e3 / n


def phase_stamps(run, ts, reps: int = 20):
    """The median over `reps` runs of `run` (a launch writing its blocks' phase stamps into ts [grid, 8]) of each
    stamp, ns from the first block's start."""
    rows = []
    for _ in range(reps):
        run()
        cp.cuda.Device().synchronize()
        t = ts.get().astype(np.int64)
        rows.append(t - t[:, 0].min())
    return np.median(np.stack(rows), axis=0)


def phase_table(t, names, idx) -> dict:
    """{phase: first and last block's end, us} for the stamps idx of t (phase_stamps')."""
    return {nm: dict(first_us=round(float(t[:, i].min()) / 1e3, 2), last_us=round(float(t[:, i].max()) / 1e3, 2))
            for nm, i in zip(names, idx)}


def probe(ex, splits: int, local: bool, chunk: bool = False, helped: bool = False, n: int = 200, oproj: bool = False,
          xw: bool = False) -> dict:
    L = ex.layers[next(i for i, L in enumerate(ex.layers) if "gate_up" in L and (L["kind"] != "full_attention"
                                                                                 or not oproj))]
    H = ex.H
    bar = cp.zeros(1, dtype=cp.uint64)
    slot = cp.zeros(2, dtype=cp.uint32)
    x_in, x_out = cp.array(ex.x), cp.array(ex.x2)
    xsc = cp.zeros(ex.kpad_act // 32, dtype=cp.float32) if chunk else None
    hb = cp.zeros(mlp_fused_help_words(2 * cp.cuda.Device().attributes["MultiProcessorCount"], L["gate_up"]),
                  dtype=cp.uint32) if helped else None

    o_arg = None
    if oproj:  # (the gated norm's pairs as they are; chunk scales of 1)
        o_arg = (L["o"], ex.xh_att, cp.ones(ex.xh_att.shape[-1] * 2 // 32, dtype=cp.float32), 2, True, 3)

    def launch(ts=None):
        return mlp_fused_launch(L["gate_up"], L["down"], (x_in, x_out, ex.part, 3, H, L["post_norm"], H, 1e-6, ex.kpad_h),
                                ex.act, ex.kpad_act, ex.xh_act, ex.xinv_act, slot, ex.part, splits, bar,
                                tstamp=ts, local_stage=local, chunk_scales=xsc, help=hb, oproj=o_arg, xw_early=xw,
                                light_bar=min(int(ex.MLP_FUSED_LIGHT_BAR), 2))  # (the executor's barrier form)

    go, dsplits = launch()
    us = launch_us(go, n)
    grid = go.grid[0]
    ts = cp.zeros((grid, 8), dtype=cp.uint64)
    t = phase_stamps(lambda: launch(ts)[0](), ts)
    idx, names = [1, 2, 3, 4, 5], PHASES
    if oproj:
        idx, names = [6] + ([7] if xw else []) + [1, 2, 3, 5], \
            ("o + barrier",) + (("planes",) if xw else ()) + ("norm", "gate|up", "barrier 1", "down")
    phases = phase_table(t, names, idx)
    return dict(name=go.name, splits=dsplits, local=local, chunk=chunk, helped=helped, oproj=oproj, xw=xw, grid=grid,
                us=round(us, 2), start_spread_us=round(float(t[:, 0].max()) / 1e3, 2),
                phases=phases)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--geometry", default="qwen3.8-27b")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    from engine.synthetic import build_engine

    eng = build_engine(a.geometry, max_context=4096)
    ex = eng.model.executor
    out = []
    for splits, local, chunk, helped, oproj, xw in ((3, True, True, True, False, False), (3, True, True, True, True, True)):
        r = probe(ex, splits, local, chunk, helped, oproj=oproj, xw=xw)
        out.append(r)
        ph = "  ".join(f"{k} {v['first_us']}-{v['last_us']}" for k, v in r["phases"].items())
        print(f"{r['name']} splits {r['splits']} local {local} chunk {chunk} help {helped} o {oproj} xw {xw}: {r['us']} us "
              f"a launch (grid {r['grid']}, starts "
              f"spread {r['start_spread_us']} us); phases end (first-last block, us): {ph}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
