"""The Gated DeltaNet layers' launch plans on the fake CuPy (tests/fake_cupy.py, kernels are no-ops): the projections
(merged q|k|v|z, the conv epilogue), the plan's delta rule (the cluster form with the gated norm on sm_90, the delta
rule and gated_rmsnorm_chunks elsewhere) and the gated norm's chunk staging. Their numbers are checked by tests/gpu
(test_gpu_engine.py, test_gated_chunks.py, test_decode_paths.py, test_gpu_engine_moe.py)."""
import numpy as np
import pytest

from cuda_smoke import CFG, cp, flat as _flat, moe_cfg, on_gpu, weights as _weights  # noqa: F401


def _gdn_step(monkeypatch, gpu, **override):
    """The tiny model's decode step under `gpu`'s plan, its o-projections on gemv_rs_pre (as the 27B's tuning table has
    them), so that the gated norm stages chunks."""
    from engine.gpu_engine import build_engine

    on_gpu(monkeypatch, gpu, **override)
    args, w = _weights(CFG)
    ex = build_engine(args, w, CFG, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor
    ex.ctx.gemv_cfg = {(L["o"].fmt, L["o"].n, L["o"].k): {"pre2": True} for L in ex.layers}
    ex.ops = ex._plan()
    return args, ex, _flat(ex.ops)


def test_gdn_gated_cl_plumbing(cp, monkeypatch):
    """sm_90: each GDN layer's delta rule and gated norm are one gdn_delta_gated_cl (grid (Hv * 4, M), 256 threads: a
    cluster of 4 blocks a value head), its arguments the delta rule's, then the gated norm's after its o and Hv, then
    the early-state flag and the a|b projection's (its bf16 weights, x, x's stride, H); no a|b GEMV. sm_86: the two
    launches, gdn_delta_raw_rw<4> and gated_rmsnorm_chunks, and the a|b GEMV."""
    keep = ("gdn_delta", "gated_rmsnorm")
    args, base_ex, base_ops = _gdn_step(monkeypatch, "sm_86")
    base = [op for op in base_ops if getattr(op, "name", "").startswith(keep)]
    args, ex, ops = _gdn_step(monkeypatch, "sm_90")
    cl = [op for op in ops if getattr(op, "name", "").startswith(keep)]
    gdn_layers = [L for L in ex.layers if "ab" in L]
    assert [op.name for op in base] == ["gdn_delta_raw_rw<4>", "gated_rmsnorm_chunks"] * len(gdn_layers)
    assert {op.name for op in cl} == {"gdn_delta_gated_cl"} and len(cl) == len(gdn_layers)

    def scalars(a):  # (the int and float arguments: sizes, strides, scales)
        return [float(x) for x in a if isinstance(x, (np.int32, np.float32))]

    hv = args.linear_num_value_heads
    for op, d, g in zip(cl, base[::2], base[1::2]):
        assert op.grid == (hv * 4, d.grid[1]) and op.block == 256
        assert len(op.args) == len(d.args) + len(g.args) + 3  # (+ the early-state flag, then the a|b projection's four)
        assert scalars(op.args[:-4]) == scalars(d.args) + scalars(g.args[1:6] + g.args[7:]) + [1]
    assert ex.plan.gdn_ab_in and not base_ex.plan.gdn_ab_in
    assert all(int(op.args[-1]) == args.hidden_size for op in cl)
    assert [int(op.args[-4]) for op in cl] == [L["ab"].ptr(L["ab"].base) for L in gdn_layers]
    assert all(int(op.args[-3]) == ex.ctx.xn.data.ptr and int(op.args[-2]) == ex.ctx.xn.shape[1] for op in cl)

    def ab_gemvs(e, ops_):  # (the bf16 GEMVs of the executor's a|b weights)
        ab = {L["ab"].ptr(L["ab"].base) for L in e.layers if "ab" in L}
        plans = [getattr(op, "__self__", None) for op in ops_]
        return [p for p in plans if p is not None and getattr(p, "w", None) is not None and p.w.fmt == "bf16"
                and int(p.args[0]) in ab]

    assert not ab_gemvs(ex, ops) and len(ab_gemvs(base_ex, base_ops)) == len(gdn_layers)
    args, off, off_ops = _gdn_step(monkeypatch, "sm_90", gdn_ab_in=False)  # (the a|b GEMV on the side branch)
    assert len(ab_gemvs(off, off_ops)) == len(gdn_layers)
    assert all(int(a) == 0 for op in off_ops if getattr(op, "name", "") == "gdn_delta_gated_cl" for a in op.args[-4:])


def test_gdn_merge_plumbing(cp, monkeypatch):
    """GDN layers whose q, k, v and z share a row-split format (the MoE recipe's w8) hold them as one object (q|k and
    v|z its views, the same bytes counted once) and project it with one conv-epilogue GEMV into one [q|k|v|z] row,
    which the delta rule reads at its offsets; mixed formats (the dense recipe: q|k q4, v|z q5) keep two GEMVs."""
    from engine.gpu_engine import build_engine
    from engine.gpu.gemv import GemvPlan

    on_gpu(monkeypatch, "sm_86", moe_fused=False)
    cfg = moe_cfg()
    args, w = _weights(cfg)
    on = build_engine(args, w, cfg, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor
    gdn = [L for L in on.layers if L["kind"] != "full_attention"]
    assert gdn and all(L["qk"].buf is L["qkvz"].buf and L["vz"].buf is L["qkvz"].buf for L in gdn)
    assert on.weight_bytes() == sum(m.nbytes for m in on._matrices())

    def conv_plans(ex):
        return [op.__self__ for op in _flat(ex.ops) if isinstance(getattr(op, "__self__", None), GemvPlan)
                and op.__self__.epi == 4]

    m = conv_plans(on)
    assert len(m) == len(gdn)
    # (conv_w, conv_st, C, base, rows) follow the 20 common arguments: every channel of q|k|v from row 0
    assert all(p.w.n == gdn[0]["qkvz"].n and int(p.args[22]) == int(p.args[24]) > 0 == int(p.args[23]) for p in m)
    delta = [op for op in _flat(on.ops) if getattr(op, "name", "") == "gdn_delta_raw_rw<4>"]
    assert delta and all(int(op.args[0]) == on.ctx.buf_qkvz.data.ptr for op in delta)
    args_d, wd = _weights(CFG)
    dense = build_engine(args_d, wd, CFG, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor
    q = conv_plans(dense)
    n_dense = sum(L["kind"] != "full_attention" for L in dense.layers)
    assert not any("qkvz" in L for L in dense.layers) and len(q) == 2 * n_dense
    assert sorted(int(p.args[23]) for p in q[:2]) == [0, 512]  # separate: v's channels after q|k's (2 x 2 x 128)


def test_gdn_prep_in_the_projections_epilogue(cp, monkeypatch):
    """No gdn_prep launch in the decode step: the q|k and v|z GEMVs take the conv epilogue over their channels of the
    conv history (q|k from channel 0, v from 2 Hk x 128, z rows plain) and the delta rule reads their outputs; the
    columns step keeps its own prep kernel."""
    from engine.gpu_engine import build_engine
    from engine.gpu import launch as K

    on_gpu(monkeypatch, "sm_90")
    args, w = _weights(CFG)
    eng = build_engine(args, w, CFG, max_context=256, prefill_cols=8, prefill_gemm=0)
    ex = eng.model.executor
    ops = _flat(ex.ops)
    names = [getattr(op, "name", "") for op in ops]
    n_gdn = sum(1 for L in ex.layers if L["kind"] != "full_attention")
    assert "gdn_prep" not in names and names.count("gdn_delta_raw_rw<4>") == n_gdn
    conv = [op.__self__ for op in ops if getattr(op, "__self__", None) is not None
            and getattr(op.__self__, "epi", None) == K.EPI["conv"]]
    hk, hv = args.linear_num_key_heads, args.linear_num_value_heads
    c = (2 * hk + hv) * 128
    assert sorted((int(p.args[-3]), int(p.args[-2]), int(p.args[-1])) for p in conv) == \
        sorted([(c, 0, 2 * hk * 128), (c, 2 * hk * 128, hv * 128)] * n_gdn)
    assert all(p.splits == 1 for p in conv)
    cols = {getattr(op, "name", "") for op in _flat(eng.model.cols.ops)}
    assert "gdn_delta_raw_rw<4>" not in cols and any(n.startswith("gdn_prep") for n in cols)
    eng.prefill(list(range(1, 20)))
    assert len(eng.decode_greedy(3, 2)) == 2


def test_conv_epilogue_is_refused_where_it_is_not_compiled(cp):
    """The GDN conv epilogue exists only in the row-split GEMVs for one token: a bf16 matrix or several token
    rows raise instead of storing the plain product."""
    from engine.gpu_engine import build_engine
    from engine.gpu.gemv import GemvPlan

    args, w = _weights(CFG)
    ex = build_engine(args, w, CFG, max_context=256, prefill_cols=8, prefill_gemm=0).model.executor
    L = next(L for L in ex.layers if L["kind"] != "full_attention")
    hk, hv = args.linear_num_key_heads, args.linear_num_value_heads
    conv = (L["conv"], L["conv_state"], (2 * hk + hv) * 128, 0, 2 * hk * 128)
    c = ex.ctx
    xpre = (c.xh_n, c.xinv_n)
    with pytest.raises(ValueError, match="one token"):
        GemvPlan(L["qk"], c.xn, c.xn.shape[-1], c.buf_a, c.buf_a.shape[-1], m=2, epi="conv", xpre=xpre, conv=conv)
    assert L["ab"].fmt == "bf16"
    with pytest.raises(ValueError, match="row-split"):
        GemvPlan(L["ab"], c.xn, c.xn.shape[-1], c.ab, c.ab.shape[-1], epi="conv", conv=conv)
    launch = c.gemv(L["qk"], c.xn, c.buf_a, xpre=xpre, epi="conv", conv=conv)
    assert launch.__self__._go.name.endswith(",true>") and launch.__self__.splits == 1
