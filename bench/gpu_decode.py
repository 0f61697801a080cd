"""GPU decode: kernel sweep (bench/gemv_sweep.py), full-size synthetic decode, per-kernel breakdown, tiny-model parity.

Run on the GPU machine:  python bench/gpu_decode.py --all --out $OUT/decode.json
Bandwidth figures count the bytes the kernel must read (packed weights), over CUDA-event time of
graph replays, against the copy bandwidth measured in the same run.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine.gpu import launch as K  # noqa: E402
from gemv_sweep import SHAPES_27B, SHAPES_35B, best_cfg, kernel_sweep, routed_sweep, time_graph  # noqa: E402


def copy_bandwidth():
    """Device-to-device copy of 4 GiB, bytes read + written over event time (best of 5)."""
    n = 4 << 30
    a, b = cp.empty(n, cp.uint8), cp.empty(n, cp.uint8)
    a.fill(1)
    b.fill(0)
    best = 0.0
    for _ in range(5):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        b.data.copy_from_device_async(a.data, n)
        e1.record()
        e1.synchronize()
        best = max(best, 2 * n / (cp.cuda.get_elapsed_time(e0, e1) * 1e-3) / 1e9)
    del a, b
    cp.get_default_memory_pool().free_all_blocks()
    return best


def _burst_tps(eng, n, depth):
    """(tok/s of the median of three n-token greedy bursts after a warm-up, from a fresh sequence at
    `depth`; the last burst's tokens)."""
    eng.reset()
    if depth:
        eng.seek_synthetic(depth)  # the KV pages below `depth` are read all the same, whatever they hold
    eng.decode_greedy(1, 8)
    times = []
    for _ in range(3):
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        toks = eng.decode_greedy(1, n)
        times.append(time.perf_counter() - t)
    return n / float(np.median(times)), toks


def _ab(eng, n, depth, variants, label, setup):
    """Each variant measured twice in an interleaved order, the step re-planned and re-captured for it:
    `setup(v)` applies variant v to the executor and returns what undoes it. {variant: [tok/s, tok/s]}."""
    ex = eng.model.executor
    out = {}
    try:
        for _round in range(2):
            for v in variants:
                undo = setup(v)
                try:
                    ex.ops = ex._plan()
                    ex.capture()
                    out.setdefault(v, []).append(round(_burst_tps(eng, n, depth)[0], 1))
                finally:
                    undo()
                print(f"  {label} {v}: {out[v][-1]} tok/s", flush=True)
    finally:
        ex.ops = ex._plan()
        ex.capture()
        eng.reset()
    return out


def ldg_variants(eng, n, depth, variants):
    """The step with a tuning-entry flag set for the shapes a variant names (`_ab`). A variant: "base", or
    parts joined by "+", each "[FLAG@]SHAPES" with SHAPES "all", a format prefix such as "q5" or an
    "fmt:NxK" key and FLAG ldg (the default: weight loads through L1) or another boolean entry such as
    fuse_stage (gate|up staging its SwiGLU output, with pre2), or NAME=V for an integer entry (splits=2@...,
    rows=2@...)."""
    ex = eng.model.executor
    saved = {k: dict(v) for k, v in ex.gemv_cfg.items()}
    keys = sorted({(m.fmt, m.n, m.k) for m in ex._matrices() if m.fmt in K.FMT_IDS})

    def setup(v):
        cfg = {k: dict(c) for k, c in saved.items()}
        for part in ([] if v == "base" else v.split("+")):
            flag, _, sel = part.rpartition("@")
            for key in keys:
                name = f"{key[0]}:{key[1]}x{key[2]}"
                if sel == "all" or name == sel or key[0].startswith(sel + "_"):
                    if "=" in flag:
                        entry, _, val = flag.partition("=")
                        cfg.setdefault(key, {})[entry] = int(val)
                        continue
                    cfg.setdefault(key, {})[flag or "ldg"] = True
                    if flag == "fuse_stage":
                        cfg[key]["pre2"] = True
        ex.gemv_cfg = cfg
        return lambda: setattr(ex, "gemv_cfg", saved)

    return _ab(eng, n, depth, variants, "ldg", setup)


def attr_variants(eng, n, depth, variants):
    """The step with fields of its decode plan replaced per variant (`_ab`): "base", or "NAME=V;NAME=V" with NAME a
    field of engine.gpu.plan.DecodePlan and V a JSON value (gemv_pair=false; norm="residual_rmsnorm_mb5_1r"), checked
    as NINFER_PLAN's are; the kernels a variant needs beyond the plan's compile on first use."""
    import json  # noqa: PLC0415

    from engine.gpu import plan as gpu_plan  # noqa: PLC0415

    ex = eng.model.executor
    base = ex.plan

    def setup(v):
        sets = dict(p.split("=", 1) for p in v.split(";")) if v != "base" else {}
        ex.plan = gpu_plan._apply(base, {k: json.loads(val) for k, val in sets.items()}, gpu_plan.current_device(),
                                  ex.args)
        K.PDL = ex.plan.pdl
        return lambda: (setattr(ex, "plan", base), setattr(K, "PDL", base.pdl))

    return _ab(eng, n, depth, variants, "plan", setup)


def synthetic_decode(geometry, bw, gemv_cfg, n=128, depth=0, breakdown=False, kv="bf16", ldg=(),
                     attrs=()):
    from engine.synthetic import build_engine

    t0 = time.perf_counter()
    # room for the warm-up and three timed bursts past `depth`
    eng = build_engine(geometry, max_context=max(4096, depth + 2 * (8 + 3 * n) + 64), gemv_cfg=gemv_cfg, kv=kv)
    ex = eng.model.executor
    cp.cuda.Device().synchronize()
    build_s = time.perf_counter() - t0
    print(f"{geometry}: built in {build_s:.1f} s; launches ready for PDL: {K.pdl_ready(ex.ops)}", flush=True)
    tps, toks = _burst_tps(eng, n, depth)
    dt = n / tps
    if K.PDL:  # the same graph captured with plain launches, for the A/B of programmatic dependent launch
        K.PDL = False
        try:
            ex.capture()
            plain_tps = _burst_tps(eng, n, depth)[0]
        finally:
            K.PDL = True
        ex.capture()
        print(f"{geometry} depth {depth}: PDL {tps:.1f} tok/s, plain launches {plain_tps:.1f} tok/s", flush=True)
    else:
        plain_tps = tps
    ldg_ab = ldg_variants(eng, n, depth, ldg) if ldg else None
    attr_ab = attr_variants(eng, n, depth, attrs) if attrs else None
    ctx = depth + n / 2
    bytes_tok = ex.weight_bytes_per_token() + 2 * ex.state_bytes() + ctx * ex.kv_bytes_per_token()
    gbs = bytes_tok * tps / 1e9
    pp = None
    if not depth:
        prompt = [int(t) for t in np.random.default_rng(0).integers(0, 1000, 512)]
        eng.reset()
        eng.prefill(prompt[:64])  # warm-up
        eng.reset()
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        eng.prefill(prompt)
        pp = round(512 / (time.perf_counter() - t), 1)
    res = dict(geometry=geometry, test=f"tg{n}" + (f"@d{depth}" if depth else ""), kv=kv, tok_s=round(tps, 1),
               pdl=K.PDL, plain_launch_tok_s=round(plain_tps, 1),
               pp512_tok_s=pp, ldg_variants=ldg_ab,
               attr_variants=attr_ab,
               ms_per_token=round(1e3 * dt / n, 3), weight_bytes=ex.weight_bytes(),
               weight_bytes_per_token=ex.weight_bytes_per_token(), state_bytes=ex.state_bytes(),
               kv_bytes_per_token=ex.kv_bytes_per_token(), bytes_per_token=int(bytes_tok), gbs=round(gbs, 1),
               pct_copy=round(100 * gbs / bw, 1), kernels=len(ex.ops), build_s=round(build_s, 1),
               tokens_sample=toks[:8], peak_vram_gb=round(cp.get_default_memory_pool().total_bytes() / 1e9, 2))
    print(json.dumps(res), flush=True)
    if breakdown:
        # (each capture above ran the step eagerly and reset the sequence: back to `depth`, or the attention's replays
        # read a few tokens of KV instead of `depth` of them, as sessions 19-20's 32K breakdowns did)
        eng.reset()
        if depth:
            eng.seek_synthetic(depth)
        eng.decode_greedy(1, 2)
        per = {}
        for op in ex.ops:
            name = K.op_name(op)
            ms = time_graph(op, reps=10, iters=3)
            per.setdefault(name, [0.0, 0])
            per[name][0] += ms
            per[name][1] += 1
        total = sum(v[0] for v in per.values())
        res["breakdown_ms"] = {k: [round(v[0], 4), v[1]] for k, v in sorted(per.items(), key=lambda kv: -kv[1][0])}
        res["breakdown_sum_ms"] = round(total, 4)
        print(f"sum of kernels {total:.3f} ms vs step {1e3 * dt / n:.3f} ms", flush=True)
        for k_, v in list(res["breakdown_ms"].items())[:14]:
            print(f"  {k_:40s} {v[0]:8.4f} ms  x{v[1]}", flush=True)
    del eng, ex
    cp.get_default_memory_pool().free_all_blocks()
    return res


def tiny_parity(steps=64):
    """CUDA engine vs the NumPy engine on a tiny Qwen3.5 (real head dims), same dequantized weights."""
    from engine import api
    from engine.gpu import weights as gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5 import random_weights
    from engine.synthetic import TINY_CUDA as cfg

    args = ModelArgs.from_config(cfg)
    wq = gpu_weights.as_stored(random_weights(args, seed=3))
    ref = api.load({"config": cfg, "weights": wq}, device="cpu", gdn_mode="recurrent")
    gpu = build_engine(args, gpu_weights.from_logical(args, wq), cfg, max_context=256)
    toks = list(np.random.default_rng(5).integers(0, 1000, steps))
    worst = 0.0
    same = 0
    for i, t in enumerate(toks):
        a = ref.decode_step(int(t))
        b = gpu.decode_step(int(t))
        r = float(np.linalg.norm(a - b) / np.linalg.norm(a))
        worst = max(worst, r)
        same += int(np.argmax(a) == np.argmax(b))
    res = dict(steps=steps, worst_rel_l2=worst, argmax_agree=same)
    print("tiny parity:", json.dumps(res), flush=True)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep-fast", action="store_true", help="with --sweep: gemv_rs_pre as the table runs it and gemv_tma")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--synthetic", default="")
    ap.add_argument("--depth", type=int, default=0)
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--out", default="")
    ap.add_argument("--cfg", default="", help="take the GEMV choices of an earlier --sweep report")
    ap.add_argument("--ldg", default="", help="weight-load variants to A/B in the same process: base, all, q5, "
                    "fmt:NxK keys joined by +, comma-separated")
    ap.add_argument("--attr", default="", help="executor flag variants to A/B in the same process: base, "
                    "NAME=V;NAME=V, comma-separated")
    ap.add_argument("--fuse-stage", action="store_true",
                    help="gate|up through gemv_rs_pre with its output staged in the same launch (no stage_x)")
    a = ap.parse_args()
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    report = {"gpu": props["name"].decode(), "cupy": cp.__version__,
              "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(), "driver": cp.cuda.runtime.driverGetVersion()}
    t = time.perf_counter()
    K.kernel("argmax_step")
    report["compile_s"] = round(time.perf_counter() - t, 1)
    bw = copy_bandwidth()
    report["copy_gbs"] = round(bw, 1)
    print(json.dumps(report), flush=True)
    cfg = None
    if a.cfg:
        saved = json.loads(Path(a.cfg).read_text())["gemv_cfg"]
        cfg = {(k.split(":")[0], *map(int, k.split(":")[1].split("x"))): v for k, v in saved.items()}
        report["gemv_cfg"] = saved
    if a.tiny:
        report["tiny"] = tiny_parity()
    if a.sweep:
        geos = a.synthetic.split(",") if a.synthetic else ["qwen3.8-27b"]
        shapes = [s_ for g in geos for s_ in (SHAPES_35B if "35b" in g else SHAPES_27B)]
        report["sweep"] = kernel_sweep(bw, list(dict.fromkeys(shapes)), fast=a.sweep_fast)
        if any("35b" in g for g in geos) and not a.sweep_fast:  # (reported, not part of the tuning table)
            report["routed_sweep"] = routed_sweep(bw)
        cfg = best_cfg(report["sweep"])
        report["gemv_cfg"] = {f"{k[0]}:{k[1]}x{k[2]}": v for k, v in cfg.items()}
        if a.out:
            Path(a.out).write_text(json.dumps(report, indent=1, default=str))
    if a.fuse_stage:  # every (N, K) the geometries' gate|up matrices have: pre2 + fuse_stage
        from engine.gpu.gemv_tuning import default_cfg
        from engine.synthetic import geometry_config

        cfg = dict(cfg) if cfg else default_cfg()
        for geo in a.synthetic.split(","):
            c = geometry_config(geo)
            n, k = 2 * c.get("intermediate_size", 0), c["hidden_size"]
            for f in ("q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16"):
                cfg[(f, n, k)] = dict(cfg.get((f, n, k), {"rows": 2, "unroll": 2, "splits": 1}), pre2=True,
                                      fuse_stage=True)
        report["fuse_stage"] = True
    if a.synthetic:
        report["decode"] = []
        geos = a.synthetic.split(",")
        for i, geo in enumerate(geos):  # the breakdown for the first geometry only
            ldg = tuple(v for v in a.ldg.split(",") if v)
            report["decode"].append(synthetic_decode(geo, bw, cfg, depth=0, breakdown=a.breakdown and i == 0,
                                                     ldg=ldg,
                                                     attrs=tuple(v for v in a.attr.split(",") if v)))
            if a.out:
                Path(a.out).write_text(json.dumps(report, indent=1, default=str))
        if a.depth and "35b" not in geos[0]:  # the depth targets are the 27B's (issue 7)
            for kv in ("int8", "bf16"):  # (--breakdown: the int8 run's too)
                attrs = tuple(v for v in a.attr.split(",") if v) if kv == "int8" else ()
                report["decode"].append(synthetic_decode(geos[0], bw, cfg, depth=a.depth, kv=kv, attrs=attrs,
                                                         breakdown=a.breakdown and kv == "int8"))
                if a.out:
                    Path(a.out).write_text(json.dumps(report, indent=1, default=str))
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
