"""The CUDA executors' Python, on the CPU: op lists built and run against a NumPy stand-in for CuPy
(tests/fake_cupy.py, kernels are no-ops). Catches breakage of the GPU path's plumbing in CI; the
kernels' numbers are checked by tests/gpu on a device. This file: the decode step and the engine around
it; the attention forms' are in test_cuda_attention_smoke.py, the tensor-core prefill's in
test_cuda_prefill_smoke.py, the norms' in test_cuda_norm_smoke.py, the GDN layers' in test_cuda_gdn_smoke.py."""
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


def test_gemv_pair_plumbing(cp, monkeypatch):
    """NINFER_GEMV_PAIR=1 with the 27B's choices (GDN v|z q5 a row a warp and q|k q4 two rows, both with the conv
    epilogue; attention gate|v q5 and q|k q4 two rows; all on gemv_rs_pre): each pair is one gemv_rs_pre_pair launch
    of one wave (the SMs x 4 blocks) whose arguments are the two plans' 25, then the first's blocks (split by weight
    bytes); the GDN layers' a|b GEMV stays on its side branch; off, the two launches."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K
    from engine.ops.gemv_plan import GemvPlan

    args, w = _weights(CFG)
    ex = build_engine(args, w, CFG, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor
    rows = {"vz": 1, "qk": 2, "gv": 2}
    ex.gemv_cfg = {**ex.gemv_cfg, **{(L[k].fmt, L[k].n, L[k].k): {"pre2": True, "rows": r} for L in ex.layers
                                     for k, r in rows.items() if k in L}}

    def plan(on):
        monkeypatch.setattr(CudaQwen35, "GEMV_PAIR", on)
        ex.ops = ex._plan()
        return _flat(ex.ops)

    off = [getattr(op, "__self__", None) for op in plan(False)]
    by_w = {int(p.args[0]): p for p in off if isinstance(p, GemvPlan)}  # (by the weights' address)
    pairs = [op for op in plan(True) if getattr(op, "name", "").startswith("gemv_rs_pre_pair<")]
    gdn = sum(L["kind"] != "full_attention" for L in ex.layers)
    names = [op.name for op in pairs]
    assert names.count("gemv_rs_pre_pair<1,1,0,2,true,4>") == gdn
    assert names.count("gemv_rs_pre_pair<1,2,0,2,false,4>") == len(ex.layers) - gdn > 0
    for op, L in zip(pairs, ex.layers):
        a, b = (L["vz"], L["qk"]) if "vz" in L else (L["gv"], L["qk"])
        pa, pb = by_w[a.ptr(a.base)], by_w[b.ptr(b.base)]
        assert op.grid == (K.sm_count() * 4,) and op.block == 256 and len(op.args) == 51
        assert [int(x) for x in op.args[:50]] == [int(x) for x in pa.args[:25] + pb.args[:25]]
        assert int(op.args[50]) == round(op.grid[0] * a.nbytes / (a.nbytes + b.nbytes))
    plans = lambda ops: sum(isinstance(getattr(op, "__self__", op), GemvPlan) for op in ops)  # noqa: E731
    assert plans(plan(True)) == plans(off) - 2 * len(pairs)


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
