"""Measure the default model on this machine: `ninfer run` wall time from process start to the first answer byte
(model already in the store), and NumPy decode tok/s. Prints one line per run and the load average, because a
shared 2-core box swings these numbers a lot.

    .venv/bin/python dev/bench_default_model.py [--runs 3] [--tokens 128]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "What is the capital of France?"


def first_byte(cmd: list[str], env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first = os.read(proc.stdout.fileno(), 1)  # unbuffered: the clock stops at the first byte
    t1 = time.perf_counter()
    rest, _ = proc.communicate()
    return t1 - t0, (first + rest).decode("utf-8", "replace")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "ninfer_cli.main", "run", "--temperature", "0"]
    subprocess.run(base + ["-n", "1", "hi"], env=env, capture_output=True, check=True)  # store + page cache warm
    for i in range(args.runs):
        load = os.getloadavg()[0]
        ttft, out = first_byte(base + [PROMPT], env)
        res = subprocess.run(base + ["-n", str(args.tokens), "--json", "Write a long story about a dragon."],
                             env=env, capture_output=True, text=True, check=True)
        data = json.loads(res.stdout)
        print(f"run {i}: load {load:.1f} | start->first answer byte {ttft:.2f} s ({out.strip()[:40]!r}) | "
              f"decode {data['timings']['generation_tokens_per_s']:.1f} tok/s over "
              f"{data['usage']['completion_tokens']} tokens | prefill {data['timings']['prompt_tokens_per_s']:.0f} tok/s",
              flush=True)
    in_process(args.tokens)


def in_process(tokens: int) -> None:
    """Decode in this process: wall tok/s and tok/s per CPU-second (what one uncontended core gives)."""
    sys.path.insert(0, str(ROOT))
    import engine
    from ninfer_cli.model_session import resolve_model, tune_blas_threads

    path, _ = resolve_model(None, quiet=True)
    eng = engine.load(path, device="cpu")
    threads = tune_blas_threads()
    ids = eng.tokenizer.encode("<|im_start|>user\nWrite a long story about a dragon.<|im_end|>\n<|im_start|>assistant\n")
    for _ in range(2):
        eng.reset()
        tok = int(eng.prefill(ids).argmax())
        w, c = time.perf_counter(), time.process_time()
        eng.decode_greedy(tok, tokens)
        w, c = time.perf_counter() - w, time.process_time() - c
        gb = eng.info()["weight_bytes"] / 1e9
        print(f"in-process decode: {tokens / w:.1f} tok/s wall, {tokens / c:.1f} tok/s per CPU-second, "
              f"{gb * tokens / w:.1f} GB/s of fp32 weights, BLAS threads {threads}, load {os.getloadavg()[0]:.1f}",
              flush=True)


if __name__ == "__main__":
    main()
