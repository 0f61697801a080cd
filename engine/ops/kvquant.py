"""Reference for the int8-g64 KV cache format (spec/container.md §5.5): per 64-dim group of each
cached K or V row, scale = fp16(amax / 127) (min fp16 subnormal when a non-zero group rounds to 0),
codes = clamp(round_half_even(x * (1 / scale)), -127, 127); x ~= code * scale."""
from __future__ import annotations

import numpy as np

GROUP = 64


def quantize_kv_int8_g64(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x[..., D] (D % 64 == 0) -> (codes int8 [..., D], scales float16 [..., D/64])."""
    x = np.asarray(x, dtype=np.float32)
    g = x.reshape(*x.shape[:-1], x.shape[-1] // GROUP, GROUP)
    amax = np.abs(g).max(axis=-1)
    s16 = (amax / np.float32(127.0)).astype(np.float16)
    s16 = np.where((s16 == 0) & (amax > 0), np.float16(2.0**-24), s16)
    sf = s16.astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(sf > 0, np.float32(1.0) / sf, np.float32(0.0)).astype(np.float32)
    codes = np.clip(np.rint(g * inv[..., None]), -127, 127).astype(np.int8)
    return codes.reshape(x.shape), s16


def dequantize_kv_int8_g64(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Inverse of `quantize_kv_int8_g64` up to rounding: float32 [..., D]."""
    c = np.asarray(codes, dtype=np.float32)
    g = c.reshape(*c.shape[:-1], c.shape[-1] // GROUP, GROUP)
    return (g * np.asarray(scales, dtype=np.float32)[..., None]).reshape(c.shape)
