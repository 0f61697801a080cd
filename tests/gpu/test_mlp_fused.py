"""mlp_fused (cuda/mlp_fused.cu): the post-attention norm and the dense MLP of one token in one persistent launch
against the four kernels it replaces (residual_rmsnorm_mb, gemv_rs_pre SwiGLU folding its maximum, stage_x_amax,
gemv_rs_pre into split-K planes): the same residual, SwiGLU row, staged pairs and planes, bit for bit; and against
the float reference within the GEMV tolerances. local: every block stages the down's input itself (one barrier
fewer)."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from engine.artifact import formats  # noqa: E402
from engine.ops import ref  # noqa: E402
from engine.gpu.gemv import GemvPlan, mlp_fused_help_words, mlp_fused_launch  # noqa: E402

from kernel_checks import LINEAR, RNG, check, poisoned  # noqa: E402  (tests/gpu is on sys.path)


def mlp_case(cp, h, inter, nplanes):
    """(q4 gate|up [2 inter, h], q5 down [h, inter], x_in on the host, nplanes partial planes, the norm weight,
    kpad_h, kpad_i) of a random MLP, drawn from RNG in this order; skips without int16 pairs."""
    from engine.gpu.weights import upload_matrix
    from engine.gpu import launch as K

    wg = (RNG.standard_normal((2 * inter, h)) / np.sqrt(h)).astype(np.float32)
    wd = (RNG.standard_normal((h, inter)) / np.sqrt(inter)).astype(np.float32)
    gu, dn = upload_matrix(cp, "q4_g64_fp16", wg), upload_matrix(cp, "q5_g64_fp16", wd)
    x_host = RNG.standard_normal((1, h)).astype(np.float32)
    planes = cp.asarray((RNG.standard_normal((nplanes, 1, h)) * 0.5).astype(np.float32))
    nw_ = cp.asarray((RNG.standard_normal(h) * 0.1).astype(np.float32))
    return gu, dn, x_host, planes, nw_, -(-h // K.XPAD) * K.XPAD, -(-inter // K.XPAD) * K.XPAD


@pytest.mark.parametrize("h,inter,nplanes,splits", [(5120, 3072, 1, 2), (5120, 2048, 2, 1), (1000, 1000, 0, 3),
                                                    (512, 1024, 3, 2)],
                         ids=["5120x3072-1", "5120x2048-2", "1000x1000-0", "512x1024-3"])
@pytest.mark.parametrize("local", [False, True], ids=["global", "local"])
# (the grid barriers' form; red: arrivals by a release reduction, the targets from the count read at entry)
@pytest.mark.parametrize("light", [0, 1, 2], ids=["fence", "light", "red"])
def test_mlp_fused_matches_the_four_kernels(cp, h, inter, nplanes, splits, local, light):
    from engine.gpu.mlp import stage_amax
    from engine.gpu.norm import residual_norm

    gu, dn, x_host, planes, nw_, kp_h, kp_i = mlp_case(cp, h, inter, max(nplanes, 1))

    def bufs():
        return dict(x_in=cp.asarray(x_host), x_out=poisoned(cp, (1, h)), act=poisoned(cp, (1, inter)), y=poisoned(cp, (8, 1, h)),
                    xh=cp.asarray(np.zeros((1, kp_i // 2), np.uint32)), xinv=poisoned(cp, (1,)),
                    slot=cp.asarray(np.zeros(2, np.uint32)))

    # the four kernels, as the executor launches them
    a = bufs()
    xn, xh_n, xinv_n = poisoned(cp, (1, h)), cp.asarray(np.zeros((1, kp_h // 2), np.uint32)), poisoned(cp, (1,))
    residual_norm("residual_rmsnorm_mb", x_in=a["x_in"], x_out=a["x_out"], planes=planes, nplanes=nplanes, plane_stride=h,
                  weight=nw_, out=xn, hidden=h, eps=1e-6, xh=xh_n, xinv=xinv_n, kpad=kp_h, rows=1)()
    g = GemvPlan(gu, xn, h, a["act"], inter, epi="swiglu", rows=2, unroll=2, xpre=(xh_n, xinv_n), pre2=True,
                 amax_out=a["slot"])
    assert g.tracks_amax
    g.launch()
    stage_amax(x=a["act"], k=inter, kpad=kp_i, xh=a["xh"], xinv=a["xinv"], slot=a["slot"])()
    d = GemvPlan(dn, a["act"], inter, a["y"], h, epi="partial", splits=splits, rows=1, unroll=2,
                 xpre=(a["xh"], a["xinv"]), pre2=True)
    d.launch()

    b = bufs()
    bar = cp.asarray(np.zeros(1, np.uint64))
    got = mlp_fused_launch(gu, dn, (b["x_in"], b["x_out"], planes, nplanes, h, nw_, h, 1e-6, kp_h), b["act"], kp_i,
                           b["xh"], b["xinv"], b["slot"], b["y"], splits, bar, local_stage=local, light_bar=light)
    assert got is not None
    launch, dsplits = got
    assert dsplits == d.splits
    for _ in range(3):  # (the barrier counter carries over between launches)
        launch()
    cp.cuda.Device().synchronize()
    assert int(bar.get()[0]) == 3 * (1 if local else 2) * launch.grid[0]
    assert np.array_equal(b["x_out"].get(), a["x_out"].get())
    assert np.array_equal(b["act"].get(), a["act"].get())
    assert np.array_equal(b["xinv"].get(), a["xinv"].get())
    assert local or np.array_equal(b["xh"].get(), a["xh"].get())  # (local: every block's own pairs in shared memory)
    assert np.array_equal(b["y"][:dsplits].get(), a["y"][:dsplits].get())
    assert b["slot"].get().tolist() == [0, 0] and a["slot"].get().tolist() == [0, 0]

    # and the float reference: rmsnorm, SwiGLU, down
    x = x_host + (planes.get()[:nplanes].sum(axis=0) if nplanes else 0)
    xr = x / np.sqrt(np.mean(x.astype(np.float64) ** 2) + 1e-6) * (1 + nw_.get())
    gq = formats.decode("q4_g64_fp16", "row_split_k128_v1", (2 * inter, h), cp.asnumpy(gu.buf))
    dq = formats.decode("q5_g64_fp16", "row_split_k128_v1", (h, inter), cp.asnumpy(dn.buf))
    hg = ref.linear(xr.astype(np.float32), gq)
    act = b["act"].get()
    check("mlp_fused swiglu", act, ref.swiglu(hg[:, :inter], hg[:, inter:]), **LINEAR)
    check("mlp_fused down", b["y"][:dsplits].get().sum(axis=0), ref.linear(act, dq), **LINEAR)


@pytest.mark.parametrize("h,inter", [(5120, 3072), (1000, 1056), (512, 1024)], ids=["5120x3072", "1000x1056", "512x1024"])
def test_mlp_fused_chunk_scaled(cp, h, inter):
    """chunk_scales: each block stages its own 32-value chunks of the SwiGLU row with a power-of-two scale each (before
    the only barrier), the down multiplies the chunk's scale in: the residual and the SwiGLU row bit-identical to the
    four kernels', the down's planes within the GEMV tolerances of the float reference, the amax slot untouched; with
    help (the leftover chunks' row pairs computed in slices by every warp and summed by their owners), the SwiGLU
    row close to it and the helpers' counts as three launches leave them."""
    from engine.gpu import launch as K

    gu, dn, x_host, planes, nw_, kp_h, kp_i = mlp_case(cp, h, inter, 1)
    outs = {}
    for chunk, helped in ((False, False), (True, False), (True, True)):
        x_out, act, y = poisoned(cp, (1, h)), poisoned(cp, (1, inter)), poisoned(cp, (8, 1, h))
        xh, xinv = cp.asarray(np.zeros((1, kp_i // 2), np.uint32)), cp.asarray(np.ones(1, np.float32))
        slot, bar = cp.asarray(np.zeros(2, np.uint32)), cp.asarray(np.zeros(1, np.uint64))
        xsc = poisoned(cp, (kp_i // 32,)) if chunk else None
        hb = cp.zeros(mlp_fused_help_words(K.sm_count(), gu), dtype=cp.uint32) if helped else None
        launch, dsplits = mlp_fused_launch(gu, dn, (cp.asarray(x_host), x_out, planes, 1, h, nw_, h, 1e-6, kp_h), act,
                                           kp_i, xh, xinv, slot, y, 3, bar, local_stage=True, chunk_scales=xsc,
                                           help=hb)
        for _ in range(3):  # (the helpers' counts carry over between launches as the barrier's does)
            launch()
        cp.cuda.Device().synchronize()
        assert slot.get().tolist() == [0, 0]
        outs[chunk, helped] = (x_out.get(), act.get(), y[:dsplits].get().sum(axis=0))
        if helped:  # every leftover row pair counted by each of its 32-lane slices, three launches
            grid, nch = launch.grid[0], dn.gpr * 2
            q, P = nch // grid, -(-gu.gpr * 2 // 32)
            pairs = [e * 32 + w for e in range(nch - q * grid) for w in range(32) if (grid * q + e) * 32 + w < inter]
            counts = hb.get()[:grid * 32]
            assert pairs and all(counts[i] == 3 * P for i in pairs) and counts.sum() == 3 * P * len(pairs)
    assert np.array_equal(outs[True, False][0], outs[False, False][0])
    assert np.array_equal(outs[True, False][1], outs[False, False][1])
    assert np.array_equal(outs[True, True][0], outs[False, False][0])
    check("mlp_fused helped swiglu", outs[True, True][1], outs[False, False][1], **LINEAR)
    dq = formats.decode("q5_g64_fp16", "row_split_k128_v1", (h, inter), cp.asnumpy(dn.buf))
    for helped in (False, True):
        check("mlp_fused chunk-scaled down", outs[True, helped][2], ref.linear(outs[True, helped][1], dq), **LINEAR)
