"""NumPy decode tok/s of random Qwen3.5 models (tiny and ~0.5B) on this machine.

Decode reads every weight once per token, so the bound is memory bandwidth: we print achieved GB/s
(float32 weight bytes x tok/s) next to the measured copy bandwidth of this machine.

Usage: PYTHONPATH=. .venv/bin/python dev/bench_numpy_decode.py [tiny|0.5b ...] [--tokens N]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import engine
from engine.config import ModelArgs
from engine.models.qwen3_5 import logical_shapes, random_weights

_QWEN = dict(model_type="qwen3_5_text", rms_norm_eps=1e-6, linear_conv_kernel_dim=4, max_position_embeddings=32768,
             rope_parameters={"rope_theta": 1e7, "partial_rotary_factor": 0.25})
GEOMETRIES = {
    "tiny": dict(_QWEN, hidden_size=128, num_hidden_layers=4, vocab_size=2048, intermediate_size=256,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
                 linear_key_head_dim=32, linear_num_value_heads=4, linear_value_head_dim=32),
    # Qwen3.5-0.8B-like layers (hidden 1024, GDN 16x128, attention 8/2 x 256), 12 of them, tied 248320 vocab
    "0.5b": dict(_QWEN, hidden_size=1024, num_hidden_layers=12, vocab_size=248320, intermediate_size=3584,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                 linear_key_head_dim=128, linear_num_value_heads=16, linear_value_head_dim=128,
                 tie_word_embeddings=True),
}


def copy_bandwidth_gbs(nbytes: int = 1 << 28) -> float:
    """Read+write GB/s of a large numpy copy (best of 5)."""
    a = np.ones(nbytes // 4, np.float32)
    b = np.empty_like(a)
    best = min(_timed(lambda: np.copyto(b, a)) for _ in range(5))
    return 2 * nbytes / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run(name: str, n_tokens: int, prompt_len: int = 32) -> None:
    cfg = GEOMETRIES[name]
    args = ModelArgs.from_config(cfg)
    t0 = time.perf_counter()
    eng = engine.load({"config": cfg, "weights": random_weights(args, seed=0)}, device="cpu")
    load_s = time.perf_counter() - t0
    wbytes = eng.info()["weight_bytes_per_token"]
    params = sum(int(np.prod(s)) for s in logical_shapes(args).values())
    prompt = list(np.random.default_rng(0).integers(0, args.domain, prompt_len))
    t0 = time.perf_counter()
    first = int(np.argmax(eng.prefill(prompt)))
    pp = prompt_len / (time.perf_counter() - t0)
    eng.decode_greedy(first, 2)  # warm-up
    t0 = time.perf_counter()
    eng.decode_greedy(first, n_tokens)
    tg = n_tokens / (time.perf_counter() - t0)
    print(f"{name}: {params / 1e6:.1f} M params, {wbytes / 1e9:.3f} GB fp32 weights read per token (load {load_s:.1f} s); "
          f"prefill {prompt_len} tok: {pp:.1f} tok/s; decode: {tg:.1f} tok/s = {tg * wbytes / 1e9:.2f} GB/s of weights")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=["tiny", "0.5b"])
    ap.add_argument("--tokens", type=int, default=32)
    ns = ap.parse_args()
    import os

    threads = os.environ.get("OPENBLAS_NUM_THREADS", "default")
    print(f"copy bandwidth: {copy_bandwidth_gbs():.1f} GB/s (read+write, numpy); OPENBLAS_NUM_THREADS={threads}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for m in ns.models:
        run(m, ns.tokens)


if __name__ == "__main__":
    main()
