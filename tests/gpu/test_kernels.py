"""Every decode kernel against its reference (engine.ops.ref, engine.artifact.formats).

Tolerances are the named presets of spec/testing.md (engine/ops/tolerance.py); inputs are fresh
random data, outputs are poisoned before each run.
"""
import math

import numpy as np
import pytest

from engine.artifact import formats
from engine.ops import ref

pytestmark = pytest.mark.gpu

from kernel_checks import ELEM, GDN_STATE, QFMTS, RNG, check, poisoned, rel_l2  # noqa: E402  (tests/gpu is on sys.path)


@pytest.mark.parametrize("fmt", QFMTS)
def test_embed(cp, fmt):
    from engine.gpu.gemv import embed_rows
    from engine.gpu.weights import upload_matrix

    r, k = 50, 320
    w = RNG.standard_normal((r, k)).astype(np.float32)
    dm = upload_matrix(cp, fmt, w)
    wq = formats.decode(fmt, "row_split_k128_v1", (r, k), cp.asnumpy(dm.buf))
    toks = cp.asarray(np.array([7, 49], dtype=np.int32))
    out = poisoned(cp, (2, k))
    embed_rows(dm, tokens=toks, out=out, ld=k, rows=2)()
    assert np.array_equal(out.get(), wq[[7, 49]])


def test_residual_rmsnorm_and_gated(cp):
    from engine.gpu import launch as K
    from engine.gpu.gdn import gated_norm_stage
    from engine.gpu.norm import residual_norm, stage_rows

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
    residual_norm("residual_rmsnorm_mb", x_in=cp.asarray(x), x_out=x_out, planes=cp.asarray(part), nplanes=s,
                  plane_stride=m * h, weight=cp.asarray(w), out=out2, hidden=h, eps=1e-6, xh=xh2, xinv=xinv2, kpad=kpad,
                  rows=m, blocks=5)()
    check("residual mb", x_out.get(), xs, **ELEM)
    check("rmsnorm mb", out2.get(), out.get(), **ELEM)
    assert np.array_equal(xh2.get(), xh.get())
    assert np.array_equal(xinv2.get(), xinv.get())
    # residual_rmsnorm_mb2 (2 values a thread, 8 planes a round): the same bits as residual_rmsnorm_mb, for rows
    # of up to 2,048 values and 1 to 9 planes (the MoE norm's k + 1); residual_rmsnorm_mb5_1r (5 values a thread, 4
    # planes in one round of loads with x_in and w) for rows of up to 5,120 (the 27B's, 3 planes after the fused MLP)
    # the same bits too, also past one round (12 planes) and with none
    for h2, s2 in ((1000, 3), (2048, 9), (2048, 1), (1536, 2), (5120, 3), (4000, 5), (5120, 1), (2048, 12), (5120, 0)):
        kp2 = -(-h2 // K.XPAD) * K.XPAD
        x2 = RNG.standard_normal((m, h2)).astype(np.float32)
        p2 = cp.asarray(RNG.standard_normal((max(s2, 1), m, h2)).astype(np.float32))
        w2 = cp.asarray(RNG.standard_normal(h2).astype(np.float32) * 0.1)
        got = {}
        forms = ("residual_rmsnorm_mb",) + (("residual_rmsnorm_mb2",) if h2 <= 2048 else ())
        forms += ("residual_rmsnorm_mb5_1r",)
        for name in forms:
            xo, o2 = poisoned(cp, (m, h2)), poisoned(cp, (m, h2))
            xh3, xinv3 = cp.zeros((m, kp2 // 2), dtype=cp.uint32), cp.zeros(m, dtype=cp.float32)
            residual_norm(name, x_in=cp.asarray(x2), x_out=xo, planes=p2, nplanes=s2, plane_stride=m * h2, weight=w2,
                          out=o2, hidden=h2, eps=1e-6, xh=xh3, xinv=xinv3, kpad=kp2, rows=m)()
            got[name] = [a.get() for a in (xo, o2, xh3, xinv3)]
        check(f"residual mb {h2}", got["residual_rmsnorm_mb"][0], x2 + p2.get()[:s2].sum(0), **ELEM)
        for name in forms[1:]:
            assert all(np.array_equal(a, b) for a, b in zip(got["residual_rmsnorm_mb"], got[name])), name
        # residual_rmsnorm_cl (a cluster of 8 blocks a row): x_out the same bits; the sum of squares in another order,
        # so out within fp32 rounding and the staged pairs equal but for a rare last bit
        for name in ("residual_rmsnorm_cl",) if K.cluster_capable() else ():
            xo, o2 = poisoned(cp, (m, h2)), poisoned(cp, (m, h2))
            xh3, xinv3 = cp.zeros((m, kp2 // 2), dtype=cp.uint32), cp.zeros(m, dtype=cp.float32)
            residual_norm(name, x_in=cp.asarray(x2), x_out=xo, planes=p2, nplanes=s2, plane_stride=m * h2, weight=w2,
                          out=o2, hidden=h2, eps=1e-6, xh=xh3, xinv=xinv3, kpad=kp2, rows=m)()
            got[name] = [a.get() for a in (xo, o2, xh3, xinv3)]
            mb = got["residual_rmsnorm_mb"]
            assert np.array_equal(xo.get(), mb[0])
            assert np.allclose(o2.get(), mb[1], rtol=1e-5, atol=1e-6)
            assert np.array_equal(xinv3.get(), mb[3]) and np.mean(xh3.get() == mb[2]) > 0.99

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
        gated_norm_stage(o=cp.asarray(o2), z=cp.asarray(z2), ld_z=k2, weight=cp.asarray(gw), out=g2, ld_out=ld2,
                         v_heads=hv2, eps=1e-6, k=k2, kpad=kp2, xh=xh3, xinv=xinv3, rows=m)()
        check(f"gated_rmsnorm_stage {hv2}", g2.get()[:, :k2],
              ref.gated_rmsnorm(o2, z2.reshape(m, hv2, 128), gw, 1e-6).reshape(m, -1), **ELEM)
        xh4, xinv4 = cp.zeros_like(xh3), cp.zeros_like(xinv3)
        stage_rows(x=g2, ld=ld2, k=k2, kpad=kp2, xh=xh4, ldh=kp2 // 2, xinv=xinv4, rows=m, blocks=3)()
        assert np.array_equal(xh3.get(), xh4.get()) and np.array_equal(xinv3.get(), xinv4.get())


def test_gdn_step(cp):
    from engine.gpu.gdn import delta_step, gdn_prep

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
    gdn_prep(qk=cp.asarray(qk), ld_qk=qk.shape[1], v=cp.asarray(vz), ld_v=vz.shape[1], ab=cp.asarray(ab), ld_ab=2 * hv,
             conv_state=cs, conv=cp.asarray(conv_w), a_log=cp.asarray(a_log), dt_bias=cp.asarray(dt_bias),
             q_out=bufs["q"], k_out=bufs["k"], v_out=bufs["v"], g=bufs["g"], beta=bufs["b"], k_heads=hk, v_heads=hv,
             q_scale=1.0 / math.sqrt(128), rows=1)()
    delta_step(q=bufs["q"], k=bufs["k"], v=bufs["v"], g=bufs["g"], beta=bufs["b"], state=st, o=bufs["o"], k_heads=hk,
               v_heads=hv, rows=1)()
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


# form: the split kernel (attn_decode_split<g, kv8>; "split2": a KV head's query group over two blocks,
# attn_decode_split<g / 2, kv8, 2>), attn_decode_mma<g, kv8, W, NS> in form N of kernels.ATTN_MMA_FORMS ("mmaN": W
# warps, NS stages, the sm_90 / A100 / 99 KB classes' forms, each runs on an H200), or "vraw" (int8: the raw K and V
# codes into the MMAs, the sm_90 class's form)
@pytest.mark.parametrize("form", ["split", "split2", "mma0", "mma1", "mma2", "vraw"])
@pytest.mark.parametrize("kv", ["bf16", "int8"])
@pytest.mark.parametrize("g", [6, 8])
@pytest.mark.parametrize("length", [1, 63, 200, 1500])
def test_attention_decode(cp, g, length, kv, form):
    if form == "vraw" and kv != "int8":
        pytest.skip("raw codes: int8 caches only")
    from engine.gpu import launch as K
    from engine.gpu.attention import decode_attention, qk_norm_rope_kv
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
        qk_norm_rope_kv(q=cp.asarray(q), ld_q=hq * d, k=cp.asarray(k), ld_k=hkv * d, v=cp.asarray(v), ld_v=hkv * d,
                        q_norm=cp.asarray(qn_w), k_norm=cp.asarray(kn_w), pos=pos, page_table=pt, pt_stride=pages,
                        k_cache=kc, v_cache=vc, q_out=qbuf, q_heads=hq, kv_heads=hkv, rotary_dim=64,
                        log2_theta=math.log2(1e7), eps=1e-6, rows=1, k_scales=ksc, v_scales=vsc)()
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
    if form.startswith("split"):
        gs = 2 if form == "split2" else 1
        name = f"attn_decode_split<{g // gs},{kv8},{gs}>" if gs > 1 else f"attn_decode_split<{g},{kv8}>"
        threads, smem = 256, 0
    elif form == "vraw":
        w, ns = K.ATTN_MMA_VRAW_FORM
        name, threads, smem = K.attn_mma_vraw_name(g), 32 * w, K.attn_mma_smem(True, w, ns, vraw=True)
    else:
        w, ns = K.ATTN_MMA_FORMS[int8][int(form[3:])]
        name, threads, smem = f"attn_decode_mma<{g},{kv8},{w},{ns}>", 32 * w, K.attn_mma_smem(int8, w, ns)
    decode_attention(name, threads=threads, smem=smem, q=qbuf, k_cache=kc, v_cache=vc, pos=pos, page_table=pt,
                     pt_stride=pages, kv_heads=hkv, chunk=chunk, scale=1 / 16, ml=ml, acc=acc, nsplit=nsplit, rows=1,
                     k_scales=ksc, v_scales=vsc)()
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


# attn_decode_mma with two consecutive columns' query groups in a tile (C = 2, the verified columns': ColumnsAttention)
# against a column a block, over a cache shared by 4 columns at consecutive positions; lengths where an earlier
# column sees none of a split's tokens (5, 17: its rows there are all masked)
@pytest.mark.parametrize("form", ["mma0", "vraw"])
@pytest.mark.parametrize("kv", ["bf16", "int8"])
@pytest.mark.parametrize("g", [6, 8])
@pytest.mark.parametrize("length", [5, 17, 200, 1500])
def test_attention_two_columns_a_tile(cp, g, length, kv, form):
    if form == "vraw" and kv != "int8":
        pytest.skip("raw codes: int8 caches only")
    from engine.gpu import kernel_names as KN
    from engine.gpu import launch as K
    from engine.gpu.attention import decode_attention

    hkv, d, page, M, nsplit = 2, 256, 64, 4, 3
    hq, int8 = hkv * g, kv == "int8"
    pages = -(-length // page) + 1
    rows = pages * page
    if int8:
        kc = cp.asarray(RNG.integers(-127, 128, (pages, page, hkv, d)).astype(np.int8))
        vc = cp.asarray(RNG.integers(-127, 128, (pages, page, hkv, d)).astype(np.int8))
        ksc = cp.asarray(RNG.uniform(0.005, 0.02, (pages, page, hkv, d // 64)).astype(np.float16))
        vsc = cp.asarray(RNG.uniform(0.005, 0.02, (pages, page, hkv, d // 64)).astype(np.float16))
    else:
        bits = lambda: formats.f32_to_bf16_bits(RNG.standard_normal((pages, page, hkv, d)).astype(np.float32))  # noqa: E731
        kc, vc, ksc, vsc = cp.asarray(bits()), cp.asarray(bits()), None, None
    pt = cp.asarray(RNG.permutation(pages).astype(np.int32)[None])
    q = cp.asarray(RNG.standard_normal((M, hq * d)).astype(np.float32))
    pos = cp.asarray(np.arange(length - M, length, dtype=np.int32))
    kv8 = "true" if int8 else "false"
    if form == "vraw":
        w, ns = K.ATTN_MMA_VRAW_FORM
        name, smem = K.attn_mma_vraw_name(g), K.attn_mma_smem(True, w, ns, vraw=True)
    else:
        w, ns = K.ATTN_MMA_FORMS[int8][0]
        name, smem = f"attn_decode_mma<{g},{kv8},{w},{ns}>", K.attn_mma_smem(int8, w, ns)
    outs = []
    for cols in (1, 2):
        ml = poisoned(cp, (M, hq, nsplit, 2))
        acc = poisoned(cp, (M, hq, nsplit, d))
        out = poisoned(cp, (M, hq * d))
        decode_attention(KN.attn_columns_name(name, cols), threads=32 * w, smem=smem, q=q, k_cache=kc, v_cache=vc,
                         pos=pos, page_table=pt, pt_stride=0, kv_heads=hkv, chunk=-(-rows // nsplit), scale=1 / 16,
                         ml=ml, acc=acc, nsplit=nsplit, rows=M, k_scales=ksc, v_scales=vsc, cols=cols)()
        K.prepared("attn_combine", (hq, M), (ml, acc, nsplit, cp.zeros((M, hq * d), dtype=cp.float32), hq * d, out,
                                             hq * d, hq))()
        outs.append(out.get())
    # (the tile's splits follow the last column's length, so a row's P rounds against other maxima: within ~1e-4;
    # a row seeing one token more or fewer would move by 1 / length)
    check("two columns a tile", outs[1], outs[0], atol=1e-3, rtol=1e-2, tail_frac=1e-3, worst_ratio=5, rel=2e-3)


def test_argmax_step(cp):
    from engine.gpu import launch as K
    from engine.gpu.sampling import argmax_step

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
        argmax_step(logits=cp.asarray(logits), ld=v, vocab=v, best_v=pv, best_i=pi, tickets=ticket, tokens=toks2,
                    pos=pos2, history=hist2, step=step2, hist_len=8, rows=2, blocks=nb)()
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


@pytest.mark.parametrize("rows", [2])
def test_gdn_delta_rows_matches_delta_cols(cp, rows):
    """The prefill's recurrence with several state rows a warp against the row-a-warp kernel."""
    from engine.gpu.gdn import delta_step

    hk, hv, t = 2, 6, 37
    q, k, v, g, beta, s0 = _gdn_inputs(t, hk, hv)
    outs = []
    for per in (1, rows):  # gdn_delta_cols, gdn_delta_rows<rows>
        st = cp.asarray(s0)
        o = poisoned(cp, (t, hv, 128))
        delta_step(q=cp.asarray(q), k=cp.asarray(k), v=cp.asarray(v), g=cp.asarray(g), beta=cp.asarray(beta), state=st,
                   o=o, k_heads=hk, v_heads=hv, rows=1, tokens=t, rows_a_warp=per)()
        outs.append((st.get(), o.get()))
    check("gdn_delta_rows state", outs[1][0], outs[0][0], **GDN_STATE)
    check("gdn_delta_rows out", outs[1][1], outs[0][1], **ELEM)


@pytest.mark.parametrize("t", [37, 64, 150])
@pytest.mark.parametrize("rb", [32, 64])
def test_gdn_chunked_matches_delta_cols(cp, t, rb):
    """The chunked delta rule (gdn_chunk_prep over the 64-token pieces on tensor cores, then gdn_chunk_scan_tc<RB, 1>
    in order, the output's products in 1xTF32) against the token-by-token kernel: outputs and final state, pieces
    whole and partial."""
    from engine.gpu.gdn import chunk_prep, chunk_scan, delta_step

    hk, hv = 2, 6
    q, k, v, g, beta, s0 = _gdn_inputs(t, hk, hv)
    dq, dk, dv, dg, db = (cp.asarray(a) for a in (q, k, v, g, beta))
    st, o = cp.asarray(s0), poisoned(cp, (t, hv, 128))
    delta_step(q=dq, k=dk, v=dv, g=dg, beta=db, state=st, o=o, k_heads=hk, v_heads=hv, rows=1, tokens=t)()
    want_s, want_o = st.get(), o.get()
    pieces = -(-t // 64)
    # scratch poisoned: pass 1 writes every value pass 2 reads (W, U' and M past the prompt's end included)
    w, u = cp.full(pieces * hv * 64 * 128, cp.nan, cp.float32), cp.full(pieces * hv * 64 * 128, cp.nan, cp.float32)
    m, gg = cp.full(pieces * hv * 64 * 64, cp.nan, cp.float32), cp.full(pieces * hv * 64, cp.nan, cp.float32)
    st, o = cp.asarray(s0), poisoned(cp, (t, hv, 128))
    chunk_prep(q=dq, k=dk, v=dv, g=dg, beta=db, w=w, u=u, m=m, gamma=gg, k_heads=hk, v_heads=hv, tokens=t)()
    chunk_scan(f"gdn_chunk_scan_tc<{rb}, 1>", q=dq, k=dk, w=w, u=u, m=m, gamma=gg, state=st, o=o, k_heads=hk,
               v_heads=hv, tokens=t)()
    check("gdn_chunked state", st.get(), want_s, **GDN_STATE)
    check("gdn_chunked out", o.get(), want_o, **ELEM)
