"""NumPy emulation of cuda/gdn_tc.cu and gdn_tc_scan.cu (gdn_chunk_prep, gdn_chunk_scan_tc<RB>) at the level
of the warp: every mma.sync m16n8k8 TF32 is emulated from its 32 lanes' fragments through the PTX ISA's fragment layout, the
fragments gathered with the kernels' own shared-memory addressing (flat float32 arrays, their row strides and
offsets), operands split into a TF32 head (rounded as cvt.rna) and a truncated remainder as the kernels do.
Checks:
  1. the fragment helpers reproduce plain products (each form: A row / transposed, B row / transposed);
  2. both passes against ref.gdn_recurrent at T = 150 (two whole pieces and a partial one), key/value heads
     as in tests/gpu (2 / 6) and the kernels' tiled and grouped head maps, RB = 32 and 64; the cp.async
     copies both at issue ("eager": a copy overwriting what a phase still reads would show) and at the wait
     that covers them ("lazy": a read before the wait would see NaN).
Run: .venv/bin/python dev/emu_gdn_tc.py  (about a minute)."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.ops import ref  # noqa: E402

f32 = np.float32
LANE = np.arange(32)
LG, LC = LANE >> 2, LANE & 3
GC_T, GT_KS, GT_KB, GT_MS = 64, 132, 136, 68


# ---- the hardware: TF32 rounding and the mma's fragment layout (PTX ISA, mma.m16n8k8 .tf32) ----------------
def tf32(x):
    """cvt.rna.tf32.f32: round to 10 mantissa bits, ties away from zero (the result's low 13 bits zero)."""
    b = np.asarray(x, f32).view(np.uint32).astype(np.uint64)
    return ((b + 0x1000) & 0xFFFFE000).astype(np.uint32).view(f32)


def trunc32(x):
    """x truncated to TF32 (the low 13 bits cleared)."""
    return (np.asarray(x, f32).view(np.uint32) & np.uint32(0xFFFFE000)).view(f32)


def split(x):
    """gtc::split: hi = tf32(x) (as cvt.rna), lo = x - hi truncated."""
    x = np.asarray(x, f32)
    hi = tf32(x)
    return hi, trunc32((x - hi).astype(f32))


# A (16x8): a_i at row g + 8 (i & 1), column c + 4 (i >> 1); B (8x8): b_i at k = c + 4 i, n = g;
# C (16x8): c_i at row g + 8 (i >> 1), column 2 c + (i & 1)
A_ROW = [LG + 8 * (i & 1) for i in range(4)]
A_COL = [LC + 4 * (i >> 1) for i in range(4)]
B_K = [LC + 4 * i for i in range(2)]
C_ROW = [LG + 8 * (i >> 1) for i in range(4)]
C_COL = [2 * LC + (i & 1) for i in range(4)]


def mma(d, a, b):
    """d [32][4] += A B, A and B assembled from the lanes' a [32][4], b [32][2] (TF32 values)."""
    A = np.full((16, 8), np.nan)
    B = np.full((8, 8), np.nan)
    for i in range(4):
        A[A_ROW[i], A_COL[i]] = a[:, i]
    for i in range(2):
        B[B_K[i], LG] = b[:, i]
    assert not np.isnan(A).any() and not np.isnan(B).any(), "fragment layout leaves holes"
    D = A @ B
    for i in range(4):
        d[:, i] = (d[:, i] + D[C_ROW[i], C_COL[i]]).astype(f32)


def mma1(d, a, b):
    """d += a b from the TF32 heads only (gdn_chunk_scan_tc<RB, 1>'s QS and M U)"""
    mma(d, a[0], b[0])


def mma3(d, a, b):
    (ah, al), (bh, bl) = a, b
    mma(d, al, bh)
    mma(d, ah, bl)
    mma(d, ah, bh)


# ---- the kernels' fragment loads (gtc::lda_row, lda_tr, ldb_tr, ldb_row): p = offset into shared memory sm --
def lda_row(sm, p, ld, s=1.0):
    v = [sm[p + LG * ld + LC], sm[p + (LG + 8) * ld + LC], sm[p + LG * ld + LC + 4], sm[p + (LG + 8) * ld + LC + 4]]
    return split(f32(s) * np.stack(v, 1))


def lda_tr(sm, p, ld, sk):
    s0, s1 = sm[sk + LC], sm[sk + LC + 4]
    v = [s0 * sm[p + LC * ld + LG], s0 * sm[p + LC * ld + LG + 8], s1 * sm[p + (LC + 4) * ld + LG],
         s1 * sm[p + (LC + 4) * ld + LG + 8]]
    return split(np.stack(v, 1))


def ldb_tr(sm, p, ld):
    return split(np.stack([sm[p + LG * ld + LC], sm[p + LG * ld + LC + 4]], 1))


def ldb_row(sm, p, ld, s0=1.0, s1=1.0):
    return split(np.stack([s0 * sm[p + LC * ld + LG], s1 * sm[p + (LC + 4) * ld + LG]], 1))


def c_frag(d):
    """the 16x8 tile a C fragment holds"""
    out = np.zeros((16, 8), f32)
    for i in range(4):
        out[C_ROW[i], C_COL[i]] = d[:, i]
    return out


def check_fragments(rng):
    """each load form x mma3 against the float64 product of the same tiles"""
    X = rng.standard_normal(64 * 140).astype(f32)
    Y = rng.standard_normal(64 * 140).astype(f32)
    sk = rng.standard_normal(16).astype(f32)
    worst = 0.0
    for ld_a, ld_b in ((132, 132), (68, 136), (72, 136)):
        A_row = X[: 16 * ld_a].reshape(16, ld_a)[:, :8].astype(np.float64)     # lda_row(X, 0, ld_a)
        A_tr = (X[: 8 * ld_a].reshape(8, ld_a)[:, :16] * sk[:8, None]).T.astype(np.float64)  # lda_tr
        B_tr = Y[: 8 * ld_b].reshape(8, ld_b)[:, :8].T.astype(np.float64)      # ldb_tr(Y, 0, ld_b)
        B_row = Y[: 8 * ld_b].reshape(8, ld_b)[:, :8].astype(np.float64)       # ldb_row(Y, 0, ld_b)
        sm = np.concatenate([X, Y, sk])
        oy, osk = X.size, X.size + Y.size
        for a_frag, A in ((lda_row(sm, 0, ld_a), A_row), (lda_tr(sm, 0, ld_a, osk), A_tr)):
            for b_frag, B in ((ldb_tr(sm, oy, ld_b), B_tr), (ldb_row(sm, oy, ld_b), B_row)):
                d = np.zeros((32, 4), f32)
                mma3(d, a_frag, b_frag)
                want = A @ B
                worst = max(worst, np.abs(c_frag(d) - want).max() / np.abs(want).max())
    return worst


# ---- cp.async groups ----------------------------------------------------------------------------------------
class Async:
    def __init__(self, eager):
        self.eager, self.open, self.groups = eager, [], []

    def cp16(self, sm, dst, src_arr, src, valid):
        """per lane (vectors): 16 bytes src_arr[src..] -> sm[dst..], zeros where not valid"""
        for dd, ss, vv in zip(np.atleast_1d(dst), np.atleast_1d(src), np.broadcast_to(valid, np.shape(np.atleast_1d(dst)))):
            def go(dd=dd, ss=ss, vv=vv):
                sm[dd: dd + 4] = src_arr[ss: ss + 4] if vv else 0.0
            go() if self.eager else self.open.append(go)

    def commit(self):
        self.groups.append(self.open)
        self.open = []

    def wait(self, n):
        while len(self.groups) > n:
            for go in self.groups.pop(0):
                go()


TID = np.arange(256)


def cp_rows128(cpa, sm, dst, ld, arr, src, rstride, n):
    for k in range(8):
        i = TID + 256 * k
        t, d4 = i >> 5, (i & 31) * 4
        cpa.cp16(sm, dst + t * ld + d4, arr, src + np.where(t < n, t, 0) * rstride + d4, t < n)


def kh_of(h, Hk, Hv, tiled):
    return h % Hk if tiled else h // (Hv // Hk)


# ---- gdn_chunk_prep ---------------------------------------------------------------------------------------
def prep(qn, kn, vo, g, beta, Wg, Ug, Mg, Gg, Hk, Hv, tiled, T, piece, h, eager):
    c0 = piece * GC_T
    n = min(GC_T, T - c0)
    if n <= 0:
        return
    cpa = Async(eager)
    sm = np.full(2 * GC_T * GT_KS + GC_T * GT_MS + 3 * GC_T + 3 * 256, np.nan, f32)
    Ks, QV = 0, GC_T * GT_KS
    As = QV + GC_T * GT_KS
    Gs = As + GC_T * GT_MS
    Bs, SK = Gs + GC_T, Gs + 2 * GC_T
    kh = kh_of(h, Hk, Hv, tiled)
    ph = piece * Hv + h
    cp_rows128(cpa, sm, Ks, GT_KS, kn, (c0 * Hk + kh) * 128, Hk * 128, n)
    cp_rows128(cpa, sm, QV, GT_KS, qn, (c0 * Hk + kh) * 128, Hk * 128, n)
    cpa.commit()
    t = np.arange(GC_T)
    sm[Gs: Gs + 64] = np.where(t < n, g[np.minimum(c0 + t, T - 1) * Hv + h], 0)
    sm[Bs: Bs + 64] = np.where(t < n, beta[np.minimum(c0 + t, T - 1) * Hv + h], 0)
    sm[As: As + GC_T * GT_MS] = 0
    acc = f32(0)
    for i in range(64):  # the scan's float32 sums in order (the warp's shuffle scan adds in another order)
        acc = f32(acc + sm[Gs + i])
        sm[Gs + i] = acc
    Gg[ph * 64: ph * 64 + 64] = sm[Gs: Gs + 64]
    sm[SK: SK + 64] = sm[Bs: Bs + 64] * np.exp(sm[Gs: Gs + 64])
    cpa.wait(0)
    mg = ph * GC_T * GC_T
    for warp in range(8):
        prod, lo, par = warp >> 2, (warp >> 1) & 1, warp & 1
        hi = 3 - lo
        X = QV if prod else Ks
        accs = [np.zeros((32, 4), f32) for _ in range(5)]
        tiles = []
        for i in range(5):
            L = i == 0 or (i == 1 and lo == 1)
            tiles.append((L, lo if L else hi, par + 2 * i if L else par + 2 * (i - lo - 1)))
        for ks in range(16):
            al = lda_row(sm, X + lo * 16 * GT_KS + ks * 8, GT_KS)
            ah = lda_row(sm, X + hi * 16 * GT_KS + ks * 8, GT_KS)
            for i, (L, mt, nt) in enumerate(tiles):
                b = ldb_tr(sm, Ks + nt * 8 * GT_KS + ks * 8, GT_KS)
                mma3(accs[i], al if L else ah, b)
        for i, (L, mt, nt) in enumerate(tiles):
            for half in range(2):
                tt = mt * 16 + LG + 8 * half
                s = nt * 8 + 2 * LC
                gt = sm[Gs + tt]
                d0 = np.where(s <= tt, np.exp(gt - sm[Gs + s]), 0)
                d1 = np.where(s + 1 <= tt, np.exp(gt - sm[Gs + s + 1]), 0)
                v0, v1 = accs[i][:, 2 * half], accs[i][:, 2 * half + 1]
                if prod == 0:
                    bt = sm[Bs + tt]
                    sm[As + tt * GT_MS + s] = np.where(s < tt, bt * d0 * v0, 0)
                    sm[As + tt * GT_MS + s + 1] = np.where(s + 1 < tt, bt * d1 * v1, 0)
                else:
                    Mg[mg + tt * GC_T + s] = d0 * v0
                    Mg[mg + tt * GC_T + s + 1] = d1 * v1
    for i in range(48 * 16):  # M's tiles above the diagonal
        tt, s = i >> 4, (i & 15) * 4
        if s >= 16 * ((tt >> 4) + 1):
            Mg[mg + tt * GC_T + s: mg + tt * GC_T + s + 4] = 0
    if not eager:
        sm[QV: QV + GC_T * GT_KS] = np.nan  # Q is dead; V lands at the wait
    cp_rows128(cpa, sm, QV, GT_KS, vo, (c0 * Hv + h) * 128, Hv * 128, n)
    cpa.commit()
    # the solve by 16 x 16 blocks. 3a: block b = warp >> 1, column c = (warp & 1) * 8 + lg, lane lc rows 4 lc..
    W8 = np.arange(8)[:, None]
    b = np.broadcast_to(W8 >> 1, (8, 32))
    c = (W8 & 1) * 8 + LG[None, :]
    lc = np.broadcast_to(LC, (8, 32))
    x = np.zeros((8, 32, 4), f32)
    for t in range(16):
        a = sm[As + (16 * b[..., None] + t) * GT_MS + 16 * b[..., None] + 4 * lc[..., None] + np.arange(4)]
        p = (a[..., 0] * x[..., 0] + (a[..., 1] * x[..., 1] + (a[..., 2] * x[..., 2] + a[..., 3] * x[..., 3]))).astype(f32)
        pw = p.reshape(8, 8, 4)
        p = (pw + pw[..., [1, 0, 3, 2]]).astype(f32)
        p = (p + p[..., [2, 3, 0, 1]]).astype(f32).reshape(8, 32)
        v = np.where(t == c, f32(1), f32(0)) - p
        x[..., t & 3] = np.where(lc == (t >> 2), v, x[..., t & 3])
    for i in range(4):
        sm[As + (16 * b + 4 * lc + i) * GT_MS + 16 * b + c] = x[..., i]
    # 3b: thread (r, c) = (tid >> 4, tid & 15); X_ij to XS, T_ij = -T_ii X_ij to block (j, i), moved down at the end
    XS = SK + GC_T
    tid = np.arange(256)
    r, c = tid >> 4, tid & 15
    S16 = np.arange(16)
    for d in range(1, 4):
        for i in range(d, 4):
            j = i - d
            xv = np.zeros(256, f32)
            for k in range(j, i):
                a = sm[As + (16 * i + r[:, None]) * GT_MS + 16 * k + S16]
                tcol = sm[As + 16 * j * GT_MS + 16 * k + c[:, None] + S16 * GT_MS]
                for s_ in range(16):
                    xv = (xv + a[:, s_] * tcol[:, s_]).astype(f32)
            sm[XS + j * 256 + r * 16 + c] = xv
        for i in range(d, 4):
            j = i - d
            a = sm[As + (16 * i + r[:, None]) * GT_MS + 16 * i + S16]
            xc = sm[XS + j * 256 + c[:, None] + S16 * 16]
            yv = np.zeros(256, f32)
            for s_ in range(16):
                yv = (yv + a[:, s_] * xc[:, s_]).astype(f32)
            sm[As + (16 * j + r) * GT_MS + 16 * i + c] = -yv
    for i in range(1, 4):
        for j in range(i):
            up = As + (16 * j + r) * GT_MS + 16 * i + c
            sm[As + (16 * i + r) * GT_MS + 16 * j + c] = sm[up]
            sm[up] = 0
    cpa.wait(0)
    for prod in range(2):
        X, sc = (QV, Bs) if prod else (Ks, SK)
        dst = (Ug if prod else Wg)
        base = ph * GC_T * 128
        for warp in range(8):
            acc = [[np.zeros((32, 4), f32) for _ in range(2)] for _ in range(4)]
            for ks in range(8):
                s0, s1 = sm[sc + ks * 8 + LC], sm[sc + ks * 8 + LC + 4]
                b = [ldb_row(sm, X + ks * 8 * GT_KS + (2 * warp + j) * 8, GT_KS, s0, s1) for j in range(2)]
                for mt in range(4):
                    if mt < (ks >> 1):
                        continue
                    a = lda_row(sm, As + mt * 16 * GT_MS + ks * 8, GT_MS)
                    mma3(acc[mt][0], a, b[0])
                    mma3(acc[mt][1], a, b[1])
            for mt in range(4):
                for j in range(2):
                    tt, d = mt * 16 + LG, (2 * warp + j) * 8 + 2 * LC
                    for e in range(4):
                        dst[base + (tt + 8 * (e >> 1)) * 128 + d + (e & 1)] = acc[mt][j][:, e]


# ---- gdn_chunk_scan_tc<RB> --------------------------------------------------------------------------------
def scan(qn, kn, Wg, Ug, Mg, Gg, state, o, Hk, Hv, tiled, T, RB, h, y, eager, Q1=0):
    US, NQ, WPM, NS = RB + 8, RB // 32, 128 // RB, RB // 8
    cpa = Async(eager)
    sm = np.full(RB * GT_KS + 2 * GC_T * GT_KS + GC_T * GT_KB + GC_T * GT_MS + 2 * GC_T * US + 2 * GC_T, np.nan, f32)
    Ss = 0
    Ws = Ss + RB * GT_KS
    Qs = Ws + GC_T * GT_KS
    Ks = Qs + GC_T * GT_KS
    Ms = Ks + GC_T * GT_KB
    Ub = Ms + GC_T * GT_MS
    EG = Ub + 2 * GC_T * US
    TL = EG + GC_T
    dv0 = y * RB
    kh = kh_of(h, Hk, Hv, tiled)
    pieces = (T + GC_T - 1) // GC_T

    def load_wqu(p):
        pc0, pn = p * GC_T, min(GC_T, T - p * GC_T)
        pph = p * Hv + h
        cp_rows128(cpa, sm, Ws, GT_KS, Wg, pph * GC_T * 128, 128, GC_T)
        cp_rows128(cpa, sm, Qs, GT_KS, qn, (pc0 * Hk + kh) * 128, Hk * 128, pn)
        ub = Ub + (p & 1) * GC_T * US
        i = np.arange(GC_T * RB // 4)
        t, j4 = i // (RB // 4), (i % (RB // 4)) * 4
        cpa.cp16(sm, ub + t * US + j4, Ug, (pph * GC_T + t) * 128 + dv0 + j4, True)

    load_wqu(0)
    cpa.commit()
    sg = (h * 128 + dv0) * 128
    i = np.arange(RB * 32)
    for e in range(4):
        sm[Ss + (i >> 5) * GT_KS + (i & 31) * 4 + e] = state[sg + 4 * i + e]
    for piece in range(pieces):
        c0, n = piece * GC_T, min(GC_T, T - piece * GC_T)
        ph = piece * Hv + h
        cp_rows128(cpa, sm, Ks, GT_KB, kn, (c0 * Hk + kh) * 128, Hk * 128, n)
        i = np.arange(GC_T * 16)
        cpa.cp16(sm, Ms + (i >> 4) * GT_MS + (i & 15) * 4, Mg, ph * GC_T * GC_T + i * 4, True)
        cpa.commit()
        gv, gl = Gg[ph * GC_T: ph * GC_T + GC_T], Gg[ph * GC_T + n - 1]
        cpa.wait(1)
        Us = Ub + (piece & 1) * GC_T * US
        qs_all, u_all = {}, {}
        for warp in range(8):
            pm, nq = warp & 1, warp >> 1
            u = [[None] * NQ for _ in range(2)]
            qs = [[np.zeros((32, 4), f32) for _ in range(NQ)] for _ in range(2)]
            for mm in range(2):
                mt = 3 - pm if mm else pm
                for j in range(NQ):
                    p = Us + (mt * 16 + LG) * US + (nq * NQ + j) * 8 + 2 * LC
                    u[mm][j] = np.stack([sm[p], sm[p + 1], sm[p + 8 * US], sm[p + 8 * US + 1]], 1).astype(f32)
            for ks in range(16):
                b = [ldb_tr(sm, Ss + (nq * NQ + j) * 8 * GT_KS + ks * 8, GT_KS) for j in range(NQ)]
                for mm in range(2):
                    mt = 3 - pm if mm else pm
                    aw = lda_row(sm, Ws + mt * 16 * GT_KS + ks * 8, GT_KS, -1.0)
                    aq = lda_row(sm, Qs + mt * 16 * GT_KS + ks * 8, GT_KS)
                    for j in range(NQ):
                        mma3(u[mm][j], aw, b[j])
                        mma1(qs[mm][j], aq, b[j]) if Q1 else mma3(qs[mm][j], aq, b[j])
            qs_all[warp], u_all[warp] = qs, u
        for warp in range(8):  # U to shared after every warp's P1 (the kernel's stores race with nothing)
            pm, nq = warp & 1, warp >> 1
            for mm in range(2):
                mt = 3 - pm if mm else pm
                for j in range(NQ):
                    p = Us + (mt * 16 + LG) * US + (nq * NQ + j) * 8 + 2 * LC
                    uu = u_all[warp][mm][j]
                    sm[p], sm[p + 1], sm[p + 8 * US], sm[p + 8 * US + 1] = uu[:, 0], uu[:, 1], uu[:, 2], uu[:, 3]
        t = np.arange(GC_T)
        sm[EG: EG + 64] = np.exp(gv)
        sm[TL: TL + 64] = np.where(t < n, np.exp(gl - gv), 0)
        cpa.wait(0)
        if piece + 1 < pieces:
            load_wqu(piece + 1)
        cpa.commit()
        for warp in range(8):
            pm, nq = warp & 1, warp >> 1
            qs = qs_all[warp]
            for mm in range(2):
                mt = 3 - pm if mm else pm
                r0 = mt * 16 + LG
                e0, e1 = sm[EG + r0], sm[EG + r0 + 8]
                for j in range(NQ):
                    qs[mm][j] = (qs[mm][j] * np.stack([e0, e0, e1, e1], 1)).astype(f32)
                for ks in range(2 * mt + 2):
                    a = lda_row(sm, Ms + mt * 16 * GT_MS + ks * 8, GT_MS)
                    for j in range(NQ):
                        bu = ldb_row(sm, Us + ks * 8 * US + (nq * NQ + j) * 8, US)
                        mma1(qs[mm][j], a, bu) if Q1 else mma3(qs[mm][j], a, bu)
                for j in range(NQ):
                    col = dv0 + (nq * NQ + j) * 8 + 2 * LC
                    for e in range(4):
                        rr = r0 + 8 * (e >> 1)
                        ok = rr < n
                        o[((c0 + rr[ok]) * Hv + h) * 128 + col[ok] + (e & 1)] = qs[mm][j][ok, e]
        for warp in range(8):
            smt, sn0 = warp // WPM, (warp % WPM) * NS
            el = sm[EG + n - 1]
            sa = []
            for j in range(NS):
                p = Ss + (smt * 16 + LG) * GT_KS + (sn0 + j) * 8 + 2 * LC
                sa.append((el * np.stack([sm[p], sm[p + 1], sm[p + 8 * GT_KS], sm[p + 8 * GT_KS + 1]], 1)).astype(f32))
            for ks in range(8):
                a = lda_tr(sm, Us + ks * 8 * US + smt * 16, US, TL + ks * 8)
                for j in range(NS):
                    mma3(sa[j], a, ldb_row(sm, Ks + ks * 8 * GT_KB + (sn0 + j) * 8, GT_KB))
            for j in range(NS):
                p = Ss + (smt * 16 + LG) * GT_KS + (sn0 + j) * 8 + 2 * LC
                sm[p], sm[p + 1], sm[p + 8 * GT_KS], sm[p + 8 * GT_KS + 1] = sa[j][:, 0], sa[j][:, 1], sa[j][:, 2], sa[j][:, 3]
    cpa.wait(0)
    i = np.arange(RB * 32)
    for e in range(4):
        state[sg + 4 * i + e] = sm[Ss + (i >> 5) * GT_KS + (i & 31) * 4 + e]


def run(T, hk, hv, RB, tiled, eager, rng, Q1=0):
    q = (rng.standard_normal((T, hk, 128)) / 11).astype(f32)
    k = (rng.standard_normal((T, hk, 128)) / 11).astype(f32)
    v = rng.standard_normal((T, hv, 128)).astype(f32)
    g = (-np.abs(rng.standard_normal((T, hv))) * 0.1).astype(f32)
    b = (1 / (1 + np.exp(-rng.standard_normal((T, hv))))).astype(f32)
    s0 = (rng.standard_normal((hv, 128, 128)) * 0.1).astype(f32)
    # the reference takes [T, Hv] key rows: the kernels' head map, expanded
    kh = np.array([kh_of(h, hk, hv, tiled) for h in range(hv)])
    o_ref, s_ref = ref.gdn_recurrent(q[:, kh], k[:, kh], v, g, b, s0.copy())
    o_ref = o_ref * np.sqrt(128)  # ref divides by sqrt(Dk); the kernels take q pre-scaled
    P = (T + 63) // 64
    Wg = np.full(P * hv * 64 * 128, np.nan, f32)
    Ug, Mg, Gg = Wg.copy(), np.full(P * hv * 64 * 64, np.nan, f32), np.full(P * hv * 64, np.nan, f32)
    qn, kn, vo, gf, bf = q.reshape(-1), k.reshape(-1), v.reshape(-1), g.reshape(-1), b.reshape(-1)
    for piece in range(P):
        for h in range(hv):
            prep(qn, kn, vo, gf, bf, Wg, Ug, Mg, Gg, hk, hv, tiled, T, piece, h, eager)
    state = s0.reshape(-1).copy()
    o = np.full(T * hv * 128, np.nan, f32)
    for h in range(hv):
        for y in range(128 // RB):
            scan(qn, kn, Wg, Ug, Mg, Gg, state, o, hk, hv, tiled, T, RB, h, y, eager, Q1)
    o, state = o.reshape(T, hv, 128), state.reshape(hv, 128, 128)
    assert np.isfinite(o).all() and np.isfinite(state).all()
    return (np.abs(o - o_ref).max() / np.abs(o_ref).max(), np.abs(state - s_ref).max() / np.abs(s_ref).max())


if __name__ == "__main__":
    rng = np.random.default_rng(1)
    print(f"fragments: 3xTF32 products {check_fragments(rng):.2e} from float64 (relative to the largest)")
    for T, RB, tiled, eager, Q1 in ((150, 64, 0, False, 0), (150, 32, 1, True, 0), (64, 64, 0, True, 0),
                                    (37, 32, 0, False, 0), (150, 64, 0, False, 1), (150, 32, 1, True, 1)):
        eo, es = run(T, 2, 6, RB, tiled, eager, rng, Q1)
        print(f"T={T} RB={RB}{' Q1' if Q1 else ''} tiled={tiled} {'eager' if eager else 'lazy'} copies: out {eo:.2e}, "
              f"state {es:.2e} (max error / max |ref|)")
