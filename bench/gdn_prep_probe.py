"""Where gdn_chunk_prep's time goes: the kernel timed with stages left out (cuda/gdn_tc.cu GDN_PREP_SKIP).

Run on the GPU machine:  python bench/gdn_prep_probe.py [--tokens 8192] [--hk 16] [--hv 48] [--reps 10]
The 27B's pp8192 profile gives the kernel 1.15 ms a layer against ~0.3 ms of its MMA and bytes
(bench/NOTES-decode.md, session 8). Each variant is the tensor-core module compiled with
-DGDN_PREP_SKIP=mask (1: the K K^T / Q K^T products, 2: the triangular solve, 4: the W / U' products,
8: their stores; the results of a variant with a bit set are wrong, only its time is read), launched on
random inputs of the geometry (grid: 64-token pieces x value heads, as the engine launches it).
Prints milliseconds a launch for each mask, and the difference to the whole kernel.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cupy as cp  # noqa: E402

from engine.gpu import launch as K  # noqa: E402

MASKS = {0: "whole kernel", 1: "without K K^T / Q K^T", 2: "without the solve", 4: "without W / U'",
         8: "without the W / U' stores", 6: "without the solve and W / U'", 7: "loads, cumsum and stores only"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hk", type=int, default=16)
    ap.add_argument("--hv", type=int, default=48)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    T, Hk, Hv = a.tokens, a.hk, a.hv
    pieces = -(-T // 64)
    rng = np.random.default_rng(0)

    def unit(shape):  # L2-normed rows, as gdn_prep_cols leaves q and k
        x = rng.standard_normal(shape).astype(np.float32)
        return cp.asarray(x / np.linalg.norm(x, axis=-1, keepdims=True))
    q, k = unit((T, Hk, 128)), unit((T, Hk, 128))
    v = cp.asarray(rng.standard_normal((T, Hv, 128)).astype(np.float32))
    g = cp.asarray(-rng.uniform(0.0, 0.1, (T, Hv)).astype(np.float32))
    beta = cp.asarray(rng.uniform(0.0, 1.0, (T, Hv)).astype(np.float32))
    w = cp.empty(pieces * Hv * 64 * 128, dtype=cp.float32)
    u = cp.empty_like(w)
    m = cp.empty(pieces * Hv * 64 * 64, dtype=cp.float32)
    gs = cp.empty(pieces * Hv * 64, dtype=cp.float32)
    args = (q, k, v, g, beta, w, u, m, gs, np.int32(Hk), np.int32(Hv), np.int32(0), np.int32(T))
    base = None
    for mask, what in MASKS.items():
        mod = cp.RawModule(code=f"#define GDN_PREP_SKIP {mask}\n" + K._source(K.TC_SOURCES), options=("-std=c++17",))
        fn = mod.get_function("gdn_chunk_prep")
        fn.max_dynamic_shared_size_bytes = K.GDN_PREP_SMEM
        launch = lambda: fn((pieces, Hv), (256,), args, shared_mem=K.GDN_PREP_SMEM)  # noqa: E731
        launch()
        cp.cuda.Device().synchronize()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        for _ in range(a.reps):
            launch()
        e1.record()
        e1.synchronize()
        ms = cp.cuda.get_elapsed_time(e0, e1) / a.reps
        base = ms if mask == 0 else base
        print(f"mask {mask:2d} {what:34s} {ms:7.3f} ms" + ("" if mask == 0 else f"  ({ms - base:+.3f})"), flush=True)


if __name__ == "__main__":
    main()
