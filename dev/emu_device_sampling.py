"""NumPy emulation of cuda/sampler.cu's device sampler (sample_max_mb + sample_step_mb), step by step as the
kernels do it: per-block slices and maxima, per-block bucket histograms (count, double weight), the candidate
list of the top buckets (capped, with its overflow), and the last block's merge, bucket walk, sorted-bucket
scans and the bisection over 64-bit keys for buckets of more than `cap` ids. Run it to compare the tokens
with engine.sampling.Sampler on many random rows:

    PYTHONPATH=. .venv/bin/python dev/emu_device_sampling.py [--rows N] [--cap C]

`--cap` shrinks SAMPLE_CAP (2048 on the device) so the bisection path runs on ordinary rows too.
tests/test_device_sampling_host.py runs a short version of the same comparison.
"""
from __future__ import annotations

import argparse
import math

import numpy as np

from engine.device_sampling import SAMPLE_Q, SAMPLE_QTOP, SAMPLE_R, pack_params
from engine.sampling import PURPOSE_DECODE, Sampler, counter_uniform

SAMPLE_CAP = 2048


def sort_keys(x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """sample_key: ordered float bits << 32 | (2^32 - 1 - id), descending = (logit desc, id asc)."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    o = np.where(b & 0x80000000, ~b & 0xFFFFFFFF, b | 0x80000000).astype(np.uint64)
    return (o << np.uint64(32)) | (np.uint64(0xFFFFFFFF) - ids.astype(np.uint64))


def key_logit(k: np.ndarray) -> np.ndarray:
    o = (k >> np.uint64(32)).astype(np.uint32)
    b = np.where(o & 0x80000000, o & 0x7FFFFFFF, ~o).astype(np.uint32)
    return b.view(np.float32)


class Row:
    """One token row's context: what sample_bucket computes (membership, bucket, weight) in double."""

    def __init__(self, logits, D, T, min_p):
        self.l = np.asarray(logits, np.float32)[:D]
        self.D = D
        self.M = float(self.l.max())
        self.T, self.min_p = float(T), float(min_p)
        self.thr = self.M - 30.0 * self.T
        x = self.l.astype(np.float64)
        inm = x >= self.thr
        t = (x - self.M) / self.T
        q = np.minimum(SAMPLE_Q - 1, np.where(inm, -t * SAMPLE_R, 0).astype(np.int64))
        w = np.exp(t)
        if self.min_p > 0.0:
            inm &= w >= self.min_p
        self.member, self.q, self.w = inm, q, w
        self.key = sort_keys(self.l, np.arange(D))

    def bucket_ids(self, q):
        return np.flatnonzero(self.member & (self.q == q))


def _cut_ok(cut, rank, cum):
    mode, cap, target, denom = cut
    if rank >= cap:
        return True
    if mode == "ge":
        return cum / denom >= target
    if mode == "gt":
        return cum / denom > target
    return False


def _bucket_sorted(row, q, rank0, cum0, cut, cand, cand_ok):
    if cand_ok and q < SAMPLE_QTOP:  # from the candidate list (keys only; weights recomputed from them)
        x = key_logit(cand).astype(np.float64)
        keys = cand[np.minimum(SAMPLE_Q - 1, (-((x - row.M) / row.T) * SAMPLE_R).astype(np.int64)) == q]
    else:
        keys = row.key[row.bucket_ids(q)]
    keys = np.sort(keys)[::-1]
    w = np.exp((key_logit(keys).astype(np.float64) - row.M) / row.T)
    pre = np.cumsum(w)  # (the device's parallel scan adds in another order: rounding only)
    for i in range(keys.size):
        if _cut_ok(cut, rank0 + i + 1, cum0 + pre[i]):
            return True, int(0xFFFFFFFF - int(keys[i] & np.uint64(0xFFFFFFFF))), rank0 + i + 1, cum0 + pre[i], pre[-1]
    return False, -1, rank0 + keys.size, cum0 + pre[-1], pre[-1]


def _bucket_bisect(row, q, rank0, cum0, cut):
    ids = row.bucket_ids(q)
    keys, w = row.key[ids], row.w[ids]

    def stats(k):
        sel = keys >= np.uint64(k)
        return int(sel.sum()), float(w[sel].sum())

    lo, hi = int(keys.min()), int(keys.max())
    n, s = stats(lo)
    if not _cut_ok(cut, rank0 + n, cum0 + s):
        return False, -1, rank0 + n, cum0 + s, s
    steps = 0
    while lo < hi:
        mid = lo + (hi - lo) // 2 + 1
        n2, s2 = stats(mid)
        if _cut_ok(cut, rank0 + n2, cum0 + s2):
            lo = mid
        else:
            hi = mid - 1
        steps += 1
    n2, s2 = stats(lo)
    return True, int(0xFFFFFFFF - (lo & 0xFFFFFFFF)), rank0 + n2, cum0 + s2, s


def _find(row, qs, cut, cnt, cb, wb, cand, cand_ok, cap, log):
    rank0, cum0 = int(cb[qs]), float(wb[qs])
    h = (False, -1, 0, 0.0, 0.0)
    for q in range(qs, SAMPLE_Q):
        if cnt[q] == 0:
            continue
        if cnt[q] <= cap:
            h = _bucket_sorted(row, q, rank0, cum0, cut, cand, cand_ok)
            log.append("sorted-cand" if cand_ok and q < SAMPLE_QTOP else "sorted-row")
        else:
            h = _bucket_bisect(row, q, rank0, cum0, cut)
            log.append("bisect")
        if h[0]:
            return h
        rank0 += int(cnt[q])
        cum0 += h[4]
    return h


def _first_bucket(qmax, cut, cnt, wb, mass):
    for q in range(qmax):
        if cnt[q] > 0 and _cut_ok(cut, 0, wb[q] + mass[q]):
            return q
    return qmax


def device_sample(logits, position, params, D=None, *, blocks=64, cap=SAMPLE_CAP, cap_g=8192, log=None):
    """The token sample_step_mb commits for one row whose step sits at `position` - 1 (pos[m] + 1 = position).
    `params`: the packed u64 row (engine.device_sampling.pack_params)."""
    log = [] if log is None else log
    p = np.asarray(params, np.uint64)
    T, top_p, min_p = (float(p[i:i + 1].view(np.float64)[0]) for i in range(3))
    top_k = int(p[3].astype(np.int64))
    seed, purpose = int(p[4]), int(p[5])
    D = len(logits) if D is None else D
    l = np.asarray(logits, np.float32)[:D]
    # sample_max_mb: per-block (max, lowest id); the merge keeps the lowest id among equal maxima
    per = -(-D // blocks)
    parts = [(float(l[b * per:(b + 1) * per].max()), b * per + int(np.argmax(l[b * per:(b + 1) * per])))
             for b in range(blocks) if b * per < D]
    best = max(v for v, _ in parts)
    idx = min(i for v, i in parts if v == best)
    if not T > 0.0:
        return idx
    row = Row(l, D, T, min_p)
    # sample_step_mb, every block: histogram of its slice, candidates of the top buckets
    hist_c = np.zeros((blocks, SAMPLE_Q), np.int64)
    hist_w = np.zeros((blocks, SAMPLE_Q), np.float64)
    cand = []
    for b in range(blocks):
        sl = np.arange(b * per, min(D, (b + 1) * per))
        sl = sl[row.member[sl]]
        np.add.at(hist_c[b], row.q[sl], 1)
        np.add.at(hist_w[b], row.q[sl], row.w[sl])
        cand.extend(row.key[sl[row.q[sl] < SAMPLE_QTOP]].tolist())
    cand_ok = len(cand) <= cap_g
    cand = np.asarray(cand[:cap_g], np.uint64)
    # the last block
    cnt, mass = hist_c.sum(0), hist_w.sum(0)
    cb = np.concatenate([[0], np.cumsum(cnt)])
    wb = np.concatenate([[0.0], np.cumsum(mass)])
    N = int(cb[-1])
    if N == 0:
        return idx
    qlast = int(np.flatnonzero(cnt)[-1])
    K1 = top_k if 0 < top_k < N else N
    D1, q1 = float(wb[-1]), qlast
    if K1 < N:
        q1 = int(np.flatnonzero((cb[:-1] < K1) & (K1 <= cb[1:]))[0])
        D1 = _find(row, q1, ("rank", K1, 0.0, 1.0), cnt, cb, wb, cand, cand_ok, cap, log)[3]
    K2, S, q2 = K1, D1, q1
    if top_p < 1.0:
        cut = ("ge", K1, top_p, D1)
        h = _find(row, _first_bucket(q1, cut, cnt, wb, mass), cut, cnt, cb, wb, cand, cand_ok, cap, log)
        K2, S = h[2], h[3]
        q2 = int(np.flatnonzero((cb[:-1] < K2) & (K2 <= cb[1:]))[0])
    u = counter_uniform(seed, position, purpose)
    cut = ("gt", K2, u, S)
    h = _find(row, _first_bucket(q2, cut, cnt, wb, mass), cut, cnt, cb, wb, cand, cand_ok, cap, log)
    return h[1] if h[0] else idx


# ---- the comparison ----------------------------------------------------------------------------------

SETTINGS = [
    dict(temperature=0.7),
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=20, top_p=0.8),
    dict(temperature=0.6, top_p=0.95),
    dict(temperature=1.0, min_p=0.05),
    dict(temperature=1.5, top_k=3000),
    dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.02),
    dict(temperature=2.0, top_p=0.5),
    dict(temperature=0.3, top_k=1),
    dict(temperature=1.0, min_p=1.5),  # min_p > 1: the host keeps its top id
    dict(temperature=1.0, top_p=0.0),
    dict(temperature=0.0),
]


def make_row(rng, kind, V):
    if kind == "peaked":
        x = rng.standard_normal(V).astype(np.float32) * 2
        x[rng.integers(0, V, 5)] += rng.uniform(8, 20, 5).astype(np.float32)
    elif kind == "flat":
        x = np.zeros(V, np.float32)
    elif kind == "ties":  # a few distinct values: many equal logits
        x = rng.integers(-3, 2, V).astype(np.float32)
    elif kind == "wide":
        x = (rng.standard_normal(V) * 6).astype(np.float32)
    else:  # "llm": a heavy bulk and a long head, like a real step
        x = (rng.standard_normal(V) * 2.5 - 2).astype(np.float32)
        x[rng.integers(0, V, 40)] += rng.exponential(6, 40).astype(np.float32)
    return x


def compare(rows: int, V: int, cap: int, seed: int = 0, cap_g: int = 8192, verbose=True) -> tuple[int, int, dict]:
    """(mismatches, draws, paths used) over `rows` random rows and every setting."""
    rng = np.random.default_rng(seed)
    kinds = ["peaked", "llm", "flat", "ties", "wide"]
    bad, total, paths = 0, 0, {}
    for r in range(rows):
        kind = kinds[r % len(kinds)]
        x = make_row(rng, kind, V)
        D = V - int(rng.integers(0, 50))
        for st in SETTINGS:
            s = Sampler(seed=int(rng.integers(0, 2**63)), domain=D, **st)
            pos = int(rng.integers(0, 1 << 20))
            want = s(x, pos)
            log = []
            got = device_sample(x, pos, pack_params(s), D, cap=cap, cap_g=cap_g, log=log)
            for name in log:
                paths[name] = paths.get(name, 0) + 1
            total += 1
            if got != want:
                bad += 1
                if verbose:
                    print(f"MISMATCH row {r} ({kind}) {st} pos {pos}: device {got} host {want}")
    return bad, total, paths


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=60)
    ap.add_argument("--vocab", type=int, default=248_320)
    ap.add_argument("--cap", type=int, default=SAMPLE_CAP)
    ap.add_argument("--cap-g", type=int, default=8192)
    a = ap.parse_args()
    bad, total, paths = compare(a.rows, a.vocab, a.cap, cap_g=a.cap_g)
    print(f"{total - bad}/{total} draws equal to engine.sampling (vocab {a.vocab}, cap {a.cap}); bucket paths {paths}")
    assert math.isfinite(total)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
