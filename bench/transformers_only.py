"""Run only the transformers baseline of `ninfer bench` on a synthetic geometry (no ninfer engine needed).

Useful on a GPU machine before the synthetic GPU engine exists, or to re-measure the baseline alone:

    python bench/transformers_only.py qwen3.8-27b -p 512 -n 128 -r 3 --out bench/results/hf.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import bench, bench_device  # noqa: E402
from engine.bench_report import build_report, render  # noqa: E402
from engine.bench_run import _run_baseline  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("geometry", choices=sorted(bench_models_geometries()))
    ap.add_argument("-p", default="512")
    ap.add_argument("-n", default="128")
    ap.add_argument("-d", default="0")
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--out")
    a = ap.parse_args()
    tests = bench.expand_matrix(bench.parse_int_list(a.p, "-p"), bench.parse_int_list(a.n, "-n"), [],
                                bench.parse_int_list(a.d, "-d"))
    from engine.backend import resolve_device  # noqa: PLC0415
    from engine.bench_models import geometries  # noqa: PLC0415
    from engine.config import ModelArgs  # noqa: PLC0415

    device = resolve_device(a.device)
    env = bench_device.environment(device)
    roof, _ = bench_device.roofline(env)
    domain = ModelArgs.from_config(geometries()[a.geometry][0]).domain
    tokens = bench.bench_tokens(max(t.context_needed for t in tests) + 16, domain)
    meta, results = _run_baseline(None, a.geometry, tests, a.r, a.warmup, device, tokens, roof,
                                  lambda s: print(s, file=sys.stderr, flush=True))
    env["backend"] = f"transformers {meta['version']} {meta['dtype']}"
    report = build_report(command="python bench/transformers_only.py " + " ".join(sys.argv[1:]), env=env,
                          roofline=roof, model={"synthetic": a.geometry, "weight_bytes": meta["weight_bytes"]},
                          settings={"repetitions": a.r, "warmup": a.warmup, "device": device},
                          results=results)
    report["baseline"] = meta
    print(render(report, "md"))
    if a.out:
        Path(a.out).write_text(render(report, "json"))


def bench_models_geometries():
    from engine.bench_models import geometries  # noqa: PLC0415

    return geometries()


if __name__ == "__main__":
    main()
