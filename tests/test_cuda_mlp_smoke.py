"""The dense MLP's launch plans on the fake CuPy (tests/fake_cupy.py): mlp_fused with its forms (chunk
scales, help, the o-projection inside) and gemv_tma, against the kernel-per-op plan."""
from cuda_smoke import CFG, cp, flat as _flat, weights as _weights  # noqa: F401


def test_mlp_tma_plumbing(cp, monkeypatch):
    """NINFER_MLP_TMA (sm_90): each dense layer's post-attention norm, gate|up, stage_x_amax and down become two
    gemv_tma launches (the norm and the staging inside them, producer warp + consumer warps, one block an SM),
    the residual buffers alternating as the norm kernels alternate them; off, the four kernels as before."""
    from engine.models.qwen3_5_cuda import CudaQwen35 as _C

    monkeypatch.setattr(_C, "MLP_FUSED", 0)  # (the four-kernel MLP)
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    args, w = _weights(CFG)
    monkeypatch.setattr(K, "tma_capable", lambda: True)

    def ops(on):
        monkeypatch.setattr(CudaQwen35, "MLP_TMA", on)
        ex = build_engine(args, w, CFG, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor
        return ex, [getattr(getattr(op, "__self__", None), "_go", op) for op in _flat(ex.ops)]  # (GEMV plans' launches)

    ex_off, off = ops(False)
    ex_on, on = ops(True)
    names_on = [getattr(op, "name", "") for op in on]
    tma = [op for op in on if getattr(op, "name", "").startswith("gemv_tma<")]
    layers = args.num_hidden_layers
    assert len(tma) == 2 * layers and "stage_x_amax" not in names_on
    norms = lambda names: sum(n.startswith("residual_rmsnorm") for n in names)  # noqa: E731
    assert norms(names_on) == norms([getattr(op, "name", "") for op in off]) - layers
    assert len(on) == len(off) - 2 * layers
    for gu, dn in zip(tma[::2], tma[1::2]):
        assert gu.block == (CudaQwen35.MLP_TMA_NW + 1) * 32 and gu.grid[0] <= K.sm_count()
        assert int(gu.args[15]) == 1 and int(dn.args[15]) == 2  # the norm prologue, then the amax one
        assert int(dn.args[6]) == ex_on.act.data.ptr and int(dn.args[24]) == ex_on.stage_slot.data.ptr
    # the residual: layer l's gate|up reads what the norm before it wrote and writes the other buffer
    bufs = {ex_on.x.data.ptr, ex_on.x2.data.ptr}
    assert all({int(op.args[16]), int(op.args[17])} == bufs for op in tma[::2])
    # NINFER_MLP_TMA=2: the down-projection only (the norm and gate|up kernels kept, stage_x_amax gone)
    ex2, two = ops(2)
    names2 = [getattr(op, "name", "") for op in two]
    assert sum(n.startswith("gemv_tma<") for n in names2) == layers and "stage_x_amax" not in names2
    assert norms(names2) == norms([getattr(op, "name", "") for op in off]) and len(two) == len(off) - layers


def test_mlp_fused_plumbing(cp, monkeypatch):
    """NINFER_MLP_FUSED: each dense layer's post-attention norm, gate|up, staging and down become one mlp_fused
    launch (1,024 threads, one block a multiprocessor, the barrier counter, the residual buffers alternating as the
    norm kernels alternate them); off, the four kernels as before."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    args, w = _weights(CFG)
    monkeypatch.setattr(K, "resident_blocks", lambda name, block, smem=0: 1)
    monkeypatch.setattr(CudaQwen35, "MLP_FUSED_CHUNK", 0)  # (one scale for the down's input; chunked below)
    monkeypatch.setattr(CudaQwen35, "MLP_FUSED_HELP", 0)  # (the leftover chunks by their blocks; helped below)
    monkeypatch.setattr(CudaQwen35, "MLP_FUSED_O", 0)  # (the o-projections as their own GEMVs: test_mlp_fused_o_plumbing)

    def ops(on):
        monkeypatch.setattr(CudaQwen35, "MLP_FUSED", on)
        ex = build_engine(args, w, CFG, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor
        return ex, [getattr(getattr(op, "__self__", None), "_go", op) for op in _flat(ex.ops)]

    _, off = ops(0)
    ex, on = ops(1)
    layers = args.num_hidden_layers
    names_on, names_off = [getattr(op, "name", "") for op in on], [getattr(op, "name", "") for op in off]
    fused = [op for op in on if getattr(op, "name", "").startswith("mlp_fused<")]
    stages = lambda names: sum(n.startswith("stage_x") for n in names)  # noqa: E731
    assert len(fused) == layers and stages(names_on) == stages(names_off) - layers
    norms = lambda names: sum(n.startswith("residual_rmsnorm") for n in names)  # noqa: E731
    assert norms(names_on) == norms(names_off) - layers and len(on) == len(off) - 3 * layers
    bufs = {ex.x.data.ptr, ex.x2.data.ptr}
    for op in fused:
        assert op.block == 1024 and op.grid == (K.sm_count(),)
        assert {int(op.args[0]), int(op.args[1])} == bufs  # reads one residual buffer, writes the other
        assert int(op.args[2]) == int(op.args[25]) == ex.part.data.ptr and int(op.args[27]) == ex.mlp_bar.data.ptr
        assert int(op.args[18]) == ex.stage_slot.data.ptr and int(op.args[13]) == ex.act.data.ptr
    # the next norm reads what the fused launch wrote, and sums its planes
    i = names_on.index(fused[0].name)
    nxt = next(op for op in on[i + 1:] if getattr(op, "name", "").startswith("residual_rmsnorm"))
    assert int(nxt.args[0]) == int(fused[0].args[1]) and int(nxt.args[3]) == int(fused[0].args[24])
    # (no timestamps; local staging, bit 2 of the same word: the light grid barriers, bit 4 their red form, with
    # MLP_FUSED_LIGHT_BAR = 2, the default)
    assert all(int(op.args[28]) == 0 and int(op.args[29]) == 7 for op in fused)
    for light, bits in ((0, 1), (1, 3)):
        monkeypatch.setattr(CudaQwen35, "MLP_FUSED_LIGHT_BAR", light)
        assert all(int(op.args[29]) == bits for op in ops(1)[1] if getattr(op, "name", "").startswith("mlp_fused<"))
    monkeypatch.setattr(CudaQwen35, "MLP_FUSED_LIGHT_BAR", 2)
    assert all(op.smem == max(ex.kpad_h * 6, ex.kpad_act * 2) for op in fused)
    assert all(int(op.args[30]) == 0 for op in fused)  # (no chunk scales)
    monkeypatch.setattr(CudaQwen35, "MLP_FUSED_CHUNK", 1)
    ex3, three = ops(1)
    chunked = [op for op in three if getattr(op, "name", "").startswith("mlp_fused<")]
    assert len(chunked) == layers and all(int(op.args[30]) == ex3.xsc_act.data.ptr for op in chunked)
    assert all(op.smem == ex3.kpad_h * 6 for op in chunked)
    assert all(int(op.args[31]) == 0 for op in chunked)  # (no help)
    monkeypatch.setattr(CudaQwen35, "MLP_FUSED_HELP", 1)
    ex4, four = ops(1)
    helped = [op for op in four if getattr(op, "name", "").startswith("mlp_fused<")]
    assert len(helped) == layers and all(int(op.args[31]) == ex4.mlp_help.data.ptr for op in helped)
    assert all(int(op.args[27]) == ex4.mlp_bar_help.data.ptr for op in helped)  # (its own barrier counter)
    monkeypatch.setattr(CudaQwen35, "MLP_FUSED_HELP", 0)
    monkeypatch.setattr(K, "MLP_FUSED_CHUNKS", 0)  # (a block would own more chunks than its row holds: one scale)
    _, one = ops(1)
    fused1 = [op for op in one if getattr(op, "name", "").startswith("mlp_fused<")]
    assert len(fused1) == layers and all(int(op.args[30]) == 0 and not op.name.endswith(",true>") for op in fused1)


def test_mlp_fused_o_plumbing(cp, monkeypatch):
    """NINFER_MLP_FUSED_O=1: where a GDN layer's o-projection takes the gated norm's chunk scales (gemv_rs_pre, the
    table's pre2), it runs inside that layer's mlp_fused launch (mlp_fused<..., true, true>: the o weights, the gated
    norm's pairs and chunk scales, its splits as the norm's planes, barrier counter and help words of its own), its
    GEMV gone; attention layers keep their o-projection GEMV and the two-flag launch; off, nothing changes."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K
    from engine.ops.gemv_plan import prestaged_slices

    args, w = _weights(CFG)
    monkeypatch.setattr(K, "resident_blocks", lambda name, block, smem=0: 1)
    monkeypatch.setattr(CudaQwen35, "GDN_FUSED", False)
    monkeypatch.setattr(CudaQwen35, "MLP_FUSED_OU", 2)  # (the defaults, OU 3 and O_ATTN, below)
    monkeypatch.setattr(CudaQwen35, "MLP_FUSED_O_ATTN", 0)
    monkeypatch.setattr(CudaQwen35, "ATTN_CHUNK", 0)  # (with it the attention layers' o-projection goes in too)

    def ops(on):
        monkeypatch.setattr(CudaQwen35, "MLP_FUSED_O", on)
        ex = build_engine(args, w, CFG, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor
        ex.gemv_cfg = {**ex.gemv_cfg, **{(L["o"].fmt, L["o"].n, L["o"].k): {"pre2": True} for L in ex.layers}}
        ex.ops = ex._plan()
        return ex, [getattr(getattr(op, "__self__", None), "_go", op) for op in _flat(ex.ops)]

    _, off = ops(0)
    ex, on = ops(1)
    gdn = [L for L in ex.layers if L["kind"] != "full_attention"]
    o_ptrs = {int(L["o"].ptr(L["o"].base)) for L in gdn}
    assert gdn and not any(getattr(op, "name", "").endswith(",true,true>") for op in off)
    fo = [op for op in on if getattr(op, "name", "").endswith(",true,true>")]
    assert len(fo) == len(gdn) and len(on) == len(off) - len(gdn)
    assert not any(int(getattr(op, "args", (0,))[0]) in o_ptrs for op in on if getattr(op, "name", "").startswith("gemv"))
    u4ps, osplits = prestaged_slices(gdn[0]["o"].gpr * 2, CudaQwen35.MLP_FUSED_O_SPLITS)
    for op in fo:
        a = [int(v) for v in op.args]
        assert a[32] in o_ptrs and a[35:38] == [gdn[0]["o"].gpr, u4ps, osplits] and a[3] == osplits
        assert a[38] == ex.xh_att.data.ptr and a[39] == ex.xsc_att.data.ptr and a[2] == ex.part.data.ptr
        assert a[27] == ex.mlp_bar_help_o.data.ptr and a[31] == ex.mlp_help_o.data.ptr
    plain = [op for op in on if getattr(op, "name", "").startswith("mlp_fused<") and op not in fo]
    assert len(plain) == len(ex.layers) - len(gdn)
    assert all(int(op.args[27]) == ex.mlp_bar_help.data.ptr and int(op.args[32]) == 0 for op in plain)
    assert all(int(op.args[40]) == 1 for op in fo)  # (chunk scales)
    monkeypatch.setattr(CudaQwen35, "MLP_FUSED_XW", 0)  # (the norm's x and weight loaded after the o barrier)
    _, xw = ops(1)
    assert [getattr(op, "name", "") for op in xw] == [
        getattr(op, "name", "").replace(",true,true,true>", ",true,true>") for op in on]
    monkeypatch.setattr(CudaQwen35, "MLP_FUSED_XW", 1)
    monkeypatch.setattr(CudaQwen35, "MLP_FUSED_OU", 3)  # (the o-projection's loads in flight)
    _, ou = ops(1)
    assert sum(getattr(op, "name", "").endswith(",true,true,true,3>") for op in ou) == len(gdn)
    monkeypatch.setattr(CudaQwen35, "MLP_FUSED_OU", 2)
    monkeypatch.setattr(CudaQwen35, "MLP_FUSED_O_ATTN", 1)  # (the attention layers' o-projection too, one scale)
    ex5, att = ops(1)
    fa = [op for op in att if getattr(op, "name", "").endswith(",true,true,true>")]
    assert len(fa) == len(ex5.layers) and len(att) == len(off) - len(ex5.layers)
    one = [op for op in fa if int(op.args[40]) == 0]
    assert len(one) == len(ex5.layers) - len(gdn) and all(int(op.args[39]) == ex5.xinv_att.data.ptr for op in one)


def test_mlp_fused_falls_back_where_no_block_fits(cp, monkeypatch):
    """Where the occupancy calculator fits no 1,024-thread block of mlp_fused, the dense MLP keeps the four kernels."""
    from engine.gpu_engine import build_engine
    from engine.ops import kernels as K

    def none_fit(name, block, smem=0):
        raise RuntimeError(f"{name}: no resident block")
    monkeypatch.setattr(K, "resident_blocks", none_fit)
    args, w = _weights(CFG)
    ex = build_engine(args, w, CFG, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor
    names = [getattr(getattr(getattr(op, "__self__", None), "_go", op), "name", "") for op in _flat(ex.ops)]
    assert not any(n.startswith("mlp_fused<") for n in names)
    assert sum(n.startswith("residual_rmsnorm") for n in names) == 2 * args.num_hidden_layers + 1
