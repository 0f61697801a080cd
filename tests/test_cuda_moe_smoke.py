"""The MoE block's launch plans on the fake CuPy (tests/fake_cupy.py): moe_fused (the layer's o-projection, the
post-attention norm and the whole MoE block of one token as one persistent launch) against the kernel-per-op plan."""
from cuda_smoke import cp, flat as _flat, moe_cfg, on_gpu, weights as _weights  # noqa: F401,F811


def _build(monkeypatch, gpu="sm_90", **override):
    from engine.gpu_engine import build_engine

    on_gpu(monkeypatch, gpu, **override)
    cfg = moe_cfg()
    args, w = _weights(cfg)
    return args, cfg, build_engine(args, w, cfg, max_context=256, prefill_cols=1, prefill_gemm=0)


def _names(ops):
    return [getattr(op, "name", "") for op in ops]


def test_moe_fused_plumbing(cp, monkeypatch):
    """The plan's moe_fused: each MoE layer's o-projection, post-attention norm, router GEMV, top-k, shared and routed
    gate|up and moe_down are one moe_fused launch (1,024 threads, the normed row's 6 bytes a value of shared memory,
    programmatic without the cooperative attribute), leaving the k + 1 planes the next norm sums; the residual
    buffers alternate as the norm kernels alternate them; the decode step runs. Off: the kernels."""
    from engine.gpu import launch as K

    _, _, off_eng = _build(monkeypatch, moe_fused=False)
    off = list(_flat(off_eng.model.executor.ops))
    args, cfg, eng = _build(monkeypatch)
    ex = eng.model.executor
    k, H, L = cfg["num_experts_per_tok"], args.hidden_size, args.num_hidden_layers
    on = list(_flat(ex.ops))
    fused = [op for op in on if getattr(op, "name", "").startswith("moe_fused<")]
    assert len(fused) == L and {op.name for op in fused} == {"moe_fused<0,1,3,3,1,2>"}
    assert not any(n.startswith(("moe_down", "moe_route")) for n in _names(on))
    assert any(n.startswith("moe_down") for n in _names(off)) and "moe_route" in _names(off)
    norms = lambda ops: sum(n.startswith("residual_rmsnorm") for n in _names(ops))  # noqa: E731
    assert norms(on) == norms(off) - L
    for op in fused:
        assert op.cooperative and op.block == 1024 and op.smem == ex.ctx.kpad_h * 6 and op.grid == (K.sm_count(),)
        a = [int(v) for v in op.args[:12]]
        assert a[2] == ex.ctx.part.data.ptr and a[4] == H and a[6] == H and a[10] == args.num_experts and a[11] == k
        tail = [int(v) for v in op.args[-11:-8]]  # (the barrier counter, no timestamps, the options; then the o's)
        assert tail == [ex.moe.bar.data.ptr, 0, K.MOE_FUSED_OPTS]
    after = [on[i + 1] for i, op in enumerate(on[:-1]) if op in fused]
    assert all(int(op.args[3]) == k + 1 for op in after if getattr(op, "name", "").startswith("residual_rmsnorm"))
    bufs = {ex.ctx.x.data.ptr, ex.ctx.x2.data.ptr}
    assert all({int(op.args[0]), int(op.args[1])} == bufs for op in fused)
    assert len(eng.decode_greedy(3, 2)) == 2


def test_moe_fused_needs_its_rules(cp, monkeypatch):
    """moe_fused only where it fits: a grid too small for the shared expert's 32-value chunks (one block) falls back to
    the kernels."""
    from engine.gpu import launch as K

    monkeypatch.setattr(K, "sm_count", lambda: 1)
    _, _, eng = _build(monkeypatch)
    assert eng.model.executor.plan.moe_fused
    assert not any(n.startswith("moe_fused") for n in _names(_flat(eng.model.executor.ops)))


def test_moe_fused_o_plumbing(cp, monkeypatch):
    """Each MoE layer's w8 o-projection goes inside its moe_fused launch (its weights, split-K slices of at most 4 chunks
    a lane on whole 64-chunk blocks, as many planes as slices for the norm to sum), its input chunk-scaled: each GDN
    layer's gated norm stages chunks (gated_rmsnorm_chunks, or inside gdn_delta_gated_cl on sm_90) and each attention
    layer's combine is attn_combine_chunks_b, all writing the scales moe_fused's o-phase takes (its last argument)."""
    from engine.gpu import launch as K

    for gpu in ("sm_86", "sm_90"):
        args, _, eng = _build(monkeypatch, gpu)
        ex = eng.model.executor
        o_ptrs = {int(L["o"].ptr(L["o"].base)) for L in ex.layers}
        assert not [op for op in _flat(ex.ops) if getattr(getattr(op, "__self__", None), "w", None) is not None
                    and int(op.__self__.w.ptr(op.__self__.w.base)) in o_ptrs]
        ops = list(_flat(ex.ops))
        fused = [op for op in ops if getattr(op, "name", "").startswith("moe_fused<")]
        assert len(fused) == args.num_hidden_layers
        for op, L in zip(fused, ex.layers):
            o = L["o"]
            ou4, ou4ps, osplits = o.gpr * 2, int(op.args[-4]), int(op.args[-5])
            assert int(op.args[-8]) == int(o.ptr(o.base)) and int(op.args[-7]) == int(o.ptr(o.scales))
            assert ou4ps % 64 == 0 and ou4ps <= 32 * K.MOE_FUSED_OT and osplits == -(-ou4 // ou4ps)
            assert int(op.args[3]) == osplits  # (the norm sums the o-projection's planes)
            assert int(op.args[-3]) == ex.ctx.xh_att.data.ptr and int(op.args[-1]) == ex.ctx.xsc_att.data.ptr
        names = _names(ops)
        gdn = sum(L["kind"] != "full_attention" for L in ex.layers)
        attn = len(ex.layers) - gdn
        assert names.count("attn_combine_chunks_b") == attn and "gated_rmsnorm_stage" not in names
        staged = "gdn_delta_gated_cl" if gpu == "sm_90" else "gated_rmsnorm_chunks"
        assert names.count(staged) == gdn
        assert all(int(op.args[-6]) == ex.ctx.xsc_att.data.ptr and int(op.args[-5]) == 1 for op in ops
                   if getattr(op, "name", "") == "gdn_delta_gated_cl")  # (the scales, then the early-state flag)
        assert len(eng.decode_greedy(3, 2)) == 2
