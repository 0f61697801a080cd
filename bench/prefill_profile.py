"""Where a tensor-core prefill chunk spends its time: every op of one chunk timed with CUDA events.

Run on the GPU machine:  python bench/prefill_profile.py --tokens 8192 --chunk 1024 --out $OUT/pp_profile.json
Builds the synthetic 27B, prefills `tokens` once (warm-up: CuPy kernels compile, cuBLAS picks
algorithms), then again with each op of each chunk bracketed by events; prints the ops grouped by name,
summed over all chunks, against the wall time of an unprofiled prefill.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cupy as cp  # noqa: E402

from engine.gpu.launch import op_name  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--geometry", default="qwen3.8-27b")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--out")
    a = ap.parse_args()
    from engine.gpu import weights as gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine
    from engine.synthetic import GEOMETRIES, geometry_config

    config = geometry_config(a.geometry)
    args = ModelArgs.from_config(config)
    w = gpu_weights.synthetic(args, GEOMETRIES[a.geometry][1], seed=0)
    eng = build_engine(args, w, config, max_context=a.tokens + 64, prefill_gemm=a.chunk)
    ex = eng.model.gemm
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, args.vocab_size, a.tokens)]

    def prefill():
        eng.reset()
        eng.prefill(prompt)
        cp.cuda.Device().synchronize()

    prefill()  # warm-up
    t = time.perf_counter()
    prefill()
    wall = time.perf_counter() - t
    print(f"{a.geometry} pp{a.tokens} chunk {a.chunk}: {wall:.3f} s, {a.tokens / wall:.0f} tok/s", flush=True)

    marks = []
    plain = ex.run_eager

    def timed():
        for op in ex.ops:
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(ex.stream)
            op()
            e1.record(ex.stream)
            marks.append((op_name(op), e0, e1))

    ex.run_eager = timed
    moe = []
    for g in eng.model.gemms:  # MoE: phases inside the one MoE op
        g.moe_marks = moe
    t = time.perf_counter()
    prefill()
    wall_p = time.perf_counter() - t
    ex.run_eager = plain
    phases = {}
    for (_, e0), (name, e1) in zip(moe, moe[1:]):
        if name != "start":
            phases[name] = phases.get(name, 0.0) + cp.cuda.get_elapsed_time(e0, e1)
    for name, ms in phases.items():
        print(f"  moe phase {name:60s} {ms:9.1f} ms", flush=True)
    per = {}
    for name, e0, e1 in marks:
        ms = cp.cuda.get_elapsed_time(e0, e1)
        per.setdefault(name, [0.0, 0])
        per[name][0] += ms
        per[name][1] += 1
    total = sum(v[0] for v in per.values())
    print(f"profiled run {wall_p:.3f} s; sum of ops {total / 1e3:.3f} s", flush=True)
    rows = sorted(per.items(), key=lambda kv: -kv[1][0])
    for name, (ms, n) in rows[:30]:
        print(f"  {name:48s} {ms:9.1f} ms  x{n:<5d} {100 * ms / total:5.1f}%")
    if a.out:
        Path(a.out).write_text(json.dumps(dict(geometry=a.geometry, tokens=a.tokens, chunk=a.chunk, wall_s=wall,
                                               tok_s=a.tokens / wall, ops={k: dict(ms=v[0], n=v[1]) for k, v in rows}),
                                          indent=1))


if __name__ == "__main__":
    main()
