"""NumPy emulation of cuda/attn_decode_mma.cu (attn_decode_mma<G, KV8>) at the level of the warp, then the
combine: every ldmatrix (.x4, plain and .trans) and mma.sync m16n8k16 is emulated from its 32 lanes'
addresses and fragments (PTX ISA layouts), over the kernel's own shared-memory addressing (16-bit tiles of
row stride ADM_LD, the Q tile and each warp's K / V tiles), with the kernel's split ranges, token masks,
online softmax (log2 units), the 4 warps' merge and the natural-log partials that attn_combine reads.
Checks the result against ref.attention for both cache forms (bf16 rows; int8 codes x fp16 scales), query
groups 6 and 8, several depths (a partial last round, splits with no tokens) and a non-trivial page table.
Run: .venv/bin/python dev/emu_attn_decode_mma.py  (a few seconds)."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.ops import ref  # noqa: E402
from engine.ops.kvquant import dequantize_kv_int8_g64, quantize_kv_int8_g64  # noqa: E402

f32 = np.float32
LANE = np.arange(32)
G_, C_ = LANE >> 2, LANE & 3
LD = 264
PAGE = 64
LOG2E = f32(1.4426950408889634)


def bf16(x):
    """round to bfloat16 (to nearest even), as float32"""
    b = np.asarray(x, f32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(f32)


def fp16(x):
    return np.asarray(x, f32).astype(np.float16).astype(f32)


# ---- ldmatrix.x4: lane l gives the row address of matrix l // 8, row l % 8 (8 consecutive 16-bit values);
# register i of lane l holds matrix i's (row l // 4, columns 2 (l % 4), +1), or with .trans (rows 2 (l % 4),
# +1, column l // 4). Shared memory is a flat array of 16-bit values (as float32 here); addr in elements.
def ldsm_x4(sm, addr, trans=False):
    out = np.zeros((32, 4, 2), f32)
    for i in range(4):
        rows = np.stack([sm[addr[8 * i + r]: addr[8 * i + r] + 8] for r in range(8)])  # [8][8]
        mat = rows.T if trans else rows
        out[:, i, 0] = mat[G_, 2 * C_]
        out[:, i, 1] = mat[G_, 2 * C_ + 1]
    return out  # [lane][reg][half]


# ---- mma.m16n8k16 (row.col): A 16x16 from a0..a3 (a0: row g, k 2c..; a1: row g+8; a2: row g, k 2c+8..;
# a3: row g+8, k 2c+8..), B 16x8 from b0 (k 2c.., n g), b1 (k 2c+8.., n g); C c0,c1 (row g, n 2c..), c2,c3
def mma(d, a, b0, b1):
    A = np.full((16, 16), np.nan)
    B = np.full((16, 8), np.nan)
    for lane in range(32):
        g, c = lane >> 2, lane & 3
        for h in range(2):
            A[g, 2 * c + h] = a[lane, 0, h]
            A[g + 8, 2 * c + h] = a[lane, 1, h]
            A[g, 2 * c + 8 + h] = a[lane, 2, h]
            A[g + 8, 2 * c + 8 + h] = a[lane, 3, h]
            B[2 * c + h, g] = b0[lane, h]
            B[2 * c + 8 + h, g] = b1[lane, h]
    assert not np.isnan(A).any() and not np.isnan(B).any()
    D = (A.astype(np.float64) @ B).astype(f32)
    d[:, 0] += D[G_, 2 * C_]
    d[:, 1] += D[G_, 2 * C_ + 1]
    d[:, 2] += D[G_ + 8, 2 * C_]
    d[:, 3] += D[G_ + 8, 2 * C_ + 1]


def block(q, kc, vc, ks, vs, pt, Hkv, chunk, scale, nsplit, G, kv8, L, kvh, split, part_ml, part_acc, W=4):
    rnd = fp16 if kv8 else bf16
    per = -(-(-(-L // nsplit)) // 16) * 16  # a split's share rounded up to 16 tokens (rounds in one page)
    t0, t1 = split * per, min(split * per + per, L)
    Hq = Hkv * G
    sm = np.full(16 * LD * 9, np.nan, f32)
    for r in range(16):  # Q tile
        sm[r * LD: r * LD + 256] = rnd(q[kvh * G + r] * f32(scale)) if r < G else 0
    qa = (LANE & 7) + 8 * ((LANE >> 3) & 1)
    qa = qa * LD + 8 * (LANE >> 4)
    res = []
    for warp in range(W):  # (W warps, 16 W tokens a round; the stages NS only change when rows land)
        Ks = 16 * LD * (1 + 2 * warp)
        Vs = Ks + 16 * LD
        ka = Ks + ((LANE & 7) + 8 * (LANE >> 4)) * LD + 8 * ((LANE >> 3) & 1)
        va = Vs + ((LANE & 7) + 8 * ((LANE >> 3) & 1)) * LD + 8 * (LANE >> 4)
        o = np.zeros((32, 32, 4), f32)
        m_a = np.full(32, -np.inf, f32)
        m_b = m_a.copy()
        l_a = np.zeros(32, f32)
        l_b = l_a.copy()
        tb = t0 + 16 * warp
        while tb < t1:
            for r in range(16):  # adm_load_rows: the warp's K and V rows (zero past t1)
                for base, cache, sc in ((Ks, kc, ks), (Vs, vc, vs)):
                    if tb + r < t1:
                        t = tb + r
                        row = cache[pt[t // PAGE], t % PAGE, kvh]
                        vals = fp16(row.astype(f32) * np.repeat(sc[pt[t // PAGE], t % PAGE, kvh].astype(f32), 64)) \
                            if kv8 else row
                        sm[base + r * LD: base + r * LD + 256] = vals
                    else:
                        sm[base + r * LD: base + r * LD + 256] = 0
            s = np.zeros((2, 32, 4), f32)
            for kk in range(16):
                a = ldsm_x4(sm, qa + kk * 16)
                b = ldsm_x4(sm, ka + kk * 16)
                mma(s[0], a, b[:, 0], b[:, 1])
                mma(s[1], a, b[:, 2], b[:, 3])
            nv = t1 - tb
            for n in range(2):
                for e in range(2):
                    ok = 8 * n + 2 * C_ + e < nv
                    s[n, :, e] = np.where(ok, s[n, :, e] * LOG2E, -np.inf)
                    s[n, :, 2 + e] = np.where(ok, s[n, :, 2 + e] * LOG2E, -np.inf)
            # fa_softmax_tile
            mx_a = np.maximum.reduce([s[n, :, e] for n in range(2) for e in range(2)])
            mx_b = np.maximum.reduce([s[n, :, 2 + e] for n in range(2) for e in range(2)])
            mx_a = mx_a.reshape(8, 4).max(1).repeat(4)
            mx_b = mx_b.reshape(8, 4).max(1).repeat(4)
            mn_a, mn_b = np.maximum(m_a, mx_a), np.maximum(m_b, mx_b)
            ms_a, ms_b = np.where(mn_a == -np.inf, 0, mn_a), np.where(mn_b == -np.inf, 0, mn_b)
            c_a, c_b = np.exp2(m_a - ms_a).astype(f32), np.exp2(m_b - ms_b).astype(f32)
            m_a, m_b = mn_a, mn_b
            s[:, :, 0:2] = np.exp2(s[:, :, 0:2] - ms_a[None, :, None])
            s[:, :, 2:4] = np.exp2(s[:, :, 2:4] - ms_b[None, :, None])
            l_a = l_a * c_a + s[:, :, 0:2].sum((0, 2))
            l_b = l_b * c_b + s[:, :, 2:4].sum((0, 2))
            o[:, :, 0:2] *= c_a[None, :, None]
            o[:, :, 2:4] *= c_b[None, :, None]
            # fa_pack_p (kk = 0): p0 (row g, tokens 2c..) = s0[0..1], p1 (row g+8) = s0[2..3], p2 = s1[0..1], p3
            p = np.zeros((32, 4, 2), f32)
            p[:, 0] = rnd(s[0, :, 0:2])
            p[:, 1] = rnd(s[0, :, 2:4])
            p[:, 2] = rnd(s[1, :, 0:2])
            p[:, 3] = rnd(s[1, :, 2:4])
            for dp in range(16):
                b = ldsm_x4(sm, va + dp * 16, trans=True)
                mma(o[2 * dp], p, b[:, 0], b[:, 1])
                mma(o[2 * dp + 1], p, b[:, 2], b[:, 3])
            tb += 16 * W
        l_a = l_a.reshape(8, 4).sum(1).repeat(4)
        l_b = l_b.reshape(8, 4).sum(1).repeat(4)
        res.append((o, m_a, m_b, l_a, l_b))
    # merge (thread d: dims d, d + 128)
    sm_o = np.zeros((W, 16, 256), f32)
    sm_ml = np.zeros((W, 16, 2), f32)
    for w, (o, m_a, m_b, l_a, l_b) in enumerate(res):
        for n in range(32):
            d = 8 * n + 2 * C_
            for e in range(2):
                sm_o[w, G_, d + e] = o[n, :, e]
                sm_o[w, G_ + 8, d + e] = o[n, :, 2 + e]
        sm_ml[w, G_, 0], sm_ml[w, G_, 1] = m_a, l_a
        sm_ml[w, G_ + 8, 0], sm_ml[w, G_ + 8, 1] = m_b, l_b
    for r in range(G):
        M_ = sm_ml[:, r, 0].max()
        Ls, A = f32(0), np.zeros(256, f32)
        if M_ > -np.inf:
            for w in range(W):
                mw = sm_ml[w, r, 0]
                c = np.exp2(mw - M_) if mw > -np.inf else f32(0)
                Ls += sm_ml[w, r, 1] * c
                A += sm_o[w, r] * c
        hs = kvh * G + r
        part_acc[hs, split] = A
        part_ml[hs, split] = (M_ * f32(0.6931471805599453) if M_ > -np.inf else -np.inf, Ls)


def combine(part_ml, part_acc):
    """attn_combine without the gate: softmax-weighted sum of the splits' partials."""
    m, ls = part_ml[..., 0], part_ml[..., 1]
    M = m.max(1, keepdims=True)
    c = np.where(m > -np.inf, np.exp(m - M), 0)
    return (part_acc * c[..., None]).sum(1) / (ls * c).sum(1, keepdims=True)


def run(G, kv8, length, rng, nsplit=5, max_ctx=1024, Hkv=2, W=4):
    pages = max_ctx // PAGE
    perm = rng.permutation(pages).astype(np.int32)
    k = rng.standard_normal((length, Hkv, 256)).astype(f32)
    v = rng.standard_normal((length, Hkv, 256)).astype(f32)
    q = rng.standard_normal((Hkv * G, 256)).astype(f32)
    shape = (pages, PAGE, Hkv, 256)
    if kv8:
        kc, vc = np.zeros(shape, np.int8), np.zeros(shape, np.int8)
        ks, vs = np.zeros(shape[:3] + (4,), np.float16), np.zeros(shape[:3] + (4,), np.float16)
        for t in range(length):
            p_, s_ = perm[t // PAGE], t % PAGE
            kc[p_, s_], ks[p_, s_] = quantize_kv_int8_g64(k[t])
            vc[p_, s_], vs[p_, s_] = quantize_kv_int8_g64(v[t])
        kref = dequantize_kv_int8_g64(*quantize_kv_int8_g64(k))
        vref = dequantize_kv_int8_g64(*quantize_kv_int8_g64(v))
    else:
        kc, vc = np.zeros(shape, f32), np.zeros(shape, f32)
        ks = vs = None
        for t in range(length):
            kc[perm[t // PAGE], t % PAGE], vc[perm[t // PAGE], t % PAGE] = bf16(k[t]), bf16(v[t])
        kref, vref = bf16(k), bf16(v)
    chunk = -(-max_ctx // nsplit)
    part_ml = np.zeros((Hkv * G, nsplit, 2), f32)
    part_acc = np.zeros((Hkv * G, nsplit, 256), f32)
    for kvh in range(Hkv):
        for split in range(nsplit):
            block(q, kc, vc, ks, vs, perm, Hkv, chunk, 1 / 16, nsplit, G, kv8, length, kvh, split, part_ml, part_acc, W)
    got = combine(part_ml, part_acc)
    want = ref.attention(q[None], kref, vref, 1 / 16, q_start=length - 1)[0]
    return float(np.linalg.norm(got - want) / np.linalg.norm(want)), float(np.abs(got - want).max())


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    for G, kv8, length, W in ((6, False, 1, 4), (6, False, 200, 4), (8, True, 63, 4), (6, True, 333, 4),
                              (8, False, 1000, 4), (6, True, 333, 3), (8, True, 1000, 3)):
        rl2, mx = run(G, kv8, length, rng, W=W)
        print(f"G={G} {'int8' if kv8 else 'bf16'} length {length} W={W}: rel-L2 {rl2:.2e}, max abs {mx:.2e}")
        assert rl2 < 8e-3, rl2
