"""One `ninfer bench` session: build each engine instance, run the matrix, then the baseline, report."""
from __future__ import annotations

import gc
import os
import traceback
from pathlib import Path
from typing import Callable

from engine import bench_device
from engine.bench import (
    TOKEN_SEED, Instance, Result, Sampling, SpecRun, Test, bench_tokens, memory_probe, run_test,
)
from engine.bench_models import (
    build_model, build_synthetic, default_recipe, engine_costs, geometry_costs, hf_config_of,
)
from engine.bench_report import build_report
from engine.errors import NinferError


def _reason(e: BaseException) -> str:
    """One line for an unexpected baseline error; a SyntaxError (a damaged install's file) names the file."""
    if isinstance(e, SyntaxError) and e.filename:
        return f"{type(e).__name__}: {e.msg} (reading {e.filename})"
    return f"{type(e).__name__}: {e}"


def _release(device: str) -> None:
    gc.collect()
    if device == "gpu":
        from engine.backend import cupy_or_none  # noqa: PLC0415

        cp = cupy_or_none()
        if cp is not None:
            cp.get_default_memory_pool().free_all_blocks()


def _domain(engine, info: dict) -> int:
    args = getattr(engine, "args", None)
    if args is not None and hasattr(args, "domain"):
        return int(args.domain)
    return int(info.get("token_domain") or info.get("vocab_size") or 32000)


def _line(r: Result, who: str = "") -> str:
    parts = [f"{who}{r.test.name}", f"{r.tps.fmt()} tok/s"]
    if r.instance != Instance():
        parts.insert(0, f"[kv={r.instance.kv} lanes={r.instance.lanes} spec={r.instance.spec}]")
    if r.extra.get("error"):
        parts.append(f"error: {r.extra['error']}")
    if r.extra.get("rounds"):
        parts.append(f"acceptance {100 * r.extra['acceptance']:.0f}% · {r.extra['tokens_per_round']:.2f} tok/round · "
                     f"round {r.extra['round_ms']:.2f} ms")
    if r.gbps is not None:
        parts.append(f"{r.gbps:.4g} GB/s" + (f" ({r.pct_copy:.1f}% of copy)" if r.pct_copy is not None else ""))
    if r.tflops is not None:
        parts.append(f"{r.tflops:.3g} TFLOP/s" + (f" ({r.pct_matmul:.1f}% of matmul)" if r.pct_matmul else ""))
    return "  ".join(parts)


def run_bench(
    *,
    model: str | None,
    model_path: Path | None,
    synthetic: str | None,
    recipe: str | None,
    tests: list[Test],
    instances: list[Instance],
    repetitions: int,
    warmup: int,
    device: str,
    env: dict,
    remeasure: bool = False,
    baseline: bool = False,
    progress: Callable[[str], None] | None = None,
    command: str = "",
    fit: Callable[[str | None], int | None] | None = None,
    sampling: Sampling | None = None,
    burst: bool = False,
    spec_accept: tuple[float, ...] | None = None,
) -> dict:
    """Run every test on every instance (one engine each), then the baseline; return the report dict.

    `fit(kv)` (from `ninfer_cli.profiles.bench_fitter`) gives the context to build an instance with
    (fitted to memory); None, or no `fit`, builds with what the tests need. An instance with `spec` mtp:K decodes
    in speculative rounds; `spec_accept` forces their acceptance per draft position (greedy only; see
    `engine.bench.SpecRun`)."""
    say = progress or (lambda _text: None)
    preload_error = None
    if baseline:
        from engine.bench_baseline import check_available, preload  # noqa: PLC0415

        check_available()
        try:  # imported before our engines run: a late import has read junk from the device image's files
            preload(hf_config_of(model_path, synthetic))
        except Exception as e:  # noqa: BLE001  (reported with the results, which still run)
            preload_error = e
    roof, measured = bench_device.roofline(env, remeasure=remeasure)
    if measured:
        say(f"roofline measured: copy {roof['copy_gbps']:.1f} GB/s, {roof['matmul_dtype']} matmul "
            f"{roof['matmul_tflops']:.2f} TFLOP/s (stored in {bench_device.cache_dir()})")
        if roof.get("load_average", 0) > 0.5 * (env.get("cpu_count") or 1):
            say(f"warning: the CPU was busy (load {roof['load_average']}), so these bounds are low; "
                "run `ninfer bench --roofline` again when it is idle")
    # speculative rounds verify K + 1 columns, and a forced run's oracle decodes K more tokens
    max_context = max(t.context_needed for t in tests) + 16 + max(_draft_tokens(i.spec) for i in instances)
    memory = memory_probe(device)
    results: list[Result] = []
    meta: dict = {"model": model, "synthetic": synthetic,
                  "recipe": (recipe or default_recipe(synthetic)) if synthetic else None}
    base_meta, base_results, interrupted = None, None, False
    contexts = []
    try:
        for inst in instances:
            build_ctx = (fit(inst.kv) if fit else None) or max_context
            if build_ctx < max_context:
                raise NinferError(f"context {build_ctx:,} is shorter than the tests need ({max_context:,})",
                                  "lower -p/-n/-d, or give the engine more memory (--vram-limit, --kv int8)")
            contexts.append({"kv": inst.kv, "lanes": inst.lanes, "spec": inst.spec, "context": build_ctx})
            if synthetic:
                eng = build_synthetic(synthetic, recipe=recipe, device=device, max_context=build_ctx,
                                      instance=inst)
            else:
                eng = build_model(model_path, device=device, max_context=build_ctx, instance=inst)
            spec = None
            if inst.spec != "off":
                from engine.speculative import check_spec  # noqa: PLC0415

                spec = SpecRun(check_spec(eng, inst.spec)[1], spec_accept)
            info = dict(eng.info()) if hasattr(eng, "info") else {}
            costs, sources = engine_costs(eng, info)
            env["backend"] = info.get("backend", env["backend"])
            meta |= {
                "weight_bytes": costs.weight_bytes,
                "weight_bytes_per_token": costs.weight_bytes_per_token,
                "state_bytes": costs.state_bytes,
                "kv_bytes_per_token": costs.kv_bytes_per_token,
                "params_per_token": costs.params_per_token,
                "cost_sources": {k: v for k, v in sources.items() if v},
                "engine_info": {k: v for k, v in info.items() if isinstance(v, (str, int, float, bool, type(None)))},
            }
            tokens = bench_tokens(max_context, _domain(eng, info))
            for t in tests:
                r = run_test(eng, t, inst, repetitions=repetitions, warmup=warmup, tokens=tokens, costs=costs,
                             roofline=roof, memory=memory, sampling=sampling, burst=burst, spec=spec)
                results.append(r)
                say(_line(r))
            del eng
            _release(device)
        if baseline:
            try:
                if preload_error is not None:  # (its imports failed before our engines ran)
                    raise preload_error
                base_meta, base_results = _run_baseline(model_path, synthetic, tests, repetitions, warmup, device,
                                                        tokens, roof, say)
            except Exception as e:  # noqa: BLE001  (our results are already measured: keep them)
                if isinstance(e, NinferError):
                    reason = f"{e.message} ({e.next_action})" if e.next_action else e.message
                else:
                    reason = _reason(e)
                    if os.environ.get("NINFER_DEBUG"):
                        traceback.print_exception(e)
                say(f"baseline failed, reporting without it: {reason}")
                base_meta, base_results = {"name": "transformers", "error": reason}, []
                _release(device)
    except KeyboardInterrupt:  # a long GPU run stopped with Ctrl+C still reports what it measured
        interrupted = True
        say("interrupted: reporting the tests that finished")
    settings = {"repetitions": repetitions, "warmup": warmup, "device": device, "max_context": max_context,
                "prompt_tokens": f"PCG64 seed {TOKEN_SEED:#x}", "stops": "off", "prefix_reuse": "off",
                "decode_path": "burst" if not any(r.extra.get("path") == "stream" for r in results) else "stream",
                "sampling": (sampling or Sampling()).as_dict(),
                "spec_accept": list(spec_accept) if spec_accept is not None else None,
                "interrupted": interrupted, "contexts": contexts,
                "depth_fill": "seek (synthetic weights: KV below the depth not computed)"
                if synthetic and device == "gpu" else "prefill"}
    return build_report(command=command, env=env, roofline=roof, model=meta, settings=settings,
                        results=results, baseline=base_meta, baseline_results=base_results)


def _draft_tokens(spec: str) -> int:
    from engine.speculative import parse_spec  # noqa: PLC0415

    return 2 * parse_spec(spec)[1]


def _run_baseline(model_path, synthetic, tests, repetitions, warmup, device, tokens, roof, say):
    from engine.bench_baseline import build_baseline  # noqa: PLC0415
    from engine.config import ModelArgs  # noqa: PLC0415

    cfg = hf_config_of(model_path, synthetic)
    say("baseline: building a random-init transformers model of the same geometry")
    eng = build_baseline(cfg, device=device)
    width = 2 if eng.dtype == "bfloat16" else 4
    costs, _ = geometry_costs(ModelArgs.from_config(cfg), weight_bytes_per_param=width, kv_bytes_per_elem=width)
    info = eng.info()
    costs.weight_bytes = info["weight_bytes"]
    # the roofline belongs to the device: a CPU baseline beside a GPU run gets no bound columns
    same_device = (device == "gpu") == eng.device.startswith("cuda")
    results = []
    for t in tests:
        r = run_test(eng, t, Instance(), repetitions=repetitions, warmup=warmup, tokens=tokens, costs=costs,
                     roofline=roof if same_device else None, memory=eng.memory_probe())
        results.append(r)
        say(_line(r, "transformers "))
    meta = {"name": "transformers", "version": eng.version, "dtype": eng.dtype, "device": eng.device,
            "weight_bytes": info["weight_bytes"], "note": eng.note,
            "weights": "random init of the same geometry (speed does not depend on values with stops off)"}
    del eng
    _release(device)
    return meta, results
