"""GPU decode of a full-size synthetic model: tok/s, bytes per token against the copy bandwidth, and with
--breakdown the time of every kernel of the step.

    python bench/gpu_decode.py --synthetic qwen3.8-27b --breakdown --out breakdown.json
    python bench/gpu_decode.py --synthetic qwen3.8-27b --depth 32768 --kv int8 --breakdown --out ...

tok/s is the median of three 128-token greedy bursts of the captured decode graph (no host sync inside a
burst). The breakdown replays each op of the step alone, 10 times in a graph (so a kernel's launch ramp and
tail count, the gaps between kernels do not): the sum of kernels against the step says what the graph's
boundaries cost. Bytes per token = packed weights read + GDN state read and written + KV read at the mean
context of the burst; the copy bandwidth is a 4 GiB device-to-device copy measured in the same process.
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

from engine.gpu import launch as K  # noqa: E402


def copy_bandwidth() -> float:
    """GB/s of a 4 GiB device-to-device copy, bytes read + written over event time (best of 5)."""
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


def time_graph(fn, reps: int = 10, iters: int = 3) -> float:
    """Median ms of one call of fn(), over replays of a graph of `reps` calls."""
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


def burst_tps(eng, n: int, depth: int) -> tuple[float, list[int]]:
    """tok/s of the median of three n-token greedy bursts after a warm-up, from a fresh sequence at `depth`
    (the KV pages below `depth` are read all the same, whatever they hold); the last burst's tokens."""
    eng.reset()
    if depth:
        eng.seek_synthetic(depth)
    eng.decode_greedy(1, 8)
    times = []
    for _ in range(3):
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        toks = eng.decode_greedy(1, n)
        times.append(time.perf_counter() - t)
    return n / float(np.median(times)), toks


def breakdown(eng, ops, depth: int) -> dict:
    """{op name: [ms a step, launches]}, slowest first, each op replayed alone at `depth`."""
    eng.reset()
    if depth:
        eng.seek_synthetic(depth)
    eng.decode_greedy(1, 2)
    per: dict[str, list] = {}
    for op in ops:
        entry = per.setdefault(K.op_name(op), [0.0, 0])
        entry[0] += time_graph(op)
        entry[1] += 1
    return {k: [round(v[0], 4), v[1]] for k, v in sorted(per.items(), key=lambda kv: -kv[1][0])}


def decode(geometry: str, bw: float, depth: int, kv: str, with_breakdown: bool, n: int = 128) -> dict:
    from engine.synthetic import build_engine

    t0 = time.perf_counter()
    # room for the warm-up and three timed bursts past `depth`
    eng = build_engine(geometry, max_context=max(4096, depth + 2 * (8 + 3 * n) + 64), kv=kv)
    ex = eng.model.executor
    cp.cuda.Device().synchronize()
    build_s = time.perf_counter() - t0
    tps, toks = burst_tps(eng, n, depth)
    ms = 1e3 / tps
    bytes_tok = ex.weight_bytes_per_token() + 2 * ex.state_bytes() + (depth + n / 2) * ex.kv_bytes_per_token()
    gbs = bytes_tok * tps / 1e9
    res = dict(geometry=geometry, test=f"tg{n}" + (f"@d{depth}" if depth else ""), kv=kv, tok_s=round(tps, 1),
               ms_per_token=round(ms, 3), weight_bytes=ex.weight_bytes(),
               weight_bytes_per_token=ex.weight_bytes_per_token(), state_bytes=ex.state_bytes(),
               kv_bytes_per_token=ex.kv_bytes_per_token(), bytes_per_token=int(bytes_tok), gbs=round(gbs, 1),
               pct_copy=round(100 * gbs / bw, 1), kernels=len(ex.ops), build_s=round(build_s, 1),
               tokens_sample=toks[:8], peak_vram_gb=round(cp.get_default_memory_pool().total_bytes() / 1e9, 2))
    print(f"{geometry} {res['test']} ({kv} KV): {tps:.1f} tok/s, {ms:.3f} ms a step, {gbs:.0f} GB/s "
          f"({res['pct_copy']}% of copy), {len(ex.ops)} ops", flush=True)
    if with_breakdown:
        res["breakdown_ms"] = breakdown(eng, ex.ops, depth)
        res["breakdown_sum_ms"] = round(sum(v[0] for v in res["breakdown_ms"].values()), 4)
        print(f"  sum of kernels {res['breakdown_sum_ms']:.3f} ms of a {ms:.3f} ms step", flush=True)
        for name, (t, count) in list(res["breakdown_ms"].items())[:14]:
            print(f"  {name:44s} {t:8.4f} ms  x{count:<3d} {1e3 * t / count:7.2f} us each", flush=True)
    del eng, ex
    cp.get_default_memory_pool().free_all_blocks()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--synthetic", required=True, help="geometries, comma-separated (engine.synthetic.GEOMETRIES)")
    ap.add_argument("--depth", type=int, default=0, help="context already in the KV cache when the bursts start")
    ap.add_argument("--kv", default="bf16", choices=("bf16", "int8"), help="KV cache format")
    ap.add_argument("--breakdown", action="store_true", help="time every op of the step alone")
    ap.add_argument("--out", default="", help="write the report as JSON")
    a = ap.parse_args()
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    report = {"gpu": props["name"].decode(), "cupy": cp.__version__,
              "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(), "driver": cp.cuda.runtime.driverGetVersion()}
    t = time.perf_counter()
    K.kernel("argmax_step")
    report["compile_s"] = round(time.perf_counter() - t, 1)
    report["copy_gbs"] = round(copy_bandwidth(), 1)
    print(json.dumps(report), flush=True)
    report["decode"] = []
    for geo in a.synthetic.split(","):
        report["decode"].append(decode(geo, report["copy_gbs"], a.depth, a.kv, a.breakdown))
        if a.out:
            Path(a.out).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
