"""Sampled decode through the generate loop: the whole logits row to the host each token, against the
sparse read-back of the ids within the sampler's margin (`NINFER_SPARSE_LOGITS`, engine.gpu_engine).

Run on the GPU machine:  python bench/sampled_decode.py [--geometry qwen3.8-27b] [--tokens 128]
Prints tok/s of `generate_step` (temperature 0.7, top-p 0.9) both ways on the same engine; the CUDA
graph step is the same, so the difference is the read-back and the sampler's work on the host.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--geometry", default="qwen3.8-27b")
    ap.add_argument("--tokens", type=int, default=128)
    a = ap.parse_args()
    from engine import gpu_engine
    from engine.generate import generate_step
    from engine.sampling import Sampler
    from engine.synthetic import build_engine

    eng = build_engine(a.geometry, max_context=4 * a.tokens + 64)
    for sparse in (False, True, False, True):  # twice each, the first of each as a warm-up
        gpu_engine.SPARSE_LOGITS = sparse
        eng.reset()
        t = time.perf_counter()
        n = sum(1 for _ in generate_step(eng, [1, 2, 3], Sampler(temperature=0.7, top_p=0.9, seed=1),
                                         max_tokens=a.tokens))
        dt = time.perf_counter() - t
        print(f"{a.geometry} sampled decode, {'sparse' if sparse else 'whole row'}: {n / dt:.1f} tok/s "
              f"({1e3 * dt / n:.2f} ms/token, prefill of 3 tokens included)", flush=True)


if __name__ == "__main__":
    main()
