"""gated_rmsnorm_chunks (cuda/norm.cu, engine.gpu.gdn.gated_norm_chunks): the GDN gated norm staging the
o-projection's input a 32-value chunk at a time with a scale each, and gemv_rs_pre<..., XS> multiplying the scales
in: the fp32 output
bit-identical to gated_rmsnorm_stage's, the o-projection within the GEMV tolerances of the float reference."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from engine.artifact import formats  # noqa: E402
from engine.ops import ref  # noqa: E402
from engine.gpu.gemv import GemvPlan  # noqa: E402

from kernel_checks import LINEAR, RNG, check, poisoned  # noqa: E402  (tests/gpu is on sys.path)


@pytest.mark.parametrize("hv,n", [(48, 5120), (16, 1024)], ids=["27b", "small"])
def test_gated_chunks_and_the_chunk_scaled_gemv(cp, hv, n):
    from engine.gpu.weights import upload_matrix
    from engine.gpu import launch as K

    k = hv * 128
    kpad = -(-k // K.XPAD) * K.XPAD
    o = cp.asarray(RNG.standard_normal((1, hv, 128)).astype(np.float32))
    z = cp.asarray(RNG.standard_normal((1, k)).astype(np.float32))
    w = cp.asarray((1 + 0.1 * RNG.standard_normal(128)).astype(np.float32))
    wo = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    dev = upload_matrix(cp, "q5_g64_fp16", wo)
    outs = {}
    for name in ("gated_rmsnorm_stage", "gated_rmsnorm_chunks"):
        out, xinv = poisoned(cp, (1, k)), poisoned(cp, (1,))
        xh = cp.asarray(np.zeros((1, kpad // 2), np.uint32))
        xsc = poisoned(cp, (kpad // 32,))
        chunk = name == "gated_rmsnorm_chunks"
        args = (o, z, k, w, out, k, hv, 1e-6, k, kpad, xh, xinv) + ((xsc,) if chunk else (np.uint64(0),))  # (no twin)
        K.prepared(name, ((-(-hv // 8)) if chunk else 1, 1), args, block=256 if chunk else 1024)()
        y = poisoned(cp, (1, n))
        plan = GemvPlan(dev, out, k, y, n, epi="store", rows=2, unroll=2, xpre=(xh, xinv), pre2=True,
                        xs=xsc if chunk else None)
        assert plan.xs == chunk and plan.fn is not None
        plan.launch()
        cp.cuda.Device().synchronize()
        outs[name] = (out.get(), y.get(), xinv.get())
    assert np.array_equal(outs["gated_rmsnorm_chunks"][0], outs["gated_rmsnorm_stage"][0])
    assert outs["gated_rmsnorm_chunks"][2].tolist() == [1.0]
    dq = formats.decode("q5_g64_fp16", "row_split_k128_v1", (n, k), cp.asnumpy(dev.buf))
    for name, (out, y, _) in outs.items():
        check(f"o-projection after {name}", y, ref.linear(out, dq), **LINEAR)


@pytest.mark.parametrize("early", [1, 0], ids=["early", "after-wait"])
@pytest.mark.parametrize("hk,hv,m", [(16, 48, 1), (16, 32, 2)], ids=["27b", "35b-2rows"])
def test_gdn_delta_gated_cl_matches_the_two_launches(cp, hk, hv, m, early):
    """gdn_delta_gated_cl (cuda/gdn_cluster.cu, the sm_90 plan's gdn: a cluster of 4 blocks a value head, the head's
    outputs pushed into its first block through distributed shared memory) against gdn_delta_raw_rw<4> then
    gated_rmsnorm_chunks: the state, o, the gated output, the staged pairs, the chunk scales and xinv bit for bit; early:
    the state rows loaded before the PDL wait (its early-state flag)."""
    from engine.gpu import launch as K

    if not K.cluster_capable():
        pytest.skip("thread block clusters (sm_90) and chunk scales on int16 pairs")
    rng = np.random.default_rng(5)

    def f(*shape, s=1.0):
        return (s * rng.standard_normal(shape)).astype(np.float32)

    k = hv * 128
    kpad = -(-k // K.XPAD) * K.XPAD
    qk, vz, ab, nw = f(m, 2 * hk * 128), f(m, 2 * k), f(m, 2 * hv), 1 + f(128, s=0.1)
    a_log, dt = f(hv, s=0.3), f(hv, s=0.3)
    state0 = f(m, hv, 128, 128, s=0.1)
    outs = {}
    from engine.gpu.gdn import delta_gated_cl, delta_rule, gated_norm_chunks

    for fused in ("", "gdn_delta_gated_cl"):
        st, vzd = cp.asarray(state0), cp.asarray(vz)
        o, out, xinv = poisoned(cp, (m, k)), poisoned(cp, (m, k)), poisoned(cp, (m,))
        xsc = poisoned(cp, (m * kpad // 32,))
        xh = cp.asarray(np.zeros((m, kpad // 2), np.uint32))
        delta = dict(qk=cp.asarray(qk), ld_qk=qk.shape[1], v=vzd, ld_v=vz.shape[1], ab=cp.asarray(ab),
                     ld_ab=ab.shape[1], a_log=cp.asarray(a_log), dt_bias=cp.asarray(dt), q_scale=1 / np.sqrt(128),
                     state=st, o=o, k_heads=hk, v_heads=hv, rows=m)
        norm = dict(z=vzd[:, k:], ld_z=vz.shape[1], weight=cp.asarray(nw), out=out, ld_out=k, eps=1e-6, k=k,
                    kpad=kpad, xh=xh, xinv=xinv, xsc=xsc, rows=m)
        if fused:
            delta_gated_cl(**delta, **{key: v for key, v in norm.items() if key != "rows"}, state_early=bool(early))()
        else:
            delta_rule(**delta)()
            gated_norm_chunks(o=o, v_heads=hv, **norm)()
        cp.cuda.Device().synchronize()
        outs[fused] = [a.get() for a in (st, o, out, xh, xsc, xinv)]
    for name, a, b in zip(("state", "o", "out", "xh", "xsc", "xinv"), outs[""], outs["gdn_delta_gated_cl"]):
        assert np.array_equal(a, b, equal_nan=True), name
    assert not np.isnan(outs[""][2]).any() and outs[""][5].tolist() == [1.0] * m


@pytest.mark.parametrize("hk,hv,h,m", [(16, 48, 5120, 1), (16, 32, 2048, 2)], ids=["27b", "35b-2rows"])
def test_gdn_ab_in_matches_the_ab_gemv(cp, hk, hv, h, m):
    """The plan's gdn_ab_in: gdn_delta_gated_cl computing each head's a and b projections from the bf16 [a; b] weights and the
    fp32 normed row (before the PDL wait: the weights) against gemv_bf16 (8 warps a row, as the executor launches it
    for 2 Hv rows) writing ab and the kernel reading it: the state, o and the gated output within fp32 rounding (the
    sums run in gemv_bf16's order; the compiler may contract them differently)."""
    from engine.gpu import launch as K

    if not K.cluster_capable():
        pytest.skip("thread block clusters (sm_90) and chunk scales on int16 pairs")
    rng = np.random.default_rng(9)

    def f(*shape, s=1.0):
        return (s * rng.standard_normal(shape)).astype(np.float32)

    k = hv * 128
    kpad = -(-k // K.XPAD) * K.XPAD
    qk, vz, nw, x = f(m, 2 * hk * 128), f(m, 2 * k), 1 + f(128, s=0.1), f(m, h)
    wab = (f(2 * hv, h) / np.sqrt(h)).astype(np.float32)
    wab_bf16 = (wab.view(np.uint32) >> 16).astype(np.uint16)  # (truncated to bf16: the kernel's weights)
    a_log, dt = f(hv, s=0.3), f(hv, s=0.3)
    state0 = f(m, hv, 128, 128, s=0.1)
    wdev, xdev = cp.asarray(wab_bf16), cp.asarray(x)
    from engine.gpu.gdn import delta_gated_cl

    outs = {}
    for inside in (False, True):
        st, vzd = cp.asarray(state0), cp.asarray(vz)
        ab = poisoned(cp, (m, 2 * hv))
        if not inside:
            K.prepared(f"gemv_bf16<{m}>", (2 * hv,), (wdev, 2 * hv, h, xdev, h, ab, 2 * hv, 0, 8))()
        o, out, xinv = poisoned(cp, (m, k)), poisoned(cp, (m, k)), poisoned(cp, (m,))
        xsc = poisoned(cp, (m * kpad // 32,))
        xh = cp.asarray(np.zeros((m, kpad // 2), np.uint32))
        ab_in = dict(ab_weights=wdev.data.ptr, x=xdev, ld_x=h, hidden=h) if inside else {}
        delta_gated_cl(qk=cp.asarray(qk), ld_qk=qk.shape[1], v=vzd, ld_v=vz.shape[1], ab=ab, ld_ab=2 * hv,
                       a_log=cp.asarray(a_log), dt_bias=cp.asarray(dt), q_scale=1 / np.sqrt(128), state=st, o=o,
                       k_heads=hk, v_heads=hv, z=vzd[:, k:], ld_z=vz.shape[1], weight=cp.asarray(nw), out=out,
                       ld_out=k, eps=1e-6, k=k, kpad=kpad, xh=xh, xinv=xinv, xsc=xsc, rows=m, **ab_in)()
        cp.cuda.Device().synchronize()
        outs[inside] = [a.get() for a in (st, o, out)]
    for name, a, b in zip(("state", "o", "out"), outs[False], outs[True]):
        assert not np.isnan(b).any(), name
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5, err_msg=name)
