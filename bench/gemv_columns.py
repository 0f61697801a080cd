"""The GEMVs of a synthetic model over 1 and M token columns (GPU machine only): what verification of K + 1 columns
pays for its projections against one decode token.

    python bench/gemv_columns.py [--geometry qwen3.8-27b] [--cols 4] [--iters 50] [--warps 2,4,8 --gu 2,4 --stages 3,4]
                                 [--mtp [--one-rows 1,2 --one-splits 1,2,4]] [--json OUT]

For every distinct packed matrix of the decode executor (format, rows, K: the merged projections, the head), x
pre-staged as the producers stage it (with its packed twin, which gemv_tc reads for up to 4 columns of q4-q6): the time of GemvPlan for one column (gemv_rs_pre, the decode's form without
its tuning table) and for M columns (gemv_tc), GB/s of its weight bytes, and the per-token total over the model
(each matrix times its count). --mtp: the MTP head's matrices instead (its input projection, its layer's, the
proposal head), the ones a round reads once over the verified columns (the catch-up, M columns) and K - 1 times
for one row (the drafts); --one-rows / --one-splits time the one-row forms too (rows a warp, split-K planes).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter


def time_ms(cp, fn, iters: int) -> float:
    fn()
    cp.cuda.Device().synchronize()
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    b.synchronize()
    return cp.cuda.get_elapsed_time(a, b) / iters


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--geometry", default="qwen3.8-27b")
    ap.add_argument("--cols", type=int, default=4)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warps", default="", help="gemv_tc warps a tile to time beside the launcher's choice (e.g. 1,2,8)")
    ap.add_argument("--gu", default="", help="gemv_tc groups a run (GU) to time with each --warps (e.g. 2,4)")
    ap.add_argument("--stages", default="", help="gemv_tc ring stages (S) to time with each --warps and --gu (e.g. 3,4,6)")
    ap.add_argument("--mtp", action="store_true", help="the MTP head's matrices (the model's weights must carry mtp)")
    ap.add_argument("--one-rows", default="", help="one-row forms: rows a warp (e.g. 1,2), with each --one-splits")
    ap.add_argument("--one-splits", default="", help="one-row forms: split-K planes (e.g. 1,2,4)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    import cupy as cp

    from engine.gpu import gemv
    from engine.gpu import kernel_names as KN
    from engine.gpu import launch as K
    from engine.gpu.gemv import GemvPlan
    from engine.gpu.norm import stage_rows
    from engine.synthetic import build_engine

    warps = [int(v) for v in a.warps.split(",") if v]
    gus = [int(v) for v in a.gu.split(",") if v] or [KN.GEMV_TC_GU]
    K.require(KN.gemv_names(range(4), (a.cols,), pair=False, bf16=False, conv=[], xs=[]))  # (in the plan's module)
    stages = [int(v) for v in a.stages.split(",") if v] or [KN.GEMV_TC_STAGES]
    K.require(KN.gemv_tc_name(f, a.cols, gu, st, pk) for f in range(4) for gu in gus for st in stages
              for pk in ((False, True) if KN.gemv_tc_packs(f, a.cols) else (False,)))
    eng = build_engine(a.geometry, max_context=1024)
    ex = eng.model.executor
    if a.mtp:
        mtp = eng.speculator(3).mtp
        shared = {id(ex.head), id(ex.embed)}
        mats = [mtp.fc] + [m for m in mtp._matrices() if id(m) not in shared] + \
            ([mtp.phead] if mtp.phead is not None else [])
        mats = [m for m in mats if m.fmt in K.FMT_IDS]
    else:
        mats = [m for m in ex._matrices() if m.fmt in K.FMT_IDS and m is not ex.embed]
    one_rows = [int(v) for v in a.one_rows.split(",") if v]
    one_splits = [int(v) for v in a.one_splits.split(",") if v] or [1]
    count = Counter((m.fmt, m.n, m.k) for m in mats)
    first = {}
    for m in mats:
        first.setdefault((m.fmt, m.n, m.k), m)
    rows, tot1, totm, nbytes = [], 0.0, 0.0, 0
    M = a.cols
    for key, w in first.items():
        kpad = -(-w.k // K.XPAD) * K.XPAD
        x = cp.random.default_rng(0).standard_normal((M, w.k), dtype=cp.float32)
        xh, xinv = cp.zeros((M, kpad // 2), dtype=cp.uint32), cp.zeros(M, dtype=cp.float32)
        # (and the packed twin the producers write where gemv_tc reads one: StepContext._twin)
        pk = cp.zeros((kpad // 64 + 4) * 512, dtype=cp.uint8) if KN.gemv_tc_packs(0, M) else None
        stage_rows(x=x, ld=w.k, k=w.k, kpad=kpad, xh=xh, ldh=kpad // 2, xinv=xinv, rows=M, blocks=3, xpk=pk)()
        y = cp.zeros((M, w.n), dtype=cp.float32)
        one = GemvPlan(w, None, w.k, y[:1], w.n, m=1, xpre=(xh[:1], xinv[:1]), pre2=True)
        many = GemvPlan(w, None, w.k, y, w.n, m=M, xpre=(xh, xinv, pk))
        t1, tm = time_ms(cp, one.launch, a.iters), time_ms(cp, many.launch, a.iters)
        ones = {}
        for r in one_rows:
            for s in one_splits:
                yp = cp.zeros((s, w.n), dtype=cp.float32)
                plan = GemvPlan(w, None, w.k, yp, w.n, m=1, xpre=(xh[:1], xinv[:1]), pre2=True, rows=r,
                                splits=s, epi="partial" if s > 1 else "store")
                ones[f"r{r}s{plan.splits}"] = time_ms(cp, plan.launch, a.iters)
        chosen, other, diff = gemv.tc_warps, {}, {}
        want = cp.asnumpy(y)  # (the launcher's choice's output: every variant's is compared with it)
        scale = float(abs(want).max()) or 1.0
        for gu in gus if warps else []:
            for st in stages:
                for wt in warps:
                    gemv.tc_warps = lambda tiles, wt=wt: wt
                    name = f"gu{gu}s{st}wt{wt}"
                    try:
                        plan = GemvPlan(w, None, w.k, y, w.n, m=M, xpre=(xh, xinv, pk), tc=(gu, st))
                    except Exception as e:  # noqa: BLE001 (a ring too large for shared memory)
                        print(f"  {name}: {str(e).splitlines()[-1][:100]}", file=sys.stderr)
                        continue
                    y.fill(float("nan"))
                    other[name] = time_ms(cp, plan.launch, a.iters)
                    diff[name] = float(abs(cp.asnumpy(y) - want).max()) / scale
        gemv.tc_warps = chosen
        bad = {k: v for k, v in diff.items() if not v < 1e-5}
        if bad:
            print(f"  variants whose output differs from the launcher's choice (max |diff| / max |y|): {bad}",
                  file=sys.stderr)
        n = count[key]
        tot1, totm, nbytes = tot1 + n * t1, totm + n * tm, nbytes + n * w.nbytes
        rows.append({"fmt": key[0], "n": key[1], "k": key[2], "count": n, "bytes": w.nbytes, "one_ms": t1,
                     "cols_ms": tm, "one_gb_s": w.nbytes / t1 / 1e6, "cols_gb_s": w.nbytes / tm / 1e6,
                     "kernel": many.kname, "warps": many.warps, "by_warps_ms": other,
                     "variant_rel_diff": diff, "one_forms_ms": ones})
        best = min(other, key=other.get) if other else ""
        print(f"{key[0]:12s} {key[1]:>7d} x {key[2]:>6d} x{n:<3d} 1 col {t1 * 1e3:8.1f} us ({w.nbytes / t1 / 1e6:6.0f} GB/s)"
              f"   {M} cols {tm * 1e3:8.1f} us ({w.nbytes / tm / 1e6:6.0f} GB/s) = {tm / t1:.2f}x (wt {many.warps}) "
              + " ".join(f"{k}: {v * 1e3:.1f}" for k, v in other.items()) + (f" best {best}" if best else "")
              + ("   one row " + " ".join(f"{k}: {v * 1e3:.1f}" for k, v in ones.items()) if ones else ""),
              file=sys.stderr)
    out = {"geometry": a.geometry, "cols": M, "mtp": a.mtp, "matrices": rows, "total_one_ms": tot1, "total_cols_ms": totm,
           "weight_bytes": nbytes, "gpu": eng.info().get("device_name", "")}
    print(f"per token, every matrix: 1 col {tot1:.3f} ms ({nbytes / tot1 / 1e6:.0f} GB/s), {M} cols {totm:.3f} ms "
          f"({nbytes / totm / 1e6:.0f} GB/s) = {totm / tot1:.2f}x", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
