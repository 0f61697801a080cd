"""The CUDA executors' Python, on the CPU: op lists built and run against a NumPy stand-in for CuPy
(tests/fake_cupy.py, kernels are no-ops). Catches breakage of the GPU path's plumbing in CI; the
kernels' numbers are checked by tests/gpu on a device. This file: the decode step and the engine around
it; the attention forms' are in test_cuda_attention_smoke.py, the tensor-core prefill's in
test_cuda_prefill_smoke.py, the norms' in test_cuda_norm_smoke.py."""
import numpy as np
import pytest

from cuda_smoke import CFG, cp, flat as _flat, moe_cfg, weights as _weights  # noqa: F401


@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_dense_engine_builds_and_runs_every_path(cp, kv):
    from engine.gpu_engine import build_engine
    from engine.ops import kernels as K

    args, w = _weights(CFG)
    eng = build_engine(args, w, CFG, max_context=512, kv=kv, prefill_cols=8, prefill_gemm=64)
    m = eng.model
    assert m.cols is not None and m.gemm is not None
    names = {getattr(op, "name", "gemv") for op in _flat(m.executor.ops)}
    from engine.models.qwen3_5_cuda import CudaQwen35

    gdn = ({"gdn_delta_gated_stage", "gdn_prep"} if CudaQwen35.GDN_FUSED
           else {"gdn_delta_raw" if CudaQwen35.GDN_DELTA_RW not in K.GDN_DELTA_RW
                 else f"gdn_delta_raw_rw<{CudaQwen35.GDN_DELTA_RW}>", "gated_rmsnorm_stage"} if CudaQwen35.GDN_PREP_FUSED
           else {"gdn_delta", "gdn_prep", "gated_rmsnorm_stage"})
    h = args.hidden_size
    norm = ("residual_rmsnorm_cl" if CudaQwen35.NORM_CLUSTER and K.cluster_capable()
            else "residual_rmsnorm_mb2" if CudaQwen35.NORM_MB2 and h <= 2048
            else "residual_rmsnorm_mb5" if CudaQwen35.NORM_MB5 and h <= 5120 else "residual_rmsnorm_mb")
    assert {norm, "argmax_step_mb"} | gdn <= names
    assert any(n.startswith("attn_decode_split") for n in names)
    eng.prefill(list(range(1, 150)))  # GEMM chunks of 64, a columns chunk of 8, single tokens
    assert eng.position == 149
    out = eng.decode_greedy(3, 4)
    assert len(out) == 4 and eng.position == 153
    eng.reset()
    eng.seek_synthetic(40)
    assert eng.position == 40
    sp = eng._decode_step_sparse(5, 1.0)
    assert sp.ids.size >= 1 and eng.position == 41
    assert K.pdl_ready(m.executor.ops)[1] == len(m.executor.ops)


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
    its arguments the delta rule's, then the gated norm's after its o and Hv; with RW 2 or without clusters, the two."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    args, w = _weights(CFG)
    monkeypatch.setattr(CudaQwen35, "GDN_FUSED", False)
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
        assert len(op.args) == len(d.args) + len(g.args) - 2
        assert scalars(op.args) == scalars(d.args) + scalars(g.args[1:6] + g.args[7:])
    assert [op.name for op in gdn(True, rw=2)] == ["gdn_delta_raw_rw<2>", "gated_rmsnorm_chunks"] * len(cl)
    assert [op.name for op in gdn(True, capable=False)] == [op.name for op in base]


def test_attn_merge_plumbing(cp, monkeypatch):
    """NINFER_ATTN_MERGE (on by default): attention layers whose q, k, gate and v share a row-split format (the MoE
    recipe's w8) hold them as one object (q|k and gate|v its views, the same bytes) and project it with one GEMV into
    the merged row buffer, whose q|k part qk_norm_rope_kv and whose gate|v part it and the combine read at one row
    stride; off, two GEMVs on two branches into buf_a / buf_b; mixed formats (the dense recipe) keep two."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops.gemv_plan import GemvPlan

    assert CudaQwen35.ATTN_MERGE
    cfg = moe_cfg()
    args, w = _weights(cfg)

    def build(on, c=cfg, a=args, weights=w):
        monkeypatch.setattr(CudaQwen35, "ATTN_MERGE", on)
        return build_engine(a, weights, c, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor

    off, on = build(False), build(True)
    attn = [L for L in on.layers if L["kind"] == "full_attention"]
    assert attn and all(L["qk"].buf is L["qkgv"].buf and L["gv"].buf is L["qkgv"].buf for L in attn)
    assert on.weight_bytes() == off.weight_bytes()

    def gemvs(ex):  # (the GEMVs over the first attention layer's object: their row counts and output pointers)
        buf = next(L for L in ex.layers if L["kind"] == "full_attention")["qkgv"].buf
        return sorted((p.w.n, int(p.args[10])) for p in (getattr(op, "__self__", None) for op in _flat(ex.ops))
                      if isinstance(p, GemvPlan) and p.w.buf is buf)

    nqk = attn[0]["qk"].n
    assert gemvs(on) == [(attn[0]["qkgv"].n, on.buf_qkvz.data.ptr)]
    assert gemvs(off) == sorted([(nqk, off.buf_a.data.ptr), (attn[0]["gv"].n, off.buf_b.data.ptr)])
    width = on.buf_qkvz.shape[1]
    rope = [op for op in _flat(on.ops) if getattr(op, "name", "") == "qk_norm_rope_kv"]
    assert rope and all(int(op.args[0]) == on.buf_qkvz.data.ptr and int(op.args[1]) == int(op.args[3]) == width
                        and int(op.args[5]) == width for op in rope)
    qw = on.Hq * 256
    assert all(int(op.args[4]) == on.buf_qkvz.data.ptr + 4 * (nqk + qw) for op in rope)  # (v after q|k and the gate)
    comb = [op for op in _flat(on.ops) if getattr(op, "name", "").startswith("attn_combine")]
    assert len(comb) == len(attn) and all(int(op.args[3]) == on.buf_qkvz.data.ptr + 4 * nqk
                                          and int(op.args[4]) == width for op in comb)
    args_d, wd = _weights(CFG)
    dense = build(True, CFG, args_d, wd)
    assert not any("qkgv" in L for L in dense.layers)


def test_attn_chunk_plumbing(cp, monkeypatch):
    """NINFER_ATTN_CHUNK=1: where the attention layers' o-projection takes chunk scales (gemv_rs_pre, pre2), their
    combine is attn_combine_chunks (block 256, the staging arguments, xsc_att, the positions, the split rounding) and
    the fused MLP's o-phase reads the chunk scales; elsewhere, or off, attn_combine_stage."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    args, w = _weights(CFG)
    monkeypatch.setattr(K, "resident_blocks", lambda name, block, smem=0: 1)
    monkeypatch.setattr(CudaQwen35, "GDN_FUSED", False)
    monkeypatch.setattr(CudaQwen35, "ATTN_COMBINE_B", 0)  # (its batched form: below)

    def ops(chunk, pre2):
        monkeypatch.setattr(CudaQwen35, "ATTN_CHUNK", chunk)
        ex = build_engine(args, w, CFG, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor
        if pre2:
            ex.gemv_cfg = {**ex.gemv_cfg, **{(L["o"].fmt, L["o"].n, L["o"].k): {"pre2": True} for L in ex.layers}}
            ex.ops = ex._plan()
        return ex, [getattr(getattr(op, "__self__", None), "_go", op) for op in _flat(ex.ops)]

    for chunk, pre2 in ((0, True), (1, False)):
        _, o = ops(chunk, pre2)
        assert not any(getattr(op, "name", "") == "attn_combine_chunks" for op in o)
    ex, o = ops(1, True)
    n_att = sum(L["kind"] == "full_attention" for L in ex.layers)
    cc = [op for op in o if getattr(op, "name", "") == "attn_combine_chunks"]
    assert len(cc) == n_att > 0 and not any(getattr(op, "name", "") == "attn_combine_stage" for op in o)
    assert all(op.block == 256 and int(op.args[12]) == ex.xsc_att.data.ptr and int(op.args[13]) == ex.qpos.data.ptr
               and int(op.args[14]) in (1, 16) for op in cc)
    fused = [op for op in o if getattr(op, "name", "").startswith("mlp_fused<")]
    assert fused and all(int(op.args[39]) == ex.xsc_att.data.ptr and int(op.args[40]) == 1 for op in fused)
    # ATTN_COMBINE_B (on by default): attn_combine_chunks_b in its place, the same grid, block and arguments
    monkeypatch.setattr(CudaQwen35, "ATTN_COMBINE_B", 1)
    _, ob = ops(1, True)
    cb = [op for op in ob if getattr(op, "name", "").startswith("attn_combine")]
    assert [op.name for op in cb] == ["attn_combine_chunks_b"] * n_att
    assert all(a.grid == b.grid and a.block == b.block and len(a.args) == len(b.args) for a, b in zip(cc, cb))


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


def test_moe_down_plumbing(cp, monkeypatch):
    """NINFER_MOE_DOWN (on by default): one moe_down launch a layer (grid.z = the k slots + the shared expert,
    2 x 8 x rows rows a block) after the routed gate|up, in place of the routed down GEMV and the shared
    down-projection's branch."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K
    from engine.ops.gemv_plan import GemvPlan

    monkeypatch.setattr(CudaQwen35, "MOE_FUSED", 0)  # (the kernel-per-op MoE block; moe_fused: its own tests)
    cfg = moe_cfg()
    args, w = _weights(cfg)
    k, H, L = cfg["num_experts_per_tok"], args.hidden_size, args.num_hidden_layers
    assert CudaQwen35.MOE_DOWN

    def ops(on, rows=4, i16=False):
        monkeypatch.setattr(CudaQwen35, "MOE_DOWN", on)
        monkeypatch.setattr(CudaQwen35, "MOE_DOWN_ROWS", rows)
        monkeypatch.setattr(CudaQwen35, "MOE_DOWN_I16", i16)
        return list(_flat(build_engine(args, w, cfg, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor.ops))

    def routed(o):
        return [op.__self__ for op in o if isinstance(getattr(op, "__self__", None), GemvPlan)
                and len(op.__self__.grid) > 2 and op.__self__.grid[2] == k]

    off = ops(False)
    assert not any(getattr(op, "name", "").startswith("moe_down") for op in off) and len(routed(off)) == 2 * L
    for rows in K.MOE_DOWN_ROWS:
        for i16 in (False, True):
            on = ops(True, rows, i16)
            down = [op for op in on if getattr(op, "name", "").startswith("moe_down<")]
            assert len(down) == L and len(routed(on)) == L  # the routed gate|up stays a GemvPlan
            assert all(op.grid == (-(-H // (2 * K.WARPS * rows)), 1, k + 1) for op in down)
            fr, fs = K.FMT_IDS["q5_g64_fp16"], K.FMT_IDS["q8_g32_fp16"]
            assert {op.name for op in down} == {f"moe_down<{fr},{fs},{rows},{str(i16).lower()}>"}
            assert all(int(op.args[-1]) == k for op in down)


def test_moe_pre2_plumbing(cp, monkeypatch):
    """NINFER_MOE_PRE2 (off by default): the routed experts' gate|up (grid.z = the k slots) runs on gemv_rs_pre;
    the routed down-projection, which stages its slot's row itself, stays on gemv_rs."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops.gemv_plan import GemvPlan

    monkeypatch.setattr(CudaQwen35, "MOE_FUSED", 0)  # (the kernel-per-op MoE block; moe_fused: its own tests)
    cfg = moe_cfg()
    args, w = _weights(cfg)
    k = cfg["num_experts_per_tok"]

    monkeypatch.setattr(CudaQwen35, "MOE_DOWN", False)  # (the routed down-projection as a GEMV)

    def routed(on):
        monkeypatch.setattr(CudaQwen35, "MOE_PRE2", on)
        ops = _flat(build_engine(args, w, cfg, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor.ops)
        plans = [op.__self__ for op in ops if isinstance(getattr(op, "__self__", None), GemvPlan)]
        return [p for p in plans if len(p.grid) > 2 and p.grid[2] == k]

    assert not CudaQwen35.MOE_PRE2
    off, on = routed(False), routed(True)
    assert len(off) == len(on) == 2 * args.num_hidden_layers  # gate|up and down a layer
    assert not any(p.pre2 for p in off)
    assert sum(p.pre2 for p in on) == args.num_hidden_layers


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


def test_moe_route_fused_plumbing(cp, monkeypatch):
    """NINFER_MOE_ROUTE_FUSED=1: the router GEMV and moe_route become one router_route launch a layer."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    monkeypatch.setattr(CudaQwen35, "MOE_FUSED", 0)  # (the kernel-per-op MoE block; moe_fused: its own tests)
    cfg = moe_cfg()
    args, w = _weights(cfg)
    names = {}
    for fused in (False, True):
        monkeypatch.setattr(CudaQwen35, "MOE_ROUTE_FUSED", fused)
        eng = build_engine(args, w, cfg, max_context=256)
        names[fused] = [getattr(op, "name", "") for op in _flat(eng.model.executor.ops)]
        assert eng.decode_greedy(4, 2) is not None
    n = args.num_hidden_layers
    assert names[False].count("moe_route") == n and names[True].count("router_route<1>") == n
    assert "moe_route" not in names[True]


@pytest.mark.parametrize("shared,stage,down", [(256, True, False), (128, True, False), (128, False, False),
                                               (256, False, True)])  # 128: a routed expert's width
def test_moe_engine_builds_and_runs(cp, shared, stage, down, monkeypatch):
    """The routed down projection: a GEMV slot a grid.z, staged by a launch (MOE_STAGE) or by its own
    blocks, or moe_down (MOE_DOWN, with the shared one); the next norm sums the k slots' planes and the
    shared expert's."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    monkeypatch.setattr(CudaQwen35, "MOE_FUSED", 0)  # (the kernel-per-op MoE block; moe_fused: its own tests)
    monkeypatch.setattr(CudaQwen35, "MOE_STAGE", stage)
    monkeypatch.setattr(CudaQwen35, "MOE_DOWN", down)

    cfg = moe_cfg(shared)
    args, w = _weights(cfg)
    eng = build_engine(args, w, cfg, max_context=256)
    assert eng.model.cols is None  # no columns step for MoE (the tensor-core prefill where memory allows)
    eng.prefill([1, 2, 3])
    assert eng.decode_greedy(4, 3) is not None and eng.position == 6
    ex = eng.model.executor
    names = [getattr(o, "name", "") for o in _flat(ex.ops)]
    # each attention layer stages its output with stage_x_mb (unless ATTN_FUSED: attn_combine_stage does)
    attn = 0 if CudaQwen35.ATTN_FUSED else sum(L["kind"] == "full_attention" for L in ex.layers)
    assert names.count("stage_x_mb") - attn == (args.num_hidden_layers if stage else 0)
    norms = [o for o in _flat(ex.ops) if getattr(o, "name", "").startswith(("residual_rmsnorm_mb", "residual_rmsnorm_cl"))]
    k = args.num_experts_per_tok
    assert [int(o.args[3]) for o in norms[2::2]] == [k + 1] * args.num_hidden_layers
    assert np.isfinite(eng.info()["weight_bytes_per_token"])


def test_fused_gate_up_staging_drops_the_stage_launch(cp, monkeypatch):
    """pre2 + fuse_stage in the gate|up tuning entry: gemv_rs_pre stages its own output, one stage_x_mb
    launch fewer a layer; the rest of the step is unchanged."""
    from engine.models.qwen3_5_cuda import CudaQwen35

    monkeypatch.setattr(CudaQwen35, "MLP_FUSED", 0)  # (the four-kernel MLP)
    from engine.gpu_engine import build_engine

    args, w = _weights(CFG)

    def launches(cfg):
        eng = build_engine(args, w, CFG, max_context=256, prefill_cols=1, prefill_gemm=0, gemv_cfg=cfg)
        ops = eng.model.executor.ops
        names = [getattr(getattr(getattr(op, "__self__", None), "_go", op), "name", "") for op in _flat(ops)]
        eng.decode_step(1)
        return names

    gu = next(L["gate_up"] for L in build_engine(args, w, CFG, max_context=256, prefill_cols=1,
                                                 prefill_gemm=0).model.executor.layers if "gate_up" in L)
    key = (gu.fmt, gu.n, gu.k)
    plain = launches({key: dict(rows=2, unroll=2, splits=1)})
    fused = launches({key: dict(rows=2, unroll=2, splits=1, pre2=True, fuse_stage=True)})
    n_layers = args.num_hidden_layers
    assert plain.count("stage_x_mb") - fused.count("stage_x_mb") == n_layers
    assert sum(n.startswith("gemv_rs_pre<") for n in fused) == n_layers
    # pre2 alone: gemv_rs_pre folds the row's largest |value| into a slot, stage_x_amax stages from it
    amax = launches({key: dict(rows=2, unroll=2, splits=1, pre2=True)})
    assert plain.count("stage_x_mb") - amax.count("stage_x_mb") == n_layers
    assert amax.count("stage_x_amax") == n_layers and "stage_x_amax" not in plain + fused


def test_ffn_split_plumbing(cp, monkeypatch):
    """NINFER_FFN_SPLIT=1 (off by default: slower on the H200): an MLP of two or more 1,024-value blocks
    runs as two halves (gate|up A; gate|up B
    beside stage A + down A; stage B + down B), the down halves into partial planes 0 and 1 over column
    views of the down matrix; a narrower MLP, and the flag off, keep one gate|up, stage and down."""
    from engine.models.qwen3_5_cuda import CudaQwen35 as _C

    monkeypatch.setattr(_C, "MLP_FUSED", 0)  # (the four-kernel MLP)
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    cfg = dict(CFG, intermediate_size=3072)
    args, w = _weights(cfg)

    def build():
        eng = build_engine(args, w, cfg, max_context=256, prefill_cols=8, prefill_gemm=0)
        return eng, eng.model.executor

    monkeypatch.setattr(CudaQwen35, "FFN_SPLIT", True)
    eng, ex = build()
    assert ex._ffn_split_at(ex.layers[0]["down"]) == 2048
    conc = [op for op in ex.ops if isinstance(op, K.Concurrent) and any(
        getattr(o, "name", "") == "stage_x_mb" for o in op.side)]
    assert len(conc) == args.num_hidden_layers
    down_a = conc[0].side[1].__self__
    assert down_a.grid[1] == 1 and down_a.w.k == 2048 and down_a.args[9] == 2048 // 32  # u4 per slice
    eng.prefill(list(range(1, 30)))  # the columns executor (8 rows) takes the split too
    assert eng.decode_greedy(3, 2) is not None
    monkeypatch.setattr(CudaQwen35, "FFN_SPLIT", False)
    _, ex_off = build()
    assert not any(isinstance(op, K.Concurrent) and any(getattr(o, "name", "") == "stage_x_mb" for o in op.side)
                   for op in ex_off.ops)
    assert len(ex_off.ops) == len(ex.ops) - args.num_hidden_layers  # 3 ops a layer's MLP against 4


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
