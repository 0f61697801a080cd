"""The Gated DeltaNet layers' launch plans on the fake CuPy (tests/fake_cupy.py, kernels are no-ops): the projections
(merged q|k|v|z, the conv epilogue), the delta rule's forms (rows a warp, the cluster form with the gated norm, the
fused tail) and the gated norm's chunk staging. Their numbers are checked by tests/gpu (test_gpu_engine.py,
test_gated_chunks.py, test_decode_paths.py, test_gpu_engine_moe.py)."""
import pytest

from cuda_smoke import CFG, cp, flat as _flat, moe_cfg, weights as _weights  # noqa: F401


@pytest.mark.parametrize("rw", [2, 4])
def test_gdn_delta_rw_plumbing(cp, monkeypatch, rw):
    """NINFER_GDN_DELTA_RW: gdn_delta_raw_rw<RW> with gdn_delta_raw's arguments on a grid RW times smaller."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    args, w = _weights(CFG)
    monkeypatch.setattr(CudaQwen35, "GDN_FUSED", False)

    def deltas(v):
        monkeypatch.setattr(CudaQwen35, "GDN_DELTA_RW", v)
        ops = _flat(build_engine(args, w, CFG, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor.ops)
        return [op for op in ops if getattr(op, "name", "").startswith("gdn_delta_raw")]

    one, many = deltas(1), deltas(rw)
    assert one and {op.name for op in many} == {f"gdn_delta_raw_rw<{rw}>"} and len(many) == len(one)
    assert all(b.grid == (-(-a.grid[0] // rw), a.grid[1]) and len(a.args) == len(b.args)
               and [int(x) for x in a.args[-3:]] == [int(x) for x in b.args[-3:]] for a, b in zip(one, many))


def test_gdn_gated_cl_plumbing(cp, monkeypatch):
    """NINFER_GDN_GATED_CL (on by default) on a cluster-capable GPU, with GDN_DELTA_RW 4: each GDN layer's gdn_delta_raw_rw<4> and
    gated_rmsnorm_chunks are one gdn_delta_gated_cl (grid (Hv * 4, M), 256 threads: a cluster of 4 blocks a value head),
    its arguments the delta rule's, then the gated norm's after its o and Hv, then GDN_STATE_EARLY; with RW 2 or without
    clusters, the two."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    args, w = _weights(CFG)
    monkeypatch.setattr(CudaQwen35, "GDN_FUSED", False)
    monkeypatch.setattr(CudaQwen35, "GDN_AB_IN", 0)
    keep = ("gdn_delta", "gated_rmsnorm")

    def gdn(on, rw=4, capable=True):
        monkeypatch.setattr(CudaQwen35, "GDN_GATED_CL", on)
        monkeypatch.setattr(CudaQwen35, "GDN_DELTA_RW", rw)
        monkeypatch.setattr(K, "cluster_capable", lambda: capable)
        ex = build_engine(args, w, CFG, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor
        ex.gemv_cfg = {(L["o"].fmt, L["o"].n, L["o"].k): {"pre2": True} for L in ex.layers}
        ex.ops = ex._plan()  # (the o-projections on gemv_rs_pre: the gated norm stages chunks)
        return [op for op in _flat(ex.ops) if getattr(op, "name", "").startswith(keep)]

    def scalars(a):
        return [x for x in a if isinstance(x, (int, float))]

    base, cl = gdn(False), gdn(True)
    assert [op.name for op in base] == ["gdn_delta_raw_rw<4>", "gated_rmsnorm_chunks"] * len(cl)
    assert cl and {op.name for op in cl} == {"gdn_delta_gated_cl"}
    hv = args.linear_num_value_heads
    for op, d, g in zip(cl, base[::2], base[1::2]):
        assert op.grid == (hv * 4, d.grid[1]) and op.block == 256
        assert len(op.args) == len(d.args) + len(g.args) + 3  # (+ GDN_STATE_EARLY, then GDN_AB_IN's four)
        assert scalars(op.args) == scalars(d.args) + scalars(g.args[1:6] + g.args[7:]) and int(op.args[-5]) == 1
        assert [int(a) for a in op.args[-4:]] == [0] * 4  # (GDN_AB_IN off)
    assert [op.name for op in gdn(True, rw=2)] == ["gdn_delta_raw_rw<2>", "gated_rmsnorm_chunks"] * len(cl)
    monkeypatch.setattr(CudaQwen35, "GDN_AB_IN", 1)  # the a|b projection inside: the weights, x, its stride and H
    monkeypatch.setattr(CudaQwen35, "GDN_GATED_CL", True)
    monkeypatch.setattr(CudaQwen35, "GDN_DELTA_RW", 4)
    monkeypatch.setattr(K, "cluster_capable", lambda: True)
    ex = build_engine(args, w, CFG, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor
    ex.gemv_cfg = {(L["o"].fmt, L["o"].n, L["o"].k): {"pre2": True} for L in ex.layers}
    ex.ops = ex._plan()
    ops = _flat(ex.ops)
    ab_in = [op for op in ops if getattr(op, "name", "") == "gdn_delta_gated_cl"]
    gdn_layers = [L for L in ex.layers if "ab" in L]
    assert len(ab_in) == len(gdn_layers) and all(int(op.args[-1]) == args.hidden_size for op in ab_in)
    assert [int(op.args[-4]) for op in ab_in] == [L["ab"].ptr(L["ab"].base) for L in gdn_layers]
    assert all(int(op.args[-3]) == ex.xn.data.ptr and int(op.args[-2]) == ex.xn.shape[1] for op in ab_in)
    launched_bf16 = [op for op in ops if getattr(op, "name", "").startswith("gemv_bf16")]
    assert not any(int(op.args[0]) == L["ab"].ptr(L["ab"].base) for op in launched_bf16 for L in gdn_layers)
    assert [op.name for op in gdn(True, capable=False)] == [op.name for op in base]


def test_gdn_merge_plumbing(cp, monkeypatch):
    """NINFER_GDN_MERGE (on by default): GDN layers whose q, k, v and z share a row-split format hold them as one
    object (q|k and v|z its views, the same bytes counted once) and project it with one conv-epilogue GEMV into
    one [q|k|v|z] row, which the delta rule and the gated norm read at their offsets; mixed formats (the dense
    recipe: q|k q4, v|z q5) keep two GEMVs."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops.gemv_plan import GemvPlan

    assert CudaQwen35.GDN_MERGE
    cfg = moe_cfg()
    args, w = _weights(cfg)

    def build(c, weights, on):
        monkeypatch.setattr(CudaQwen35, "GDN_MERGE", on)
        return build_engine(args if c is cfg else _weights(c)[0], weights, c, max_context=256, prefill_cols=1,
                            prefill_gemm=0).model.executor

    off, on = build(cfg, w, False), build(cfg, w, True)
    gdn = [L for L in on.layers if L["kind"] != "full_attention"]
    assert gdn and all(L["qk"].buf is L["qkvz"].buf and L["vz"].buf is L["qkvz"].buf for L in gdn)
    assert on.weight_bytes() == off.weight_bytes()

    def conv_plans(ex):
        return [op.__self__ for op in _flat(ex.ops) if isinstance(getattr(op, "__self__", None), GemvPlan)
                and op.__self__.epi == 4]

    q, m = conv_plans(off), conv_plans(on)
    assert len(q) == 2 * len(gdn) and len(m) == len(gdn)
    # (conv_w, conv_st, C, base, rows) follow the 20 common arguments: every channel of q|k|v from row 0
    assert all(p.w.n == gdn[0]["qkvz"].n and int(p.args[22]) == int(p.args[24]) > 0 == int(p.args[23]) for p in m)
    assert sorted(int(p.args[23]) for p in q[:2]) == [0, 512]  # separate: v's channels after q|k's (2 x 2 x 128)
    delta = [op for op in _flat(on.ops) if getattr(op, "name", "") == "gdn_delta_raw"]
    assert all(int(op.args[0]) == on.buf_qkvz.data.ptr for op in delta)
    args_d, wd = _weights(CFG)
    dense = build(CFG, wd, True)
    assert not any("qkvz" in L for L in dense.layers) and len(conv_plans(dense)) == 2 * sum(
        L["kind"] != "full_attention" for L in dense.layers)


def test_gdn_fused_off_keeps_two_launches(cp, monkeypatch):
    """NINFER_GDN_FUSED=0 (the default): the decode step keeps gdn_delta and gated_rmsnorm_stage; with it on,
    the columns step still never fuses (its delta rule runs T tokens a launch)."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    args, w = _weights(CFG)
    monkeypatch.setattr(CudaQwen35, "GDN_FUSED", False)
    monkeypatch.setattr(CudaQwen35, "GDN_PREP_FUSED", False)
    eng = build_engine(args, w, CFG, max_context=256, prefill_cols=8, prefill_gemm=0)
    names = {getattr(op, "name", "") for op in _flat(eng.model.executor.ops)}
    assert {"gdn_delta", "gated_rmsnorm_stage"} <= names and "gdn_delta_gated_stage" not in names
    monkeypatch.setattr(CudaQwen35, "GDN_FUSED", True)
    eng = build_engine(args, w, CFG, max_context=256, prefill_cols=8, prefill_gemm=0)
    assert "gdn_delta_gated_stage" in {getattr(op, "name", "") for op in _flat(eng.model.executor.ops)}
    cols = {getattr(op, "name", "") for op in _flat(eng.model.cols.ops)}
    assert "gated_rmsnorm_stage" in cols and "gdn_delta_gated_stage" not in cols
    eng.prefill(list(range(1, 20)))
    assert len(eng.decode_greedy(3, 2)) == 2


def test_gated_chunk_plumbing(cp, monkeypatch):
    """NINFER_GATED_CHUNK=1: where a GDN layer's o-projection runs on gemv_rs_pre (the tuning table's pre2), its gated
    norm is gated_rmsnorm_chunks (a warp a head, the chunk scales into xsc_att) and the o-projection the XS form
    reading them; elsewhere (and off) gated_rmsnorm_stage as before; attention layers keep theirs."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    args, w = _weights(CFG)
    monkeypatch.setattr(CudaQwen35, "GDN_FUSED", False)
    monkeypatch.setattr(CudaQwen35, "MLP_FUSED_O", 0)  # (the o-projection as its own GEMV; inside mlp_fused: below)
    monkeypatch.setattr(CudaQwen35, "ATTN_CHUNK", 0)  # (the attention layers' chunk staging: its own test)
    monkeypatch.setattr(CudaQwen35, "GDN_GATED_CL", 0)  # (the chunk staging inside the delta rule's launch: its own)

    def names(on, pre2):
        monkeypatch.setattr(CudaQwen35, "GATED_CHUNK", on)
        ex = build_engine(args, w, CFG, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor
        if pre2:
            ex.gemv_cfg = {(L["o"].fmt, L["o"].n, L["o"].k): {"pre2": True} for L in ex.layers}
            ex.ops = ex._plan()
        return ex, [getattr(getattr(op, "__self__", None), "_go", op) for op in _flat(ex.ops)]

    gdn = sum(L["kind"] != "full_attention" for L in names(0, False)[0].layers)
    for on, pre2 in ((0, True), (1, False)):
        _, ops = names(on, pre2)
        assert sum(getattr(op, "name", "") == "gated_rmsnorm_chunks" for op in ops) == 0
    ex, ops = names(1, True)
    chunks = [op for op in ops if getattr(op, "name", "") == "gated_rmsnorm_chunks"]
    xs = [op for op in ops if getattr(op, "name", "").endswith(",false,true>")]
    assert len(chunks) == len(xs) == gdn > 0
    assert all(int(op.args[-1]) == ex.xsc_att.data.ptr and op.grid == (-(-ex.Hv // 8), 1) for op in chunks)
    assert all(int(op.args[-1]) == ex.xsc_att.data.ptr for op in xs)
    assert not any(getattr(op, "name", "") == "gated_rmsnorm_stage" for op in ops)


def test_gdn_prep_in_the_projections_epilogue(cp, monkeypatch):
    """NINFER_GDN_PREP_FUSED (the default): no gdn_prep launch in the decode step; the q|k and v|z GEMVs take
    the conv epilogue over their channels of the conv history (q|k from channel 0, v from 2 Hk x 128, z rows
    plain) and gdn_delta_raw reads their outputs; the columns step keeps its own prep kernel."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    monkeypatch.setattr(CudaQwen35, "GDN_PREP_FUSED", True)
    monkeypatch.setattr(CudaQwen35, "GDN_DELTA_RW", 1)  # (state rows a warp: test_gdn_delta_rw_plumbing)
    args, w = _weights(CFG)
    eng = build_engine(args, w, CFG, max_context=256, prefill_cols=8, prefill_gemm=0)
    ex = eng.model.executor
    ops = _flat(ex.ops)
    names = [getattr(op, "name", "") for op in ops]
    n_gdn = sum(1 for L in ex.layers if L["kind"] != "full_attention")
    assert "gdn_prep" not in names and names.count("gdn_delta_raw") == n_gdn
    conv = [op.__self__ for op in ops if getattr(op, "__self__", None) is not None
            and getattr(op.__self__, "epi", None) == K.EPI["conv"]]
    hk, hv = args.linear_num_key_heads, args.linear_num_value_heads
    c = (2 * hk + hv) * 128
    assert sorted((int(p.args[-3]), int(p.args[-2]), int(p.args[-1])) for p in conv) == \
        sorted([(c, 0, 2 * hk * 128), (c, 2 * hk * 128, hv * 128)] * n_gdn)
    assert all(p.splits == 1 for p in conv)
    cols = {getattr(op, "name", "") for op in _flat(eng.model.cols.ops)}
    assert "gdn_delta_raw" not in cols and any(n.startswith("gdn_prep") for n in cols)
    eng.prefill(list(range(1, 20)))
    assert len(eng.decode_greedy(3, 2)) == 2


def test_conv_epilogue_is_refused_where_it_is_not_compiled(cp):
    """The GDN conv epilogue exists only in the row-split GEMVs for one token: a bf16 matrix or several token
    rows raise instead of storing the plain product, and an `mma` tuning entry is not taken with it."""
    from engine.gpu_engine import build_engine
    from engine.ops.gemv_plan import GemvPlan

    args, w = _weights(CFG)
    ex = build_engine(args, w, CFG, max_context=256, prefill_cols=8, prefill_gemm=0).model.executor
    L = next(L for L in ex.layers if L["kind"] != "full_attention")
    hk, hv = args.linear_num_key_heads, args.linear_num_value_heads
    conv = (L["conv"], L["conv_state"], (2 * hk + hv) * 128, 0, 2 * hk * 128)
    xpre = (ex.xh_n, ex.xinv_n)
    with pytest.raises(ValueError, match="one token"):
        GemvPlan(L["qk"], ex.xn, ex.xn.shape[-1], ex.buf_a, ex.buf_a.shape[-1], m=2, epi="conv", xpre=xpre, conv=conv)
    assert L["ab"].fmt == "bf16"
    with pytest.raises(ValueError, match="row-split"):
        GemvPlan(L["ab"], ex.xn, ex.xn.shape[-1], ex.ab, ex.ab.shape[-1], epi="conv", conv=conv)
    qk = L["qk"]
    ex.gemv_cfg[(qk.fmt, qk.n, qk.k)] = dict(rows=1, unroll=2, mma=(1, 1, 1))
    launch = ex._gemv(qk, ex.xn, ex.buf_a, xpre=xpre, epi="conv", conv=conv)
    assert launch.__self__._go.name.endswith(",true>") and launch.__self__.splits == 1
