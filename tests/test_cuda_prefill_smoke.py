"""The tensor-core prefill executors' Python, on the CPU (tests/fake_cupy.py, kernels are no-ops): which
kernels and GEMMs a chunk runs, what it allocates and shares, how it picks its forms by the GPU. The
kernels' numbers are checked by tests/gpu/test_prefill.py on a device."""
import numpy as np
import pytest

from cuda_smoke import CFG, cp, on_gpu, flat as _flat, moe_cfg, weights as _weights  # noqa: F401


def test_moe_gemm_prefill_plumbing(cp, monkeypatch):
    """the MoE model gets tensor-core prefill executors whose MoE block is one op
    (router, grouped experts, shared expert), and a prompt runs through them."""
    from engine import gpu_engine
    from engine.gpu_engine import build_engine

    cfg = moe_cfg(128)
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
    from engine.gpu.prefill import CudaQwen35Prefill

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


def test_chunked_gdn_prefill_plumbing(cp, monkeypatch):
    """The plan's chunked GDN (sm_90): the GEMM prefill's GDN layers run gdn_chunk_prep then the plan's
    gdn_chunk_scan_tc<RB, 1> (in place of gdn_delta_rows) over scratch sized for the chunk's 64-token pieces."""
    from engine.gpu_engine import build_engine

    on_gpu(monkeypatch, "sm_90")
    args, w = _weights(CFG)
    eng = build_engine(args, w, CFG, max_context=512, prefill_cols=8, prefill_gemm=128)
    gemm = eng.model.gemm
    names = [getattr(op, "name", "") for op in gemm.ops]
    n_gdn = sum(1 for L in gemm.layers if L["kind"] != "full_attention")
    scan = gemm.plan.gdn_scan
    assert scan == "gdn_chunk_scan_tc<32, 1>"  # (the tiny model's 4 value heads)
    assert names.count("gdn_chunk_prep") == n_gdn and names.count(scan) == n_gdn
    assert not any(n.startswith("gdn_delta") for n in names)
    assert gemm._gdn_scratch[0].size == 2 * args.linear_num_value_heads * 64 * 128  # 128 rows: two pieces
    eng.prefill(list(range(1, 140)))


def test_padded_prefill_plumbing(cp, monkeypatch):
    """whole chunks of the largest executor, then the rest padded into the smallest
    executor that holds it; the T-dependent launches take the valid length."""
    from engine import gpu_engine
    from engine.gpu_engine import build_engine

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


@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_flash_prefill_plumbing(cp, monkeypatch, kv):
    """The GEMM prefill's attention layers are one attn_prefill_fa launch a chunk (grid: query heads x 64-row query tiles
    of the valid rows; the chunk's start; the int8 scales), 4 warps a block on the 99 KB GPUs."""
    from engine.gpu_engine import build_engine
    from engine.gpu import launch as K

    on_gpu(monkeypatch, "sm_86")
    launches = []
    prepared = K.prepared

    def spy(name, grid, args, block=K.WARPS * 32, smem=0, **kw):
        if name.startswith("attn_prefill_fa"):
            launches.append((name, tuple(grid), args, block, smem))
        return prepared(name, grid, args, block=block, smem=smem, **kw)
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


def test_prefill_norms_write_the_gemm_input(cp, monkeypatch):
    """The tensor-core prefill's norms (but the final one) write the GEMMs' fp16 input rows themselves,
    so that only the attention layers' o-projection input (the flash kernel's fp32 output) is cast before
    its GEMM."""
    from engine.gpu_engine import build_engine
    from engine.gpu.prefill import CudaQwen35Prefill

    norm16 = True
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


def test_moe_prefill_norm_reads_one_partial(cp, monkeypatch):
    """The tensor-core MoE block writes its whole sum into partial 0, so the norm after it reads that plane
    only (the decode step's norm sums the k routed slots and the shared expert)."""
    from engine.gpu_engine import build_engine

    cfg = moe_cfg(128)
    args, w = _weights(cfg)
    eng = build_engine(args, w, cfg, max_context=512, prefill_gemm=128)
    g = eng.model.gemm
    splits = [int(op.launch.args[3]) for op in g.ops if getattr(op, "name", "") == "residual_rmsnorm_f16"]
    # per layer: the input norm (after the previous MoE block: 1 plane; the first: none), the post-attention
    # norm (none: the o-projection added itself to the residual); then the final norm (the decode step's
    # kernel, its head staging)
    L = args.num_hidden_layers
    assert splits == [0, 0] + [1, 0] * (L - 1)
    final = [op for op in g.ops if getattr(op, "name", "").startswith(("residual_rmsnorm_mb", "residual_rmsnorm_cl"))]
    assert len(final) == 1 and int(final[0].args[3]) == 1


def test_prefill_dequantizes_the_next_weights_ahead(cp, monkeypatch):
    """Dense models: the first run of a chunk records its GEMMs' weights in order (dequantized in place);
    later runs dequantize weight j on the side stream into fp16 buffer j % DQ_BUFS, once GEMM j - DQ_BUFS
    is done with that buffer: one ahead at each GEMM, up to DQ_BUFS at a GDN layer's window before its
    recurrence (its o-projection's there), an attention layer's o-projection in place, after the flash
    kernel, none across it."""
    from engine.gpu_engine import build_engine
    from engine.gpu.prefill import CudaQwen35Prefill

    args, w = _weights(CFG)
    eng = build_engine(args, w, CFG, max_context=512, prefill_gemm=128)
    g = eng.model.gemm
    nbuf = len(g._wbufs)
    assert nbuf == max(2, CudaQwen35Prefill.DQ_BUFS) and len({id(b) for b in g._wbufs}) == nbuf
    log = []
    orig = CudaQwen35Prefill._dequant

    def spy(self, w, buf=None):
        log.append((w, buf, cp.cuda.get_current_stream() is self._dq_stream, len(waits)))
        issued_at.append(self._wpos - 1)  # the GEMM whose _weights16 issued it
        return orig(self, w, buf)
    waits, issued_at = [], []
    monkeypatch.setattr(CudaQwen35Prefill, "_dequant", spy)
    g.run_chunk(list(range(1, 129)), 0)
    first = list(log)
    n = len(g._wseq)
    assert n == len(first) and not any(side for _, _, side, _ in first)
    log.clear()
    issued_at.clear()
    monkeypatch.setattr(g._dq_stream, "wait_event", waits.append, raising=False)
    g.run_chunk(list(range(1, 129)), 0)
    assert [x for x, _, _, _ in log] == g._wseq
    assert all(buf is g._wbufs[i % nbuf] for i, (_, buf, _, _) in enumerate(log))
    # in place: the first weights and each attention layer's o-projection; the rest on the side stream,
    # each after the wait for GEMM j - nbuf (the side stream's first wait: the chunk's start)
    o_attn = {id(L["o"]) for L in g.layers if L["kind"] == "full_attention"}
    in_place = [i for i, (x, _, side, _) in enumerate(log) if not side]
    assert in_place == [0] + [i for i, x in enumerate(g._wseq) if id(x) in o_attn]
    assert waits[0] is g._chunk_start
    side = [(i, nw) for i, (_, _, s, nw) in enumerate(log) if s]
    assert [waits[nw - 1] for _, nw in side] == [g._gemm_done[i % nbuf] for i, _ in side]
    # ahead of their GEMM by 1 .. nbuf - 1 (all of that used), none across an attention o-projection
    ahead = [j - issued_at[j] for j, _ in side]
    assert min(ahead) == 1 and max(ahead) == (nbuf if nbuf > 2 else 1)
    # (more than one ahead only at a GDN layer's window, after its last GEMM before the recurrence: the
    # next GEMM is that layer's o-projection)
    o_gdn = {id(L["o"]) for L in g.layers if L["kind"] != "full_attention"}
    far = [j for j, _ in side if j - issued_at[j] > 1]
    assert (len(far) > 0) == (nbuf > 2) and all(id(g._wseq[issued_at[j] + 1]) in o_gdn for j in far)
    # ... where the GDN o-projections' own weights wait: issued there, not beside the GEMM before it
    o_at = [j for j in range(n) if id(g._wseq[j]) in o_gdn]
    assert all(log[j][2] and issued_at[j] == j - 1 for j in o_at)
    windows = [i for i, op in enumerate(g.ops) if getattr(op, "name", "") == "dequantize ahead (window)"]
    assert len(windows) == (len(o_gdn) if nbuf > 2 else 0)
    # a window's dequantizations start after what the main stream held there (its event), in GPU time
    for j in far:
        assert any(w is g._window_ev for w in waits[: log[j][3]])
    for j, _ in side:
        assert not any(id(x) in o_attn for x in g._wseq[issued_at[j] + 1: j])


@pytest.mark.parametrize("gpu,warps,scan", [("sm_90", 8, "gdn_chunk_scan_tc<32, 1>"),
                                            ("sm_80", 8, "gdn_chunk_scan_tc<32, 1>"), ("sm_86", 4, "")])
def test_prefill_kernels_follow_the_shared_memory_a_block_may_take(cp, monkeypatch, gpu, warps, scan):
    """H100/H200 (227 KiB a block), A100 (163), RTX 30/40 (99): the flash prefill's warps and the chunked GDN's form
    are the largest that fit (on 99 KiB: 4 warps, the token-by-token recurrence, gdn_delta_rows<2>)."""
    from engine.gpu_engine import build_engine

    on_gpu(monkeypatch, gpu)
    args, w = _weights(CFG)
    gemm = build_engine(args, w, CFG, max_context=512, prefill_cols=8, prefill_gemm=64).model.gemm
    assert gemm.plan.flash_warps == warps and gemm.plan.gdn_scan == scan
    names = [getattr(op, "name", "") for op in gemm.ops]
    assert any(n.startswith("gdn_chunk") for n in names) == bool(scan)
    assert ("gdn_delta_rows<2>" in names) == (not scan)


def test_gdn_scan_rows_a_block_fill_the_gpu():
    """The in-order GDN pass takes the largest tensor-core RB whose blocks fill 70% of the GPU and fit its shared
    memory: the 27B's 48 value heads keep RB 64 (96 blocks on 132 SMs), the 35B-A3B's 32 take RB 32 (128 blocks, not
    64); the A100's 163 KiB fit RB 32 only."""
    from engine.gpu.plan import DEVICES, gdn_scan_form

    assert gdn_scan_form(48, DEVICES["sm_90"]) == "gdn_chunk_scan_tc<64, 1>"
    assert gdn_scan_form(32, DEVICES["sm_90"]) == gdn_scan_form(4, DEVICES["sm_90"]) == "gdn_chunk_scan_tc<32, 1>"
    assert gdn_scan_form(48, DEVICES["sm_80"]) == "gdn_chunk_scan_tc<32, 1>" and gdn_scan_form(48, DEVICES["sm_89"]) == ""
