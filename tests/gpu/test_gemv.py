"""Every GEMV form against its reference (engine.ops.ref, engine.artifact.formats): the register kernels on x
staged in the block or by the producer (q4/q5/q6 and w8), split-K, SwiGLU, the pairs and bf16; the forms a plan
can take (rows 1 and 2, unroll 2; kernel_names.gemv_names).

Tolerances are the named presets of spec/testing.md (engine/ops/tolerance.py); inputs are fresh
random data, outputs are poisoned before each run.
"""
import numpy as np
import pytest

from engine.artifact import formats
from engine.ops import ref
from engine.gpu.gemv import GemvPlan

pytestmark = pytest.mark.gpu

from kernel_checks import LINEAR, QFMTS, RNG, check, poisoned, staged_case  # noqa: E402  (tests/gpu is on sys.path)

@pytest.mark.parametrize("fmt", QFMTS)
@pytest.mark.parametrize("n,k", [(512, 5120), (37, 1000), (300, 130)], ids=["512x5120", "37x1000", "300x130"])
@pytest.mark.parametrize("m", [1, 2, 4, 8])
@pytest.mark.parametrize("rows", [1, 2])
def test_gemv_store(cp, fmt, n, k, m, rows):
    from engine.gpu.weights import upload_matrix

    w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)  # unit-scale outputs, as in a model
    dm = upload_matrix(cp, fmt, w)
    wq = formats.decode(fmt, "row_split_k128_v1", (n, k), cp.asnumpy(dm.buf))
    x = RNG.standard_normal((m, k)).astype(np.float32)
    y = poisoned(cp, (m, n))
    GemvPlan(dm, cp.asarray(x), k, y, n, m=m, rows=rows, unroll=2).launch()
    check(f"gemv {fmt}", y.get(), ref.linear(x, wq), **LINEAR)


@pytest.mark.parametrize("fmt", QFMTS[:3])
@pytest.mark.parametrize("n,k", [(512, 5120), (37, 1000), (300, 130)], ids=["512x5120", "37x1000", "300x130"])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("pre2", [False, True])
@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("m", [1, 3])
def test_gemv_prestaged(cp, fmt, n, k, splits, pre2, rows, m):
    """x staged once by stage_x (as the producer kernels do), read by the GEMV from global memory
    (one token: gemv_rs, and gemv_rs_pre with pre2; more: gemv_tc)."""
    from engine.gpu.weights import upload_matrix
    from engine.gpu import launch as K
    from engine.gpu.mlp import stage_amax
    from engine.gpu.norm import stage_rows

    w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    dm = upload_matrix(cp, fmt, w)
    wq = formats.decode(fmt, "row_split_k128_v1", (n, k), cp.asnumpy(dm.buf))
    x = RNG.standard_normal((m, k)).astype(np.float32)
    kpad = -(-k // K.XPAD) * K.XPAD
    xh, xinv = cp.zeros((m, kpad // 2), dtype=cp.uint32), cp.zeros(m, dtype=cp.float32)
    stage_rows(x=cp.asarray(x), ld=k, k=k, kpad=kpad, xh=xh, ldh=kpad // 2, xinv=xinv, rows=m, blocks=3)()
    part = poisoned(cp, (splits, m, n))
    plan = GemvPlan(dm, None, k, part, n, m=m, epi="partial", splits=splits, xpre=(xh, xinv), rows=rows, unroll=2,
                    pre2=pre2)
    assert plan.pre2 == (pre2 and m == 1) and plan.kname.startswith("gemv_tc<") == (m > 1)
    part = part[: plan.splits]
    plan.launch()
    check(f"gemv prestaged {fmt}", part.get().sum(axis=0), ref.linear(x, wq), **LINEAR)
    if pre2 and splits == 1 and n % 2 == 0:
        y = poisoned(cp, (m, n // 2))
        GemvPlan(dm, None, k, y, n // 2, m=m, epi="swiglu", xpre=(xh, xinv), pre2=True).launch()
        h = ref.linear(x, wq)
        check(f"gemv prestaged swiglu {fmt}", y.get(), ref.swiglu(h[:, : n // 2], h[:, n // 2:]), **LINEAR)
        # the SwiGLU's largest |output| a row folded into a slot (one token: gemv_rs_pre; more: gemv_tc), stage_x_amax
        # staging the rows from it gives stage_x_mb's pairs
        k2 = n // 2
        kp2 = -(-k2 // K.XPAD) * K.XPAD
        y1 = poisoned(cp, (m, k2))
        slot = cp.zeros(2 * m, cp.uint32)
        plan = GemvPlan(dm, None, k, y1, k2, m=m, epi="swiglu", xpre=(xh, xinv), pre2=True, amax_out=slot, rows=rows)
        assert plan.tracks_amax
        for _ in range(2):  # the second launch finds the slot reset by stage_x_amax
            plan.launch()
            sh, sinv = cp.zeros((m, kp2 // 2), cp.uint32), cp.zeros(m, cp.float32)
            stage_amax(x=y1, k=k2, kpad=kp2, xh=sh, xinv=sinv, slot=slot, rows=m)()
            rh, rinv = cp.zeros_like(sh), cp.zeros_like(sinv)
            stage_rows(x=y1, ld=k2, k=k2, kpad=kp2, xh=rh, ldh=kp2 // 2, xinv=rinv, rows=m, blocks=3)()
            assert np.array_equal(sh.get(), rh.get()) and np.array_equal(sinv.get(), rinv.get())
            assert not slot.get().any()


@pytest.mark.parametrize("n,k", [(512, 5120), (37, 1000), (300, 130), (96, 2048)],
                         ids=["512x5120", "37x1000", "300x130", "96x2048"])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("m", [1, 2, 5])
@pytest.mark.parametrize("rows", [1, 2])
def test_gemv_w8_prestaged(cp, n, k, splits, m, rows):
    """w8 on the pre-staged int16 pairs (gemv_rs_pre<3, ...>, a chunk half a staged block; split-K slices of 64
    chunks; more tokens: gemv_tc), partial planes and SwiGLU."""
    dm, wq, x, xd, xh, xinv = staged_case(cp, "q8_g32_fp16", n, k, m)  # (xd: read when the GEMV stages x itself)
    part = poisoned(cp, (splits, m, n))
    plan = GemvPlan(dm, xd, k, part, n, m=m, epi="partial", splits=splits, xpre=(xh, xinv), rows=rows)
    assert plan.pre2 == (m == 1)
    plan.launch()
    check(f"gemv w8 prestaged {n}x{k}", part[: plan.splits].get().sum(axis=0), ref.linear(x, wq), **LINEAR)
    if n % 2 == 0:
        y = poisoned(cp, (m, n // 2))
        GemvPlan(dm, xd, k, y, n // 2, m=m, epi="swiglu", xpre=(xh, xinv)).launch()
        h = ref.linear(x, wq)
        check(f"gemv w8 prestaged swiglu {n}x{k}", y.get(), ref.swiglu(h[:, : n // 2], h[:, n // 2:]), **LINEAR)


@pytest.mark.parametrize("fmt", QFMTS)
@pytest.mark.parametrize("splits", [1, 3])
def test_gemv_partial_splits(cp, fmt, splits):
    from engine.gpu.weights import upload_matrix

    n, k = 256, 4160
    w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    dm = upload_matrix(cp, fmt, w)
    wq = formats.decode(fmt, "row_split_k128_v1", (n, k), cp.asnumpy(dm.buf))
    x = RNG.standard_normal((1, k)).astype(np.float32)
    part = poisoned(cp, (splits, 1, n))
    GemvPlan(dm, cp.asarray(x), k, part, n, m=1, epi="partial", splits=splits).launch()
    check(f"gemv split {fmt}", part.get().sum(axis=0), ref.linear(x, wq), **LINEAR)


def test_gemv_swiglu_and_bf16(cp):
    from engine.gpu.weights import upload_matrix

    n2, k = 2 * 300, 512
    w = (RNG.standard_normal((n2, k)) / np.sqrt(k)).astype(np.float32)
    dm = upload_matrix(cp, "q4_g64_fp16", w)
    wq = formats.decode("q4_g64_fp16", "row_split_k128_v1", (n2, k), cp.asnumpy(dm.buf))
    x = RNG.standard_normal((1, k)).astype(np.float32)
    y = poisoned(cp, (1, n2 // 2))
    GemvPlan(dm, cp.asarray(x), k, y, n2 // 2, epi="swiglu").launch()
    h = ref.linear(x, wq)
    check("swiglu", y.get(), ref.swiglu(h[:, : n2 // 2], h[:, n2 // 2:]), **LINEAR)

    # few rows: 8 warps split each row's K; many rows: a warp per row; K of one batch of a lane's chunks and of
    # several (gemv_bf16 loads BF16_CH chunks a lane at a time), a row count not a multiple of the block's rows
    for nb, kb in ((96, k), (96, 5120), (96, 12288), (5000, k), (1001, 5120)):
        wb = (RNG.standard_normal((nb, kb)) / np.sqrt(kb)).astype(np.float32)
        db = upload_matrix(cp, "bf16", wb)
        wbq = formats.bf16_bits_to_f32(formats.f32_to_bf16_bits(wb))
        for mb in (1, 2, 4):
            xb = RNG.standard_normal((mb, kb)).astype(np.float32)
            yb = poisoned(cp, (mb, nb))
            GemvPlan(db, cp.asarray(xb), kb, yb, nb, m=mb).launch()
            check(f"gemv bf16 {nb}x{kb} m={mb}", yb.get(), ref.linear(xb, wbq), **LINEAR)


def test_gemv_pair_matches_the_two_launches(cp):
    """gemv_rs_pre_pair (gemv.pair_launch, the plan's gemv_pair): the 27B's attention gate|v (q5) and q|k (q4),
    two rows a warp on gemv_rs_pre, as one grid: each output bit for bit that of its own launch."""
    from engine.gpu.gemv import pair_launch

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


@pytest.mark.parametrize("tc", [(2, 4), (4, 3), (4, 4)], ids=["gu2s4", "gu4s3", "gu4s4"])
@pytest.mark.parametrize("fmt", QFMTS)
@pytest.mark.parametrize("m", [2, 4, 6])
@pytest.mark.parametrize("n,k", [(4096, 5120), (300, 1000), (80, 17408)], ids=["4096x5120", "300x1000", "80x17408"])
def test_gemv_columns_epilogues(cp, fmt, m, n, k, tc):
    """gemv_tc (2..8 columns on the int8 MMAs) staging x itself, in each of its compiled forms (groups a run, ring
    stages): store, add, SwiGLU, split-K partial planes; and q4-q6 against the one-token GEMV column by column (the same
    staged integers, only the fp32 order differs; its w8 multiplies fp16 pairs)."""
    from engine.gpu import kernel_names
    from engine.gpu.launch import FMT_IDS
    from engine.gpu.weights import upload_matrix

    if kernel_names.gemv_tc_name(FMT_IDS[fmt], m, *tc) not in kernel_names.all_names():
        pytest.skip(f"gemv_tc form {tc} is not compiled for {fmt}")

    w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    dm = upload_matrix(cp, fmt, w)
    wq = formats.decode(fmt, "row_split_k128_v1", (n, k), cp.asnumpy(dm.buf))
    x = RNG.standard_normal((m, k)).astype(np.float32)
    xd, h = cp.asarray(x), ref.linear(x, wq)
    y = poisoned(cp, (m, n))
    plan = GemvPlan(dm, xd, k, y, n, m=m, tc=tc)
    assert plan.kname.startswith("gemv_tc<")
    plan.launch()
    check(f"gemv_tc store {fmt}", y.get(), h, **LINEAR)
    if fmt != "q8_g32_fp16":
        one = poisoned(cp, (m, n))
        for r in range(m):
            GemvPlan(dm, xd[r:r + 1], k, one[r:r + 1], n, m=1).launch()
        np.testing.assert_allclose(y.get(), one.get(), rtol=1e-4, atol=1e-5 * float(np.abs(h).max()))
    base = RNG.standard_normal((m, n)).astype(np.float32)
    ya = cp.asarray(base)
    GemvPlan(dm, xd, k, ya, n, m=m, epi="add", tc=tc).launch()
    check(f"gemv_tc add {fmt}", ya.get(), base + h, **LINEAR)
    part = poisoned(cp, (3, m, n))
    plan = GemvPlan(dm, xd, k, part, n, m=m, epi="partial", splits=3, tc=tc)
    plan.launch()
    check(f"gemv_tc split {fmt}", part[: plan.splits].get().sum(axis=0), h, **LINEAR)
    if n % 2 == 0:
        ys = poisoned(cp, (m, n // 2))
        GemvPlan(dm, xd, k, ys, n // 2, m=m, epi="swiglu", tc=tc).launch()
        check(f"gemv_tc swiglu {fmt}", ys.get(), ref.swiglu(h[:, : n // 2], h[:, n // 2:]), **LINEAR)
