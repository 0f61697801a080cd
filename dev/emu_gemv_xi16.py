"""NumPy emulation of the int16-x GEMV decode (NI_XI16 in cuda/gemv_decode.cu): checks the bit tricks offline.

Each 32-bit word of a 16-byte chunk holds codes 8c..8c+7 (nibble i = code 8c + i); the high plane's
32-bit word holds bit 8c + i (q5) or bits 2(8c + i), +1 (q6). The kernel builds two words of signed bytes,
E (codes 0, 2, 4, 6 of the word) and O (1, 3, 5, 7), each byte F * code (q4 F = 16, q5 8, q6 4), and
takes dp2a.lo / dp2a.hi against the staged int16 pairs (x0, x2), (x4, x6), (x1, x3), (x5, x7).
Run: PYTHONPATH=. python dev/emu_gemv_xi16.py  (prints the largest error per format; 0 is exact).
"""
from __future__ import annotations

import numpy as np

from engine.artifact import formats

M32 = np.uint64(0xFFFFFFFF)


def u32(v):
    return np.asarray(v, np.uint64) & M32


def byte_perm_sel(x, c):
    """__byte_perm(x, 0, 0x4440 | c): byte c of x, zero above."""
    return (u32(x) >> np.uint64(8 * c)) & np.uint64(0xFF)


def sbytes(w):
    """The 4 signed bytes of 32-bit words w [...] -> int64 [..., 4]."""
    b = np.stack([(u32(w) >> np.uint64(8 * i)) & np.uint64(0xFF) for i in range(4)], -1).astype(np.int64)
    return np.where(b >= 128, b - 256, b)


def words_eo(fmt, q, hx, hy, c):
    """E, O words of word c (q: uint32 words [...], hx/hy: the chunk's high words [...])."""
    q = u32(q)
    if fmt == "q4_g64_fp16":
        e = (q << np.uint64(4)) & np.uint64(0xF0F0F0F0)
        o = q & np.uint64(0xF0F0F0F0)
        return u32(e), u32(o), 16
    if fmt == "q5_g64_fp16":
        he = u32(hx) & np.uint64(0x55555555)
        ho = (u32(hx) >> np.uint64(1)) & np.uint64(0x55555555)
        se = u32(byte_perm_sel(he, c) * np.uint64(0x02082080))
        so = u32(byte_perm_sel(ho, c) * np.uint64(0x02082080))
        e = ((q << np.uint64(3)) & np.uint64(0x78787878)) | (se & np.uint64(0x80808080))
        o = ((q >> np.uint64(1)) & np.uint64(0x78787878)) | (so & np.uint64(0x80808080))
        return u32(e), u32(o), 8
    if fmt == "q6_g64_fp16":
        hw = u32(hx) if c < 2 else u32(hy)
        hh = (hw >> np.uint64(16 * (c & 1))) & np.uint64(0xFFFF)

        def spread(h):  # 2-bit fields at bits 4b (b = 0..3) -> bits 8b + 6
            return (((h & np.uint64(0x3)) << np.uint64(6)) | ((h & np.uint64(0x30)) << np.uint64(10))
                    | ((h & np.uint64(0x300)) << np.uint64(14)) | ((h & np.uint64(0x3000)) << np.uint64(18)))
        e = ((q << np.uint64(2)) & np.uint64(0x3C3C3C3C)) | spread(hh & np.uint64(0x3333))
        o = ((q >> np.uint64(2)) & np.uint64(0x3C3C3C3C)) | spread((hh >> np.uint64(2)) & np.uint64(0x3333))
        return u32(e), u32(o), 4
    raise ValueError(fmt)


def main() -> int:
    rng = np.random.default_rng(7)
    n, k = 64, 1024
    bad = 0
    for fmt in ("q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16"):
        w = rng.standard_normal((n, k)).astype(np.float32)
        w[:, :64] *= 50  # endpoints of the code range
        buf = formats.encode(fmt, "row_split_k128_v1", w)
        geo = formats.rowsplit_geometry(fmt, (n, k))
        base, high, _ = formats.rowsplit_planes(geo, buf, 0, n)
        codes = formats.decode_codes(geo, base, high).astype(np.int64)  # [n, k]
        xi = rng.integers(-32767, 32768, size=k).astype(np.int64)  # staged int16 x
        words = base.reshape(n, -1).view("<u4").reshape(n, k // 32, 4)  # chunk j, word c
        hb = geo.high_row_bytes * 32 // k if geo.high_row_bytes else 0  # high bytes a chunk
        hw = high.reshape(n, k // 32, hb).view("<u4") if hb else np.zeros((n, k // 32, 2), np.uint32)
        hx = hw[:, :, 0]
        hy = hw[:, :, 1] if hw.shape[2] > 1 else hx
        got = np.zeros(n, np.int64)
        for c in range(4):
            e, o, f = words_eo(fmt, words[:, :, c], hx, hy, c)
            xs = xi.reshape(k // 32, 4, 8)[:, c, :]  # the word's 8 x values
            pairs = [(0, 2), (4, 6), (1, 3), (5, 7)]  # staged pair order: .x .y .z .w
            eb, ob = sbytes(e), sbytes(o)  # [n, chunks, 4]
            # dp2a.lo(xv.x, E) + dp2a.hi(xv.y, E) + dp2a.lo(xv.z, O) + dp2a.hi(xv.w, O)
            got += (eb[..., 0] * xs[:, pairs[0][0]] + eb[..., 1] * xs[:, pairs[0][1]]
                    + eb[..., 2] * xs[:, pairs[1][0]] + eb[..., 3] * xs[:, pairs[1][1]]
                    + ob[..., 0] * xs[:, pairs[2][0]] + ob[..., 1] * xs[:, pairs[2][1]]
                    + ob[..., 2] * xs[:, pairs[3][0]] + ob[..., 3] * xs[:, pairs[3][1]]).sum(axis=1) // 1
            fac = f
        want = codes @ xi
        err = int(np.abs(got - fac * want).max())
        lim = int(np.abs(codes).max()) * fac
        print(f"{fmt}: largest |dot - {fac} * exact| = {err}; largest |byte| {lim} (<= 128)")
        bad |= err != 0 or lim > 128
    return int(bad)


if __name__ == "__main__":
    raise SystemExit(main())
