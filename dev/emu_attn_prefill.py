"""NumPy emulation of cuda/attn_prefill.cu (attn_prefill_fa): its fragment layouts, tiling and online softmax.

    PYTHONPATH=. .venv/bin/python dev/emu_attn_prefill.py

1. Fragments: ldmatrix (.x4, plain and .trans) and mma.m16n8k16 emulated lane by lane from the PTX ISA's
   fragment tables (A: a0,a1 row g cols 2t,2t+1; a2,a3 row g+8; a4..a7 the same at cols + 8; B: b0,b1
   rows 2t,2t+1 col g, b2,b3 rows + 8; C: c0,c1 row g cols 2t,2t+1, c2,c3 row g+8; g = lane >> 2,
   t = lane % 4; ldmatrix: lanes 8i..8i+7 give the row addresses of matrix i, lane l receives row l >> 2,
   elements 2(l % 4), +1 of each matrix, or with .trans the column l >> 2, rows 2(l % 4), +1), with the
   kernel's lane addresses: S = Q K^T and O = P V of one warp must equal the plain matrix products,
   with P taken from the S accumulators as the kernel packs it.
2. Tiling: the kernel's loop (query tiles of 16 NW rows, key tiles = cache pages through a permuted
   page table, warps skipping tiles past their rows, the causal mask on diagonal tiles, log2-unit
   online softmax, per-thread row-sum shares added over the quad at the end) in fp32 without rounding
   the MMA inputs: must match plain softmax attention to ~1e-6. With the inputs rounded as the kernel
   rounds them (bf16 Q, P for a bf16 cache; fp16 for int8), the distance to the fp32 reference is
   printed against the attention_bf16 / attention_int8 rel-L2 bound (8e-3).
3. int8 decode: the byte_perm / fp16 magic-number decode of fa_dequant4 gives code exactly and one
   rounding of code * scale, for every code and a spread of scales.
"""
from __future__ import annotations

import sys

import numpy as np

D, BN, LD = 256, 64, 264


# ---------------------------------------------------------------- 1. fragments
def ldmatrix_x4(sm, lane_rc, trans=False):
    """sm [rows, LD] (16-bit values as float); lane_rc[l] = (row, col) address lane l gives.
    Returns regs [32 lanes][4 matrices][2 values] (low half first)."""
    out = np.zeros((32, 4, 2), np.float64)
    for i in range(4):
        rows = [lane_rc[8 * i + r] for r in range(8)]  # matrix i: 8 rows of 8 values
        m = np.array([sm[r, c: c + 8] for r, c in rows])  # [8, 8]
        if trans:
            m = m.T
        for lane in range(32):
            out[lane, i] = m[lane >> 2, 2 * (lane % 4): 2 * (lane % 4) + 2]
    return out


def mma_16816(a, b, c):
    """a [32][4][2] (regs a0..a3 = elements a0..a7), b [32][2][2], c [32][4]: D = A B + C lane by lane."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        for i in range(8):
            row = g if (i < 2 or 4 <= i < 6) else g + 8
            col = 2 * t + (i & 1) + (8 if i >= 4 else 0)
            A[row, col] = a[lane, i // 2, i % 2]
        for i in range(4):
            B[2 * t + (i & 1) + (8 if i >= 2 else 0), g] = b[lane, i // 2, i % 2]
    C = frag_to_c(c)
    return c_to_frag(A @ B + C)


def frag_to_c(c):
    C = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        C[g, 2 * t: 2 * t + 2] = c[lane, 0:2]
        C[g + 8, 2 * t: 2 * t + 2] = c[lane, 2:4]
    return C


def c_to_frag(C):
    c = np.zeros((32, 4))
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        c[lane, 0:2] = C[g, 2 * t: 2 * t + 2]
        c[lane, 2:4] = C[g + 8, 2 * t: 2 * t + 2]
    return c


def check_fragments(warp=1, nw=4, seed=0):
    rng = np.random.default_rng(seed)
    bm = 16 * nw
    Qs = rng.standard_normal((bm, LD))
    Ks = rng.standard_normal((BN, LD))
    Vs = rng.standard_normal((BN, LD))
    lanes = range(32)
    # the kernel's lane addresses (element offsets; qa/ka/va in attn_prefill_fa)
    qa = [(16 * warp + (l & 7) + 8 * ((l >> 3) & 1), 8 * (l >> 4)) for l in lanes]
    ka = [((l & 7) + 8 * (l >> 4), 8 * ((l >> 3) & 1)) for l in lanes]
    va = [((l & 7) + 8 * ((l >> 3) & 1), 8 * (l >> 4)) for l in lanes]
    s = np.zeros((8, 32, 4))
    for kk in range(D // 16):
        a = ldmatrix_x4(Qs, [(r, c + 16 * kk) for r, c in qa])
        for np_ in range(4):
            b = ldmatrix_x4(Ks, [(r + 16 * np_, c + 16 * kk) for r, c in ka])
            s[2 * np_] = mma_16816(a, b[:, 0:2], s[2 * np_])
            s[2 * np_ + 1] = mma_16816(a, b[:, 2:4], s[2 * np_ + 1])
    S = np.concatenate([frag_to_c(s[n]) for n in range(8)], axis=1)  # [16, 64]
    want = Qs[16 * warp: 16 * warp + 16, :D] @ Ks[:, :D].T
    e1 = np.abs(S - want).max()
    # P fragments from the S accumulators (p[kk] in the kernel), then O = P V with ldmatrix.trans
    o = np.zeros((32, 32, 4))
    for kk in range(4):
        p = np.zeros((32, 4, 2))
        p[:, 0] = s[2 * kk][:, 0:2]
        p[:, 1] = s[2 * kk][:, 2:4]
        p[:, 2] = s[2 * kk + 1][:, 0:2]
        p[:, 3] = s[2 * kk + 1][:, 2:4]
        for dp in range(16):
            b = ldmatrix_x4(Vs, [(r + 16 * kk, c + 16 * dp) for r, c in va], trans=True)
            o[2 * dp] = mma_16816(p, b[:, 0:2], o[2 * dp])
            o[2 * dp + 1] = mma_16816(p, b[:, 2:4], o[2 * dp + 1])
    O = np.concatenate([frag_to_c(o[n]) for n in range(32)], axis=1)  # [16, 256]
    e2 = np.abs(O - want @ Vs[:, :D]).max() / np.abs(want @ Vs[:, :D]).max()
    # the banks an ldmatrix phase (8 rows of 16 bytes) touches: 4-word groups, all distinct
    for addrs in (qa, ka, va):
        for i in range(4):
            banks = [((r * LD + c) * 2 // 4) % 32 for r, c in addrs[8 * i: 8 * i + 8]]
            assert len({b // 4 for b in banks}) == 8, banks
    return e1, e2


# ---------------------------------------------------------------- 2. tiling and online softmax
def _round(x, kind):
    x = np.asarray(x, np.float32)
    if kind == "bf16":  # round to nearest even, as __floats2bfloat162_rn
        u = x.view(np.uint32).astype(np.uint64)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
        return u.astype(np.uint32).view(np.float32)
    if kind == "fp16":
        return x.astype(np.float16).astype(np.float32)
    return x


def emulate(q, kpages, vpages, page_table, start, nq, nw=4, kind=None):
    """The kernel's arithmetic for one query head: q [nq, D] fp32; kpages/vpages [pages, 64, D] (the
    values the MMAs see: bf16, or fp16(code * scale)); page_table [tiles]. kind: None (no rounding of
    Q and P), "bf16" or "fp16". Returns o [nq, D] before the gate."""
    f32 = np.float32
    bm = 16 * nw
    out = np.zeros((nq, D), f32)
    sl2 = f32(1 / 16) * f32(1.4426950408889634)
    ntq = -(-nq // bm)
    for by in range(ntq):
        q0 = (ntq - 1 - by) * bm
        last = start + min(q0 + bm, nq) - 1
        ntiles = last // BN + 1
        Q = np.zeros((bm, D), f32)
        Q[: max(0, min(bm, nq - q0))] = q[q0: q0 + bm]
        Q = _round(Q, kind)
        for w in range(nw):
            row0 = start + q0 + 16 * w
            pos = row0 + np.arange(16)
            o = np.zeros((16, D), f32)
            m = np.full(16, -np.inf, f32)
            lpart = np.zeros((16, 4), f32)  # the quad's 4 row-sum shares
            for j in range(ntiles):
                k0 = j * BN
                if not k0 <= row0 + 15:  # `live`
                    continue
                Kt, Vt = kpages[page_table[j]], vpages[page_table[j]]
                s = np.zeros((16, BN), f32)
                for kk in range(D // 16):  # fp32 accumulation over the 16 k-steps
                    s = (s + Q[16 * w: 16 * w + 16, 16 * kk: 16 * kk + 16] @ Kt[:, 16 * kk: 16 * kk + 16].T).astype(f32)
                s = (s * sl2).astype(f32)
                if k0 + BN - 1 > row0:
                    s[(k0 + np.arange(BN))[None, :] > pos[:, None]] = -np.inf
                mn = np.maximum(m, s.max(axis=1))
                ms = np.where(mn == -np.inf, f32(0), mn).astype(f32)
                c = np.exp2(m - ms).astype(f32)
                m = mn
                p = np.exp2(s - ms[:, None]).astype(f32)
                # thread t4 holds keys 8n + 2 t4 + e; its share adds n = 0..7 in turn, e = 0, 1 pairwise
                pr = p.reshape(16, 8, 4, 2)
                share = np.zeros((16, 4), f32)
                for n in range(8):
                    share = (share + (pr[:, n, :, 0] + pr[:, n, :, 1]).astype(f32)).astype(f32)
                lpart = (lpart * c[:, None] + share).astype(f32)
                o = (o * c[:, None]).astype(f32)
                pq = _round(p, kind)
                for kk in range(4):
                    o = (o + pq[:, 16 * kk: 16 * kk + 16] @ Vt[16 * kk: 16 * kk + 16]).astype(f32)
            l = ((lpart[:, 0] + lpart[:, 1]) + (lpart[:, 2] + lpart[:, 3])).astype(f32)  # shfl xor 1, then 2
            rows = q0 + 16 * w + np.arange(16)
            ok = rows < nq
            out[rows[ok]] = (o * (f32(1) / l)[:, None])[ok]
    return out


def reference(q, k, v, start):
    """Plain causal softmax attention (float64): q [nq, D] at positions start.., k, v [n, D]."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = q @ k.T / 16.0
    pos = start + np.arange(len(q))
    s[np.arange(len(k))[None, :] > pos[:, None]] = -np.inf
    s -= s.max(axis=1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(axis=1, keepdims=True)) @ v


def paged(x, perm):
    """x [n, D] into pages [npages, 64, D] in page-table order perm (page perm[i] holds rows 64i..)."""
    npg = len(perm)
    pages = np.zeros((npg, BN, D), np.float32)
    xp = np.zeros((npg * BN, D), np.float32)
    xp[: len(x)] = x
    pages[perm] = xp.reshape(npg, BN, D)
    return pages


# ---------------------------------------------------------------- 3. int8 decode
def check_dequant():
    """fa_dequant4: byte_perm(w ^ 0x80808080, 0x64646464, 0x4140 / 0x4342) as fp16, minus 1152, times s."""
    codes = np.arange(-128, 128, dtype=np.int64)
    u = (codes + 128) & 0xFF  # the byte after the sign flip
    h = ((0x64 << 8) | u).astype(np.uint16).view(np.float16)
    x = (h - np.float16(1152)).astype(np.float16)  # exact: small integers
    assert np.array_equal(x.astype(np.int64), codes)
    # byte order: selector 0x4140 takes bytes (u0, y, u1, y): halves (u0 | 0x6400, u1 | 0x6400)
    w = np.uint32(0x7F80_01FF)
    uu = int(w) ^ 0x80808080
    b = [(uu >> (8 * i)) & 0xFF for i in range(4)]
    sel = lambda s: [([*b, 0x64, 0x64, 0x64, 0x64])[(s >> (4 * i)) & 0xF] for i in range(4)]  # noqa: E731
    lo, hi = sel(0x4140), sel(0x4342)
    assert lo[1] == lo[3] == hi[1] == hi[3] == 0x64 and [lo[0], lo[2], hi[0], hi[2]] == b
    rng = np.random.default_rng(5)
    scales = np.concatenate([rng.uniform(1e-4, 0.2, 200), [6.1e-5, 1e-6, 0.0]]).astype(np.float16)
    worst = 0
    for s in scales:
        got = (x.astype(np.float16) * s).astype(np.float16)  # HMUL2: one rounding of the exact product
        want = (codes.astype(np.float32) * np.float32(s)).astype(np.float16)
        worst = max(worst, int(np.sum(got != want)))
    return worst


def main() -> int:
    ok = True
    for nw in (4, 8):
        for warp in (0, nw - 1):
            e1, e2 = check_fragments(warp, nw)
            print(f"fragments nw={nw} warp={warp}: S max |err| {e1:.1e}, O rel max err {e2:.1e}")
            ok &= e1 < 1e-9 and e2 < 1e-12
    print("int8 decode: mismatches vs fp16(code * scale):", check_dequant())
    rng = np.random.default_rng(1)
    cases = [(1, 0), (63, 0), (64, 0), (65, 0), (200, 37), (130, 128), (1, 300), (100, 64)]
    for nw in (4, 8):
        for nq, start in cases:
            n = start + nq
            npg = -(-n // BN)
            perm = rng.permutation(npg)
            q = rng.standard_normal((nq, D)).astype(np.float32)
            k = rng.standard_normal((n, D)).astype(np.float32)
            v = rng.standard_normal((n, D)).astype(np.float32)
            want = reference(q, k, v, start)
            got = emulate(q, paged(k, perm), paged(v, perm), perm, start, nq, nw)
            err = np.abs(got - want).max()
            kb, vb = _round(k, "bf16"), _round(v, "bf16")
            got_b = emulate(q, paged(kb, perm), paged(vb, perm), perm, start, nq, nw, kind="bf16")
            rel_b = np.linalg.norm(got_b - reference(q, kb, vb, start)) / np.linalg.norm(reference(q, kb, vb, start))
            kh, vh = _round(k, "fp16"), _round(v, "fp16")
            got_h = emulate(q, paged(kh, perm), paged(vh, perm), perm, start, nq, nw, kind="fp16")
            rel_h = np.linalg.norm(got_h - reference(q, kh, vh, start)) / np.linalg.norm(reference(q, kh, vh, start))
            print(f"nw={nw} T={nq:4d} start={start:3d}: fp32 max |err| {err:.1e}; rounded inputs rel-L2 "
                  f"bf16 {rel_b:.1e}, fp16 {rel_h:.1e} (bound 8e-3)")
            ok &= err < 2e-6 and rel_b < 8e-3 and rel_h < 8e-3
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
