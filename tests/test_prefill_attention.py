"""The GEMM prefill's attention pieces on NumPy: cache gathering and blocked causal attention."""
import numpy as np

from engine.artifact import formats
from engine.models.qwen3_5_cuda_prefill import kv_rows, prefill_attention
from engine.ops import ref
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


def _case(t, start, hq, hkv, d):
    """q [t, hq, d], k and v [start + t, hkv, d], gate [t, hq * d]."""
    q = RNG.standard_normal((t, hq, d)).astype(np.float32)
    k = RNG.standard_normal((start + t, hkv, d)).astype(np.float32)
    v = RNG.standard_normal((start + t, hkv, d)).astype(np.float32)
    return q, k, v, RNG.standard_normal((t, hq * d)).astype(np.float32)


def test_prefill_attention_blocks_match_one_pass():
    t, start, hq, d = 37, 20, 6, 256
    q, k, v, gate = _case(t, start, hq, 2, d)
    want = ref.attention(q, k, v, 1 / np.sqrt(d), q_start=start).reshape(t, -1) * ref.sigmoid(gate)
    for score_bytes in (1 << 30, 4 * hq * (start + t) * 5, 1):  # one block, blocks of 5 rows, one row each
        got = prefill_attention(np, q, k, v, gate, start, score_bytes=score_bytes)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_prefill_attention_fp16_products_within_the_attention_tolerance():
    t, start, hq = 29, 35, 6
    q, k, v, gate = _case(t, start, hq, 2, 256)
    want = prefill_attention(np, q, k, v, gate, start)
    got = prefill_attention(np, q, k, v, gate, start, half=True, score_bytes=4 * hq * (start + t) * 8)
    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    assert err < 8e-3, err  # spec/testing.md attention_bf16 rel-L2

