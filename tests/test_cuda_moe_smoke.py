"""The MoE block's launch plans on the fake CuPy (tests/fake_cupy.py): moe_fused (the post-attention norm and the
whole MoE block of one token as one persistent launch) against the kernel-per-op plan."""
import pytest

from cuda_smoke import cp, flat as _flat, moe_cfg, weights as _weights  # noqa: F401,F811


@pytest.mark.parametrize("dr", [2, 3])
def test_moe_fused_plumbing(cp, monkeypatch, dr):
    """NINFER_MOE_FUSED=1: each MoE layer's post-attention norm, router GEMV, top-k, shared and routed gate|up and
    moe_down become one cooperative moe_fused launch (1,024 threads, the normed row's 6 bytes a value of shared
    memory), reading the o-projection's planes and leaving the k + 1 planes the next norm sums; the residual buffers
    alternate as the norm kernels alternate them; the decode step runs. Off: the kernels as before."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    cfg = moe_cfg()
    args, w = _weights(cfg)
    k, H, L = cfg["num_experts_per_tok"], args.hidden_size, args.num_hidden_layers
    monkeypatch.setattr(CudaQwen35, "MOE_FUSED_DR", dr)

    def build(on):
        monkeypatch.setattr(CudaQwen35, "MOE_FUSED", on)
        return build_engine(args, w, cfg, max_context=256, prefill_cols=1, prefill_gemm=0)

    def names(ops):
        return [getattr(op, "name", "") for op in ops]

    off = list(_flat(build(0).model.executor.ops))
    eng = build(1)
    ex = eng.model.executor
    on = list(_flat(ex.ops))
    fused = [op for op in on if getattr(op, "name", "").startswith("moe_fused<")]
    fr, fd, fs = K.FMT_IDS["q4_g64_fp16"], K.FMT_IDS["q5_g64_fp16"], K.FMT_IDS["q8_g32_fp16"]
    assert len(fused) == L and {op.name for op in fused} == {f"moe_fused<{fr},{fd},{fs},{fs},1,{dr}>"}
    assert not any(n.startswith(("moe_down", "moe_route")) for n in names(on))
    assert any(n.startswith("moe_down") for n in names(off)) and "moe_route" in names(off)
    norms = lambda ops: sum(n.startswith("residual_rmsnorm") for n in names(ops))  # noqa: E731
    assert norms(on) == norms(off) - L
    for op in fused:
        assert op.cooperative and op.block == 1024 and op.smem == ex.kpad_h * 6 and op.grid == (K.sm_count(),)
        a = [int(v) for v in op.args[:12]]
        assert a[2] == ex.part.data.ptr and a[4] == H and a[6] == H and a[10] == args.num_experts and a[11] == k
        tail = [int(v) for v in op.args[-11:-8]]  # (the barrier counter, no timestamps, the options; then the o's)
        assert tail == [ex.moe_bar.data.ptr, 0, CudaQwen35.MOE_FUSED_OPTS]
    # every norm after a MoE layer sums its k + 1 planes; the residual alternates through the fused launches
    after = [on[i + 1] for i, op in enumerate(on[:-1]) if op in fused]
    assert all(int(op.args[3]) == k + 1 for op in after if getattr(op, "name", "").startswith("residual_rmsnorm"))
    bufs = {ex.x.data.ptr, ex.x2.data.ptr}
    assert all({int(op.args[0]), int(op.args[1])} == bufs for op in fused)
    out = eng.decode_greedy(3, 2)
    assert len(out) == 2


def test_moe_fused_needs_its_rules(cp, monkeypatch):
    """moe_fused only where it is compiled and fits: a hidden size not on 256 values or a router without the shared
    expert's gate row falls back to the kernels."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    monkeypatch.setattr(CudaQwen35, "MOE_FUSED", 1)
    monkeypatch.setattr(CudaQwen35, "MOE_FUSED_DR", 5)  # (not compiled)
    cfg = moe_cfg()
    args, w = _weights(cfg)
    ops = _flat(build_engine(args, w, cfg, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor.ops)
    assert not any(getattr(op, "name", "").startswith("moe_fused") for op in ops)


def test_moe_fused_o_plumbing(cp, monkeypatch):
    """NINFER_MOE_FUSED_O=1: each MoE layer's w8 o-projection GEMV goes inside its moe_fused launch (its weights, the
    one-scale staged input and its scale, split-K slices of at most 4 chunks a lane on whole 64-chunk blocks, as many
    planes as slices for the norm to sum); the step has no o-projection GEMV left and still runs."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    cfg = moe_cfg()
    args, w = _weights(cfg)
    monkeypatch.setattr(CudaQwen35, "MOE_FUSED", 1)
    monkeypatch.setattr(CudaQwen35, "MOE_FUSED_O_CHUNK", 0)  # (one scale for the row; by chunks: the test below)

    def build(on):
        monkeypatch.setattr(CudaQwen35, "MOE_FUSED_O", on)
        return build_engine(args, w, cfg, max_context=256, prefill_cols=1, prefill_gemm=0)

    def o_gemvs(ex):
        o_ptrs = {int(L["o"].ptr(L["o"].base)) for L in ex.layers}
        return [op for op in _flat(ex.ops) if getattr(getattr(op, "__self__", None), "w", None) is not None
                and int(op.__self__.w.ptr(op.__self__.w.base)) in o_ptrs]

    off = build(0).model.executor
    assert len(o_gemvs(off)) == args.num_hidden_layers
    assert all(int(op.args[-8]) == 0 for op in _flat(off.ops) if getattr(op, "name", "").startswith("moe_fused<"))
    eng = build(1)
    ex = eng.model.executor
    assert not o_gemvs(ex)
    fused = [op for op in _flat(ex.ops) if getattr(op, "name", "").startswith("moe_fused<")]
    assert len(fused) == args.num_hidden_layers
    for op, L in zip(fused, ex.layers):
        o = L["o"]
        ou4, ou4ps, osplits = o.gpr * 2, int(op.args[-4]), int(op.args[-5])
        assert int(op.args[-8]) == int(o.ptr(o.base)) and int(op.args[-7]) == int(o.ptr(o.scales))
        assert ou4ps % 64 == 0 and ou4ps <= 32 * K.MOE_FUSED_OT and osplits == -(-ou4 // ou4ps)
        assert int(op.args[3]) == osplits  # (the norm sums the o-projection's planes)
        assert int(op.args[-3]) == ex.xh_att.data.ptr and int(op.args[-2]) == ex.xinv_att.data.ptr
        assert int(op.args[-1]) == 0  # (one scale for the row: MOE_FUSED_O_CHUNK off)
    assert len(eng.decode_greedy(3, 2)) == 2


def test_moe_fused_o_chunk_plumbing(cp, monkeypatch):
    """NINFER_MOE_FUSED_O_CHUNK=1: the o-projection inside moe_fused reads chunk-scaled pairs, so each GDN layer's gated
    norm is gated_rmsnorm_chunks (not gated_rmsnorm_stage) and each attention layer's combine attn_combine_chunks, all
    writing the chunk scales that moe_fused's o-phase takes (its last argument); the step runs."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    cfg = moe_cfg()
    args, w = _weights(cfg)
    monkeypatch.setattr(CudaQwen35, "MOE_FUSED", 1)
    monkeypatch.setattr(CudaQwen35, "MOE_FUSED_O", 1)
    monkeypatch.setattr(CudaQwen35, "GDN_GATED_CL", 0)  # (the chunk staging inside the delta rule's launch: below)

    def build(on):
        monkeypatch.setattr(CudaQwen35, "MOE_FUSED_O_CHUNK", on)
        eng = build_engine(args, w, cfg, max_context=256, prefill_cols=1, prefill_gemm=0)
        return eng, [getattr(op, "name", "") for op in _flat(eng.model.executor.ops)], list(_flat(eng.model.executor.ops))

    _, off, _ = build(0)
    eng, on, ops = build(1)
    ex = eng.model.executor
    gdn = sum(L["kind"] != "full_attention" for L in ex.layers)
    attn = len(ex.layers) - gdn
    assert gdn > 0 and attn > 0
    assert on.count("gated_rmsnorm_chunks") == gdn and "gated_rmsnorm_stage" not in on
    assert off.count("gated_rmsnorm_chunks") == 0 and off.count("gated_rmsnorm_stage") == gdn
    combine = lambda names: sum(n.startswith("attn_combine_chunks") for n in names)  # noqa: E731 (and its _b form)
    assert combine(on) == attn and combine(off) == 0
    fused = [op for op in ops if getattr(op, "name", "").startswith("moe_fused<")]
    assert len(fused) == len(ex.layers) and all(int(op.args[-1]) == ex.xsc_att.data.ptr for op in fused)
    assert len(eng.decode_greedy(3, 2)) == 2
    monkeypatch.setattr(CudaQwen35, "GDN_GATED_CL", 1)  # (gdn_delta_gated_cl stages the chunks into the same scales)
    eng, cl, ops = build(1)
    assert cl.count("gdn_delta_gated_cl") == gdn and "gated_rmsnorm_chunks" not in cl
    assert all(int(op.args[-6]) == eng.model.executor.xsc_att.data.ptr and int(op.args[-5]) == 1 for op in ops
               if getattr(op, "name", "") == "gdn_delta_gated_cl")  # (the xsc scales, GDN_STATE_EARLY, GDN_AB_IN's four)
