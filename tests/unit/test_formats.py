"""Format codecs against a scalar, spec-literal reference (container.md §2.5-2.7)."""
import struct

import numpy as np
import pytest

from engine.artifact import formats as F
from engine.errors import NinferError

RS = "row_split_k128_v1"
QFMTS = ["q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16"]


def ref_encode(fmt, x):
    """Spec-literal, loop-based MAXABS_F16_RECIP_RNE_V1 + row_split_k128_v1 (slow; small inputs)."""
    bits, G = F.GROUPWISE[fmt]
    qmax = 127 if bits == 8 else (1 << (bits - 1)) - 1
    qmin = -127 if bits == 8 else -(1 << (bits - 1))
    n, k = x.shape
    k_pad = -(-k // 128) * 128
    gpr = k_pad // G
    base, high, scales = bytearray(), bytearray(), bytearray()
    for r in range(n):
        row = [float(np.float32(v)) for v in x[r]] + [0.0] * (k_pad - k)
        for g in range(gpr):
            vals = row[g * G:(g + 1) * G]
            amax = np.float32(max(abs(v) for v in vals))
            if amax == 0:
                s16 = np.float16(0)
                codes = [0] * G
            else:
                raw = np.float32(np.float64(amax) / qmax)
                s16 = np.float16(raw)
                if s16 == 0:
                    s16 = np.array([1], np.uint16).view(np.float16)[0]
                inv = np.float32(np.float32(1) / np.float32(s16))
                codes = [int(min(qmax, max(qmin, round(float(np.float32(np.float32(v) * inv)))))) for v in vals]
            scales += struct.pack("<e", float(s16))
            u = [c & ((1 << bits) - 1) for c in codes]
            if bits == 8:
                base += bytes(u)
            else:
                base += bytes((u[2 * j] & 0xF) | ((u[2 * j + 1] & 0xF) << 4) for j in range(G // 2))
                nb = bits - 4
                stream = [(u[lane] >> (4 + j)) & 1 for lane in range(G) for j in range(nb)]
                high += bytes(sum(stream[8 * i + t] << t for t in range(8)) for i in range(len(stream) // 8))
    pad = lambda b: bytes(b) + bytes(-len(b) % 256)  # noqa: E731
    return np.frombuffer(pad(base) + (pad(high) if high else b"") + bytes(scales), dtype=np.uint8)


def _cases(rng):
    yield "normal", (rng.standard_normal((3, 200)) * 0.05).astype(np.float32)
    yield "tail_k_130", rng.standard_normal((2, 130)).astype(np.float32)
    yield "k_lt_group", rng.standard_normal((4, 17)).astype(np.float32)
    yield "k_256", rng.uniform(-3, 3, (2, 256)).astype(np.float32)
    tiny = (rng.standard_normal((2, 128)) * 1e-6).astype(np.float32)  # subnormal fp16 scales
    yield "subnormal", tiny
    yield "below_min_scale", (rng.standard_normal((1, 128)) * 1e-9).astype(np.float32)
    z = rng.standard_normal((2, 192)).astype(np.float32)
    z[0, :64] = 0
    z[1, 64:128] = 0
    yield "zero_groups", z
    yield "all_zero", np.zeros((2, 64), np.float32)
    yield "large", (rng.standard_normal((2, 128)) * 1000).astype(np.float32)


@pytest.mark.parametrize("fmt", QFMTS)
def test_encoder_matches_spec_reference(fmt):
    rng = np.random.default_rng(7)
    for name, x in _cases(rng):
        got = F.encode(fmt, RS, x)
        want = ref_encode(fmt, x)
        assert got.size == F.encoded_size(fmt, RS, x.shape) == want.size, name
        assert np.array_equal(got, want), f"{fmt} {name}"


@pytest.mark.parametrize("fmt", QFMTS)
def test_round_trip_within_half_step(fmt):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((37, 300)) * rng.uniform(1e-3, 10, (37, 1))).astype(np.float32)
    y = F.decode(fmt, RS, x.shape, F.encode(fmt, RS, x))
    G = F.GROUPWISE[fmt][1]
    err = np.abs(np.pad(y - x, ((0, 0), (0, 384 - 300)))).reshape(37, -1, G).max(-1)
    assert (err <= F.max_abs_error(fmt, x)).all()
    # re-encoding decoded values is a fixed point (codes and scales reproduce exactly)
    b = F.encode(fmt, RS, y)
    assert np.array_equal(F.decode(fmt, RS, x.shape, b), y)


def test_ties_round_half_even():
    # amax 7 -> Q4 scale exactly 1.0, inv 1.0: x*inv lands on .5 ties
    x = np.zeros((1, 64), np.float32)
    x[0, :6] = [7.0, 2.5, 3.5, -2.5, -0.5, 0.5]
    codes = F.decode("q4_g64_fp16", RS, x.shape, F.encode("q4_g64_fp16", RS, x))[0, :6]
    assert codes.tolist() == [7.0, 2.0, 4.0, -2.0, -0.0, 0.0]


def test_reciprocal_multiply_order_matters():
    # near a .5 tie, x*inv and x/s16 can round to different codes: the encoder must use x*inv
    s16 = np.float32(np.float16(np.float32(10.0 / 7)))
    inv = np.float32(np.float32(1) / s16)
    ties = np.array([(k + 0.5) * s16 for k in range(-7, 7)], np.float32)
    xs = np.concatenate([ties, np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf))])
    xs = xs[np.abs(xs) < 10]
    by_mul, by_div = np.rint(xs * inv), np.rint(xs / s16)
    diff = np.nonzero(by_mul != by_div)[0]
    assert diff.size > 0
    x = np.zeros((1, 64), np.float32)
    x[0, 0] = 10.0
    x[0, 1: 1 + diff.size] = xs[diff]
    got = F.decode("q4_g64_fp16", RS, x.shape, F.encode("q4_g64_fp16", RS, x))[0, 1: 1 + diff.size] / s16
    assert np.array_equal(got, by_mul[diff])


def test_zero_group_scale_is_zero_and_min_subnormal_scale():
    x = np.zeros((1, 128), np.float32)
    x[0, 64] = 1e-9  # raw scale rounds to fp16 0 -> forced to 0x0001
    buf = F.encode("q8_g32_fp16", RS, x)
    geo = F.rowsplit_geometry("q8_g32_fp16", x.shape)
    scales = buf[geo.scale_off:].view("<u2")
    assert scales.tolist() == [0, 0, 1, 0]


def test_size_examples_and_plane_offsets():
    g = F.rowsplit_geometry("q5_g64_fp16", [2, 130])
    assert (g.k_pad, g.groups_per_row, g.high_off, g.scale_off, g.bytes) == (256, 4, 256, 512, 528)
    assert F.encoded_size("q4_g64_fp16", RS, [7168, 5120]) == 19_496_960
    assert F.encoded_size("q5_g64_fp16", RS, [7168, 5120]) == 24_084_480
    assert F.encoded_size("fp8_e4m3fn_row_bf16", "row_scale_v1", [14336, 5120]) == 73_428_992
    assert F.encoded_size("nvfp4", "block_scale_k16_m128x4_v1", [14336, 5120]) == 41_287_684
    # inventory: text/token_embedding q6 [248320, 5120]
    g6 = F.rowsplit_geometry("q6_g64_fp16", [248320, 5120])
    assert (g6.high_off, g6.scale_off, g6.bytes) == (635699200, 953548800, 993280000)
    assert F.encoded_size("bf16", "contiguous_le_v1", [4, 10240]) == 81920


def test_q6_high_bits_lane_major():
    x = np.zeros((1, 64), np.float32)
    x[0, 0] = -31.0  # code -31 = 0b100001 (6-bit) -> bit4 = 0, bit5 = 1
    x[0, 1] = 31.0   # 0b011111 -> bit4 = 1, bit5 = 0
    buf = F.encode("q6_g64_fp16", RS, x)
    g = F.rowsplit_geometry("q6_g64_fp16", x.shape)
    assert buf[0] == (0x1 | (0xF << 4))  # low nibbles of lanes 0 and 1
    assert buf[g.high_off] == 0b0110  # lane 0 -> bits 0,1; lane 1 -> bits 2,3


def test_decode_rows_matches_full_decode():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((9, 140)).astype(np.float32)
    for fmt in QFMTS:
        buf = F.encode(fmt, RS, x)
        full = F.decode(fmt, RS, x.shape, buf)
        assert np.array_equal(F.decode_rows(fmt, RS, x.shape, buf, 3, 7), full[3:7])
    b = F.encode("bf16", "contiguous_le_v1", x)
    assert np.array_equal(F.decode_rows("bf16", "contiguous_le_v1", x.shape, b, 2, 5),
                          F.decode("bf16", "contiguous_le_v1", x.shape, b)[2:5])


def test_bf16_rounding_and_direct_bit_exactness():
    vals = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -0.0, np.inf, 3.0e38],
                    np.float32)
    bits = F.encode("bf16", "contiguous_le_v1", vals).view("<u2")
    assert bits.tolist() == [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x8000, 0x7F80, 0x7F62]
    nan = F.f32_to_bf16_bits(np.array([np.float32("nan")]))
    assert np.isnan(F.bf16_bits_to_f32(nan)).all()
    raw = np.array([0x7FC1, 0xFFFF, 0x0001], np.uint16)  # NaN payloads kept as they are
    assert np.array_equal(F.encode("bf16", "contiguous_le_v1", raw).view("<u2"), raw)
    f = np.array([[np.nan, -1.5], [7e-45, 2.0]], np.float32)
    out = F.decode("fp32", "contiguous_le_v1", f.shape, F.encode("fp32", "contiguous_le_v1", f))
    assert np.array_equal(out.view(np.uint32), f.view(np.uint32))
    i = np.array([-(2 ** 31), 5], np.int32)
    assert np.array_equal(F.decode("int32", "contiguous_le_v1", [2], F.encode("int32", "contiguous_le_v1", i)), i)


def test_bad_inputs_raise_ninfer_error():
    with pytest.raises(NinferError):
        F.encode("q4_g64_fp16", RS, np.array([[np.nan] * 4], np.float32))
    with pytest.raises(NinferError):
        F.encode("q4_g64_fp16", RS, np.full((1, 4), 1e6, np.float32))  # scale overflows fp16
    with pytest.raises(NinferError):
        F.encoded_size("q4_g64_fp16", "contiguous_le_v1", [4, 4])
    with pytest.raises(NinferError):
        F.encoded_size("q3", RS, [4, 4])
    with pytest.raises(NinferError):
        F.decode("q8_g32_fp16", RS, [2, 32], np.zeros(10, np.uint8))


@pytest.mark.parametrize("fmt", ["q4_g64_fp16", "q6_g64_fp16", "q8_g32_fp16"])
def test_threaded_chunks_match_one_pass(monkeypatch, fmt):
    x = (np.random.default_rng(9).standard_normal((2000, 1100)) * 0.05).astype(np.float32)
    bits = F.f32_to_bf16_bits(x)
    monkeypatch.setattr(F, "_WORKERS", 4)
    monkeypatch.setattr(F, "_ROWS_PER_CHUNK_ELEMS", 1 << 18)  # ~228 rows per chunk: 9 chunks
    chunked, chunked_bits = F.encode(fmt, RS, x), F.encode(fmt, RS, bits)
    monkeypatch.setattr(F, "_WORKERS", 1)
    monkeypatch.setattr(F, "_ROWS_PER_CHUNK_ELEMS", 1 << 30)
    assert np.array_equal(chunked, F.encode(fmt, RS, x))
    assert np.array_equal(chunked_bits, F.encode(fmt, RS, F.bf16_bits_to_f32(bits)))
    assert np.array_equal(chunked[:64], ref_encode(fmt, x[:1])[:64])
