"""The GEMM prefill's cache gathering on NumPy (its tensor-core attention is checked against
`ref.attention` on the GPU: tests/gpu/test_prefill.py)."""
import numpy as np

from engine.artifact import formats
from engine.gpu.prefill import kv_rows
from engine.ops.kvquant import dequantize_kv_int8_g64, quantize_kv_int8_g64

RNG = np.random.default_rng(7)
PAGE = 64


def _paged(rows, pages_total=6):
    """rows [L, H, D] laid into a paged pool in a shuffled page order; returns (pool, page list)."""
    n = -(-rows.shape[0] // PAGE)
    order = RNG.permutation(pages_total)[:n]
    pool = np.zeros((pages_total, PAGE) + rows.shape[1:], dtype=rows.dtype)
    for i, p in enumerate(order):
        chunk = rows[i * PAGE:(i + 1) * PAGE]
        pool[p, : len(chunk)] = chunk
    return pool, order


def test_kv_rows_bf16_and_int8():
    length, hkv, d = 150, 2, 256
    x = RNG.standard_normal((length, hkv, d)).astype(np.float32)
    bits = formats.f32_to_bf16_bits(x)
    pool, pages = _paged(bits)
    got = kv_rows(np, pool, None, pages, length)
    assert np.array_equal(got, formats.bf16_bits_to_f32(bits))
    codes, scales = quantize_kv_int8_g64(x)
    cpool, pages = _paged(codes)
    spool = np.zeros((6, PAGE) + scales.shape[1:], dtype=scales.dtype)
    for i, p in enumerate(pages):
        chunk = scales[i * PAGE:(i + 1) * PAGE]
        spool[p, : len(chunk)] = chunk
    got = kv_rows(np, cpool, spool, pages, length)
    np.testing.assert_allclose(got, dequantize_kv_int8_g64(codes, scales), rtol=1e-6, atol=1e-6)
