"""NumPy emulation of cuda/attention.cu's split-K decode attention: attn_decode_split (one token a warp a
round), then attn_combine.

    PYTHONPATH=. .venv/bin/python dev/emu_attn_decode_split.py

The emulation follows the kernel's loops as written: the split's token range from the current length
(per = min(chunk, ceil(L / nsplit))), warp w of 8 taking tokens t0 + w, t0 + w + 8, ..., the running max / sum /
accumulator per query head, the 8 warps merged per split, the splits combined and gated. In fp32 with
the cache as stored (bf16 values), both must match ref.attention to ~1e-6 relative, and each other; the
script also walks the corner cases (length 1, a split with fewer tokens than 8, lengths just past a
round, a context cut into more splits than it has tokens) and exits 1 on any miss.
"""
from __future__ import annotations

import sys

import numpy as np

from engine.ops import ref

F32 = np.float32


def split_partials(qh, k, v, length, nsplit, chunk, tt):
    """qh [G, D] (scaled) of one kv head; k, v [S, D]: the kernel's per-split (max, sum, acc [G, D])."""
    g, d = qh.shape
    per = min(chunk, -(-length // nsplit))
    out = []
    for split in range(nsplit):
        t0, t1 = split * per, min(split * per + per, length)
        wm, wl, wa = [], [], []
        for warp in range(8):
            mx = np.full(g, -np.inf, F32)
            ls = np.zeros(g, F32)
            acc = np.zeros((g, d), F32)
            t = t0 + warp
            while t < t1:
                toks = [t + 8 * j for j in range(tt)]
                live = [tj < t1 for tj in toks]
                s = np.array([[F32(qh[gi] @ k[tj]) if lv else -np.inf for tj, lv in zip(toks, live)]
                              for gi in range(g)], F32)  # [G, TT]
                if tt == 1:  # the one-token update
                    nm = np.maximum(mx, s[:, 0])
                    c = np.exp(mx - nm).astype(F32)
                    p = np.exp(s[:, 0] - nm).astype(F32)
                    ls = ls * c + p
                    acc = acc * c[:, None] + p[:, None] * v[toks[0]][None, :]
                    mx = nm
                else:  # one rescale a round
                    nm = np.maximum(mx, s.max(axis=1))
                    c = np.exp(mx - nm).astype(F32)
                    ls = ls * c
                    acc = acc * c[:, None]
                    mx = nm
                    for j, tj in enumerate(toks):
                        p = np.exp(s[:, j] - mx).astype(F32)  # 0 for a token past the split
                        ls = ls + p
                        if live[j]:
                            acc = acc + p[:, None] * v[tj][None, :]
                t += 8 * tt
            wm.append(mx)
            wl.append(ls)
            wa.append(acc)
        wm, wl, wa = np.stack(wm), np.stack(wl), np.stack(wa)  # [8, G], [8, G], [8, G, D]
        big = wm.max(axis=0)  # the block's merge of its 8 warps
        with np.errstate(invalid="ignore"):
            c = np.where(wm > -np.inf, np.exp(wm - big), 0.0).astype(F32)
        c = np.where(big > -np.inf, c, 0.0)
        out.append((big, (wl * c).sum(axis=0), (wa * c[:, :, None]).sum(axis=0)))
    return out


def combine(parts):
    """attn_combine without the gate: sum over splits of acc e^(m - M) / sum of l e^(m - M)."""
    big = np.stack([p[0] for p in parts]).max(axis=0)  # [G]
    num = np.zeros_like(parts[0][2])
    den = np.zeros_like(parts[0][1])
    for m_, l_, a_ in parts:
        c = np.where(m_ > -np.inf, np.exp(m_ - big), 0.0).astype(F32)
        num += a_ * c[:, None]
        den += l_ * c
    return num / den[:, None]


def emulate(q, k, v, length, nsplit, chunk, tt, scale):
    """q [Hq, D]; k, v [S, Hkv, D]: the kernels' attention output [Hq, D] for a query at length - 1."""
    hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    o = np.zeros((hq, d), F32)
    for h in range(hkv):
        qh = (q[h * g:(h + 1) * g] * F32(scale)).astype(F32)
        o[h * g:(h + 1) * g] = combine(split_partials(qh, k[:, h], v[:, h], length, nsplit, chunk, tt))
    return o


def main() -> int:
    rng = np.random.default_rng(0)
    d, hkv, g, scale = 256, 2, 6, 1 / 16
    worst = 0.0
    cases = [(1, 4), (7, 4), (8, 2), (31, 3), (32, 1), (33, 5), (65, 4), (200, 3), (257, 8), (600, 16), (3, 16)]
    for length, nsplit in cases:
        chunk = -(-max(length, 1024) // nsplit)
        q = rng.standard_normal((hkv * g, d)).astype(F32)
        k = rng.standard_normal((length, hkv, d)).astype(F32)
        v = rng.standard_normal((length, hkv, d)).astype(F32)
        k, v = (ref_bf16(x) for x in (k, v))
        want = ref.attention(q[None], k, v, scale, q_start=length - 1)[0]
        for tt in (1,):  # (tokens a warp a round: the kernel's one)
            got = emulate(q, k, v, length, nsplit, chunk, tt, scale)
            err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            worst = max(worst, err)
            print(f"length {length:4d} nsplit {nsplit:2d} TT {tt}: rel err {err:.2e}")
    print(f"worst relative error {worst:.2e}")
    return 0 if worst < 1e-5 else 1


def ref_bf16(x):
    """x rounded to bf16 (what the cache stores), back in fp32."""
    from engine.artifact import formats

    return formats.bf16_bits_to_f32(formats.f32_to_bf16_bits(np.asarray(x, F32))).reshape(x.shape)


if __name__ == "__main__":
    sys.exit(main())
