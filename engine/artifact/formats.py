"""Numeric formats and storage layouts of the `.ninfer` container (spec container.md §2.5-2.7).

Direct formats (`bf16`, `fp32`, `int32`) are little-endian words in `contiguous_le_v1`.
Groupwise formats (`q4_g64_fp16`, `q5_g64_fp16`, `q6_g64_fp16`, `q8_g32_fp16`) are rank-2 `[N, K]`
matrices in `row_split_k128_v1`: three planes (low codes, high bits, fp16 scales), each row-major then
group-major, K padded to a multiple of 128. `nvfp4` and `fp8_e4m3fn_row_bf16` are only size-checked.

The encoder is the canonical MAXABS_F16_RECIP_RNE_V1: per row and group, scale = f16(f32(amax / qmax)),
codes = clamp(round_half_even(f32(x * f32(1 / scale)))). The reciprocal multiply is normative.
"""
from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from engine.errors import NinferError

FORMATS = ("bf16", "fp32", "int32", "q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16",
           "nvfp4", "fp8_e4m3fn_row_bf16")
LAYOUTS = ("contiguous_le_v1", "row_split_k128_v1", "block_scale_k16_m128x4_v1", "row_scale_v1")
DIRECT = {"bf16": 2, "fp32": 4, "int32": 4}
# format -> (code bits, group size)
GROUPWISE = {"q4_g64_fp16": (4, 64), "q5_g64_fp16": (5, 64), "q6_g64_fp16": (6, 64), "q8_g32_fp16": (8, 32)}
OPAQUE = {"nvfp4": "block_scale_k16_m128x4_v1", "fp8_e4m3fn_row_bf16": "row_scale_v1"}
ROW_SPLIT = "row_split_k128_v1"
CONTIGUOUS = "contiguous_le_v1"
_ROWS_PER_CHUNK_ELEMS = 1 << 20  # ~4 MB float32 per chunk: temporaries stay in cache
_WORKERS = min(8, os.cpu_count() or 1)
_F16_MIN_SUBNORMAL = np.array([1], dtype=np.uint16).view(np.float16)[0]


def align_up(x: int, a: int) -> int:
    """Round x up to a multiple of a."""
    return (x + a - 1) // a * a


@dataclass(frozen=True)
class RowSplit:
    """Geometry of one `row_split_k128_v1` object; offsets are relative to the object start."""

    n: int
    k: int
    k_pad: int
    group: int
    groups_per_row: int
    bits: int
    base_bytes_per_group: int
    high_bytes_per_group: int
    base_off: int
    high_off: int
    scale_off: int
    bytes: int

    @property
    def qmax(self) -> int:
        return 127 if self.bits == 8 else (1 << (self.bits - 1)) - 1

    @property
    def qmin(self) -> int:
        return -127 if self.bits == 8 else -(1 << (self.bits - 1))

    @property
    def base_row_bytes(self) -> int:
        return self.groups_per_row * self.base_bytes_per_group

    @property
    def high_row_bytes(self) -> int:
        return self.groups_per_row * self.high_bytes_per_group

    @property
    def scale_row_bytes(self) -> int:
        return self.groups_per_row * 2


def _check_names(fmt: str, layout: str) -> None:
    if fmt not in FORMATS:
        raise NinferError(f"unknown tensor format {fmt!r}", f"known formats: {', '.join(FORMATS)}")
    if layout not in LAYOUTS:
        raise NinferError(f"unknown tensor layout {layout!r}", f"known layouts: {', '.join(LAYOUTS)}")
    ok = ((fmt in DIRECT and layout == CONTIGUOUS) or (fmt in GROUPWISE and layout == ROW_SPLIT)
          or OPAQUE.get(fmt) == layout)
    if not ok:
        raise NinferError(f"format {fmt} cannot be stored in layout {layout}")


def _rank2(fmt: str, shape) -> tuple[int, int]:
    shape = tuple(int(s) for s in shape)
    if len(shape) != 2 or min(shape) < 1:
        raise NinferError(f"format {fmt} needs a non-empty rank-2 [N, K] shape, got {list(shape)}")
    return shape


def rowsplit_geometry(fmt: str, shape) -> RowSplit:
    """Plane geometry of a groupwise `[N, K]` matrix in `row_split_k128_v1`."""
    if fmt not in GROUPWISE:
        raise NinferError(f"format {fmt} has no row-split geometry")
    n, k = _rank2(fmt, shape)
    bits, group = GROUPWISE[fmt]
    k_pad = align_up(k, 128)
    gpr = k_pad // group
    base_pg = 32  # Q4/5/6: 64 nibbles; W8: 32 bytes
    high_pg = 0 if bits in (4, 8) else group * (bits - 4) // 8
    base_bytes = n * gpr * base_pg
    high_bytes = n * gpr * high_pg
    high_off = align_up(base_bytes, 256)
    scale_off = high_off + align_up(high_bytes, 256)
    return RowSplit(n, k, k_pad, group, gpr, bits, base_pg, high_pg, 0, high_off, scale_off,
                    scale_off + n * gpr * 2)


def encoded_size(fmt: str, layout: str, shape) -> int:
    """Bytes an object of this format, layout and shape occupies."""
    _check_names(fmt, layout)
    shape = tuple(int(s) for s in shape)
    if fmt in DIRECT:
        if len(shape) > 16 or any(s < 0 for s in shape):
            raise NinferError(f"bad shape {list(shape)} for {fmt}")
        return math.prod(shape) * DIRECT[fmt]
    if fmt in GROUPWISE:
        return rowsplit_geometry(fmt, shape).bytes
    n, k = _rank2(fmt, shape)
    if fmt == "nvfp4":
        if n % 128 or k % 64:
            raise NinferError(f"nvfp4 needs N % 128 == 0 and K % 64 == 0, got {[n, k]}")
        return align_up(n * k // 2, 256) + n * k // 16 + 4
    return align_up(n * k, 256) + 2 * n


# --- bf16 helpers (NumPy has no bfloat16) ---------------------------------------------------

def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (round half to even), returned as uint16 bit patterns."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    nan = np.isnan(x)
    if nan.any():  # keep NaN a (quiet) NaN instead of letting rounding carry into the exponent
        rounded = np.where(nan, (u >> np.uint32(16)) | np.uint32(0x40), rounded)
    return rounded.astype(np.uint16)


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """Widen bfloat16 bit patterns (uint16) to float32 exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _is_bf16_dtype(dt: np.dtype) -> bool:
    return dt.name == "bfloat16"  # ml_dtypes.bfloat16, when present


# --- canonical encoder ------------------------------------------------------------------------

def _quantize_rows(x: np.ndarray, geo: RowSplit) -> tuple[np.ndarray, np.ndarray]:
    """Codes int8 [n, k_pad] and fp16 scales [n, groups_per_row] of float32 rows x [n, k]."""
    n = x.shape[0]
    if geo.k == geo.k_pad:
        xp = np.ascontiguousarray(x, dtype=np.float32)
    else:
        xp = np.zeros((n, geo.k_pad), dtype=np.float32)
        xp[:, : geo.k] = x
    g = xp.reshape(n, geo.groups_per_row, geo.group)
    amax = np.maximum(g.max(axis=2), -g.min(axis=2))
    amax += np.float32(0)  # -0.0 + 0.0 = +0.0: an all-zero group gets scale +0, never -0
    if not np.isfinite(amax).all():  # NaN and inf both reach the group maximum
        raise NinferError("cannot quantize a tensor holding NaN or infinity",
                          "check the source checkpoint, or keep this tensor in bf16")
    # spec: host rounds amax/qmax through float64 -> f32 -> f16
    raw = (amax.astype(np.float64) / geo.qmax).astype(np.float32)
    with np.errstate(over="ignore"):
        s16 = raw.astype(np.float16)
    if not np.isfinite(s16).all():
        raise NinferError("a group scale overflows binary16 (|x| > 65504 * qmax)",
                          "keep this tensor in bf16 or fp32")
    s16 = np.where((s16 == 0) & (amax > 0), _F16_MIN_SUBNORMAL, s16)
    s32 = s16.astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(s32 > 0, np.float32(1.0) / s32, np.float32(0.0)).astype(np.float32)
    q = np.multiply(g, inv[:, :, None])
    np.rint(q, out=q)
    np.clip(q, geo.qmin, geo.qmax, out=q)
    return q.astype(np.int8).reshape(n, geo.k_pad), s16


def _pack_rows(codes: np.ndarray, s16: np.ndarray, geo: RowSplit) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Base, high and scale plane bytes for the rows in codes [n, k_pad]."""
    n = codes.shape[0]
    u = codes.view(np.uint8)
    if geo.bits == 8:
        base = u.reshape(n, -1)
        high = np.zeros((n, 0), dtype=np.uint8)
    else:
        lo = (u & 0x0F).reshape(n, geo.k_pad // 2, 2)
        base = lo[:, :, 0] | (lo[:, :, 1] << 4)
        if geo.bits == 4:
            high = np.zeros((n, 0), dtype=np.uint8)
        else:
            nbits = geo.bits - 4
            # lane-major bitstream: lane l's bit 4+j is stream bit l*nbits + j
            hb = np.stack([(u >> (4 + j)) & 1 for j in range(nbits)], axis=-1).reshape(n, -1)
            high = np.packbits(hb, axis=1, bitorder="little")
    scales = s16.astype("<f2").view(np.uint8).reshape(n, -1)
    return base, high, scales


def encode(fmt: str, layout: str, x: np.ndarray) -> np.ndarray:
    """Encode x into the bytes of one object (uint8, length encoded_size).

    bf16 takes float arrays (rounded half to even) or uint16 arrays holding bf16 bit patterns
    (copied as they are). Groupwise formats take a float `[N, K]` matrix.
    """
    _check_names(fmt, layout)
    x = np.asarray(x)
    if fmt == "bf16":
        if x.dtype == np.uint16 or _is_bf16_dtype(x.dtype):
            bits = x.view(np.uint16)
        else:
            bits = f32_to_bf16_bits(x.astype(np.float32))
        return np.ascontiguousarray(bits, dtype="<u2").reshape(-1).view(np.uint8)
    if fmt == "fp32":
        if _is_bf16_dtype(x.dtype):
            x = bf16_bits_to_f32(x.view(np.uint16))
        return np.ascontiguousarray(x, dtype="<f4").reshape(-1).view(np.uint8)
    if fmt == "int32":
        return np.ascontiguousarray(x, dtype="<i4").reshape(-1).view(np.uint8)
    if fmt in OPAQUE:
        raise NinferError(f"encoding {fmt} is not supported (objects are carried through as they are)")
    geo = rowsplit_geometry(fmt, x.shape)
    if _is_bf16_dtype(x.dtype):
        x = x.view(np.uint16)
    out = np.zeros(geo.bytes, dtype=np.uint8)
    base_p = out[: geo.n * geo.base_row_bytes].reshape(geo.n, -1)
    high_p = out[geo.high_off: geo.high_off + geo.n * geo.high_row_bytes].reshape(geo.n, -1)
    scale_p = out[geo.scale_off:].reshape(geo.n, -1)
    def chunk(r0: int) -> None:
        r1 = min(geo.n, r0 + step)
        rows = x[r0:r1]
        if rows.dtype == np.uint16:
            rows = bf16_bits_to_f32(rows)
        codes, s16 = _quantize_rows(np.asarray(rows, dtype=np.float32), geo)
        base, high, scales = _pack_rows(codes, s16, geo)
        base_p[r0:r1] = base
        if geo.high_row_bytes:
            high_p[r0:r1] = high
        scale_p[r0:r1] = scales

    step = max(1, _ROWS_PER_CHUNK_ELEMS // geo.k_pad)
    starts = range(0, geo.n, step)
    if len(starts) > 1 and _WORKERS > 1:  # NumPy ufuncs release the GIL: chunks run in parallel
        with ThreadPoolExecutor(_WORKERS) as pool:
            list(pool.map(chunk, starts))
    else:
        for r0 in starts:
            chunk(r0)
    return out


# --- decoder ----------------------------------------------------------------------------------

def rowsplit_planes(geo: RowSplit, buf: np.ndarray, r0: int, r1: int):
    """Views of rows [r0, r1) of the three planes: base [n, B], high [n, H], scales fp16 [n, G]."""
    b, h, s = geo.base_row_bytes, geo.high_row_bytes, geo.scale_row_bytes
    base = buf[r0 * b: r1 * b].reshape(r1 - r0, b)
    high = buf[geo.high_off + r0 * h: geo.high_off + r1 * h].reshape(r1 - r0, h)
    scales = buf[geo.scale_off + r0 * s: geo.scale_off + r1 * s].view("<f2").reshape(r1 - r0, -1)
    return base, high, scales


def decode_codes(geo: RowSplit, base: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Signed codes int8 [n, k_pad] from the base and high planes of n rows."""
    n = base.shape[0]
    if geo.bits == 8:
        return base.view(np.int8).reshape(n, geo.k_pad)
    u = np.empty((n, geo.k_pad), dtype=np.uint8)
    u[:, 0::2] = base & 0x0F
    u[:, 1::2] = base >> 4
    if geo.bits > 4:
        nbits = geo.bits - 4
        hb = np.unpackbits(np.ascontiguousarray(high), axis=1, bitorder="little").reshape(n, geo.k_pad, nbits)
        for j in range(nbits):
            u |= hb[:, :, j] << (4 + j)
    shift = 8 - geo.bits  # sign-extend from `bits`
    return ((u << shift).view(np.int8) >> shift).astype(np.int8)


def _check_buf(fmt: str, layout: str, shape, buf: np.ndarray) -> np.ndarray:
    if isinstance(buf, (bytes, bytearray, memoryview)):
        buf = np.frombuffer(buf, dtype=np.uint8)
    buf = np.asarray(buf)
    if buf.dtype != np.uint8:
        buf = buf.view(np.uint8)
    need = encoded_size(fmt, layout, shape)
    if buf.size != need:
        raise NinferError(f"{fmt} {list(shape)} needs {need} bytes, got {buf.size}")
    return buf.reshape(-1)


def decode_rows(fmt: str, layout: str, shape, buf: np.ndarray, r0: int, r1: int) -> np.ndarray:
    """Decode rows [r0, r1) of an object (first axis for direct formats)."""
    shape = tuple(int(s) for s in shape)
    buf = _check_buf(fmt, layout, shape, buf)
    if fmt in DIRECT:
        inner = math.prod(shape[1:]) if len(shape) > 1 else 1
        word = DIRECT[fmt]
        rows = buf[r0 * inner * word: r1 * inner * word]
        out_shape = (r1 - r0,) + shape[1:] if shape else ()
        if fmt == "bf16":
            return bf16_bits_to_f32(rows.view("<u2")).reshape(out_shape)
        return rows.view("<f4" if fmt == "fp32" else "<i4").reshape(out_shape)
    if fmt in OPAQUE:
        raise NinferError(f"decoding {fmt} is not supported in NumPy")
    geo = rowsplit_geometry(fmt, shape)
    if not 0 <= r0 <= r1 <= geo.n:
        raise NinferError(f"row range [{r0}, {r1}) outside [0, {geo.n})")
    base, high, scales = rowsplit_planes(geo, buf, r0, r1)
    codes = decode_codes(geo, base, high).reshape(r1 - r0, geo.groups_per_row, geo.group)
    w = codes.astype(np.float32) * scales.astype(np.float32)[:, :, None]
    return w.reshape(r1 - r0, geo.k_pad)[:, : geo.k]


def decode(fmt: str, layout: str, shape, buf: np.ndarray) -> np.ndarray:
    """Decode a whole object: float32 for groupwise and bf16, native dtype for fp32/int32."""
    shape = tuple(int(s) for s in shape)
    if fmt in DIRECT:
        buf = _check_buf(fmt, layout, shape, buf)
        if fmt == "bf16":
            return bf16_bits_to_f32(buf.view("<u2")).reshape(shape)
        return buf.view("<f4" if fmt == "fp32" else "<i4").reshape(shape)
    return decode_rows(fmt, layout, shape, buf, 0, shape[0] if shape else 0)


def max_abs_error(fmt: str, x: np.ndarray) -> np.ndarray:
    """Per-group bound [N, groups_per_row] on |decode(encode(x)) - x| for a groupwise format:
    half a step (the fp16 scale may round up by 2^-11), plus slack for subnormal fp16 scales."""
    geo = rowsplit_geometry(fmt, x.shape)
    xp = np.zeros((geo.n, geo.k_pad), dtype=np.float32)
    xp[:, : geo.k] = x
    amax = np.abs(xp.reshape(geo.n, geo.groups_per_row, geo.group)).max(axis=2).astype(np.float64)
    return 0.5 * amax / geo.qmax * (1 + 2.0 ** -9) + geo.qmax * 2.0 ** -24
