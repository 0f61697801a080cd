"""The dense MLP's launch plans on the fake CuPy (tests/fake_cupy.py): mlp_fused with the o-projection inside,
against the kernel-per-op MLP (the plan's mlp_fused off)."""
from cuda_smoke import CFG, cp, flat as _flat, on_gpu, weights as _weights  # noqa: F401


def _step(monkeypatch, pre2=False, **override):
    from engine.gpu_engine import build_engine
    from engine.gpu import launch as K

    on_gpu(monkeypatch, "sm_90", **override)
    monkeypatch.setattr(K, "resident_blocks", lambda name, block, smem=0: 1)
    args, w = _weights(CFG)
    ex = build_engine(args, w, CFG, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor
    if pre2:  # (the o-projections on gemv_rs_pre, as the 27B's table has them: the GDN layers' o input by chunks)
        ex.ctx.gemv_cfg = {(L["o"].fmt, L["o"].n, L["o"].k): {"pre2": True} for L in ex.layers}
        ex.ops = ex._plan()
    return args, ex, [getattr(getattr(op, "__self__", None), "_go", op) for op in _flat(ex.ops)]


def test_mlp_fused_plumbing(cp, monkeypatch):
    """The plan's mlp_fused: each dense layer's post-attention norm, gate|up, staging and down are one mlp_fused launch
    (1,024 threads, one block a multiprocessor, the residual buffers alternating as the norm kernels alternate them,
    chunk scales, the help words and their own barrier counter; the attention layers' o-projection inside it, from
    the combine's one-scale pairs); with mlp_fused off, the four kernels."""
    from engine.gpu import launch as K

    args, off_ex, off = _step(monkeypatch, mlp_fused=False)
    args, ex, on = _step(monkeypatch)
    layers = args.num_hidden_layers
    names_on, names_off = [getattr(op, "name", "") for op in on], [getattr(op, "name", "") for op in off]
    fused = [op for op in on if getattr(op, "name", "").startswith("mlp_fused<")]
    assert len(fused) == layers and not any(n.startswith("mlp_fused<") for n in names_off)
    assert names_off.count("stage_x_mb") == layers  # (gate|up, staging, down)
    norms = lambda names: sum(n.startswith("residual_rmsnorm") for n in names)  # noqa: E731
    assert norms(names_on) == norms(names_off) - layers
    n_attn = sum(L["kind"] == "full_attention" for L in ex.layers)
    assert sum(op.name.endswith(",true,true,true,3>") for op in fused) == n_attn  # (the o-projection inside)
    assert sum(op.name == "mlp_fused<0,1,1,1,true>" for op in fused) == layers - n_attn
    c = ex.ctx
    bufs = {c.x.data.ptr, c.x2.data.ptr}
    for op in fused:
        assert op.block == 1024 and op.grid == (K.sm_count(),) and op.smem == c.kpad_h * 6
        assert {int(op.args[0]), int(op.args[1])} == bufs  # reads one residual buffer, writes the other
        assert int(op.args[2]) == int(op.args[25]) == c.part.data.ptr
        assert int(op.args[18]) == c.stage_slot.data.ptr and int(op.args[13]) == c.act.data.ptr
        assert int(op.args[28]) == 0 and int(op.args[29]) == 7  # (no timestamps; local staging, the red barriers)
        assert int(op.args[30]) == ex.mlp.xsc_act.data.ptr  # (chunk scales)
        _, bar_help, help_ = ex.mlp.barriers[op.name.endswith(",3>")]  # (the launches with the o-projection: theirs)
        assert int(op.args[31]) == help_.data.ptr
        assert int(op.args[27]) == bar_help.data.ptr
    # the next norm reads what the fused launch wrote, and sums its planes
    i = names_on.index(fused[0].name)
    nxt = next(op for op in on[i + 1:] if getattr(op, "name", "").startswith("residual_rmsnorm"))
    assert int(nxt.args[0]) == int(fused[0].args[1]) and int(nxt.args[3]) == int(fused[0].args[24])


def test_mlp_fused_o_plumbing(cp, monkeypatch):
    """Where the GDN layers' o-projection takes chunk scales (gemv_rs_pre), it goes inside mlp_fused too, from the gated
    norm's chunk-scaled pairs: every layer one launch after its core, no o GEMV left."""
    from engine.gpu.gemv import GemvPlan

    args, ex, ops = _step(monkeypatch, pre2=True)
    fused = [op for op in ops if getattr(op, "name", "").startswith("mlp_fused<")]
    assert len(fused) == args.num_hidden_layers and all(op.name.endswith(",true,true,true,3>") for op in fused)
    o_ptrs = {L["o"].ptr(L["o"].base) for L in ex.layers}
    assert not any(isinstance(getattr(op, "__self__", None), GemvPlan) and int(op.__self__.args[0]) in o_ptrs
                   for op in _flat(ex.ops))
    gdn_fused = [op for op, L in zip(fused, ex.layers) if L["kind"] != "full_attention"]
    assert all(int(op.args[-1]) == 1 for op in gdn_fused)  # (chunk-scaled o input)


def test_mlp_fused_falls_back_where_no_block_fits(cp, monkeypatch):
    """Where the occupancy calculator fits no 1,024-thread block of mlp_fused, the dense MLP keeps the four kernels."""
    from engine.gpu_engine import build_engine
    from engine.gpu import launch as K

    def none_fit(name, block, smem=0):
        raise RuntimeError(f"{name}: no resident block")
    monkeypatch.setattr(K, "resident_blocks", none_fit)
    args, w = _weights(CFG)
    ex = build_engine(args, w, CFG, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor
    names = [getattr(getattr(getattr(op, "__self__", None), "_go", op), "name", "") for op in _flat(ex.ops)]
    assert not any(n.startswith("mlp_fused<") for n in names)
    assert sum(n.startswith("residual_rmsnorm") for n in names) == 2 * args.num_hidden_layers + 1
