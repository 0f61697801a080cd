"""The CUDA executors' Python, on the CPU: op lists built and run against a NumPy stand-in for CuPy
(tests/fake_cupy.py, kernels are no-ops). Catches breakage of the GPU path's plumbing in CI; the
kernels' numbers are checked by tests/gpu on a device."""
import numpy as np
import pytest

import fake_cupy

from engine.synthetic import TINY_CUDA as CFG


@pytest.fixture
def cp(monkeypatch):
    cp = fake_cupy.install(monkeypatch)
    yield cp
    from engine.ops import kernels as K

    for fn in (K.module, K.module_tc, K.kernel, K.sm_count, K.blocks_per_sm, K.mma_ok, K.smem_optin):
        fn.cache_clear()


def _weights(cfg):
    from engine import gpu_weights
    from engine.config import ModelArgs
    from engine.models.qwen3_5 import random_weights

    args = ModelArgs.from_config(cfg)
    recipe = "groupwise-int-moe" if args.is_moe else "groupwise-int"
    w = gpu_weights.as_stored(random_weights(args, seed=1), recipe)
    return args, gpu_weights.from_logical(args, w, recipe=recipe)


def _flat(ops):
    """The graph ops with Concurrent ones opened (main, then side)."""
    from engine.ops import kernels as K

    out = []
    for op in ops:
        out += _flat(op.main + op.side) if isinstance(op, K.Concurrent) else [op]
    return out


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
           else {"gdn_delta_raw", "gated_rmsnorm_stage"} if CudaQwen35.GDN_PREP_FUSED
           else {"gdn_delta", "gdn_prep", "gated_rmsnorm_stage"})
    assert {"residual_rmsnorm_mb", "argmax_step_mb"} | gdn <= names
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


def test_moe_route_fused_plumbing(cp, monkeypatch):
    """NINFER_MOE_ROUTE_FUSED=1: the router GEMV and moe_route become one router_route launch a layer."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    cfg = dict(CFG, architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe_text", num_experts=8,
               num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=256)
    cfg.pop("intermediate_size")
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


def test_attn_tt_picks_the_multi_token_kernel(cp, monkeypatch):
    """NINFER_ATTN_TT=4: decode attention through attn_decode_tt<G,KV8,4>; 1 (the default) attn_decode_split."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    args, w = _weights(CFG)
    for tt, want in ((1, "attn_decode_split<"), (4, "attn_decode_tt<")):
        monkeypatch.setattr(CudaQwen35, "ATTN_TT", tt)
        eng = build_engine(args, w, CFG, max_context=256, prefill_cols=0, prefill_gemm=0)
        names = [getattr(op, "name", "") for op in _flat(eng.model.executor.ops)]
        attn = [n for n in names if n.startswith("attn_decode")]
        assert attn and all(n.startswith(want) for n in attn)
        assert len(eng.decode_greedy(3, 2)) == 2


def test_attn_fused_replaces_combine_and_staging(cp, monkeypatch):
    """NINFER_ATTN_FUSED=1: each attention layer's combine and staging become one attn_combine_stage launch."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    args, w = _weights(CFG)
    count = {}
    for fused in (False, True):
        monkeypatch.setattr(CudaQwen35, "ATTN_FUSED", fused)
        eng = build_engine(args, w, CFG, max_context=256, prefill_cols=0, prefill_gemm=0)
        ex = eng.model.executor
        names = [getattr(op, "name", "") for op in _flat(ex.ops)]
        count[fused] = (names.count("stage_x_mb"), names.count("attn_combine"), names.count("attn_combine_stage"))
        assert len(eng.decode_greedy(3, 2)) == 2
    attn = sum(L["kind"] == "full_attention" for L in ex.layers)
    assert attn >= 1
    assert count[True] == (count[False][0] - attn, 0, attn) and count[False][1:] == (attn, 0)


@pytest.mark.parametrize("shared,stage", [(256, True), (128, True), (128, False)])  # 128: a routed expert's width
def test_moe_engine_builds_and_runs(cp, shared, stage, monkeypatch):
    """The routed down projection: a GEMV slot a grid.z, staged by a launch (MOE_STAGE) or by its own
    blocks; the next norm sums the k slots' planes and the shared expert's."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    monkeypatch.setattr(CudaQwen35, "MOE_STAGE", stage)

    cfg = dict(CFG, architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe_text", num_experts=8,
               num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=shared)
    cfg.pop("intermediate_size")
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
    norms = [o for o in _flat(ex.ops) if getattr(o, "name", "") == "residual_rmsnorm_mb"]
    k = args.num_experts_per_tok
    assert [int(o.args[3]) for o in norms[2::2]] == [k + 1] * args.num_hidden_layers
    assert np.isfinite(eng.info()["weight_bytes_per_token"])


def test_moe_gemm_prefill_plumbing(cp, monkeypatch):
    """NINFER_MOE_PREFILL: the MoE model gets tensor-core prefill executors whose MoE block is one op
    (router, grouped experts, shared expert), and a prompt runs through them."""
    from engine import gpu_engine
    from engine.gpu_engine import build_engine

    monkeypatch.setattr(gpu_engine, "MOE_PREFILL", True)
    cfg = dict(CFG, architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe_text", num_experts=8,
               num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=128)
    cfg.pop("intermediate_size")
    args, w = _weights(cfg)
    eng = build_engine(args, w, cfg, max_context=512, prefill_gemm=128)
    gemm = eng.model.gemm
    assert gemm is not None and eng.model.cols is None
    names = [getattr(op, "name", "") for op in gemm.ops]
    assert names.count("moe (router, grouped experts, shared)") == args.num_hidden_layers
    for ex in eng.model.gemms:  # (the stand-in's kernels write nothing: distinct experts, as top-k gives)
        ex.eidx[...] = np.arange(args.num_experts_per_tok, dtype=np.int32)
    eng.prefill(list(range(1, 200)))
    assert eng.position == 199
    from engine.models.qwen3_5_cuda_prefill import CudaQwen35Prefill

    monkeypatch.setattr(CudaQwen35Prefill, "MOE_PAD_WASTE", 1e9)  # the strided-batched experts too
    eng.reset()
    eng.prefill(list(range(1, 200)))
    assert eng.position == 199


def test_try_build_takes_the_prefill_chunk(cp, monkeypatch):
    """--prefill-chunk on the GPU: the engine's prompt pieces, and the tensor-core chunk when that is on."""
    from engine import gpu_engine
    from engine.config import ModelArgs
    from engine.models.qwen3_5 import random_weights

    w = random_weights(ModelArgs.from_config(CFG), seed=2)
    monkeypatch.setattr(gpu_engine, "PREFILL_GEMM", 0)  # the GEMM path off: the chunk only sets the pieces
    eng = gpu_engine.try_build(CFG, w, max_context=512, prefill_chunk=96)
    assert eng.prefill_chunk == 96 and eng.model.gemm is None
    monkeypatch.setattr(gpu_engine, "PREFILL_GEMM", 64)
    eng = gpu_engine.try_build(CFG, w, max_context=512, prefill_chunk=32)
    assert eng.model.gemm is not None and eng.model.gemm.M == 32 and eng.prefill_chunk == 32
    eng.prefill(list(range(1, 80)))
    assert eng.position == 79


def test_tensor_core_prefill_is_on_where_the_memory_allows(cp, monkeypatch):
    """Default ("auto"): the largest chunk of AUTO_CHUNKS that fits the free memory, with the smaller
    tail executors sharing its scratch; off when the device has no room; --prefill-chunk caps it."""
    from engine import gpu_engine
    from engine.config import ModelArgs
    from engine.models.qwen3_5 import random_weights

    w = random_weights(ModelArgs.from_config(CFG), seed=2)
    monkeypatch.setattr(gpu_engine, "PREFILL_GEMM", gpu_engine.AUTO)
    eng = gpu_engine.try_build(CFG, w, max_context=512)  # fake device: 100 GiB free
    m = eng.model
    assert [g.M for g in m.gemms] == [8192, 4096, 2048, 1024, 512, 256, 64] and eng.prefill_chunk == 8192
    assert all(g._w16 is m.gemm._w16 for g in m.gemms)
    assert eng.info()["prefill_chunks"] == "8192,4096,2048,1024,512,256,64" and eng.info()["prefill_cols"] == 8
    eng.prefill(list(range(1, 80)))  # one 64-row chunk, then the columns step, then single tokens
    assert eng.position == 79
    eng = gpu_engine.try_build(CFG, w, max_context=512, prefill_chunk=1024)
    assert [g.M for g in eng.model.gemms] == [1024, 512, 256, 64]
    eng = gpu_engine.try_build(CFG, w, max_context=512, prefill_chunk=512)  # below AUTO_CHUNKS: itself
    assert [g.M for g in eng.model.gemms] == [512, 256, 64] and eng.prefill_chunk == 512
    eng = gpu_engine.try_build(CFG, w, max_context=512, prefill_chunk=4)  # under the columns step: no GEMMs
    assert eng.model.gemms == [] and eng.prefill_chunk == 4
    # a --vram-limit pool cap leaves no room either, whatever the device has free
    pool = type("P", (), {"free_bytes": lambda self: 0, "get_limit": lambda self: 20 << 30,
                          "used_bytes": lambda self: 20 << 30})()
    monkeypatch.setattr(cp, "get_default_memory_pool", lambda: pool)
    eng = gpu_engine.try_build(CFG, w, max_context=512)
    assert eng.model.gemm is None
    monkeypatch.setattr(cp.cuda.runtime, "memGetInfo", lambda: (0, 141 << 30))
    monkeypatch.setattr(cp, "get_default_memory_pool", lambda: type("P", (), {"free_bytes": lambda self: 0})())
    eng = gpu_engine.try_build(CFG, w, max_context=512)
    assert eng.model.gemm is None and eng.model.gemms == [] and eng.prefill_chunk == 256


def test_fused_gate_up_staging_drops_the_stage_launch(cp):
    """pre2 + fuse_stage in the gate|up tuning entry: gemv_rs_pre stages its own output, one stage_x_mb
    launch fewer a layer; the rest of the step is unchanged."""
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


def test_chunked_gdn_prefill_plumbing(cp, monkeypatch):
    """NINFER_GDN_CHUNKED (+ NINFER_GDN_TC): the GEMM prefill's GDN layers run gdn_chunk_prep then
    gdn_chunk_scan_tc<RB> (in place of gdn_delta_rows) over scratch sized for the chunk's 64-token pieces."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda_prefill import CudaQwen35Prefill

    monkeypatch.setattr(CudaQwen35Prefill, "GDN_CHUNKED", True)
    monkeypatch.setattr(CudaQwen35Prefill, "GDN_TC", True)
    args, w = _weights(CFG)
    eng = build_engine(args, w, CFG, max_context=512, prefill_cols=8, prefill_gemm=128)
    gemm = eng.model.gemm
    names = [getattr(op, "name", "") for op in gemm.ops]
    n_gdn = sum(1 for L in gemm.layers if L["kind"] != "full_attention")
    rb = gemm.gdn_scan_rb()
    assert names.count("gdn_chunk_prep") == n_gdn and names.count(f"gdn_chunk_scan_tc<{rb}>") == n_gdn
    assert not any(n.startswith("gdn_delta") for n in names)
    assert gemm._gdn_scratch[0].size == 2 * args.linear_num_value_heads * 64 * 128  # 128 rows: two pieces
    eng.prefill(list(range(1, 140)))


def test_padded_prefill_plumbing(cp, monkeypatch):
    """NINFER_PREFILL_PAD: whole chunks of the largest executor, then the rest padded into the smallest
    executor that holds it; the T-dependent launches take the valid length."""
    from engine import gpu_engine
    from engine.gpu_engine import build_engine

    monkeypatch.setattr(gpu_engine, "PREFILL_PAD", True)
    args, w = _weights(CFG)
    eng = build_engine(args, w, CFG, max_context=1024, prefill_cols=8, prefill_gemm=256)
    m = eng.model
    assert [g.M for g in m.gemms] == [256, 64]
    runs = []
    for g in m.gemms:
        orig = g.run_chunk
        monkeypatch.setattr(g, "run_chunk", lambda ids, start, valid=None, g=g, orig=orig:
                            (runs.append((g.M, len(ids), valid)), orig(ids, start, valid=valid))[1])
    eng.prefill(list(range(1, 301)))  # 256 whole, then 44 padded into the 64-row executor
    assert runs == [(256, 256, None), (64, 64, 44)] and eng.position == 300
    assert m.gemms[1]._valid == 44
    eng.reset()
    runs.clear()
    eng.prefill(list(range(1, 276)))  # 256 whole, 19 left: under PAD_MIN, the columns step and decode
    assert runs == [(256, 256, None)] and eng.position == 275


def test_ffn_split_plumbing(cp, monkeypatch):
    """NINFER_FFN_SPLIT=1 (off by default: slower on the H200): an MLP of two or more 1,024-value blocks
    runs as two halves (gate|up A; gate|up B
    beside stage A + down A; stage B + down B), the down halves into partial planes 0 and 1 over column
    views of the down matrix; a narrower MLP, and the flag off, keep one gate|up, stage and down."""
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


@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_flash_prefill_plumbing(cp, monkeypatch, kv):
    """NINFER_FLASH_PREFILL: the GEMM prefill's attention layers are one attn_prefill_fa launch a chunk
    (grid: query heads x 64-row query tiles of the valid rows; the chunk's start; the int8 scales)."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda_prefill import CudaQwen35Prefill
    from engine.ops import kernels as K

    monkeypatch.setattr(CudaQwen35Prefill, "FLASH_PREFILL", True)
    monkeypatch.setattr(CudaQwen35Prefill, "FLASH_WARPS", 4)
    launches = []
    prepared = K.prepared

    def spy(name, grid, args, block=K.WARPS * 32, smem=0):
        if name.startswith("attn_prefill_fa"):
            launches.append((name, tuple(grid), args, block, smem))
        return prepared(name, grid, args, block=block, smem=smem)
    monkeypatch.setattr(K, "prepared", spy)
    args, w = _weights(CFG)
    eng = build_engine(args, w, CFG, max_context=512, kv=kv, prefill_cols=8, prefill_gemm=64)
    gemm = eng.model.gemm
    names = [getattr(op, "name", "") for op in gemm.ops]
    n_attn = sum(1 for L in gemm.layers if L["kind"] == "full_attention")
    assert names.count("attention (flash kernel over the paged cache)") == n_attn
    eng.prefill(list(range(1, 150)))  # two GEMM chunks of 64 (starts 0, 64), then the columns step
    hq, kv8 = args.num_attention_heads, "true" if kv == "int8" else "false"
    assert [(n, g, b, s) for n, g, _, b, s in launches] == \
        [(f"attn_prefill_fa<4,{kv8}>", (hq, 1), 128, 2 * 264 * 192)] * (2 * n_attn)
    assert [(int(a[9]), int(a[10])) for _, _, a, _, _ in launches] == [(0, 64)] * n_attn + [(64, 64)] * n_attn
    assert all((int(a[4]) != 0) == (kv == "int8") for _, _, a, _, _ in launches)  # the scales pointer
    assert eng.position == 149


def test_pre_ampere_gpus_take_the_cublas_attention_and_the_token_by_token_recurrence(cp, monkeypatch):
    """Below sm_80 (no bf16/tf32 mma.sync, no cp.async) the prefill runs neither the flash kernel nor the
    chunked GDN, whatever the defaults say."""
    from engine.gpu_engine import build_engine
    from engine.ops import kernels as K

    monkeypatch.setattr(cp.cuda, "Device", lambda *a: __import__("types").SimpleNamespace(
        attributes={"MultiProcessorCount": 40}, synchronize=lambda: None, mem_info=(100 << 30, 141 << 30), id=0,
        compute_capability="75"))
    K.mma_ok.cache_clear()
    args, w = _weights(CFG)
    eng = build_engine(args, w, CFG, max_context=512, prefill_cols=8, prefill_gemm=64)
    names = [getattr(op, "name", "") for op in eng.model.gemm.ops]
    assert "attention (gather, cuBLAS, softmax kernel)" in names
    assert not any(n.startswith("gdn_chunk") or n.startswith("attention (flash") for n in names)
    K.mma_ok.cache_clear()


@pytest.mark.parametrize("optin,warps,form", [(227 * 1024, 8, (64, True)), (163 * 1024, 8, (32, True)),
                                               (99 * 1024, 4, None)])
def test_prefill_kernels_follow_the_shared_memory_a_block_may_take(cp, monkeypatch, optin, warps, form):
    """H100/H200 (227 KiB a block), A100 (163), RTX 30/40 (99): the flash prefill's warps and the chunked
    GDN's form are the largest that fit (on 99 KiB: 4 warps, the token-by-token recurrence)."""
    import types

    from engine.gpu_engine import build_engine
    from engine.ops import kernels as K

    monkeypatch.setattr(cp.cuda, "Device", lambda *a: types.SimpleNamespace(
        attributes={"MultiProcessorCount": 108, "MaxSharedMemoryPerBlockOptin": optin}, synchronize=lambda: None,
        mem_info=(100 << 30, 141 << 30), id=0, compute_capability="86"))
    K.smem_optin.cache_clear()
    K.mma_ok.cache_clear()
    from engine.models.qwen3_5_cuda_prefill import CudaQwen35Prefill

    monkeypatch.setattr(CudaQwen35Prefill, "GDN_SCAN_RB", 64)  # (the tiny model's 4 heads would pick 32)
    args, w = _weights(CFG)
    gemm = build_engine(args, w, CFG, max_context=512, prefill_cols=8, prefill_gemm=64).model.gemm
    assert gemm._flash_warps() == warps and gemm._gdn_chunked_form() == form
    names = [getattr(op, "name", "") for op in gemm.ops]
    assert any(n.startswith("gdn_chunk") for n in names) == (form is not None)
    K.smem_optin.cache_clear()
    K.mma_ok.cache_clear()


@pytest.mark.parametrize("norm16", [True, False])
def test_prefill_norms_write_the_gemm_input(cp, monkeypatch, norm16):
    """The tensor-core prefill's norms (but the final one) write the GEMMs' fp16 input rows themselves,
    so that only the attention layers' o-projection input (the flash kernel's fp32 output) is cast before
    its GEMM; NINFER_PREFILL_NORM16=0 casts before every GEMM but the down projection, as before."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda_prefill import CudaQwen35Prefill

    monkeypatch.setattr(CudaQwen35Prefill, "NORM16", norm16)
    args, w = _weights(CFG)
    eng = build_engine(args, w, CFG, max_context=512, prefill_gemm=128)
    g = eng.model.gemm
    names = [getattr(op, "name", "") for op in _flat(g.ops)]
    n_layers, n_att = args.num_hidden_layers, len(args.full_attention_layers)
    assert names.count("residual_rmsnorm_f16") == (2 * n_layers if norm16 else 0)
    assert names.count("gated_rmsnorm_f16") == (n_layers - n_att if norm16 else 0)
    casts = []
    orig = CudaQwen35Prefill._matmul

    def spy(self, w, x, y, ldy, rows=None, acc=False):
        casts.append(self._x16_of is not x)
        accs.append((acc, y is self.x))
        return orig(self, w, x, y, ldy, rows, acc)
    accs = []
    monkeypatch.setattr(CudaQwen35Prefill, "_matmul", spy)
    g.run_chunk(list(range(1, 129)), 0)
    # GEMMs a layer: attention q|k, gate|v, o, gate|up, down; GDN v|z, q|k, a|b, o, gate|up, down
    assert len(casts) == 5 * n_att + 6 * (n_layers - n_att)
    assert sum(casts) == (n_att if norm16 else 4 * n_att + 5 * (n_layers - n_att))
    # the out- and down-projections add into the residual stream itself (with the fp16 norms)
    assert accs.count((True, True)) == (2 * n_layers if norm16 else 0)
    assert accs.count((False, True)) == 0


def test_gdn_scan_rows_a_block_fill_the_gpu(monkeypatch):
    """The in-order GDN pass takes the largest tensor-core RB whose blocks fill 70% of the GPU: the 27B's 48
    value heads keep RB 64 (96 blocks on 132 SMs), the 35B-A3B's 32 take RB 32 (128 blocks, not 64)."""
    from types import SimpleNamespace

    from engine.models.qwen3_5_cuda_prefill import CudaQwen35Prefill
    from engine.ops import kernels as K

    monkeypatch.setattr(K, "sm_count", lambda: 132)
    rb = lambda hv, forced=0, tc=True: CudaQwen35Prefill.gdn_scan_rb(  # noqa: E731
        SimpleNamespace(Hv=hv, GDN_SCAN_RB=forced, GDN_TC=tc))
    assert (rb(48), rb(32), rb(4), rb(48, forced=32), rb(48, tc=False)) == (64, 32, 32, 32, 32)


def test_moe_prefill_norm_reads_one_partial(cp, monkeypatch):
    """The tensor-core MoE block writes its whole sum into partial 0, so the norm after it reads that plane
    only (the decode step's norm sums the k routed slots and the shared expert)."""
    from engine import gpu_engine
    from engine.gpu_engine import build_engine
    from engine.ops import kernels as K

    monkeypatch.setattr(gpu_engine, "MOE_PREFILL", True)
    cfg = dict(CFG, architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe_text", num_experts=8,
               num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=128)
    cfg.pop("intermediate_size")
    args, w = _weights(cfg)
    eng = build_engine(args, w, cfg, max_context=512, prefill_gemm=128)
    splits = []
    orig = K.prepared

    def spy(name, grid, a, **kw):
        if name == "residual_rmsnorm_f16":  # (built at a norm's first run; the final norm's at plan time)
            splits.append(int(a[3]))
        return orig(name, grid, a, **kw)
    monkeypatch.setattr(K, "prepared", spy)
    g = eng.model.gemm
    g.eidx[...] = np.arange(args.num_experts_per_tok, dtype=np.int32)
    g.run_chunk(list(range(1, 129)), 0)
    # per layer: the input norm (after the previous MoE block: 1 plane; the first: none), the post-attention
    # norm (none: the o-projection added itself to the residual); then the final norm (the decode step's
    # kernel, its head staging)
    L = args.num_hidden_layers
    assert splits == [0, 0] + [1, 0] * (L - 1)
    final = [op for op in g.ops if getattr(op, "name", "") == "residual_rmsnorm_mb"]
    assert len(final) == 1 and int(final[0].args[3]) == 1


def test_prefill_dequantizes_the_next_weights_ahead(cp, monkeypatch):
    """Dense models: the first run of a chunk records its GEMMs' weights in order (dequantized in place);
    later runs dequantize weight i + 1 on the side stream into the other fp16 buffer while GEMM i runs
    (but an attention layer's o-projection, after the flash kernel)."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda_prefill import CudaQwen35Prefill

    args, w = _weights(CFG)
    eng = build_engine(args, w, CFG, max_context=512, prefill_gemm=128)
    g = eng.model.gemm
    assert g._w16b is not None and g._w16b is not g._w16
    log = []
    orig = CudaQwen35Prefill._dequant

    def spy(self, w, buf=None):
        log.append((w, buf, cp.cuda.get_current_stream() is self._dq_stream))
        return orig(self, w, buf)
    monkeypatch.setattr(CudaQwen35Prefill, "_dequant", spy)
    g.run_chunk(list(range(1, 129)), 0)
    first = list(log)
    n = len(g._wseq)
    assert n == len(first) and not any(side for _, _, side in first)
    log.clear()
    waits = []
    monkeypatch.setattr(g._dq_stream, "wait_event", waits.append, raising=False)
    g.run_chunk(list(range(1, 129)), 0)
    # the side stream starts after what the main stream held at the chunk's first GEMM (another executor's
    # GEMMs on the same two buffers), then each prefetch after the GEMM that last read its buffer
    assert waits[0] is g._chunk_start and waits[1] is g._gemm_done[1]
    assert [x for x, _, _ in log] == g._wseq
    # (an attention layer's o-projection weights are dequantized in order: not ahead across the flash kernel)
    ahead = [False] + [id(x) not in {id(L["o"]) for L in g.layers if L["kind"] == "full_attention"}
                       for x in g._wseq[1:]]
    assert [side for _, _, side in log] == ahead and ahead.count(False) == 1 + len(args.full_attention_layers)
    assert [buf is (g._w16 if i % 2 == 0 else g._w16b) for i, (_, buf, _) in enumerate(log)] == [True] * n


def test_gdn_prep_in_the_projections_epilogue(cp, monkeypatch):
    """NINFER_GDN_PREP_FUSED (the default): no gdn_prep launch in the decode step; the q|k and v|z GEMVs take
    the conv epilogue over their channels of the conv history (q|k from channel 0, v from 2 Hk x 128, z rows
    plain) and gdn_delta_raw reads their outputs; the columns step keeps its own prep kernel."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    monkeypatch.setattr(CudaQwen35, "GDN_PREP_FUSED", True)
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


def test_attention_query_group_cut_plumbing(cp, monkeypatch):
    """NINFER_ATTN_GSPLIT: the decode attention takes attn_decode_split<G / GS, KV8, GS> over Hkv GS blocks a
    split where that cut is compiled (kernels.ATTN_GSPLIT), the one-block kernel elsewhere."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    cfg = dict(CFG, num_attention_heads=12, num_key_value_heads=2)  # 6 query heads a KV head, as the 27B
    args, w = _weights(cfg)
    for gs, name in ((1, "attn_decode_split<6,false>"), (2, "attn_decode_split<3,false,2>"),
                     (3, "attn_decode_split<6,false>")):  # (6 / 3 = 2 a block is not compiled)
        monkeypatch.setattr(CudaQwen35, "ATTN_GSPLIT", gs)
        ex = build_engine(args, w, cfg, max_context=256, prefill_cols=8, prefill_gemm=0).model.executor
        att = [op for op in _flat(ex.ops) if getattr(op, "name", "").startswith("attn_decode")]
        assert att and all(op.name == name for op in att)
        assert all(op.grid[0] == args.num_key_value_heads * (2 if gs == 2 else 1) for op in att)
