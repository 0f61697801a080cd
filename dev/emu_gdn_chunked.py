"""Serial NumPy emulation of the chunked GDN's two passes with the kernels' global layouts and piece offsets:
`scan` is cuda/gdn_chunked.cu gdn_chunk_scan<RB>; `prep` the math of pass 1 in the shared-memory layout of its
first, CUDA-core version (session 5; the tensor-core gdn_chunk_prep of cuda/gdn_tc.cu that replaced it, and
gdn_chunk_scan_tc, are emulated fragment by fragment in dev/emu_gdn_tc.py). Against ref.gdn_recurrent.
Run: .venv/bin/python dev/emu_gdn_chunked.py (session 5: outputs 1.8e-7, state 1.3e-7 apart at T = 100)."""
import numpy as np, sys
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[1]))
from engine.ops import ref

GC_T, GC_KS, GC_MS, GC_RS = 64, 129, 65, 257

def prep(qn, kn, vo, g, beta, Wg, Ug, Mg, Gg, Hk, Hv, tiled, T, piece, h):
    c0 = piece * GC_T; n = min(GC_T, T - c0)
    if n <= 0: return
    kh = h % Hk if tiled else h // (Hv // Hk)
    ph = piece * Hv + h
    Ks = np.zeros(GC_T * GC_KS); Qs = np.zeros(GC_T * GC_KS); R = np.zeros(GC_T * GC_RS); Am = np.zeros(GC_T * GC_MS)
    Gs = np.array([g[(c0 + t) * Hv + h] if t < n else 0.0 for t in range(64)])
    Bs = np.array([beta[(c0 + t) * Hv + h] if t < n else 0.0 for t in range(64)])
    Gs = np.cumsum(Gs)
    for t in range(64): Gg[ph * GC_T + t] = Gs[t]
    for i in range(GC_T * 128):
        t, d = i >> 7, i & 127
        src = ((c0 + t) * Hk + kh) * 128 + d
        kv = kn[src] if t < n else 0.0
        Ks[t * GC_KS + d] = kv
        Qs[t * GC_KS + d] = qn[src] if t < n else 0.0
        R[t * GC_RS + d] = Bs[t] * np.exp(Gs[t]) * kv
        R[t * GC_RS + 128 + d] = Bs[t] * vo[((c0 + t) * Hv + h) * 128 + d] if t < n else 0.0
    K = Ks.reshape(64, GC_KS)[:, :128]; Q = Qs.reshape(64, GC_KS)[:, :128]
    kk = K @ K.T; qk = Q @ K.T
    for t in range(64):
        for s in range(64):
            dec = np.exp(Gs[t] - Gs[s]) if s <= t else 0.0
            Am[t * GC_MS + s] = Bs[t] * dec * kk[t, s] if s < t else 0.0
            Mg[ph * GC_T * GC_T + t * GC_T + s] = dec * qk[t, s]
    for c in range(256):
        for t in range(1, n):
            acc = R[t * GC_RS + c]
            for s in range(t): acc -= Am[t * GC_MS + s] * R[s * GC_RS + c]
            R[t * GC_RS + c] = acc
        dst = Wg if c < 128 else Ug
        for t in range(64): dst[ph * GC_T * 128 + (c & 127) + t * 128] = R[t * GC_RS + c]

def scan(qn, kn, Wg, Ug, Mg, Gg, state, o, Hk, Hv, tiled, T, RB, h, y):
    dv0 = y * RB
    kh = h % Hk if tiled else h // (Hv // Hk)
    base = (h * 128 + dv0) * 128
    S = state[base: base + RB * 128].reshape(RB, 128).copy()
    pieces = (T + 63) // 64
    for piece in range(pieces):
        c0 = piece * 64; n = min(64, T - c0); ph = piece * Hv + h
        W = Wg[ph * 64 * 128: (ph + 1) * 64 * 128].reshape(64, 128)
        Kp = np.array([[kn[((c0 + t) * Hk + kh) * 128 + d] if t < n else 0.0 for d in range(128)] for t in range(64)])
        Qp = np.array([[qn[((c0 + t) * Hk + kh) * 128 + d] if t < n else 0.0 for d in range(128)] for t in range(64)])
        M = Mg[ph * 64 * 64: (ph + 1) * 64 * 64].reshape(64, 64)
        U = np.array([[Ug[(ph * 64 + t) * 128 + dv0 + j] for j in range(RB)] for t in range(64)])
        G = Gg[ph * 64: ph * 64 + 64]; EG = np.exp(G); TL = np.exp(G[n - 1] - G)
        U = U - W @ S.T
        qs = Qp @ S.T
        O = EG[:, None] * qs + M @ U
        for t in range(n):
            for j in range(RB): o[((c0 + t) * Hv + h) * 128 + dv0 + j] = O[t, j]
        S = EG[n - 1] * S + (U[:n] * TL[:n, None]).T @ Kp[:n]
    state[base: base + RB * 128] = S.reshape(-1)

rng = np.random.default_rng(1)
T, hk, hv, RB, valid = 100, 2, 4, 32, 100
q = rng.standard_normal((T, hk, 128)) / 11; k = rng.standard_normal((T, hk, 128)) / 11
v = rng.standard_normal((T, hv, 128)); g = -np.abs(rng.standard_normal((T, hv))) * 0.1
b = 1 / (1 + np.exp(-rng.standard_normal((T, hv)))); s0 = rng.standard_normal((hv, 128, 128)) * 0.1
# reference: recurrent with q already scaled (the kernels' convention: o = S q)
o_ref, s_ref = ref.gdn_recurrent(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), g.astype(np.float32), b.astype(np.float32), s0.astype(np.float32))
o_ref = o_ref * np.sqrt(128)  # ref divides by sqrt(Dk)
P = (T + 63) // 64
Wg = np.zeros(P * hv * 64 * 128); Ug = np.zeros_like(Wg); Mg = np.zeros(P * hv * 64 * 64); Gg = np.zeros(P * hv * 64)
qn, kn, vo, gf, bf = q.reshape(-1), k.reshape(-1), v.reshape(-1), g.reshape(-1), b.reshape(-1)
for piece in range(P):
    for h in range(hv): prep(qn, kn, vo, gf, bf, Wg, Ug, Mg, Gg, hk, hv, 0, T, piece, h)
state = s0.reshape(-1).copy(); o = np.full(T * hv * 128, np.nan)
for h in range(hv):
    for y in range(128 // RB): scan(qn, kn, Wg, Ug, Mg, Gg, state, o, hk, hv, 0, T, RB, h, y)
print("out", np.abs(o.reshape(T, hv, 128) - o_ref).max(), "state", np.abs(state.reshape(hv, 128, 128) - s_ref).max())
