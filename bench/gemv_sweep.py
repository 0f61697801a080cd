"""GEMV sweeps of the decode step's shapes (bench/gpu_decode.py --sweep): every register-kernel variant and the MoE
decode's routed launches, timed as CUDA-graph replays on the GPU machine; `best_cfg` turns a sweep into tuning-table
entries."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cupy as cp  # noqa: E402

from engine.gpu import launch as K  # noqa: E402
from engine.gpu.gemv import GemvPlan  # noqa: E402

SHAPES_27B = [  # (name, fmt, N, K, epilogue)
    ("attn q|k", "q4_g64_fp16", 7168, 5120, "store"),
    ("attn gate|v", "q5_g64_fp16", 7168, 5120, "store"),
    ("gdn q|k", "q4_g64_fp16", 4096, 5120, "store"),
    ("gdn v|z", "q5_g64_fp16", 12288, 5120, "store"),
    ("gdn out", "q5_g64_fp16", 5120, 6144, "partial"),
    ("mlp gate|up", "q4_g64_fp16", 34816, 5120, "swiglu"),
    ("mlp down", "q5_g64_fp16", 5120, 17408, "partial"),
    ("head w8", "q8_g32_fp16", 248320, 5120, "store"),
]
SHAPES_35B = [  # qwen3.6-35b-a3b (hidden 2048): w8 projections, the shared expert, the q6 head (the routed
    ("35b attn q|k", "q8_g32_fp16", 4608, 2048, "store"),  # experts' grid.z launches are not swept)
    ("35b gdn v|z", "q8_g32_fp16", 8192, 2048, "store"),
    ("35b gdn q|k", "q8_g32_fp16", 4096, 2048, "store"),
    ("35b out", "q8_g32_fp16", 2048, 4096, "partial"),
    ("35b shared gate|up", "q8_g32_fp16", 1024, 2048, "swiglu"),
    ("35b head q6", "q6_g64_fp16", 248320, 2048, "store"),
]


def time_graph(fn, reps=20, iters=5):
    """Median ms of one call of fn(), measured over graph replays of `reps` calls."""
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        fn()
        s.synchronize()
        s.begin_capture()
        for _ in range(reps):
            fn()
        g = s.end_capture()
        g.launch(s)
        s.synchronize()
        times = []
        for _ in range(iters):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(s)
            g.launch(s)
            e1.record(s)
            e1.synchronize()
            times.append(cp.cuda.get_elapsed_time(e0, e1) / reps)
    return float(np.median(times))


def time_plans(plans) -> float:
    """ms of one GEMV: each plan (copies of one matrix, so that nothing stays in L2) launched in turn in a graph."""
    def run():
        for p in plans:
            p.launch()
    return time_graph(run) / len(plans)


def kernel_sweep(bw, shapes=SHAPES_27B, fast=False):
    """The register kernels (gemv_rs; gemv_rs_pre on the pre-staged pairs) over rows, unroll and split-K slices;
    fast: rows 1-2, unroll 2."""
    from engine.gpu.weights import random_matrix

    rng = cp.random.default_rng(0)
    rows_opts, unroll_opts = ((1, 2), (2,)) if fast else ((1, 2, 4), (2, 4))
    results = []
    for name, fmt, n, k, epi in shapes:
        copies = [random_matrix(cp, rng, fmt, n, k) for _ in range(2)]  # two copies: nothing stays in L2
        x = cp.asarray(np.random.default_rng(1).standard_normal((1, k)).astype(np.float32))
        kpad = -(-k // K.XPAD) * K.XPAD
        xpre = (cp.zeros((1, kpad // 2), dtype=cp.uint32), cp.zeros(1, dtype=cp.float32))
        K.prepared("stage_x", (1,), (x, k, k, kpad, xpre[0], xpre[1]), block=1024)()
        out_n = n // 2 if epi == "swiglu" else n
        y = cp.zeros((8, out_n), cp.float32)
        best = None
        for rows in rows_opts if epi != "swiglu" else (2,):
            for unroll, pre2 in [(u_, p_) for u_ in unroll_opts for p_ in (False, True)]:
                for splits in (1, 2, 4, 8) if epi == "partial" else (1,):
                    ms = time_plans([GemvPlan(w, x, k, y, out_n, epi=epi, splits=splits, rows=rows, unroll=unroll,
                                              xpre=xpre, pre2=pre2) for w in copies])
                    gbs = copies[0].nbytes / (ms * 1e-3) / 1e9
                    r = dict(shape=name, fmt=fmt, n=n, k=k, rows=rows, unroll=unroll, splits=splits, pre2=pre2,
                             us=round(ms * 1e3, 2), gbs=round(gbs, 1), pct_copy=round(100 * gbs / bw, 1))
                    results.append(r)
                    if best is None or r["gbs"] > best["gbs"]:
                        best = r
        print(f"{name:12s} {fmt:12s} {n:6d}x{k:<6d} best rows={best['rows']} unroll={best['unroll']} "
              f"splits={best['splits']} pre={best['pre2']}: {best['us']:8.1f} us {best['gbs']:7.1f} GB/s "
              f"({best['pct_copy']}%)", flush=True)
        del copies
    return results


ROUTED_35B = [  # qwen3.6-35b-a3b's routed experts: a launch covers the k slots (grid.z), rows offset by eidx
    ("35b routed gate|up", "q4_g64_fp16", 1024, 2048, "swiglu"),  # per expert: [512 gate; 512 up] x 2048
    ("35b routed down", "q5_g64_fp16", 2048, 512, "store"),  # per expert: 2048 x 512, x its slot's fp32 row
]


def routed_sweep(bw, experts=256, slots=8):
    """The routed expert GEMVs as the MoE decode launches them (MlpOps._moe_ops): `slots` distinct experts of a
    stacked [experts x n, k] object, gate|up on the staged norm row (SwiGLU into [slots, n / 2]), down on each
    slot's own fp32 row (staged by its blocks) into weighted planes. GB/s counts the slots' bytes."""
    from engine.gpu.weights import random_matrix

    rng = cp.random.default_rng(0)
    nrng = np.random.default_rng(2)
    eidx = cp.asarray(nrng.choice(experts, slots, replace=False).astype(np.int32).reshape(1, slots))
    ewts = cp.full((1, slots + 1), 1.0 / slots, dtype=cp.float32)
    results = []
    for name, fmt, n, k, epi in ROUTED_35B:
        copies = [random_matrix(cp, rng, fmt, experts * n, k) for _ in range(2)]
        views = [c.row_slice(0, n) for c in copies]
        nbytes = views[0].nbytes * slots
        if epi == "swiglu":
            x = cp.asarray(nrng.standard_normal((1, k)).astype(np.float32))
            kpad = -(-k // K.XPAD) * K.XPAD
            xpre = (cp.zeros((1, kpad // 2), dtype=cp.uint32), cp.zeros(1, dtype=cp.float32))
            K.prepared("stage_x", (1,), (x, k, k, kpad, xpre[0], xpre[1]), block=1024)()
            y = cp.zeros((slots, n // 2), cp.float32)
            variants = [(2, u, p) for u in (2, 4) for p in (False, True)]

            def plan(v, rows, u, p):
                return GemvPlan(v, x, k, y, n // 2, epi="swiglu", unroll=u, xpre=xpre, pre2=p,
                                experts=(eidx, n, 0, n // 2, None, slots))
        else:
            x = cp.asarray(nrng.standard_normal((slots, k)).astype(np.float32))
            y = cp.zeros((slots, 1, n), cp.float32)
            variants = [(r, u, False) for r in (1, 2, 4) for u in (2, 4)]

            def plan(v, rows, u, p):
                return GemvPlan(v, x, k, y, n, epi="store", unroll=u, rows=rows,
                                experts=(eidx, n, k * 4, n, ewts, slots))
        for rows, u, p in variants:
            ms = time_plans([plan(v, rows, u, p) for v in views])
            gbs = nbytes / (ms * 1e-3) / 1e9
            r = dict(shape=name, fmt=fmt, n=n, k=k, rows=rows, unroll=u, pre2=p, slots=slots, us=round(ms * 1e3, 2),
                     gbs=round(gbs, 1), pct_copy=round(100 * gbs / bw, 1))
            results.append(r)
            print(f"{name:20s} rows={rows} unroll={u} pre2={p}: {r['us']:6.2f} us {r['gbs']:7.1f} GB/s "
                  f"({r['pct_copy']}%)", flush=True)
        del copies, views
    return results


def best_cfg(sweep):
    cfg = {}
    for r in sweep:
        key = (r["fmt"], r["n"], r["k"])
        if key not in cfg or r["gbs"] > cfg[key]["gbs"]:
            cfg[key] = r
    return {k: dict(rows=v["rows"], unroll=v["unroll"], splits=v["splits"], pre2=v.get("pre2", False))
            for k, v in cfg.items()}
