"""Every decode kernel against its reference (engine.ops.ref, engine.artifact.formats).

Tolerances are the named presets of spec/testing.md (engine/ops/tolerance.py); inputs are fresh
random data, outputs are poisoned before each run.
"""
import math

import numpy as np
import pytest

from engine.artifact import formats
from engine.ops import ref
from engine.ops.gemv_plan import GemvPlan

pytestmark = pytest.mark.gpu

RNG = np.random.default_rng(1234)
QFMTS = ["q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16"]


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def check(name, got, want, atol, rtol, tail_frac, worst_ratio, rel):
    """The composite pass rule of spec/testing.md §5.1."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.isfinite(got).all(), f"{name}: NaN/Inf"
    err = np.abs(got - want)
    lim = atol + rtol * np.abs(want)
    if (err <= lim).all():
        return
    frac = float((err > lim).mean())
    worst = float((err / lim).max())
    r = rel_l2(got, want)
    assert frac <= tail_frac and worst <= worst_ratio and r <= rel, \
        f"{name}: violating {frac:.2e}, worst ratio {worst:.2f}, rel-L2 {r:.2e}"


def poisoned(cp, shape, dtype=np.float32):
    """An output array full of NaN, copied from the host (no CuPy kernel: on a fresh device machine CuPy's
    own kernels have failed to compile for a while, bench/NOTES-decode.md)."""
    return cp.asarray(np.full(shape, np.nan, dtype))


def staged_case(cp, fmt, n, k, m, xscale=3.0):
    """A random [n, k] matrix uploaded in `fmt` (unit-scale outputs), its exact decode, m rows of x, and x staged
    by stage_x_mb as the producer kernels stage it: (dm, wq, x, x on the device, pairs, inverse scales)."""
    from engine.gpu_weights import upload_matrix
    from engine.ops import kernels as K

    w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    dm = upload_matrix(cp, fmt, w)
    wq = formats.decode(fmt, "row_split_k128_v1", (n, k), cp.asnumpy(dm.buf))
    x = (RNG.standard_normal((m, k)) * xscale).astype(np.float32)
    xd = cp.asarray(x)
    kpad = -(-k // K.XPAD) * K.XPAD
    xh, xinv = cp.zeros((m, kpad // 2), dtype=cp.uint32), cp.zeros(m, dtype=cp.float32)
    K.prepared("stage_x_mb", (3, m), (xd, k, k, kpad, xh, kpad // 2, xinv))()
    return dm, wq, x, xd, xh, xinv


LINEAR = dict(atol=2e-3, rtol=1.6e-2, tail_frac=2e-3, worst_ratio=5, rel=8e-3)
ELEM = dict(atol=1e-3, rtol=8e-3, tail_frac=1e-3, worst_ratio=4, rel=4e-3)
GDN_STATE = dict(atol=5e-4, rtol=5e-3, tail_frac=2e-2, worst_ratio=5, rel=5e-3)


@pytest.fixture(scope="module")
def cp():
    import cupy

    return cupy


@pytest.mark.parametrize("fmt", QFMTS)
@pytest.mark.parametrize("n,k", [(512, 5120), (37, 1000), (300, 130)], ids=["512x5120", "37x1000", "300x130"])
@pytest.mark.parametrize("m", [1, 2, 8])
@pytest.mark.parametrize("rows", [1, 2, 4])
@pytest.mark.parametrize("unroll,pf", [(2, 0), (4, 0), (2, 2)])
def test_gemv_store(cp, fmt, n, k, m, rows, unroll, pf):
    from engine.gpu_weights import upload_matrix

    w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)  # unit-scale outputs, as in a model
    dm = upload_matrix(cp, fmt, w)
    wq = formats.decode(fmt, "row_split_k128_v1", (n, k), cp.asnumpy(dm.buf))
    x = RNG.standard_normal((m, k)).astype(np.float32)
    y = poisoned(cp, (m, n))
    GemvPlan(dm, cp.asarray(x), k, y, n, m=m, rows=rows, unroll=unroll, pf=pf).launch()
    check(f"gemv {fmt}", y.get(), ref.linear(x, wq), **LINEAR)


@pytest.mark.parametrize("fmt", QFMTS[:3])
@pytest.mark.parametrize("n,k", [(512, 5120), (37, 1000), (300, 130)], ids=["512x5120", "37x1000", "300x130"])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("pf,pre2", [(0, False), (1, False), (3, False), (0, True)])
@pytest.mark.parametrize("rows,unroll", [(2, 4), (1, 2), (4, 2)])
def test_gemv_prestaged(cp, fmt, n, k, splits, pf, pre2, rows, unroll):
    """x staged once by stage_x (as the producer kernels do), read by the GEMV from global memory
    (gemv_rs, and gemv_rs_pre with pre2)."""
    from engine.gpu_weights import upload_matrix
    from engine.ops import kernels as K

    m = 2
    w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    dm = upload_matrix(cp, fmt, w)
    wq = formats.decode(fmt, "row_split_k128_v1", (n, k), cp.asnumpy(dm.buf))
    x = RNG.standard_normal((m, k)).astype(np.float32)
    kpad = -(-k // K.XPAD) * K.XPAD
    xh, xinv = cp.zeros((m, kpad // 2), dtype=cp.uint32), cp.zeros(m, dtype=cp.float32)
    K.prepared("stage_x_mb", (3, m), (cp.asarray(x), k, k, kpad, xh, kpad // 2, xinv))()
    part = poisoned(cp, (splits, m, n))
    plan = GemvPlan(dm, None, k, part, n, m=m, epi="partial", splits=splits, xpre=(xh, xinv), pf=pf,
                      rows=rows, unroll=unroll, pre2=pre2)
    assert plan.pre2 == pre2
    part = part[: plan.splits]
    plan.launch()
    check(f"gemv prestaged {fmt}", part.get().sum(axis=0), ref.linear(x, wq), **LINEAR)
    if pre2 and splits == 1 and n % 2 == 0:
        y = poisoned(cp, (m, n // 2))
        GemvPlan(dm, None, k, y, n // 2, m=m, epi="swiglu", xpre=(xh, xinv), pre2=True).launch()
        h = ref.linear(x, wq)
        check(f"gemv prestaged swiglu {fmt}", y.get(), ref.swiglu(h[:, : n // 2], h[:, n // 2:]), **LINEAR)
        # one token: the SwiGLU output also staged by the last block, as stage_x_mb stages it
        k2 = n // 2
        kp2 = -(-k2 // K.XPAD) * K.XPAD
        y1 = poisoned(cp, (1, k2))
        sh, sinv, slot = cp.zeros((1, kp2 // 2), cp.uint32), cp.zeros(1, cp.float32), cp.zeros(2, cp.uint32)
        plan = GemvPlan(dm, None, k, y1, k2, m=1, epi="swiglu", xpre=(xh, xinv), pre2=True,
                          stage_out=(sh, sinv, kp2, slot), rows=rows, unroll=unroll)
        assert plan.stages_out
        for _ in range(2):  # the second launch finds the slot reset by the first
            sh.fill(0)
            plan.launch()
            rh, rinv = cp.zeros_like(sh), cp.zeros_like(sinv)
            K.prepared("stage_x_mb", (3, 1), (y1, k2, k2, kp2, rh, kp2 // 2, rinv), block=1024)()
            assert np.array_equal(sh.get(), rh.get()) and np.array_equal(sinv.get(), rinv.get())
            assert not slot.get().any()


@pytest.mark.parametrize("n,k", [(512, 5120), (37, 1000), (300, 130), (96, 2048)],
                         ids=["512x5120", "37x1000", "300x130", "96x2048"])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("rows", [1, 2, 4])
def test_gemv_w8_prestaged(cp, n, k, splits, m, rows):
    """w8 on the pre-staged int16 pairs (kernels.W8_PRE: gemv_rs_pre<3, ...>, a chunk half a staged block;
    split-K slices of 64 chunks), partial planes and SwiGLU; else the w8 GEMV stages x itself as before."""
    from engine.ops import kernels as K

    dm, wq, x, xd, xh, xinv = staged_case(cp, "q8_g32_fp16", n, k, m)  # (xd: read when the GEMV stages x itself)
    part = poisoned(cp, (splits, m, n))
    plan = GemvPlan(dm, xd, k, part, n, m=m, epi="partial", splits=splits, xpre=(xh, xinv), rows=rows)
    assert plan.pre2 == K.W8_PRE
    plan.launch()
    check(f"gemv w8 prestaged {n}x{k}", part[: plan.splits].get().sum(axis=0), ref.linear(x, wq), **LINEAR)
    if n % 2 == 0:
        y = poisoned(cp, (m, n // 2))
        GemvPlan(dm, xd, k, y, n // 2, m=m, epi="swiglu", xpre=(xh, xinv)).launch()
        h = ref.linear(x, wq)
        check(f"gemv w8 prestaged swiglu {n}x{k}", y.get(), ref.swiglu(h[:, : n // 2], h[:, n // 2:]), **LINEAR)


@pytest.mark.parametrize("fmt", QFMTS[:3])
@pytest.mark.parametrize("n,k", [(512, 5120), (37, 1000), (300, 130)], ids=["512x5120", "37x1000", "300x130"])
@pytest.mark.parametrize("rows", [1, 2, 4])
@pytest.mark.parametrize("stages", [3, 4])
@pytest.mark.parametrize("splits", [1, 3])
def test_gemv_async(cp, fmt, n, k, rows, stages, splits):
    """gemv_rs_async (weights through a shared-memory ring) on pre-staged x, partial and swiglu."""
    from engine.gpu_weights import upload_matrix
    from engine.ops import kernels as K

    w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    dm = upload_matrix(cp, fmt, w)
    wq = formats.decode(fmt, "row_split_k128_v1", (n, k), cp.asnumpy(dm.buf))
    x = RNG.standard_normal((1, k)).astype(np.float32)
    kpad = -(-k // K.XPAD) * K.XPAD
    xh, xinv = cp.zeros((1, kpad // 2), dtype=cp.uint32), cp.zeros(1, dtype=cp.float32)
    K.prepared("stage_x_mb", (3, 1), (cp.asarray(x), k, k, kpad, xh, kpad // 2, xinv))()
    part = poisoned(cp, (splits, 1, n))
    plan = GemvPlan(dm, None, k, part, n, m=1, epi="partial", splits=splits, rows=rows, xpre=(xh, xinv),
                      stages=stages)
    assert plan.stages == stages
    part = part[: plan.splits]
    plan.launch()
    h = ref.linear(x, wq)
    check(f"gemv async {fmt}", part.get().sum(axis=0), h, **LINEAR)
    if n % 2 == 0 and splits == 1:
        y = poisoned(cp, (1, n // 2))
        GemvPlan(dm, None, k, y, n // 2, m=1, epi="swiglu", xpre=(xh, xinv), stages=stages).launch()
        check(f"gemv async swiglu {fmt}", y.get(), ref.swiglu(h[:, : n // 2], h[:, n // 2:]), **LINEAR)


@pytest.mark.parametrize("fmt", QFMTS[:2])
@pytest.mark.parametrize("n,k", [(512, 5120), (37, 1000), (300, 130), (48, 17408)],
                         ids=["512x5120", "37x1000", "300x130", "48x17408"])
@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("splits", [1, 3])
def test_gemv_mma(cp, fmt, n, k, m, splits):
    """gemv_mma (tensor-core MMA on subnormal-coded weights) on pre-staged x: every compiled variant,
    partial (split-K), store, add and SwiGLU epilogues, 1-8 token columns."""
    from engine.ops import kernels as K

    if K.XI16:
        pytest.skip("gemv_mma reads fp16 x pairs (NINFER_XI16=1 stages int16 ones)")

    dm, wq, x, _, xh, xinv = staged_case(cp, fmt, n, k, m)
    h = ref.linear(x, wq)
    for mma in K.GEMV_MMA:
        part = poisoned(cp, (splits, m, n))
        plan = GemvPlan(dm, None, k, part, n, m=m, epi="partial", splits=splits, xpre=(xh, xinv), mma=mma)
        assert plan.fn is K.kernel(f"gemv_mma<{K.FMT_IDS[fmt]},{mma[0]},{mma[1]},{mma[2]}>")
        part = part[: plan.splits]
        plan.launch()
        check(f"gemv mma {fmt} {mma}", part.get().sum(axis=0), h, **LINEAR)
    if splits == 1:
        y = cp.asarray(np.ones((m, n), np.float32))
        GemvPlan(dm, None, k, y, n, m=m, epi="add", xpre=(xh, xinv), mma=(1, 4, 2)).launch()
        check(f"gemv mma add {fmt}", y.get(), h + 1, **LINEAR)
    if n % 32 == 0 and splits == 1:
        y = poisoned(cp, (m, n // 2))
        for mma in ((2, 4, 2),):
            y.fill(np.nan)
            GemvPlan(dm, None, k, y, n // 2, m=m, epi="swiglu", xpre=(xh, xinv), mma=mma).launch()
            check(f"gemv mma swiglu {fmt} {mma}", y.get(), ref.swiglu(h[:, : n // 2], h[:, n // 2:]), **LINEAR)


@pytest.mark.parametrize("fmt", QFMTS)
@pytest.mark.parametrize("splits", [1, 3])
def test_gemv_partial_splits(cp, fmt, splits):
    from engine.gpu_weights import upload_matrix

    n, k = 256, 4160
    w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    dm = upload_matrix(cp, fmt, w)
    wq = formats.decode(fmt, "row_split_k128_v1", (n, k), cp.asnumpy(dm.buf))
    x = RNG.standard_normal((1, k)).astype(np.float32)
    part = poisoned(cp, (splits, 1, n))
    GemvPlan(dm, cp.asarray(x), k, part, n, m=1, epi="partial", splits=splits).launch()
    check(f"gemv split {fmt}", part.get().sum(axis=0), ref.linear(x, wq), **LINEAR)


def test_gemv_swiglu_and_bf16(cp):
    from engine.gpu_weights import upload_matrix

    n2, k = 2 * 300, 512
    w = (RNG.standard_normal((n2, k)) / np.sqrt(k)).astype(np.float32)
    dm = upload_matrix(cp, "q4_g64_fp16", w)
    wq = formats.decode("q4_g64_fp16", "row_split_k128_v1", (n2, k), cp.asnumpy(dm.buf))
    x = RNG.standard_normal((1, k)).astype(np.float32)
    y = poisoned(cp, (1, n2 // 2))
    GemvPlan(dm, cp.asarray(x), k, y, n2 // 2, epi="swiglu").launch()
    h = ref.linear(x, wq)
    check("swiglu", y.get(), ref.swiglu(h[:, : n2 // 2], h[:, n2 // 2:]), **LINEAR)

    for nb in (96, 5000):  # few rows: 8 warps split each row's K; many rows: a warp per row
        wb = (RNG.standard_normal((nb, k)) / np.sqrt(k)).astype(np.float32)
        db = upload_matrix(cp, "bf16", wb)
        wbq = formats.bf16_bits_to_f32(formats.f32_to_bf16_bits(wb))
        for mb in (1, 2):
            xb = RNG.standard_normal((mb, k)).astype(np.float32)
            yb = poisoned(cp, (mb, nb))
            GemvPlan(db, cp.asarray(xb), k, yb, nb, m=mb).launch()
            check(f"gemv bf16 {nb}x{k} m={mb}", yb.get(), ref.linear(xb, wbq), **LINEAR)


@pytest.mark.parametrize("fmt", QFMTS)
def test_embed(cp, fmt):
    from engine.gpu_weights import upload_matrix
    from engine.ops import kernels as K

    r, k = 50, 320
    w = RNG.standard_normal((r, k)).astype(np.float32)
    dm = upload_matrix(cp, fmt, w)
    wq = formats.decode(fmt, "row_split_k128_v1", (r, k), cp.asnumpy(dm.buf))
    toks = cp.asarray(np.array([7, 49], dtype=np.int32))
    out = poisoned(cp, (2, k))
    K.prepared(f"embed_rs<{K.FMT_IDS[fmt]}>", (2,), (np.uint64(dm.ptr(dm.base)), np.uint64(dm.ptr(dm.high)),
                                                   np.uint64(dm.ptr(dm.scales)), dm.gpr, k, toks, out, k))()
    assert np.array_equal(out.get(), wq[[7, 49]])


def test_residual_rmsnorm_and_gated(cp):
    from engine.ops import kernels as K

    m, h, s = 2, 1000, 3
    x = RNG.standard_normal((m, h)).astype(np.float32)
    part = RNG.standard_normal((s, m, h)).astype(np.float32)
    w = RNG.standard_normal(h).astype(np.float32) * 0.1
    xd, out = cp.asarray(x), poisoned(cp, (m, h))
    kpad = -(-h // K.XPAD) * K.XPAD
    xh, xinv = cp.zeros((m, kpad // 2), dtype=cp.uint32), cp.zeros(m, dtype=cp.float32)
    K.prepared("residual_rmsnorm", (m,), (xd, cp.asarray(part), s, m * h, cp.asarray(w), out, h, 1e-6, 1,
                                          xh, xinv, kpad), block=1024)()
    xs = x + part.sum(0)
    check("residual", xd.get(), xs, **ELEM)
    check("rmsnorm", out.get(), ref.rmsnorm(xs, w, 1e-6, offset=True), **ELEM)
    # multi-block form: same numbers, and the same staged pairs
    x_out, out2 = cp.zeros((m, h), cp.float32), poisoned(cp, (m, h))
    xh2, xinv2 = cp.zeros_like(xh), cp.zeros_like(xinv)
    K.prepared("residual_rmsnorm_mb", (5, m), (cp.asarray(x), x_out, cp.asarray(part), s, m * h, cp.asarray(w),
                                               out2, h, 1e-6, 1, xh2, xinv2, kpad))()
    check("residual mb", x_out.get(), xs, **ELEM)
    check("rmsnorm mb", out2.get(), out.get(), **ELEM)
    assert np.array_equal(xh2.get(), xh.get())
    assert np.array_equal(xinv2.get(), xinv.get())
    # residual_rmsnorm_mb2 (2 values a thread, 8 planes a round): the same bits as residual_rmsnorm_mb, for rows
    # of up to 2,048 values and 1 to 9 planes (the MoE norm's k + 1)
    for h2, s2 in ((1000, 3), (2048, 9), (2048, 1), (1536, 2)):
        kp2 = -(-h2 // K.XPAD) * K.XPAD
        x2 = RNG.standard_normal((m, h2)).astype(np.float32)
        p2 = cp.asarray(RNG.standard_normal((s2, m, h2)).astype(np.float32))
        w2 = cp.asarray(RNG.standard_normal(h2).astype(np.float32) * 0.1)
        got = {}
        for name in ("residual_rmsnorm_mb", "residual_rmsnorm_mb2"):
            xo, o2 = poisoned(cp, (m, h2)), poisoned(cp, (m, h2))
            xh3, xinv3 = cp.zeros((m, kp2 // 2), dtype=cp.uint32), cp.zeros(m, dtype=cp.float32)
            K.prepared(name, (16, m), (cp.asarray(x2), xo, p2, s2, m * h2, w2, o2, h2, 1e-6, 1, xh3, xinv3, kp2),
                       block=1024)()
            got[name] = [a.get() for a in (xo, o2, xh3, xinv3)]
        check(f"residual mb {h2}", got["residual_rmsnorm_mb"][0], x2 + p2.get().sum(0), **ELEM)
        assert all(np.array_equal(a, b) for a, b in zip(got["residual_rmsnorm_mb"], got["residual_rmsnorm_mb2"]))

    hv = 5
    o = RNG.standard_normal((m, hv, 128)).astype(np.float32)
    z = RNG.standard_normal((m, hv * 128)).astype(np.float32)
    gw = RNG.standard_normal(128).astype(np.float32)
    ldo = hv * 128 + 256  # the output rows are as wide as the attention output (wider than Hv * 128)
    go = poisoned(cp, (m, ldo))
    K.prepared("gated_rmsnorm", (1, m), (cp.asarray(o), cp.asarray(z), hv * 128, cp.asarray(gw), go, ldo, hv,
                                         1e-6))()
    check("gated_rmsnorm", go.get()[:, : hv * 128],
          ref.gated_rmsnorm(o, z.reshape(m, hv, 128), gw, 1e-6).reshape(m, -1), **ELEM)
    # fused with the staging: the same rows, and the pairs stage_x_mb writes from them
    for hv2 in (5, 48):  # 48 heads: more than the 32 warps of the block
        o2 = RNG.standard_normal((m, hv2, 128)).astype(np.float32)
        z2 = RNG.standard_normal((m, hv2 * 128)).astype(np.float32)
        k2 = hv2 * 128
        kp2 = -(-k2 // K.XPAD) * K.XPAD
        ld2 = k2 + 256
        g2 = poisoned(cp, (m, ld2))
        xh3, xinv3 = cp.zeros((m, kp2 // 2), dtype=cp.uint32), cp.zeros(m, dtype=cp.float32)
        K.prepared("gated_rmsnorm_stage", (m,), (cp.asarray(o2), cp.asarray(z2), k2, cp.asarray(gw), g2, ld2, hv2,
                                                 1e-6, k2, kp2, xh3, xinv3), block=1024)()
        check(f"gated_rmsnorm_stage {hv2}", g2.get()[:, :k2],
              ref.gated_rmsnorm(o2, z2.reshape(m, hv2, 128), gw, 1e-6).reshape(m, -1), **ELEM)
        xh4, xinv4 = cp.zeros_like(xh3), cp.zeros_like(xinv3)
        K.prepared("stage_x_mb", (3, m), (g2, ld2, k2, kp2, xh4, kp2 // 2, xinv4), block=1024)()
        assert np.array_equal(xh3.get(), xh4.get()) and np.array_equal(xinv3.get(), xinv4.get())


def test_gdn_step(cp):
    from engine.ops import kernels as K

    hk, hv = 2, 6
    c = (2 * hk + hv) * 128
    qk = RNG.standard_normal((1, 2 * hk * 128)).astype(np.float32)
    vz = RNG.standard_normal((1, hv * 128)).astype(np.float32)
    ab = RNG.standard_normal((1, 2 * hv)).astype(np.float32)
    conv_state = RNG.standard_normal((1, 3, c)).astype(np.float32)
    conv_w = RNG.standard_normal((4, c)).astype(np.float32) * 0.5
    a_log = np.log(RNG.uniform(1, 16, hv)).astype(np.float32)
    dt_bias = RNG.standard_normal(hv).astype(np.float32)
    state = RNG.standard_normal((1, hv, 128, 128)).astype(np.float32) * 0.1
    bufs = {n: cp.zeros(s, dtype=cp.float32) for n, s in
            {"q": (1, hk, 128), "k": (1, hk, 128), "v": (1, hv, 128), "g": (1, hv), "b": (1, hv), "o": (1, hv, 128)}.items()}
    cs, st = cp.asarray(conv_state), cp.asarray(state)
    K.prepared("gdn_prep", (2, 1), (cp.asarray(qk), qk.shape[1], cp.asarray(vz), vz.shape[1], cp.asarray(ab), 2 * hv,
                                    cs, cp.asarray(conv_w), cp.asarray(a_log), cp.asarray(dt_bias), bufs["q"],
                                    bufs["k"], bufs["v"], bufs["g"], bufs["b"], hk, hv, 1.0 / math.sqrt(128)))()
    K.prepared("gdn_delta", (hv * 128 // 8, 1), (bufs["q"], bufs["k"], bufs["v"], bufs["g"], bufs["b"], st,
                                                 bufs["o"], hk, hv, 0))()
    # reference
    xin = np.concatenate([qk[0], vz[0]])
    y, new_cs = ref.causal_conv1d_step(xin, conv_state[0].T, conv_w)
    q = ref.l2norm(y[: hk * 128].reshape(hk, 128))
    k = ref.l2norm(y[hk * 128: 2 * hk * 128].reshape(hk, 128))
    v = y[2 * hk * 128:].reshape(hv, 128)
    g, beta = ref.gdn_gates(ab[0, :hv], ab[0, hv:], a_log, dt_bias)
    o, s_new = ref.gdn_recurrent(q[None], k[None], v[None], g[None], beta[None], state[0])
    check("conv state", cs.get()[0], new_cs.T, **ELEM)
    check("gdn g", bufs["g"].get()[0], g, atol=1e-6, rtol=1e-5, tail_frac=1e-4, worst_ratio=2, rel=1e-5)
    check("gdn state", st.get()[0], s_new, **GDN_STATE)
    check("gdn out", bufs["o"].get()[0], o[0], atol=1e-3, rtol=1e-2, tail_frac=2e-3, worst_ratio=5, rel=8e-3)


# tt: tokens a warp a round (their K/V loads in flight together); gs: blocks a KV head's query group is cut
# into (attn_decode_split<g / gs, kv8, gs>); tt = 0: attn_decode_mma<g, kv8, W, NS> (tensor cores), gs its
# form's index in kernels.ATTN_MMA_FORMS (W warps, NS stages: each runs on an H200)
@pytest.mark.parametrize("tt,gs", [(1, 1), (4, 1), (1, 2), (1, 4), (0, 0), (0, 1), (0, 2)])
@pytest.mark.parametrize("kv", ["bf16", "int8"])
@pytest.mark.parametrize("g", [6, 8])
@pytest.mark.parametrize("length", [1, 63, 200, 1500])
def test_attention_decode(cp, g, length, kv, tt, gs):
    from engine.ops import kernels as K

    if tt and gs > 1 and (g // gs, gs) not in K.ATTN_GSPLIT:
        pytest.skip(f"no attn_decode_split<{g // gs},*,{gs}> compiled")
    from engine.ops import kernels as K
    from engine.ops.kvquant import dequantize_kv_int8_g64, quantize_kv_int8_g64

    hkv, d, page = 2, 256, 64
    hq = hkv * g
    max_ctx = 256 if length <= 256 else 2048  # 1500: many rounds a warp (attn_decode_mma's ring of stages)
    pages = max_ctx // page
    nsplit = 3
    chunk = -(-max_ctx // nsplit)
    int8 = kv == "int8"
    kc = cp.zeros((pages, page, hkv, d), dtype=cp.int8 if int8 else cp.uint16)
    vc = cp.zeros_like(kc)
    ksc = cp.zeros((pages, page, hkv, d // 64), dtype=cp.float16) if int8 else None
    vsc = cp.zeros_like(ksc) if int8 else None
    ptr = lambda a: np.uint64(0 if a is None else a.data.ptr)  # noqa: E731
    perm = np.array([2, 0, 3, 1], dtype=np.int32) if pages == 4 else RNG.permutation(pages).astype(np.int32)
    pt = cp.asarray(perm[None])
    qn_w = RNG.standard_normal(d).astype(np.float32) * 0.1
    kn_w = RNG.standard_normal(d).astype(np.float32) * 0.1
    ks, vs = [], []
    qbuf = cp.zeros((1, hq * d), dtype=cp.float32)
    for t in range(length):
        q = RNG.standard_normal((1, hq * d)).astype(np.float32)
        k = RNG.standard_normal((1, hkv * d)).astype(np.float32)
        v = RNG.standard_normal((1, hkv * d)).astype(np.float32)
        pos = cp.asarray(np.array([t], dtype=np.int32))
        K.prepared("qk_norm_rope_kv", (-(-(hq + hkv) // 8), 1),
                   (cp.asarray(q), hq * d, cp.asarray(k), hkv * d, cp.asarray(v), hkv * d, cp.asarray(qn_w),
                    cp.asarray(kn_w), pos, pt, pages, kc, vc, qbuf, hq, hkv, 64, math.log2(1e7), 1e-6,
                    ptr(ksc), ptr(vsc)))()
        kr = ref.rope(ref.rmsnorm(k.reshape(1, hkv, d), kn_w, 1e-6), np.array([t]), 64, 1e7)
        ks.append(kr[0])
        vs.append(v.reshape(hkv, d))
    qr = ref.rope(ref.rmsnorm(q.reshape(1, hq, d), qn_w, 1e-6), np.array([length - 1]), 64, 1e7)
    check("q norm+rope", qbuf.get().reshape(1, hq, d), qr, **ELEM)
    gate = RNG.standard_normal((1, hq * d)).astype(np.float32)
    ml = cp.zeros((1, hq, nsplit, 2), dtype=cp.float32)
    acc = cp.zeros((1, hq, nsplit, d), dtype=cp.float32)
    out = poisoned(cp, (1, hq * d))
    kv8 = "true" if int8 else "false"
    name = f"attn_decode_split<{g},{kv8}>" if tt == 1 else f"attn_decode_tt<{g},{kv8},{tt}>"
    if tt and gs > 1:
        name = f"attn_decode_split<{g // gs},{kv8},{gs}>"
    launch = dict(grid=(hkv * gs, nsplit, 1))
    if tt == 0:
        w, ns = K.ATTN_MMA_FORMS[int8][gs]
        name = f"attn_decode_mma<{g},{kv8},{w},{ns}>"
        launch = dict(grid=(hkv, nsplit, 1), block=32 * w, smem=K.attn_mma_smem(int8, w, ns))
    K.prepared(name, args=(qbuf, kc, vc, pos, pt, pages, hkv, chunk, 1 / 16, ml, acc, nsplit, ptr(ksc), ptr(vsc)),
               **launch)()
    K.prepared("attn_combine", (hq, 1), (ml, acc, nsplit, cp.asarray(gate), hq * d, out, hq * d, hq))()
    if int8:
        store = lambda a: dequantize_kv_int8_g64(*quantize_kv_int8_g64(np.asarray(a, np.float32)))  # noqa: E731
        # the cache holds what the reference quantizer makes of the same rows (page-table order undone)
        slot = [(perm[t // page], t % page) for t in range(length)]
        got_k = np.stack([dequantize_kv_int8_g64(kc.get()[p_, s_], ksc.get()[p_, s_]) for p_, s_ in slot])
        # (a code may differ by one where the device's K sits on a rounding boundary: judge by rel-L2)
        assert rel_l2(got_k, store(np.stack(ks))) < 8e-3
        tol = dict(atol=4e-3, rtol=1.6e-2, tail_frac=2e-3, worst_ratio=5, rel=8e-3)  # attention_int8
    else:
        store = lambda a: formats.bf16_bits_to_f32(formats.f32_to_bf16_bits(np.asarray(a, np.float32)))  # noqa: E731
        tol = dict(atol=2e-3, rtol=1.6e-2, tail_frac=2e-3, worst_ratio=5, rel=8e-3)  # attention_bf16
    want = ref.attention(qr, store(np.stack(ks)), store(np.stack(vs)), 1 / 16, q_start=length - 1)
    want = want.reshape(1, -1) * ref.sigmoid(gate)
    check(f"attention {kv}", out.get(), want, **tol)


def test_argmax_step(cp):
    from engine.ops import kernels as K

    v = 248320
    logits = RNG.standard_normal((2, v)).astype(np.float32)
    logits[1, 1000] = logits[1, 5] = 50.0  # tie: lowest id wins
    toks, pos, step = cp.zeros(2, cp.int32), cp.asarray(np.array([3, 9], np.int32)), cp.zeros(2, cp.int32)
    hist = cp.zeros((2, 8), cp.int32)
    K.prepared("argmax_step", (2,), (cp.asarray(logits), v, v, toks, pos, hist, step, 8), block=1024)()
    assert toks.get().tolist() == [int(np.argmax(logits[0])), 5]
    assert pos.get().tolist() == [4, 10] and hist.get()[:, 0].tolist() == toks.get().tolist()
    # the multi-block form: same tokens, its tickets back at zero, so a second launch works alike
    nb = 64
    pv, pi, ticket = cp.zeros((2, nb), cp.float32), cp.zeros((2, nb), cp.int32), cp.zeros(2, cp.uint32)
    toks2, pos2, step2, hist2 = cp.zeros(2, cp.int32), cp.zeros(2, cp.int32), cp.zeros(2, cp.int32), cp.zeros((2, 8), cp.int32)
    for n in (1, 2):
        K.prepared("argmax_step_mb", (nb, 2), (cp.asarray(logits), v, v, pv, pi, ticket, toks2, pos2, hist2, step2, 8),
                   block=256)()
        assert toks2.get().tolist() == toks.get().tolist() and pos2.get().tolist() == [n, n]
        assert not ticket.get().any() and hist2.get()[:, n - 1].tolist() == toks.get().tolist()


def _gdn_inputs(t, hk, hv):
    """Delta-rule inputs of T tokens: q (pre-scaled), k, v, log decay g, beta, and a start state."""
    q = RNG.standard_normal((t, hk, 128)).astype(np.float32) / 11
    k = RNG.standard_normal((t, hk, 128)).astype(np.float32) / 11
    v = RNG.standard_normal((t, hv, 128)).astype(np.float32)
    g = -np.abs(RNG.standard_normal((t, hv))).astype(np.float32) * 0.1
    beta = (1 / (1 + np.exp(-RNG.standard_normal((t, hv))))).astype(np.float32)
    s0 = RNG.standard_normal((hv, 128, 128)).astype(np.float32) * 0.1
    return q, k, v, g, beta, s0


@pytest.mark.parametrize("rows", [2, 4])
def test_gdn_delta_rows_matches_delta_cols(cp, rows):
    """The prefill's recurrence with several state rows a warp against the row-a-warp kernel."""
    from engine.ops import kernels as K

    hk, hv, t = 2, 6, 37
    q, k, v, g, beta, s0 = _gdn_inputs(t, hk, hv)
    outs = []
    for name, per in (("gdn_delta_cols", 1), (f"gdn_delta_rows<{rows}>", rows)):
        st = cp.asarray(s0)
        o = poisoned(cp, (t, hv, 128))
        K.prepared(name, (-(-hv * 128 // (8 * per)),), (cp.asarray(q), cp.asarray(k), cp.asarray(v), cp.asarray(g),
                                                       cp.asarray(beta), st, o, hk, hv, 0, t))()
        outs.append((st.get(), o.get()))
    check("gdn_delta_rows state", outs[1][0], outs[0][0], **GDN_STATE)
    check("gdn_delta_rows out", outs[1][1], outs[0][1], **ELEM)


@pytest.mark.parametrize("t", [37, 64, 150])
@pytest.mark.parametrize("rb,tc", [(16, False), (32, False), (64, False), (32, True), (64, True), (32, "q1"), (64, "q1")])
def test_gdn_chunked_matches_delta_cols(cp, t, rb, tc):
    """The chunked delta rule (gdn_chunk_prep over the 64-token pieces on tensor cores, gdn_chunk_scan<RB>
    in order on CUDA cores or gdn_chunk_scan_tc<RB> on tensor cores; "q1": gdn_chunk_scan_tc<RB, 1>, the
    output's products in 1xTF32) against the token-by-token kernel: outputs and final state, pieces whole
    and partial."""
    from engine.ops import kernels as K

    hk, hv = 2, 6
    q, k, v, g, beta, s0 = _gdn_inputs(t, hk, hv)
    dq, dk, dv, dg, db = (cp.asarray(a) for a in (q, k, v, g, beta))
    st, o = cp.asarray(s0), poisoned(cp, (t, hv, 128))
    K.prepared("gdn_delta_cols", (-(-hv * 128 // 8),), (dq, dk, dv, dg, db, st, o, hk, hv, 0, t))()
    want_s, want_o = st.get(), o.get()
    pieces = -(-t // 64)
    # scratch poisoned: pass 1 writes every value pass 2 reads (W, U' and M past the prompt's end included)
    w, u = cp.full(pieces * hv * 64 * 128, cp.nan, cp.float32), cp.full(pieces * hv * 64 * 128, cp.nan, cp.float32)
    m, gg = cp.full(pieces * hv * 64 * 64, cp.nan, cp.float32), cp.full(pieces * hv * 64, cp.nan, cp.float32)
    st, o = cp.asarray(s0), poisoned(cp, (t, hv, 128))
    K.prepared("gdn_chunk_prep", (pieces, hv), (dq, dk, dv, dg, db, w, u, m, gg, hk, hv, 0, t),
               smem=K.GDN_PREP_SMEM)()
    name = f"gdn_chunk_scan_tc<{rb}, 1>" if tc == "q1" else f"gdn_chunk_scan{'_tc' if tc else ''}<{rb}>"
    K.prepared(name, (hv, 128 // rb),
               (dq, dk, w, u, m, gg, st, o, hk, hv, 0, t), smem=K.gdn_scan_smem(rb, tc))()
    check("gdn_chunked state", st.get(), want_s, **GDN_STATE)
    check("gdn_chunked out", o.get(), want_o, **ELEM)
