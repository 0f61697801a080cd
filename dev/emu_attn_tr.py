"""Offline replay of attn_decode_mma_t (cuda/attn_decode_mma_t.cu: the transposed int8 decode attention) in NumPy, lane by
lane as its warp computes it: S^T = K Q^T (K's raw codes as the m16 A operand, two tokens' bytes of a k-step by PRMT;
the G <= 8 query heads as one n8 tile; the group scales and 1152 x the group's Q sums on the scores), the online
softmax down the C fragment's columns (shuffles across the lanes 4 apart), P^T packed and moved into B fragments by
movmatrix.trans, O^T = V^T P^T (V's raw codes as A fragments of 16 dims x 16 tokens, dims permuted: m-tile i row r is
dim 64 (i / 4) + 4 r + i % 4 for r < 8, 32 past it for r >= 8; the tokens' group scales on P^T), over several rounds
with a partial last one; against float64 softmax attention over the dequantized cache. No GPU: `python
dev/emu_attn_tr.py`."""
from __future__ import annotations

import numpy as np

LOG2E = 1.4426950408889634
LANES = np.arange(32)
G_, T4 = LANES >> 2, LANES & 3


def byte_perm(x, y, sel: int):
    """__byte_perm on uint32 arrays: result byte i is byte (sel >> 4 i) & 7 of y:x."""
    x, y = np.asarray(x, np.uint64), np.asarray(y, np.uint64)
    out = np.zeros(np.broadcast(x, y).shape, np.uint64)
    for i in range(4):
        k = (sel >> (4 * i)) & 7
        src = x if k < 4 else y
        out |= ((src >> np.uint64(8 * (k & 3))) & np.uint64(0xFF)) << np.uint64(8 * i)
    return out.astype(np.uint32)


def halves(u):
    """uint32 array -> [..., 2] fp16 (low half first)."""
    u = np.asarray(u, np.uint32)
    return np.stack([(u & 0xFFFF).astype(np.uint16), (u >> 16).astype(np.uint16)], -1).view(np.float16)


def word(rows: np.ndarray, tok, d):
    """32-bit shared loads of 4 int8 codes at dim d (per lane) of token rows tok (per lane)."""
    b = rows.astype(np.int8).view(np.uint8).astype(np.uint32)
    tok, d = np.broadcast_arrays(tok, d)
    return b[tok, d] | (b[tok, d + 1] << 8) | (b[tok, d + 2] << 16) | (b[tok, d + 3] << 24)


def code_pairs(lo, hi):
    """The fp16 code pairs (exact: 1152 + code, then minus 1152) of bytes (jj) of lo / hi as the kernel pairs them:
    [jj][lane][2] for jj 0..3 from (w_a, w_b) word pairs lo = perm(a, b, 0x5140), hi = perm(a, b, 0x7362)."""
    out = []
    for jj in range(4):
        src = lo if jj < 2 else hi
        u = byte_perm(src, np.uint32(0x64646464), 0x4342 if jj & 1 else 0x4140)
        out.append(halves(u).astype(np.float32) - np.float32(1152))
    return out


def mma(a, b):
    """m16n8k16 with fp32 accumulation: a [lane][4][2] (a0 row g k 2t4.., a1 row g + 8, a2 row g k 2t4 + 8.., a3), b
    [lane][2][2] (b0 k 2t4.. column g, b1 k 2t4 + 8..); returns C fragments [lane][4] (c0, c1 row g columns 2t4, +1;
    c2, c3 row g + 8)."""
    A, B = np.zeros((16, 16)), np.zeros((16, 8))
    for ln in range(32):
        g, t = ln >> 2, ln & 3
        A[g, 2 * t:2 * t + 2], A[g + 8, 2 * t:2 * t + 2] = a[ln][0], a[ln][1]
        A[g, 2 * t + 8:2 * t + 10], A[g + 8, 2 * t + 8:2 * t + 10] = a[ln][2], a[ln][3]
        B[2 * t:2 * t + 2, g], B[2 * t + 8:2 * t + 10, g] = b[ln][0], b[ln][1]
    C = (A @ B).astype(np.float32)
    return np.stack([C[G_, 2 * T4], C[G_, 2 * T4 + 1], C[G_ + 8, 2 * T4], C[G_ + 8, 2 * T4 + 1]], 1)


def movmatrix_t(x):
    """movmatrix.m8n8.trans.b16: x [lane][2] (row g, columns 2t4, +1 of an 8x8) -> the transpose's fragment."""
    M = np.zeros((8, 8), np.float16)
    M[G_, 2 * T4], M[G_, 2 * T4 + 1] = x[:, 0], x[:, 1]
    return np.stack([M[2 * T4, G_], M[2 * T4 + 1, G_]], 1)


def shfl_max(v):
    """max across the 8 lanes of a quad column (xor 4, 8, 16) for [lane] values."""
    for off in (4, 8, 16):
        v = np.maximum(v, v[LANES ^ off])
    return v


def shfl_sum(v):
    for off in (4, 8, 16):
        v = v + v[LANES ^ off]
    return v


def warp_attention(q, kc, vc, ks, vs, scale, L):
    """One warp over tokens [0, L) (rounds of 16): (m natural-log units [8], l [8], O [8, 256]) for heads 0..7 as the
    kernel's merge would read them (heads past G: Q zero)."""
    q16 = (q * scale).astype(np.float16)  # [8 heads, 256] natural dim order (rows past G zero)
    qsum = 1152 * q16.astype(np.float32).reshape(8, 4, 64).sum(-1)  # [head][group]
    qsr = np.stack([qsum[2 * T4], qsum[2 * T4 + 1]], 1)  # [lane][col e&1][group]
    o = np.zeros((32, 16, 4), np.float32)
    m = np.full((32, 2), -np.inf, np.float32)
    lsum = np.zeros((32, 2), np.float32)
    for tb in range(0, L, 16):
        rows = np.arange(tb, tb + 16)
        K = kc[np.minimum(rows, len(kc) - 1)].copy()
        V = vc[np.minimum(rows, len(vc) - 1)].copy()
        ksc, vsc = ks[np.minimum(rows, len(ks) - 1)].copy(), vs[np.minimum(rows, len(vs) - 1)].copy()
        K[rows >= L], V[rows >= L], ksc[rows >= L], vsc[rows >= L] = 0, 0, 0, 0  # (cp.async zero-fill)
        # S^T: a 64-dim group at a time, 4 k-steps each
        s = np.zeros((32, 4), np.float32)
        for gq in range(4):
            sg = np.zeros((32, 4), np.float32)
            for j in range(4):
                d = 64 * gq + 16 * T4 + 4 * j
                wl = word(K, G_, d) ^ np.uint32(0x80808080)  # token g
                wh = word(K, G_ + 8, d) ^ np.uint32(0x80808080)  # token g + 8
                a = np.stack([halves(byte_perm(wl, np.uint32(0x64646464), 0x4140)),
                              halves(byte_perm(wh, np.uint32(0x64646464), 0x4140)),
                              halves(byte_perm(wl, np.uint32(0x64646464), 0x4342)),
                              halves(byte_perm(wh, np.uint32(0x64646464), 0x4342))], 1).astype(np.float32)
                b = np.stack([np.stack([q16[G_, d], q16[G_, d + 1]], 1), np.stack([q16[G_, d + 2], q16[G_, d + 3]], 1)],
                             1).astype(np.float32)
                sg += mma(a, b)
            for e in range(4):
                tok = G_ + 8 * (e >> 1)
                s[:, e] += ksc[tok, gq].astype(np.float32) * (sg[:, e] - qsr[:, e & 1, gq])
        # online softmax down the columns (heads 2t4, 2t4 + 1)
        for e in range(4):
            ok = tb + G_ + 8 * (e >> 1) < L
            s[:, e] = np.where(ok, s[:, e] * np.float32(LOG2E), -np.inf)
        mx = shfl_max(np.stack([np.maximum(s[:, 0], s[:, 2]), np.maximum(s[:, 1], s[:, 3])], 1))
        mn = np.maximum(m, mx)
        ms = np.where(mn == -np.inf, 0, mn).astype(np.float32)
        corr = np.exp2(m - ms)
        m = mn
        p = np.exp2(s - ms[:, [0, 1, 0, 1]])
        lsum = lsum * corr + np.stack([p[:, 0] + p[:, 2], p[:, 1] + p[:, 3]], 1)
        o *= corr[:, None, [0, 1, 0, 1]]
        pb0 = movmatrix_t(p[:, 0:2].astype(np.float16))  # P[head g][tokens 2t4, +1]
        pb1 = movmatrix_t(p[:, 2:4].astype(np.float16))  # [tokens 2t4 + 8, +9]
        toks = (2 * T4, 2 * T4 + 1, 2 * T4 + 8, 2 * T4 + 9)
        for gr in range(4):
            s01 = np.stack([vsc[toks[0], gr], vsc[toks[1], gr]], 1)
            s89 = np.stack([vsc[toks[2], gr], vsc[toks[3], gr]], 1)
            b = np.stack([(pb0 * s01).astype(np.float16), (pb1 * s89).astype(np.float16)], 1).astype(np.float32)
            wl = [word(V, t, 64 * gr + 4 * G_) ^ np.uint32(0x80808080) for t in toks]  # rows g: dims 64 gr + 4 g..
            wh = [word(V, t, 64 * gr + 32 + 4 * G_) ^ np.uint32(0x80808080) for t in toks]  # rows g + 8
            lo = code_pairs(byte_perm(wl[0], wl[1], 0x5140), byte_perm(wl[0], wl[1], 0x7362))
            hi = code_pairs(byte_perm(wh[0], wh[1], 0x5140), byte_perm(wh[0], wh[1], 0x7362))
            lo8 = code_pairs(byte_perm(wl[2], wl[3], 0x5140), byte_perm(wl[2], wl[3], 0x7362))
            hi8 = code_pairs(byte_perm(wh[2], wh[3], 0x5140), byte_perm(wh[2], wh[3], 0x7362))
            for jj in range(4):
                a = np.stack([lo[jj], hi[jj], lo8[jj], hi8[jj]], 1)
                o[:, 4 * gr + jj] += mma(a, b)
    lsum = shfl_sum(lsum)
    M, Ls, O = np.zeros(8), np.zeros(8), np.zeros((8, 256))
    for ln in range(32):
        g, t = ln >> 2, ln & 3
        for c in range(2):
            M[2 * t + c], Ls[2 * t + c] = m[ln, c] / LOG2E, lsum[ln, c]
        for i in range(16):
            for e in range(4):
                r = g + 8 * (e >> 1)
                dim = 64 * (i >> 2) + 4 * (r & 7) + 32 * (r >> 3) + (i & 3)
                O[2 * t + (e & 1), dim] = o[ln, i, e]
    return M, Ls, O


def run(seed: int, L: int, G: int = 6) -> float:
    rng = np.random.default_rng(seed)
    q = np.zeros((8, 256), np.float32)
    q[:G] = rng.standard_normal((G, 256)) * 0.6
    kc = rng.integers(-127, 128, (L + 16, 256)).astype(np.int8)
    vc = rng.integers(-127, 128, (L + 16, 256)).astype(np.int8)
    ks = rng.uniform(0.002, 0.03, (L + 16, 4)).astype(np.float16)
    vs = rng.uniform(0.002, 0.03, (L + 16, 4)).astype(np.float16)
    scale = 1 / 16
    M, Ls, O = warp_attention(q, kc, vc, ks, vs, scale, L)
    k = kc[:L].astype(np.float64) * np.repeat(ks[:L].astype(np.float64), 64, 1)
    v = vc[:L].astype(np.float64) * np.repeat(vs[:L].astype(np.float64), 64, 1)
    sc = (q[:G].astype(np.float64) * scale) @ k.T
    want = (np.exp(sc - sc.max(1, keepdims=True)) / np.exp(sc - sc.max(1, keepdims=True)).sum(1, keepdims=True)) @ v
    got = O[:G] / Ls[:G, None]
    assert np.allclose(M[:G], sc.max(1), atol=2e-2), (M[:G], sc.max(1))
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


if __name__ == "__main__":
    errs = [run(s, L) for s, L in ((0, 16), (1, 37), (2, 64), (3, 150))]
    print("attn_decode_mma_t: S^T from raw K, column softmax, movmatrix, O^T from raw V and the dims written back, "
          "against float64 attention: rel-L2", ", ".join(f"{e:.1e}" for e in errs))
    assert max(errs) < 5e-3, errs
