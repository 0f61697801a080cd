"""MTP speculation on the CUDA engine against plain streamed decode, synthetic weights (GPU machine only):

    python bench/spec_round.py [--geometry qwen3.8-27b] [-k 3] [-n 128] [--depth 0] [--kv bf16]
                               [--accept 0.88,0.77,0.67] [--breakdown] [--prompt 2048] [--json OUT]

For each run: plain greedy decode through Engine.stream's path (generate_step, the device one step ahead): tok/s and
the step time; the round alone (K drafts by the MTP head, the fold and verification of K + 1 columns, accept: one graph
and one host read), timed over rounds whose drafts the synthetic weights reject, greedy and with the columns drawn
by the top-k sampler (temperature 0.7, top-k 20); and speculative decode with forced
acceptance: the drafts are the plain run's own continuation, position i kept in a share `--accept` of the rounds
(cumulative, as published: Qwen3.6-27B MTP 0.88/0.77/0.67; engine.speculative.forced_draft, as `ninfer bench
--spec-accept` draws them), corrupted otherwise, the MTP head still run every round. Its output must equal the plain
run's token for token. Last, the prefill of a `--prompt`-token prompt with the MTP head's rows over it (what a
speculative stream's first token waits for) and without.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


def round_breakdown(sp) -> dict:
    """{part: {"total": ms, op name: [ms, launches]}} of the round's ops replayed alone (bench/gpu_decode.py's
    time_graph), slowest first."""
    from gpu_decode import time_graph  # (bench/ is on the path of a script run from it)

    from engine.gpu import launch as K

    out = {}
    # (the fold of the last round's columns runs inside the verification's GDN kernels)
    for part, ops in (("mtp", sp.mtp.round_ops()), ("verify", sp.verify.ops)):
        per: dict[str, list] = {}
        for op in ops:
            e = per.setdefault(K.op_name(op), [0.0, 0])
            e[0] += time_graph(op)
            e[1] += 1
        ranked = sorted(per.items(), key=lambda kv: -kv[1][0])
        out[part] = {"total": round(sum(v[0] for _, v in ranked), 4), **{k: [round(v[0], 4), v[1]] for k, v in ranked}}
        print(f"{part}: {out[part]['total']:.3f} ms; " + ", ".join(f"{k} {v[0]:.3f}/{v[1]}" for k, v in ranked[:10]),
              file=sys.stderr)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--geometry", default="qwen3.8-27b")
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--depth", type=int, default=0)
    ap.add_argument("--kv", default="bf16")
    ap.add_argument("--accept", default="0.88,0.77,0.67")
    ap.add_argument("--rounds", type=int, default=64)
    ap.add_argument("--json")
    ap.add_argument("--breakdown", action="store_true",
                    help="each op of the round replayed alone: MTP, verify (with the fold)")
    ap.add_argument("--prompt", type=int, default=2048, help="prompt tokens of the prefill timed with and without the "
                    "MTP head's rows over it")
    a = ap.parse_args(argv)
    from engine.generate import generate_step
    from engine.sampling import Sampler
    from engine.speculative import SpecStats, draft_head, forced_draft, speculative_generate_step
    from engine.synthetic import build_engine

    accept = [float(x) for x in a.accept.split(",")][: a.k]
    eng = build_engine(a.geometry, max_context=a.depth + max(1024, a.prompt + 64), kv=a.kv)
    t0 = time.perf_counter()
    sp = eng.speculator(a.k)
    build_s = time.perf_counter() - t0
    V = eng.model.args.vocab_size
    seed_ids = [5, 6, 7, 8]
    prompt = [0] * a.depth + seed_ids  # (the speculative loop resumes from the sought context: prefix reuse)

    def fresh():
        eng.reset()
        if a.depth:
            eng.seek_synthetic(a.depth)

    def plain(n):
        fresh()
        g = generate_step(eng, seed_ids, Sampler(temperature=0.0), max_tokens=n)  # (prefilled after the context)
        first = next(g)
        t = time.perf_counter()
        out = [first] + list(g)
        return out, time.perf_counter() - t

    plain(16)  # warm
    cont, dt = plain(a.n)
    step_ms = dt / (a.n - 1) * 1e3
    # the round alone: MTP drafts (rejected), fold and verify, accept
    fresh()
    list(speculative_generate_step(eng, prompt, Sampler(temperature=0.0), k=a.k, max_tokens=4))
    ts = []
    for _ in range(a.rounds):
        t = time.perf_counter()
        sp.round(None)
        ts.append(time.perf_counter() - t)
    round_ms = float(np.median(ts)) * 1e3
    from engine.device_sampling import pack_params

    drawn = pack_params(temperature=0.7, top_k=20, seed=1)  # (the columns' draws by the top-k sampler)
    ts = []
    for _ in range(a.rounds):
        t = time.perf_counter()
        sp.round(None, drawn)
        ts.append(time.perf_counter() - t)
    sampled_round_ms = float(np.median(ts)) * 1e3
    parts = round_breakdown(sp) if a.breakdown else None
    # forced acceptance
    res = []
    for rep in range(2):
        fresh()
        stats = SpecStats(a.k)
        g = speculative_generate_step(eng, prompt, Sampler(temperature=0.0), k=a.k, max_tokens=a.n, stats=stats,
                                      draft=forced_draft(cont, len(prompt), accept, seed=rep), mtp=True)
        first = next(g)
        t = time.perf_counter()
        out = [first] + list(g)
        res.append((time.perf_counter() - t, out, stats))
    sdt, out, stats = min(res, key=lambda r: r[0])
    # the prefill of a prompt with the MTP head's rows over it (speculation's first token) and without
    ids = [int(t) for t in np.random.default_rng(0).integers(0, V, a.prompt)]

    def prefill(with_mtp: bool) -> float:
        eng.reset()
        sp.prompt.restart()
        eng.model.hidden_sink = sp.prompt.absorb if with_mtp else None
        try:
            t = time.perf_counter()
            eng._resume(ids)
            if with_mtp:
                sp.prompt.flush(0)
            eng.model.executor.stream.synchronize()
            return time.perf_counter() - t
        finally:
            eng.model.hidden_sink = None

    prefill(True)
    pf_plain, pf_mtp = min(prefill(False) for _ in range(2)), min(prefill(True) for _ in range(2))
    info = eng.info()
    gbs = info["weight_bytes_per_token"] / (step_ms / 1e3) / 1e9
    row = {"geometry": a.geometry, "k": a.k, "depth": a.depth, "kv": a.kv, "n": a.n,
           "plain_tok_s": (a.n - 1) / dt, "plain_step_ms": step_ms, "plain_gb_s": gbs,
           "round_ms": round_ms, "round_over_step": round_ms / step_ms, "sampled_round_ms": sampled_round_ms,
           "forced_accept": accept, "spec_tok_s": (a.n - 1) / sdt, "speedup": dt / sdt,
           "identical": out == cont, "stats": stats.as_dict(),
           "measured_accept_per_position": [x / max(stats.rounds, 1) for x in stats.accepted_at],
           "speculator_build_s": build_s, "path": "stream", "gpu": info.get("device_name", ""),
           "prompt": a.prompt, "prefill_ms": pf_plain * 1e3, "prefill_with_mtp_ms": pf_mtp * 1e3,
           "commit": os.environ.get("NINFER_GIT_COMMIT"), "draft_head": draft_head(eng)}
    if parts:
        row["breakdown_ms"] = parts
    print(json.dumps(row))
    print(f"{a.geometry} d{a.depth} {a.kv} mtp:{a.k}: plain {row['plain_tok_s']:.2f} tok/s ({step_ms:.3f} ms/step, "
          f"{gbs:.0f} GB/s); round {round_ms:.3f} ms = {row['round_over_step']:.2f} x step (sampled top-k 20: "
          f"{sampled_round_ms:.3f} ms); forced "
          f"{'/'.join(f'{x:.2f}' for x in accept)}: {row['spec_tok_s']:.2f} tok/s ({row['speedup']:.2f}x), "
          f"{stats.tokens_per_round:.2f} tok/round, identical={row['identical']}; prefill of {a.prompt} tokens "
          f"{pf_plain * 1e3:.1f} ms, with the MTP head's rows {pf_mtp * 1e3:.1f} ms", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(row, f, indent=1)
    return 0 if row["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
