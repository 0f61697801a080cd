"""The decode attention alone at long context (GPU machine): attn_decode_mma's forms, split counts and KV layouts,
each as microseconds a launch and GB/s of the cache bytes it must read, against the copy bandwidth.

    python bench/attn_probe.py --out $OUT/attn_probe.json

Layouts: "heads" is the cache as the engine keeps it ([page][64 slots][Hkv][256]: a KV head's rows 256 bytes apart
from the next token's by Hkv x 256); "contig" runs one KV head over Hkv times the tokens, so that the same bytes are
read as rows that follow each other (what a [page][Hkv][64 slots][256] cache would give each block). Three copies of
the cache rotate through the timed graph so that nothing is served from L2. Launches are plain (no PDL overlap).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import cupy as cp  # noqa: E402

from engine.gpu import launch as K  # noqa: E402
from gemv_sweep import time_graph  # noqa: E402
from gpu_decode import copy_bandwidth  # noqa: E402

PAGE, D = 64, 256


def cache(tokens: int, hkv: int, int8: bool, rng):
    """(kc, vc, ks, vs, page table, bytes): a cache of `tokens` rows of hkv heads, pages in order."""
    pages = tokens // PAGE
    if int8:
        kc = cp.asarray(rng.integers(-127, 128, (pages, PAGE, hkv, D), dtype=np.int8))
        vc = cp.asarray(rng.integers(-127, 128, (pages, PAGE, hkv, D), dtype=np.int8))
        ks = cp.full((pages, PAGE, hkv, D // 64), 0.01, dtype=cp.float16)
        vs = cp.full((pages, PAGE, hkv, D // 64), 0.01, dtype=cp.float16)
        nbytes = 2 * (kc.nbytes + ks.nbytes)
    else:
        kc = cp.asarray(rng.integers(0x3c00, 0x3c40, (pages, PAGE, hkv, D), dtype=np.uint16))
        vc = cp.asarray(rng.integers(0x3c00, 0x3c40, (pages, PAGE, hkv, D), dtype=np.uint16))
        ks = vs = None
        nbytes = 2 * kc.nbytes
    return kc, vc, ks, vs, cp.arange(pages, dtype=cp.int32)[None], nbytes


def probe(name, block, smem, tokens, hkv, g, nsplit, int8, rng):
    """µs a launch and GB/s of the cache, the launch rotating over three copies of the cache."""
    ptr = lambda a: np.uint64(0 if a is None else a.data.ptr)  # noqa: E731
    hq = hkv * g
    q = cp.asarray(rng.standard_normal((1, hq * D), dtype=np.float32))
    pos = cp.asarray(np.array([tokens - 1], dtype=np.int32))
    ml = cp.zeros((1, hq, nsplit, 2), dtype=cp.float32)
    acc = cp.zeros((1, hq, nsplit, D), dtype=cp.float32)
    launches, nbytes = [], 0
    for _ in range(3):
        kc, vc, ks, vs, pt, nbytes = cache(tokens, hkv, int8, rng)
        args = (q, kc, vc, pos, pt, pt.shape[1], hkv, -(-tokens // nsplit), 1 / 16, ml, acc, nsplit, ptr(ks), ptr(vs))
        launches.append((K.prepared(name, (hkv, nsplit, 1), args, block=block, smem=smem), (kc, vc, ks, vs, pt)))

    def run():
        for launch, _keep in launches:
            launch()
    us = time_graph(run, reps=10) / 3 * 1e3
    return dict(kernel=name, tokens=tokens, hkv=hkv, nsplit=nsplit, us=round(us, 2), gbs=round(nbytes / us / 1e3, 1))


def configs(sms: int, g: int, T: int):
    """(kernel, W, NS, tokens, KV heads, nsplit, int8, raw K: True, False, "vraw" (raw V too) or "tr" (the transposed
    form, nsplit its blocks an SM's worth)) of each probe."""
    out = [(K.attn_mma_kraw_name(g, f), w, ns, T, 4, sms // 4, True, True)  # the engine's split count (one wave)
           for f, (w, ns) in enumerate(K.ATTN_MMA_KRAW_FORMS)]
    w, ns = K.ATTN_MMA_FORMS[True][0]
    out.append((f"attn_decode_mma<{g},true,{w},{ns}>", w, ns, T, 4, sms // 4, True, False))
    out += [(K.attn_mma_kraw_name(g, 0), 4, 4, T, 4, mult * sms // 4, True, True) for mult in (2, 4)]  # more splits
    for f in (0, 2):  # the same bytes as one head's consecutive rows
        w, ns = K.ATTN_MMA_KRAW_FORMS[f]
        out.append((K.attn_mma_kraw_name(g, f), w, ns, 4 * T, 1, sms, True, True))
    w, ns = K.ATTN_MMA_FORMS[False][0]
    out.append((f"attn_decode_mma<{g},false,{w},{ns}>", w, ns, T, 4, sms // 4, False, False))
    out.append((f"attn_decode_mma<{g},false,{w},{ns}>", w, ns, 4 * T, 1, sms, False, False))
    out += [(K.attn_mma_vraw_name(g, f), w, ns, T, 4, sms // 4, True, "vraw")  # raw K and raw V (probes 11, 12)
            for f, (w, ns) in enumerate(K.ATTN_MMA_VRAW_FORMS)]
    out += [(K.attn_mma_t_name(g, f), w, ns, T, 4, minb * sms // 4, True, "tr")  # transposed (probes 13-17)
            for f, (w, ns, minb) in enumerate(K.ATTN_MMA_T_FORMS)]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--only", type=int, default=-1, help="run probe N only (a process each: a fault kills one)")
    ap.add_argument("--count", action="store_true", help="print how many probes there are")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    g = 6
    todo = configs(K.sm_count(), g, a.tokens)
    if a.count:
        print(len(todo))
        return
    K.PDL = False
    rng = np.random.default_rng(0)
    bw = copy_bandwidth()
    rows = []
    for i, (name, w, ns, tokens, hkv, nsplit, int8, kraw) in enumerate(todo):
        if a.only >= 0 and i != a.only:
            continue
        print(f"  {name:40s} {'heads' if hkv > 1 else 'contig':6s} tokens {tokens:6d} nsplit {nsplit:3d}: ", end="",
              flush=True)
        smem = K.attn_mma_t_smem(w, ns) if kraw == "tr" else K.attn_mma_smem(int8, w, ns, kraw=bool(kraw),
                                                                               vraw=kraw == "vraw")
        r = probe(name, 32 * w, smem, tokens, hkv, g, nsplit, int8, rng)
        cp.cuda.Device().synchronize()
        r.update(pct_copy=round(100 * r["gbs"] / bw, 1), layout="heads" if hkv > 1 else "contig", copy_gbs=round(bw))
        rows.append(r)
        print(f"{r['us']:7.2f} us {r['gbs']:7.1f} GB/s ({r['pct_copy']}% of {bw:.0f})", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
