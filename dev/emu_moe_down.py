"""Offline replay of moe_down's decode (cuda/moe.cu: word_dot_f32 and half_warp_rows' addressing) in NumPy
against the canonical decoder (the bit positions of every format, the chunk and scale indexing of the planes),
and of chunk_pairs' rounding (x * scale + 1.5 * 2^23, the low 16 bits) against round-half-even; the int16
pairs' order and dp2a are dev/emu_gemv_xi16.py's. Run: PYTHONPATH=. python dev/emu_moe_down.py (no GPU)."""
import numpy as np

from engine.artifact import formats
from engine.gpu.launch import FMT_IDS

OFF = {0: 8, 1: 16, 2: 32, 3: 128}
HB = {0: 0, 1: 8, 2: 16, 3: 0}


def chunk_codes(f, w4, hb):
    """The codes chunk_dot_f32 recovers from one chunk (w4: 4 uint32 words, hb: 2 uint32 words)."""
    vpu = 16 if f == 3 else 32
    per = vpu // 4
    out = []
    for c in range(4):
        for i in range(per):
            v = c * per + i
            if f == 3:
                u = ((int(w4[c]) >> (8 * i)) & 0xFF) ^ 0x80
            else:
                u = (int(w4[c]) >> (4 * i)) & 0xF
                if f == 1:
                    u |= ((int(hb[0]) >> v) & 1) << 4
                if f == 2:
                    u |= (((int(hb[0]) >> (2 * v)) if v < 16 else (int(hb[1]) >> (2 * v - 32))) & 3) << 4
                u ^= OFF[f]
            mag = np.array([0x4B000000 | u], np.uint32).view(np.float32)[0]
            out.append(np.float32(mag - np.float32(8388608.0 + OFF[f])))
    return np.array(out, np.float32)


def decode_rows(fmt, n, k, buf):
    f = FMT_IDS[fmt]
    geo = formats.rowsplit_geometry(fmt, (n, k))
    gpr, vpu = geo.groups_per_row, (16 if f == 3 else 32)
    base = buf[geo.base_off:].view(np.uint8)
    scales = buf[geo.scale_off:geo.scale_off + n * gpr * 2].view(np.float16)
    out = np.zeros((n, k), np.float32)
    for row in range(n):
        for j in range(k // vpu):
            w4 = base[(row * gpr * 2 + j) * 16:(row * gpr * 2 + j + 1) * 16].view(np.uint32)
            rg = row * gpr + (j >> 1)
            hb = np.zeros(2, np.uint32)
            if HB[f]:
                h = buf[geo.high_off + rg * HB[f] + (j & 1) * (HB[f] // 2):][:HB[f] // 2]
                hb[:len(h) // 4] = h.view(np.uint32)
            out[row, j * vpu:(j + 1) * vpu] = np.float32(scales[rg]) * chunk_codes(f, w4, hb)
    return out


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    for fmt in FMT_IDS:
        for n, k in ((3, 512), (2, 128), (2, 96)):
            x = rng.standard_normal((n, k)).astype(np.float32)
            buf = formats.encode(fmt, "row_split_k128_v1", x)
            want = formats.decode(fmt, "row_split_k128_v1", (n, k), buf)
            vpu = 16 if fmt == "q8_g32_fp16" else 32
            kk = k // vpu * vpu
            got = decode_rows(fmt, n, kk, np.frombuffer(buf.tobytes(), np.uint8)) if kk == k else None
            if got is None:
                continue
            assert np.array_equal(got, want), (fmt, n, k, np.abs(got - want).max())
            print(f"{fmt} [{n}, {k}]: exact")
    for _ in range(200):
        x = (rng.standard_normal(32) * 10.0 ** rng.uniform(-6, 6)).astype(np.float32)
        mx = np.float32(np.abs(x).max())
        e = np.frexp(np.float32(32767.0) / mx)[1]  # pow2_scale(mx, 32767)
        sc = np.float32(np.ldexp(1.0, int(e) - 1))
        t = (x.astype(np.float64) * sc + 12582912.0).astype(np.float32)  # fmaf: one rounding
        lo = (t.view(np.uint32) & 0xFFFF).astype(np.uint16).view(np.int16).astype(np.int64)
        want = np.rint(x.astype(np.float64) * sc).astype(np.int64)
        assert np.array_equal(lo, want) and np.abs(want).max() <= 32767, (lo, want)
    print("chunk_pairs rounding: exact (200 chunks, |x| from 1e-6 to 1e6)")
