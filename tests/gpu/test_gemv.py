"""Every GEMV form against its reference (engine.ops.ref, engine.artifact.formats): the register kernels on x
staged in the block or by the producer (q4/q5/q6 and w8), the async ring, the tensor-core variant, split-K,
SwiGLU and bf16.

Tolerances are the named presets of spec/testing.md (engine/ops/tolerance.py); inputs are fresh
random data, outputs are poisoned before each run.
"""
import numpy as np
import pytest

from engine.artifact import formats
from engine.ops import ref
from engine.ops.gemv_plan import GemvPlan

pytestmark = pytest.mark.gpu

from kernel_checks import LINEAR, QFMTS, RNG, check, poisoned, staged_case  # noqa: E402  (tests/gpu is on sys.path)

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


@pytest.mark.parametrize("fmt", QFMTS[:3])
@pytest.mark.parametrize("n,k", [(512, 5120), (1000, 1024), (48, 17408), (4100, 6144)],
                         ids=["512x5120", "1000x1024", "48x17408", "4100x6144"])
@pytest.mark.parametrize("nw", [8, 16])
@pytest.mark.parametrize("splits", [1, 2, 3])
def test_gemv_tma(cp, fmt, n, k, nw, splits):
    """gemv_tma (sm_90: bulk copies into a ring of shared-memory stages, one block an SM) on pre-staged int16 x:
    partial planes (split K, P dividing the consumer warps), store, and SwiGLU with its largest |output| folded
    into a slot; fewer rows than multiprocessors too."""
    from engine.ops import kernels as K

    if not K.XI16 or not K.tma_capable():
        pytest.skip("gemv_tma needs sm_90 and int16 x pairs")
    dm, wq, x, _, xh, xinv = staged_case(cp, fmt, n, k, 1)
    h = ref.linear(x, wq)
    part = poisoned(cp, (nw, 1, n))
    plan = GemvPlan(dm, None, k, part, n, m=1, epi="partial", splits=splits, xpre=(xh, xinv), tma=nw)
    assert plan.tma is not None and plan.tma[0] == nw and nw % plan.splits == 0  # (P >= splits: rows too long)
    plan.launch()
    check(f"gemv tma partial {fmt}", part[: plan.splits].get().sum(axis=0), h, **LINEAR)
    y = poisoned(cp, (1, n))
    plan = GemvPlan(dm, None, k, y, n, m=1, epi="store", xpre=(xh, xinv), tma=nw)
    assert (plan.tma is None) == (GemvPlan.tma_geometry(dm, "store", 1, nw, xh.shape[-1] * 2) is None)
    plan.launch()  # (the register kernel where two stages of whole rows do not fit)
    check(f"gemv tma store {fmt}", y.get(), h, **LINEAR)
    if n % 2 == 0 and splits <= 2:  # (splits: pieces of a group over warps, their sums added in shared memory)
        y = poisoned(cp, (1, n // 2))
        slot = cp.zeros(2, dtype=cp.uint32)
        plan = GemvPlan(dm, None, k, y, n // 2, m=1, epi="swiglu", xpre=(xh, xinv), tma=nw, amax_out=slot,
                        splits=splits)
        assert plan.tma is None or (plan.tracks_amax and plan.tma[2] >= splits and plan.splits == 1)
        plan.launch()
        yh = y.get()
        check(f"gemv tma swiglu {fmt}", yh, ref.swiglu(h[:, : n // 2], h[:, n // 2:]), **LINEAR)
        if plan.tma is not None:
            assert float(slot[:1].view(cp.float32).get()[0]) == float(np.abs(yh).max())


@pytest.mark.parametrize("fmt", QFMTS[:3])
@pytest.mark.parametrize("h,inter", [(512, 1024), (5120, 2048), (2048, 17408)], ids=["512-1024", "5120-2048", "2048-17408"])
@pytest.mark.parametrize("nplanes", [0, 2])
def test_gemv_tma_prologues(cp, fmt, h, inter, nplanes):
    """gemv_tma's x prologues: gate|up (SwiGLU) staging rmsnorm(x_in + partial planes) (1 + w) itself, block 0 writing
    the new residual, its largest |output| folded into a slot (with 2 planes: each group on 2 warps); then down
    staging that row from the slot (the pairs stage_x_amax would write) into split-K planes, the last block
    resetting the slot."""
    from engine.gpu_weights import upload_matrix
    from engine.ops import kernels as K

    if not K.XI16 or not K.tma_capable():
        pytest.skip("gemv_tma needs sm_90 and int16 x pairs")
    wg = (RNG.standard_normal((2 * inter, h)) / np.sqrt(h)).astype(np.float32)
    wd = (RNG.standard_normal((h, inter)) / np.sqrt(inter)).astype(np.float32)
    gu, dn = upload_matrix(cp, fmt, wg), upload_matrix(cp, fmt, wd)
    gq = formats.decode(fmt, "row_split_k128_v1", (2 * inter, h), cp.asnumpy(gu.buf))
    dq = formats.decode(fmt, "row_split_k128_v1", (h, inter), cp.asnumpy(dn.buf))
    x_in = RNG.standard_normal((1, h)).astype(np.float32)
    planes = (RNG.standard_normal((max(nplanes, 1), 1, h)) * 0.5).astype(np.float32)
    nw_ = (RNG.standard_normal(h) * 0.1).astype(np.float32)
    x = x_in.copy()
    for s_ in range(nplanes):
        x = x + planes[s_]
    xn = x / np.sqrt(np.mean(x.astype(np.float64) ** 2) + 1e-6) * (1 + nw_)
    kp_h, kp_i = -(-h // K.XPAD) * K.XPAD, -(-inter // K.XPAD) * K.XPAD
    xh_n, xinv_n = cp.zeros((1, kp_h // 2), dtype=cp.uint32), cp.zeros(1, dtype=cp.float32)
    xh_a, xinv_a = cp.zeros((1, kp_i // 2), dtype=cp.uint32), cp.zeros(1, dtype=cp.float32)
    if GemvPlan.tma_geometry(gu, "swiglu", 1, 16, kp_h * 10) is None:
        pytest.skip("two stages of these gate|up rows and the norm's rows do not fit in shared memory")
    x_out, act, slot = poisoned(cp, (1, h)), poisoned(cp, (1, inter)), cp.zeros(2, dtype=cp.uint32)
    d_in, d_planes, d_w = cp.asarray(x_in), cp.asarray(planes), cp.asarray(nw_)
    g = GemvPlan(gu, None, h, act, inter, m=1, epi="swiglu", xpre=(xh_n, xinv_n), tma=16, amax_out=slot,
                 tma_pro=("norm", d_in, x_out, d_planes, nplanes, h, d_w, h, 1e-6), splits=1 + nplanes // 2)
    assert g.tma_pro == "norm" and g.tracks_amax
    g.launch()
    assert np.array_equal(x_out.get(), x)
    hg = ref.linear(xn.astype(np.float32), gq)
    a = act.get()
    check(f"gemv tma norm+swiglu {fmt}", a, ref.swiglu(hg[:, :inter], hg[:, inter:]), **LINEAR)
    assert float(slot[:1].view(cp.float32).get()[0]) == float(np.abs(a).max())
    part = poisoned(cp, (16, 1, h))
    d = GemvPlan(dn, None, inter, part, h, m=1, epi="partial", splits=2, xpre=(xh_a, xinv_a), tma=16,
                 tma_pro=("amax", act, inter, slot))
    assert d.tma_pro == "amax"
    d.launch()
    check(f"gemv tma amax down {fmt}", part[: d.splits].get().sum(axis=0), ref.linear(a, dq), **LINEAR)
    assert slot.get().tolist() == [0, 0]


def test_gemv_tma_falls_back(cp):
    """Shapes outside gemv_tma's rules (a row's scales not on a 16-byte boundary: K = 1,600, 25 groups) take the
    register kernel."""
    dm, wq, x, _, xh, xinv = staged_case(cp, "q4_g64_fp16", 300, 1600, 1)
    y = poisoned(cp, (1, 300))
    plan = GemvPlan(dm, None, 1600, y, 300, m=1, xpre=(xh, xinv), tma=16)
    assert plan.tma is None
    plan.launch()
    check("gemv tma fallback", y.get(), ref.linear(x, wq), **LINEAR)


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


def test_gemv_pair_matches_the_two_launches(cp):
    """gemv_rs_pre_pair (gemv_plan.pair_launch, CudaQwen35.GEMV_PAIR): the 27B's attention gate|v (q5) and q|k (q4),
    two rows a warp on gemv_rs_pre, as one grid: each output bit for bit that of its own launch."""
    from engine.ops.gemv_plan import pair_launch

    k = 5120
    da, _, _, xd, xh, xinv = staged_case(cp, "q5_g64_fp16", 7168, k, 1)
    db = staged_case(cp, "q4_g64_fp16", 7168, k, 1)[0]
    outs = {}
    for paired in (False, True):
        ya, yb = poisoned(cp, (1, da.n)), poisoned(cp, (1, db.n))
        pa, pb = (GemvPlan(d, xd, k, y, d.n, epi="store", rows=2, unroll=2, xpre=(xh, xinv), pre2=True)
                  for d, y in ((da, ya), (db, yb)))
        launch = pair_launch(pa, pb) if paired else None
        if paired:
            assert launch is not None and launch.name == "gemv_rs_pre_pair<1,2,0,2,false,4>"
            launch()
        else:
            pa.launch()
            pb.launch()
        cp.cuda.Device().synchronize()
        outs[paired] = (ya.get(), yb.get())
    assert all(np.array_equal(a, b) for a, b in zip(outs[True], outs[False]))
    assert not any(np.isnan(a).any() for a in outs[True])
