"""The CUDA decode step's attention forms, on the CPU: which kernel, grid, block and shared memory each flag and
device limit picks (the tensor-core forms, raw-K int8, the query-group cut, the multi-token and fused-combine
kernels), the op lists built against the NumPy stand-in for CuPy (tests/fake_cupy.py). The rest of the decode
step's plumbing is in test_cuda_executor_smoke.py."""
import functools

import pytest

from cuda_smoke import CFG, cp, flat as _flat, weights as _weights  # noqa: F401


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


def test_attention_on_tensor_cores_plumbing(cp, monkeypatch):
    """NINFER_ATTN_MMA: the decode attention takes attn_decode_mma<G, KV8, W, NS> (grid Hkv x nsplit x M, W
    warps, its form's dynamic shared memory) where G is compiled (kernels.ATTN_MMA_G), the split kernel
    elsewhere; the form is the first of kernels.ATTN_MMA_FORMS that fits the device's shared memory, and
    nsplit fills the SMs once (the split kernels: twice)."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    monkeypatch.setattr(CudaQwen35, "ATTN_MMA", True)
    monkeypatch.setattr(K, "ATTN_MMA_AUTO", 3)  # every form in the automatic choice
    for limit, kv, want, form in ((227 * 1024, "bf16", "attn_decode_mma<6,false,4,3>", (4, 3)),
                                  (227 * 1024, "int8", "attn_decode_mma<6,true,8,2,true,true>", (8, 2)),  # (raw K, V)
                                  (163 * 1024, "int8", "attn_decode_mma<6,true,4,2>", (4, 2)),
                                  (99 * 1024, "int8", "attn_decode_mma<6,true,3,1>", (3, 1)),
                                  (99 * 1024, "bf16", "attn_decode_mma<6,false,4,1>", (4, 1)),
                                  (48 * 1024, "bf16", "attn_decode_split<3,false,2>", None)):
        monkeypatch.setattr(K, "smem_optin", functools.cache(lambda limit=limit: limit))  # (the fixture clears it)
        cfg = dict(CFG, num_attention_heads=12, num_key_value_heads=2)
        args, w = _weights(cfg)
        ex = build_engine(args, w, cfg, max_context=256, prefill_cols=8, prefill_gemm=0, kv=kv).model.executor
        att = [op for op in _flat(ex.ops) if getattr(op, "name", "").startswith("attn_decode")]
        assert att and all(op.name == want for op in att), (limit, kv, {op.name for op in att})
        if form:
            kraw, vraw = want.endswith(",true>"), want.endswith(",true,true>")
            assert all(op.grid == (2, ex.nsplit, ex.M) and op.block == 32 * form[0]
                       and op.smem == K.attn_mma_smem(kv == "int8", *form, kraw=kraw, vraw=vraw) for op in att)
        waves = K.blocks_per_sm(want, 32 * form[0], att[0].smem) if form else 2  # (resident blocks an SM)
        assert ex.nsplit == min(256 // 64, (waves * K.sm_count()) // 2)
    monkeypatch.setattr(K, "smem_optin", functools.cache(lambda: 227 * 1024))
    cfg = dict(CFG, num_attention_heads=4, num_key_value_heads=2)  # 2 query heads a KV head: not compiled
    args, w = _weights(cfg)
    ex = build_engine(args, w, cfg, max_context=256, prefill_cols=8, prefill_gemm=0).model.executor
    assert {op.name for op in _flat(ex.ops) if getattr(op, "name", "").startswith("attn_decode")} == {
        "attn_decode_split<2,false>"}
    assert K.attn_mma_smem(True, 4, 4) == K.attn_mma_smem(False, 4, 3) == 211_200
    assert K.attn_mma_form(True, 227 * 1024, pick=2) == (3, 1) and K.attn_mma_form(True, 80 * 1024) is None
    assert K.ATTN_MMA_AUTO == 3  # every form in the automatic choice (each ran on the H200, session 11)
    monkeypatch.setattr(K, "ATTN_MMA_AUTO", 1)  # (the first form only)
    assert K.attn_mma_form(True, 163 * 1024) is None and K.attn_mma_form(True, 163 * 1024, pick=1) == (4, 2)
    with pytest.raises(ValueError, match="NINFER_ATTN_MMA_FORM=3"):
        K.attn_mma_form(True, 227 * 1024, pick=3)


def test_attention_raw_k_plumbing(cp, monkeypatch):
    """NINFER_ATTN_KRAW (on by default): an int8 cache on the first attn_decode_mma form takes its raw-K
    instantiation (same grid; its V-only tile takes less shared memory, NINFER_ATTN_KRAW_FORM spends it on warps);
    bf16 caches and the smaller forms keep theirs."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    assert CudaQwen35.ATTN_KRAW and CudaQwen35.ATTN_VRAW == 2
    monkeypatch.setattr(CudaQwen35, "ATTN_MMA", True)
    monkeypatch.setattr(CudaQwen35, "ATTN_VRAW", 0)  # (raw V too: below)
    monkeypatch.setattr(K, "ATTN_MMA_AUTO", 3)
    cfg = dict(CFG, num_attention_heads=12, num_key_value_heads=2)
    args, w = _weights(cfg)
    assert K.attn_mma_kraw_name(6) in K._names()
    for kraw, limit, kv, want in ((True, 227 * 1024, "int8", "attn_decode_mma<6,true,8,2,true>"),  # (ATTN_KRAW_FORM 2)
                                  (False, 227 * 1024, "int8", "attn_decode_mma<6,true,4,4>"),
                                  (True, 227 * 1024, "bf16", "attn_decode_mma<6,false,4,3>"),
                                  (True, 163 * 1024, "int8", "attn_decode_mma<6,true,4,2>")):
        monkeypatch.setattr(CudaQwen35, "ATTN_KRAW", kraw)
        monkeypatch.setattr(K, "smem_optin", functools.cache(lambda limit=limit: limit))
        ex = build_engine(args, w, cfg, max_context=256, prefill_cols=8, prefill_gemm=0, kv=kv).model.executor
        att = [op for op in _flat(ex.ops) if getattr(op, "name", "").startswith("attn_decode")]
        assert att and {op.name for op in att} == {want}, (kraw, limit, kv, {op.name for op in att})
        raw = want.endswith(",true>")
        form = tuple(int(v) for v in want.split(",")[2:4]) if raw else K.attn_mma_form(kv == "int8", limit)
        assert all(op.smem == K.attn_mma_smem(kv == "int8", *form, kraw=raw) for op in att)
    assert K.attn_mma_smem(True, 4, 4, kraw=True) == 177_408
    assert K.attn_mma_smem(True, 6, 3, kraw=True) == K.attn_mma_smem(True, 8, 2, kraw=True) == 211_200
    monkeypatch.setattr(CudaQwen35, "ATTN_KRAW", True)
    assert CudaQwen35.ATTN_KRAW_FORM == 2  # (session 21, s21b: W 8, NS 2 at 32K)
    for form, limit, want in ((0, 227 * 1024, "attn_decode_mma<6,true,4,4,true>"),
                              (1, 227 * 1024, "attn_decode_mma<6,true,6,3,true>"),
                              (2, 227 * 1024, "attn_decode_mma<6,true,8,2,true>"),
                              (3, 227 * 1024, "attn_decode_mma<6,true,5,4,true>"),
                              (3, 212 * 1024, "attn_decode_mma<6,true,4,4,true>")):  # (5, 4) does not fit: the first
        monkeypatch.setattr(CudaQwen35, "ATTN_KRAW_FORM", form)
        monkeypatch.setattr(K, "smem_optin", functools.cache(lambda limit=limit: limit))
        assert want in K._names()
        ex = build_engine(args, w, cfg, max_context=256, prefill_cols=8, prefill_gemm=0, kv="int8").model.executor
        att = [op for op in _flat(ex.ops) if getattr(op, "name", "").startswith("attn_decode")]
        ww, ns = (int(v) for v in want.split(",")[2:4])
        assert {op.name for op in att} == {want} and all(
            op.block == 32 * ww and op.smem == K.attn_mma_smem(True, ww, ns, kraw=True) for op in att)
    monkeypatch.setattr(CudaQwen35, "ATTN_KRAW_FORM", 4)
    with pytest.raises(ValueError, match="NINFER_ATTN_KRAW_FORM=4"):
        build_engine(args, w, cfg, max_context=256, prefill_cols=8, prefill_gemm=0, kv="int8")
    monkeypatch.setattr(CudaQwen35, "ATTN_KRAW_FORM", 2)
    # NINFER_ATTN_VRAW (V's codes into the MMAs too; form 2 by default): its forms, their shared memory (no fp16 tile)
    assert K.attn_mma_smem(True, 8, 3, vraw=True) == 211_200 and K.attn_mma_smem(True, 8, 2, vraw=True) == 143_616
    for vraw, limit, want, smem in ((1, 227 * 1024, "attn_decode_mma<6,true,8,3,true,true>", 211_200),
                                    (2, 227 * 1024, "attn_decode_mma<6,true,8,2,true,true>", 143_616),
                                    (1, 163 * 1024, "attn_decode_mma<6,true,4,2>", None)):  # (too small: the form
        monkeypatch.setattr(CudaQwen35, "ATTN_VRAW", vraw)                                  # that fits)
        monkeypatch.setattr(K, "smem_optin", functools.cache(lambda limit=limit: limit))
        ex = build_engine(args, w, cfg, max_context=256, prefill_cols=8, prefill_gemm=0, kv="int8").model.executor
        att = [op for op in _flat(ex.ops) if getattr(op, "name", "").startswith("attn_decode")]
        assert {op.name for op in att} == {want} and (smem is None or all(op.smem == smem and op.block == 256
                                                                           for op in att))
    monkeypatch.setattr(K, "smem_optin", functools.cache(lambda: 227 * 1024))
    monkeypatch.setattr(CudaQwen35, "ATTN_VRAW", 3)
    with pytest.raises(ValueError, match="NINFER_ATTN_VRAW=3"):
        build_engine(args, w, cfg, max_context=256, prefill_cols=8, prefill_gemm=0, kv="int8")
    monkeypatch.setattr(CudaQwen35, "ATTN_VRAW", 2)


def test_attention_transposed_plumbing(cp, monkeypatch):
    """NINFER_ATTN_TR (off by default): an int8 cache takes attn_decode_mma_t<G, W, NS, MINB> of form N - 1 (block 32 W,
    its shared memory), nsplit its resident blocks' worth (the partials sized for up to four blocks an SM), the combine
    the same nsplit; bf16 caches keep attn_decode_mma."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    assert CudaQwen35.ATTN_TR == 0
    assert K.attn_mma_t_smem(8, 2) == 139_392 and K.attn_mma_t_smem(4, 2) == 71_808
    monkeypatch.setattr(CudaQwen35, "ATTN_MMA", True)
    monkeypatch.setattr(K, "smem_optin", functools.cache(lambda: 227 * 1024))
    cfg = dict(CFG, num_attention_heads=12, num_key_value_heads=2)
    args, w = _weights(cfg)
    for tr, (ww, ns, _minb) in enumerate(K.ATTN_MMA_T_FORMS, start=1):
        monkeypatch.setattr(CudaQwen35, "ATTN_TR", tr)
        name = K.attn_mma_t_name(6, tr - 1)
        assert name in K._names() and name == f"attn_decode_mma_t<6,{ww},{ns},{_minb}>"
        ex = build_engine(args, w, cfg, max_context=2048, prefill_cols=8, prefill_gemm=0, kv="int8").model.executor
        att = [op for op in _flat(ex.ops) if getattr(op, "name", "").startswith("attn_decode")]
        assert {op.name for op in att} == {name}
        waves = K.blocks_per_sm(name, 32 * ww, K.attn_mma_t_smem(ww, ns))
        assert ex.nsplit == min(2048 // 64, (waves * K.sm_count()) // 2) <= ex.attn_ml.shape[2]
        assert all(op.block == 32 * ww and op.smem == K.attn_mma_t_smem(ww, ns) and op.grid == (2, ex.nsplit, ex.M)
                   for op in att)
        bf = build_engine(args, w, cfg, max_context=256, prefill_cols=8, prefill_gemm=0).model.executor
        assert not any(getattr(op, "name", "").startswith("attn_decode_mma_t") for op in _flat(bf.ops))
    monkeypatch.setattr(CudaQwen35, "ATTN_TR", 6)
    with pytest.raises(ValueError, match="NINFER_ATTN_TR=6"):
        build_engine(args, w, cfg, max_context=256, prefill_cols=8, prefill_gemm=0, kv="int8")


def test_attention_query_group_cut_plumbing(cp, monkeypatch):
    """NINFER_ATTN_GSPLIT: the decode attention takes attn_decode_split<G / GS, KV8, GS> over Hkv GS blocks a
    split where that cut is compiled (kernels.ATTN_GSPLIT), the one-block kernel elsewhere."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    monkeypatch.setattr(CudaQwen35, "ATTN_MMA", False)  # (on by default where it fits: H100-class GPUs)
    cfg = dict(CFG, num_attention_heads=12, num_key_value_heads=2)  # 6 query heads a KV head, as the 27B
    args, w = _weights(cfg)
    for gs, name in ((1, "attn_decode_split<6,false>"), (2, "attn_decode_split<3,false,2>"),
                     (3, "attn_decode_split<6,false>")):  # (6 / 3 = 2 a block is not compiled)
        monkeypatch.setattr(CudaQwen35, "ATTN_GSPLIT", gs)
        ex = build_engine(args, w, cfg, max_context=256, prefill_cols=8, prefill_gemm=0).model.executor
        att = [op for op in _flat(ex.ops) if getattr(op, "name", "").startswith("attn_decode")]
        assert att and all(op.name == name for op in att)
        assert all(op.grid[0] == args.num_key_value_heads * (2 if gs == 2 else 1) for op in att)
