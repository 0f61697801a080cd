"""The prefill's flash attention (attn_prefill_fa, cuda/attn_prefill.cu) against the NumPy reference, and
the tensor-core prefill with it against the NumPy engine.

Kernel checks: bf16 and int8-g64 caches behind a permuted page table, GQA groups 6 (27B: 24/4) and 8
(35B: 16/2), T = 1, 63, 64, 65, 1000 queries at start 0 and at a start off a page boundary, 4 and 8
warps a block; the cache past the chunk holds NaN (the kernel must not let it reach the output), the
output is poisoned and has rows and columns the kernel must leave alone.
"""
import os

import numpy as np
import pytest

from engine.ops import ref

pytestmark = pytest.mark.gpu

from kernel_checks import check, poisoned  # noqa: E402  (tests/gpu is on sys.path under pytest)

D, PAGE = 256, 64
ATT_BF16 = dict(atol=2e-3, rtol=1.6e-2, tail_frac=2e-3, worst_ratio=5, rel=8e-3)  # attention_bf16
ATT_INT8 = dict(atol=4e-3, rtol=1.6e-2, tail_frac=2e-3, worst_ratio=5, rel=8e-3)  # attention_int8


def _paged_cache(cp, x, kv, perm, pages):
    """x [n, Hkv, D] fp32 into a paged cache (page perm[i] holds positions 64i..64i+63) whose other
    positions are NaN; returns (codes, scales or None, the fp32 values the cache represents)."""
    from engine.artifact import formats
    from engine.ops.kvquant import dequantize_kv_int8_g64, quantize_kv_int8_g64

    n, hkv, _ = x.shape
    full = np.full((pages * PAGE, hkv, D), np.nan, np.float32)
    full[:n] = x
    order = np.empty(pages, np.int64)
    order[perm] = np.arange(pages)  # cache page p holds logical page order[p]
    if kv == "bf16":
        bits = formats.f32_to_bf16_bits(full).reshape(pages, PAGE, hkv, D)
        stored = formats.bf16_bits_to_f32(formats.f32_to_bf16_bits(x))
        return cp.asarray(bits[order]), None, stored
    codes, scales = quantize_kv_int8_g64(np.nan_to_num(full))
    scales = scales.copy()
    scales[n:] = np.float16(np.nan)  # a NaN scale past the chunk: decoded values there are NaN
    codes = codes.reshape(pages, PAGE, hkv, D)[order]
    scales = scales.reshape(pages, PAGE, hkv, D // 64)[order]
    stored = dequantize_kv_int8_g64(*quantize_kv_int8_g64(x))
    return cp.asarray(codes), cp.asarray(scales), stored


@pytest.mark.parametrize("warps", [4, 8])
@pytest.mark.parametrize("kv", ["bf16", "int8"])
@pytest.mark.parametrize("hq,hkv", [(24, 4), (16, 2)], ids=["g6", "g8"])
@pytest.mark.parametrize("t", [1, 63, 64, 65, 1000])
@pytest.mark.parametrize("start", [0, 100])
def test_flash_attention_matches_reference(t, start, hq, hkv, kv, warps):
    import cupy as cp

    from engine.gpu.prefill_attention import flash_attention

    rng = np.random.default_rng(t * 7 + start)
    n = start + t
    pages = -(-n // PAGE) + 1  # one page more than needed: never-written positions (NaN)
    perm = rng.permutation(pages).astype(np.int32)
    q = rng.standard_normal((t, hq, D)).astype(np.float32)
    k = rng.standard_normal((n, hkv, D)).astype(np.float32) * 2
    v = rng.standard_normal((n, hkv, D)).astype(np.float32)
    kc, ks, k_st = _paged_cache(cp, k, kv, perm, pages)
    vc, vs, v_st = _paged_cache(cp, v, kv, perm, pages)
    ldg, ldo = hq * D + 96, hq * D + 64  # gate and output rows wider than the heads
    gate = rng.standard_normal((t, ldg)).astype(np.float32)
    out = poisoned(cp, (t + 2, ldo))  # two rows past the queries: left alone
    flash_attention(q=cp.asarray(q.reshape(t, hq * D)), ld_q=hq * D, k_cache=kc, v_cache=vc, k_scales=ks, v_scales=vs,
                    page_table=cp.asarray(perm[None]), q_heads=hq, kv_heads=hkv, start=start, tokens=t,
                    gate=cp.asarray(gate), ld_gate=ldg, out=out, ld_out=ldo, kv8=kv == "int8", warps=warps)()
    got = out.get()
    want = ref.attention(q, k_st, v_st, 1 / np.sqrt(D), q_start=start).reshape(t, -1) * ref.sigmoid(gate[:, : hq * D])
    check(f"flash attention {kv}", got[:t, : hq * D], want, **(ATT_INT8 if kv == "int8" else ATT_BF16))
    assert np.isnan(got[:t, hq * D:]).all() and np.isnan(got[t:]).all(), "wrote outside [nq, Hq*256]"


def test_flash_attention_matches_cublas_path():
    """The same chunk through attention_cublas (the path it replaces) on the gathered cache."""
    import cupy as cp

    from engine.gpu.prefill_attention import attention_cublas, flash_attention, kv_rows

    rng = np.random.default_rng(9)
    hq, hkv, t, start = 24, 4, 300, 200
    n = start + t
    pages = -(-n // PAGE)
    perm = rng.permutation(pages).astype(np.int32)
    kc, _, _ = _paged_cache(cp, rng.standard_normal((n, hkv, D)).astype(np.float32), "bf16", perm, pages)
    vc, _, _ = _paged_cache(cp, rng.standard_normal((n, hkv, D)).astype(np.float32), "bf16", perm, pages)
    q = cp.asarray(rng.standard_normal((t, hq * D)).astype(np.float32))
    gate = cp.asarray(rng.standard_normal((t, hq * D)).astype(np.float32))
    pt = cp.asarray(perm)
    k16 = kv_rows(cp, kc, None, pt, n).transpose(1, 0, 2).astype(cp.float16, order="C")
    v16 = kv_rows(cp, vc, None, pt, n).transpose(1, 0, 2).astype(cp.float16, order="C")
    want = attention_cublas(cp, q.reshape(t, hq, D), k16, v16, gate, start).get()
    out = poisoned(cp, (t, hq * D))
    flash_attention(q=q, ld_q=hq * D, k_cache=kc, v_cache=vc, k_scales=None, v_scales=None, page_table=pt[None],
                    q_heads=hq, kv_heads=hkv, start=start, tokens=t, gate=gate, ld_gate=hq * D, out=out, ld_out=hq * D,
                    kv8=False)()
    check("flash vs cublas", out.get(), want, **ATT_BF16)


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("kv", ["bf16", "int8"])
@pytest.mark.parametrize("t", [1, 63, 64, 65, 1000])
def test_flash_prefill_matches_numpy_engine(t, kv, monkeypatch):
    """test_prefill.py's check with the flash kernel: the tiny model (GQA 4/2) in GEMM chunks of
    64 against the NumPy engine and against an engine that took the prompt token by token, then decode
    steps against the latter."""
    from test_prefill import CFG, _engines

    ref_engine, dev, args, build_engine = _engines()
    gpu = build_engine(args, dev, CFG, max_context=1152, prefill_gemm=64, kv=kv)
    assert gpu.model.gemm is not None
    prompt = [int(x) for x in np.random.default_rng(t).integers(0, CFG["vocab_size"], t)]
    a, b = ref_engine.prefill(prompt), gpu.prefill(prompt)
    slow = build_engine(args, dev, CFG, max_context=1152, prefill_gemm=0, prefill_cols=1, kv=kv)
    c = slow.prefill(prompt)
    # (the NumPy engine keeps K/V in fp32: with int8 KV, test_gpu_engine's int8 bound against it, and the
    # bf16 bound against the GPU engine that took the prompt token by token through the same int8 cache)
    assert _rel(b, a) < (3e-2 if kv == "bf16" else 0.1), _rel(b, a)
    assert _rel(b, c) < 3e-2, _rel(b, c)
    for tok in (5, 77, 901):
        a, b = slow.decode_step(tok), gpu.decode_step(tok)
        assert _rel(b, a) < 2e-2, _rel(b, a)


@pytest.mark.parametrize("t,chunk", [(1000, 64), (300, 256)])
def test_flash_padded_prefill_matches_numpy_engine(t, chunk, monkeypatch):
    """With the flash kernel: the padded chunk's valid rows only."""
    from test_prefill import CFG, _engines

    from engine import gpu_engine

    ref_engine, dev, args, build_engine = _engines()
    fast = build_engine(args, dev, CFG, max_context=1152, prefill_gemm=chunk)
    prompt = [int(x) for x in np.random.default_rng(t).integers(0, CFG["vocab_size"], t)]
    a, b = ref_engine.prefill(prompt), fast.prefill(prompt)
    assert _rel(b, a) < 3e-2, _rel(b, a)
    assert fast.model.executor.position == t


@pytest.mark.skipif(os.environ.get("NINFER_FLASH_TIMING", "0") == "0", reason="timing only: NINFER_FLASH_TIMING=1")
def test_flash_attention_timing(capsys):
    """One 27B attention layer over an 8,192-token chunk at start 0: the flash kernel (4 and 8 warps, bf16
    and int8 caches) against gather + cuBLAS + softmax, in ms and TFLOP/s (4 T^2/2 D Hq flops)."""
    import cupy as cp

    from engine.gpu.prefill_attention import attention_cublas, flash_attention, kv_rows

    hq, hkv, t = 24, 4, 8192
    pages = t // PAGE
    rng = np.random.default_rng(0)
    kc = cp.asarray((rng.standard_normal((pages, PAGE, hkv, D)).astype(np.float32).view(np.uint32) >> 16)
                    .astype(np.uint16))
    vc = kc.copy()
    k8 = cp.asarray(rng.integers(-127, 128, (pages, PAGE, hkv, D)).astype(np.int8))
    s8 = cp.asarray(np.full((pages, PAGE, hkv, D // 64), 0.01, np.float16))
    q = cp.asarray(rng.standard_normal((t, hq * D)).astype(np.float32))
    gate = cp.asarray(rng.standard_normal((t, hq * D)).astype(np.float32))
    out = cp.empty_like(q)
    pt = cp.asarray(np.arange(pages, dtype=np.int32)[None])

    def ms(fn, n=5):
        fn()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        for _ in range(n):
            fn()
        e1.record()
        e1.synchronize()
        return cp.cuda.get_elapsed_time(e0, e1) / n

    flops = 2 * t * t * D * hq
    rows = []
    for warps in (4, 8):
        for kv8 in (False, True):
            caches = (k8, k8, s8, s8) if kv8 else (kc, vc, None, None)
            kc_, vc_, ks_, vs_ = caches
            launch = flash_attention(q=q, ld_q=hq * D, k_cache=kc_, v_cache=vc_, k_scales=ks_, v_scales=vs_,
                                     page_table=pt, q_heads=hq, kv_heads=hkv, start=0, tokens=t, gate=gate,
                                     ld_gate=hq * D, out=out, ld_out=hq * D, kv8=kv8, warps=warps)
            m = ms(launch)
            rows.append(f"flash warps={warps} {'int8' if kv8 else 'bf16'}: {m:.2f} ms, {flops / m / 1e9:.0f} TFLOP/s")

    def cublas():
        k16 = kv_rows(cp, kc, None, pt[0], t).transpose(1, 0, 2).astype(cp.float16, order="C")
        v16 = kv_rows(cp, vc, None, pt[0], t).transpose(1, 0, 2).astype(cp.float16, order="C")
        attention_cublas(cp, q.reshape(t, hq, D), k16, v16, gate, 0, out=out)
    rows.append(f"gather + cuBLAS + softmax (bf16): {ms(cublas, 3):.2f} ms")
    with capsys.disabled():
        print("\n" + "\n".join(rows))
