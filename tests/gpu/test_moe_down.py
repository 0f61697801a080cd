"""moe_down (cuda/moe.cu): the MoE decode's routed down-projections (grid.z = slot, the expert id read on the
device) and the shared expert's in one launch, each slot's weighted output in its own partial plane, against
the exact decode of the same codes in float64 (the LINEAR preset of spec/testing.md); fp32 products and int16
pairs with dp2a (a scale per chunk of x), rows 2-4 a half-warp, rows past N (200) in the last block. Also
norm_route (the MoE block's input norm, router and top-k in one launch) against the three kernels it replaces."""
import numpy as np
import pytest

from engine.artifact import formats

pytestmark = pytest.mark.gpu

from kernel_checks import LINEAR, QFMTS, RNG, check, poisoned  # noqa: E402  (tests/gpu is on sys.path)


@pytest.mark.parametrize("i16", [False, True])
@pytest.mark.parametrize("n,k,sk", [(2048, 512, 512), (200, 128, 256)])
@pytest.mark.parametrize("fr,fs,rows", [(f, "q8_g32_fp16", r) for f in QFMTS for r in (2, 4)]
                         + [("q5_g64_fp16", "q5_g64_fp16", 4), ("q5_g64_fp16", "q8_g32_fp16", 3)])
def test_moe_down(cp, fr, fs, n, k, sk, rows, i16):
    from engine.gpu_weights import upload_matrix
    from engine.ops import kernels as K

    experts, slots = 6, 3
    wr = (RNG.standard_normal((experts * n, k)) / np.sqrt(k)).astype(np.float32)
    ws = (RNG.standard_normal((n, sk)) / np.sqrt(sk)).astype(np.float32)
    dr, ds = upload_matrix(cp, fr, wr), upload_matrix(cp, fs, ws)
    qr = formats.decode(fr, "row_split_k128_v1", (experts * n, k), cp.asnumpy(dr.buf)).astype(np.float64)
    qs = formats.decode(fs, "row_split_k128_v1", (n, sk), cp.asnumpy(ds.buf)).astype(np.float64)
    eidx = np.array([[4, 0, 2]], dtype=np.int32)
    wts = RNG.uniform(0.1, 1.0, (1, slots + 1)).astype(np.float32)
    act_e = (RNG.standard_normal((slots, k)) * 3).astype(np.float32)
    ld = max(k, sk) + 8  # the shared expert's row is a prefix of a wider buffer, as in the executor
    act = (RNG.standard_normal((1, ld)) * 3).astype(np.float32)
    part = poisoned(cp, (slots + 2, 1, n))
    rpb = 2 * K.WARPS * rows
    name = f"moe_down<{K.FMT_IDS[fr]},{K.FMT_IDS[fs]},{rows},{str(i16).lower()}>"
    assert name in K.MOE_DOWN_NAMES
    K.prepared(name, (-(-n // rpb), 1, slots + 1),
               (np.uint64(dr.ptr(dr.base)), np.uint64(dr.ptr(dr.high)), np.uint64(dr.ptr(dr.scales)), dr.gpr,
                cp.asarray(eidx), cp.asarray(act_e), k, np.uint64(ds.ptr(ds.base)), np.uint64(ds.ptr(ds.high)),
                np.uint64(ds.ptr(ds.scales)), ds.gpr, cp.asarray(act), sk, n, k, part, n, cp.asarray(wts),
                slots))()
    got = part.get()
    for z in range(slots):
        e = int(eidx[0, z])
        want = wts[0, z] * (qr[e * n:(e + 1) * n] @ act_e[z].astype(np.float64))
        check(f"{fr} slot {z}", got[z, 0], want, **LINEAR)
    check(f"{fs} shared", got[slots, 0], wts[0, slots] * (qs @ act[0, :sk].astype(np.float64)), **LINEAR)
    assert np.isnan(got[slots + 1]).all()  # nothing past the shared plane


@pytest.mark.parametrize("h,e,k,s", [(2048, 256, 8, 1), (2048, 256, 8, 2), (512, 8, 2, 1)])
def test_norm_route(cp, h, e, k, s):
    """norm_route against residual_rmsnorm_mb2 -> gemv_bf16 -> moe_route: the residual, the normed row and its
    staged pairs bit-identical; the logits within fp32 rounding (another summation order); the same experts with
    the same weights; the ticket back at zero."""
    from engine.gpu_weights import upload_matrix
    from engine.ops import kernels as K

    nb, kpad = 16, -(-h // K.XPAD) * K.XPAD
    x = cp.asarray(RNG.standard_normal((1, h)).astype(np.float32))
    part = cp.asarray(RNG.standard_normal((s, 1, h)).astype(np.float32))
    w = cp.asarray(RNG.standard_normal(h).astype(np.float32) * 0.1)
    rw = upload_matrix(cp, "bf16", RNG.standard_normal((e + 1, h)).astype(np.float32) / np.sqrt(h))
    got = {}
    for fused in (False, True):
        xo, xn = poisoned(cp, (1, h)), poisoned(cp, (1, h))
        xh, xinv = cp.zeros((1, kpad // 2), dtype=cp.uint32), cp.zeros(1, dtype=cp.float32)
        logits, idx, wts = poisoned(cp, (1, e + 1)), cp.zeros((1, k), cp.int32), poisoned(cp, (1, k + 1))
        args = (x, xo, part, s, h, w, xn, h, 1e-6, 1, xh, xinv, kpad)
        if fused:
            ticket = cp.zeros(1, dtype=cp.uint32)
            K.prepared("norm_route", (nb, 1), args + (np.uint64(rw.ptr(rw.base)), e + 1, logits, e, k, idx, wts, ticket),
                       block=1024)()
            assert int(ticket.get()[0]) == 0
        else:
            K.prepared("residual_rmsnorm_mb2", (nb, 1), args, block=1024)()
            K.prepared("gemv_bf16<1>", (-(-(e + 1) * K.WARPS // K.WARPS),),
                       (np.uint64(rw.ptr(rw.base)), e + 1, h, xn, h, logits, e + 1, 0, K.WARPS))()
            K.prepared("moe_route", (1,), (logits, e + 1, e, k, idx, wts, k + 1))()
        got[fused] = [a.get() for a in (xo, xn, xh, xinv, logits, idx, wts)]
    a, b = got[False], got[True]
    assert all(np.array_equal(p, q) for p, q in zip(a[:4], b[:4]))  # residual, normed row, pairs, scale
    assert np.abs(a[4] - b[4]).max() <= 1e-5 * (1 + np.abs(a[4]).max())
    order_a, order_b = np.argsort(a[5][0]), np.argsort(b[5][0])
    assert np.array_equal(a[5][0][order_a], b[5][0][order_b])
    assert np.abs(a[6][0][:k][order_a] - b[6][0][:k][order_b]).max() < 1e-5
    assert abs(a[6][0][k] - b[6][0][k]) < 1e-6
