"""Offline replay of attn_decode_mma's VRAW P V step (cuda/attn_decode_mma.cu, int8 KV) in NumPy: each lane's B
fragments built from 32-bit loads of the raw V codes as the kernel does (XOR 0x80, the byte pairs, PRMT with 0x64,
HSUB2 of 1152), P's A fragment times the tokens' group scales, m16n8k16 by its fragment layout, and the merge's dim
permutation; against P @ (codes x scales). No GPU needed: `python dev/emu_attn_vraw.py`."""
from __future__ import annotations

import numpy as np


def byte_perm(x: int, y: int, sel: int) -> int:
    """__byte_perm: result byte i is byte (sel >> 4 i) & 7 of the 8 bytes y:x."""
    src = [(x >> (8 * i)) & 0xFF for i in range(4)] + [(y >> (8 * i)) & 0xFF for i in range(4)]
    return sum(src[(sel >> (4 * i)) & 7] << (8 * i) for i in range(4))


def h2(u: int) -> np.ndarray:
    """A 32-bit word as its two fp16 halves (low first)."""
    return np.array([u & 0xFFFF, u >> 16], dtype=np.uint16).view(np.float16)


def w2(h: np.ndarray) -> int:
    b = np.asarray(h, dtype=np.float16).view(np.uint16)
    return int(b[0]) | (int(b[1]) << 16)


def word(row: np.ndarray, d: int) -> int:
    """A 32-bit shared load of 4 int8 codes at dim d of a token row."""
    return int(np.frombuffer(row[d:d + 4].astype(np.int8).tobytes(), dtype=np.uint32)[0])


def run(seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    p = rng.random((16, 16)).astype(np.float16)
    codes = rng.integers(-128, 128, (16, 256)).astype(np.int8)
    scales = (rng.random((16, 4)) * 0.05 + 0.001).astype(np.float16)
    # warp-wide: gather every lane's fragments for n-tile j, then C = A B by the PTX m16n8k16 layout
    a_frag = {}
    b_frag = {}
    for lane in range(32):
        g, t4 = lane >> 2, lane & 3
        toks = (2 * t4, 2 * t4 + 1, 2 * t4 + 8, 2 * t4 + 9)
        pa = [w2(p[g, toks[0]:toks[0] + 2]), w2(p[g + 8, toks[0]:toks[0] + 2]),
              w2(p[g, toks[2]:toks[2] + 2]), w2(p[g + 8, toks[2]:toks[2] + 2])]
        sv = [(w2(scales[t, 0:2]), w2(scales[t, 2:4])) for t in toks]
        for gr in range(4):
            sel = 0x7632 if gr & 1 else 0x5410
            s01 = byte_perm(sv[0][gr >> 1], sv[1][gr >> 1], sel)
            s89 = byte_perm(sv[2][gr >> 1], sv[3][gr >> 1], sel)
            pg = [h2(pa[0]) * h2(s01), h2(pa[1]) * h2(s01), h2(pa[2]) * h2(s89), h2(pa[3]) * h2(s89)]
            for qq in range(2):
                q = 2 * gr + qq
                d0 = 32 * q + 4 * g
                w = [word(codes[t], d0) ^ 0x80808080 for t in toks]
                lo01, hi01 = byte_perm(w[0], w[1], 0x5140), byte_perm(w[0], w[1], 0x7362)
                lo89, hi89 = byte_perm(w[2], w[3], 0x5140), byte_perm(w[2], w[3], 0x7362)
                for r in range(4):
                    j = 4 * q + r
                    sel2 = 0x4342 if r & 1 else 0x4140
                    b0 = h2(byte_perm(lo01 if r < 2 else hi01, 0x64646464, sel2)) - np.float16(1152)
                    b1 = h2(byte_perm(lo89 if r < 2 else hi89, 0x64646464, sel2)) - np.float16(1152)
                    a_frag[(lane, j)] = pg
                    b_frag[(lane, j)] = (b0, b1)
    out = np.zeros((16, 256), dtype=np.float64)
    for j in range(32):
        A = np.zeros((16, 16))
        B = np.zeros((16, 8))
        for lane in range(32):
            g, t4 = lane >> 2, lane & 3
            a = a_frag[(lane, j)]
            A[g, 2 * t4:2 * t4 + 2] = a[0]
            A[g + 8, 2 * t4:2 * t4 + 2] = a[1]
            A[g, 2 * t4 + 8:2 * t4 + 10] = a[2]
            A[g + 8, 2 * t4 + 8:2 * t4 + 10] = a[3]
            b0, b1 = b_frag[(lane, j)]
            B[2 * t4:2 * t4 + 2, g] = b0
            B[2 * t4 + 8:2 * t4 + 10, g] = b1
        C = A @ B
        for lane in range(32):  # the merge's write: n-tile j, columns 2 t4, 2 t4 + 1
            g, t4 = lane >> 2, lane & 3
            d = 32 * (j >> 2) + 8 * t4 + (j & 3)
            out[g, d], out[g, d + 4] = C[g, 2 * t4], C[g, 2 * t4 + 1]
            out[g + 8, d], out[g + 8, d + 4] = C[g + 8, 2 * t4], C[g + 8, 2 * t4 + 1]
    v = codes.astype(np.float64) * np.repeat(scales.astype(np.float64), 64, axis=1)
    want = p.astype(np.float64) @ v
    return float(np.linalg.norm(out - want) / np.linalg.norm(want))


if __name__ == "__main__":
    errs = [run(s) for s in range(4)]
    print("VRAW P V: the lanes' fragments, MMA layout and dim permutation against P @ (codes x scales): rel-L2",
          ", ".join(f"{e:.2e}" for e in errs))
    assert max(errs) < 2e-3, errs
