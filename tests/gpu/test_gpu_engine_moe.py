"""The CUDA decode engine's MoE paths on the tiny Qwen3.5 MoE config (test_gpu_engine.py's MOE_CFG): against the
NumPy engine with each routed-expert form, and the fused or reshaped launches against the plain ones (the same
tokens and logits), the device top-k against its reference."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from test_gpu_engine import MOE_CFG, quantized_weights  # noqa: E402  (tests/gpu is on sys.path under pytest)


def moe_inputs(seed):
    """The MoE config's args, its groupwise-int-moe weights on the device, and a 12-token prompt from `seed`."""
    from engine import gpu_weights
    from engine.config import ModelArgs

    args = ModelArgs.from_config(MOE_CFG)
    w = gpu_weights.from_logical(args, quantized_weights(args, recipe="groupwise-int-moe"), recipe="groupwise-int-moe")
    return args, w, [int(t) for t in np.random.default_rng(seed).integers(0, MOE_CFG["vocab_size"], 12)]


def greedy_then_logits(eng, prompt):
    """Prefill `prompt`, then 24 greedy tokens from its argmax, then the logits of one more step."""
    first = int(np.argmax(eng.prefill(prompt)))
    return eng.decode_greedy(first, 24), eng.decode_step(3)


def assert_moe_gates(ref, gpu):
    """32 decode steps of the same random tokens on the NumPy engine `ref` and the CUDA engine `gpu`: the logits'
    relative L2 error under 3e-2 at the median and 0.35 at worst, the same argmax at 30 steps or more. (fp16 activations
    can flip a near-tied expert choice, which moves that step's logits more; the worst step must still pass the
    upstream logits gate, relative RMSE <= 0.35, spec/testing.md §5.3.)"""
    toks = np.random.default_rng(7).integers(0, MOE_CFG["vocab_size"], 32)
    errs, agree = [], 0
    for t in toks:
        a, b = ref.decode_step(int(t)), gpu.decode_step(int(t))
        errs.append(float(np.linalg.norm(a - b) / np.linalg.norm(a)))
        agree += int(np.argmax(a) == np.argmax(b))
    assert np.median(errs) < 3e-2 and max(errs) < 0.35 and agree >= 30, (np.median(errs), max(errs), agree)


@pytest.mark.parametrize("stage,pre2,down,i16", [(True, False, 0, False), (False, False, 0, False), (False, True, 0, False),
                                                 (False, False, 2, False), (False, False, 4, False),
                                                 (False, False, 4, True), (False, False, 3, True)])
def test_cuda_moe_engine_matches_numpy_engine(stage, pre2, down, i16, monkeypatch):
    """MOE_STAGE: routed rows staged by a launch / in the GEMV; MOE_PRE2: the routed gate|up on gemv_rs_pre;
    down: the routed and shared down-projections in one moe_down launch, `down` rows a half-warp (0: off),
    i16: its int16 pairs and dp2a."""
    from engine import api, gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    monkeypatch.setattr(CudaQwen35, "MOE_FUSED", 0)  # (the kernel-per-op MoE block; moe_fused: its own tests)
    monkeypatch.setattr(CudaQwen35, "MOE_STAGE", stage)
    monkeypatch.setattr(CudaQwen35, "MOE_PRE2", pre2)
    monkeypatch.setattr(CudaQwen35, "MOE_DOWN", down > 0)
    monkeypatch.setattr(CudaQwen35, "MOE_DOWN_ROWS", down or 4)
    monkeypatch.setattr(CudaQwen35, "MOE_DOWN_I16", i16)
    args = ModelArgs.from_config(MOE_CFG)
    w = quantized_weights(args, recipe="groupwise-int-moe")
    ref = api.load({"config": MOE_CFG, "weights": w}, device="cpu", gdn_mode="recurrent")
    gpu = build_engine(args, gpu_weights.from_logical(args, w, recipe="groupwise-int-moe"), MOE_CFG, max_context=256)
    assert_moe_gates(ref, gpu)
    launched = [K.op_name(op) for op in gpu.model.executor.ops]
    assert (f"moe_down<1,3,{down},{str(i16).lower()}>" in launched) == (down > 0)


@pytest.mark.parametrize("dr,o,chunk", [(2, 0, 0), (3, 0, 0), (2, 1, 0), (2, 1, 1)],
                         ids=["dr2", "dr3", "dr2-o", "dr2-o-chunk"])
def test_moe_fused_matches_numpy_engine(dr, o, chunk, monkeypatch):
    """MOE_FUSED (the norm and the whole MoE block in one persistent launch, the down's input staged by chunks; o: the
    w8 o-projection inside it too, MOE_FUSED_O; chunk: its input staged by chunks, MOE_FUSED_O_CHUNK): the logits against the NumPy engine within the MoE test's gates, the
    launch in the step, each launch's grid barriers complete (the counter a multiple of the grid), the routing block 0
    leaves the top-k of the logits."""
    from engine import api, gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K
    from engine.ops import ref

    monkeypatch.setattr(CudaQwen35, "MOE_FUSED", 1)
    monkeypatch.setattr(CudaQwen35, "MOE_FUSED_DR", dr)
    monkeypatch.setattr(CudaQwen35, "MOE_FUSED_O", o)
    monkeypatch.setattr(CudaQwen35, "MOE_FUSED_O_CHUNK", chunk)
    args = ModelArgs.from_config(MOE_CFG)
    w = quantized_weights(args, recipe="groupwise-int-moe")
    ref_eng = api.load({"config": MOE_CFG, "weights": w}, device="cpu", gdn_mode="recurrent")
    gpu = build_engine(args, gpu_weights.from_logical(args, w, recipe="groupwise-int-moe"), MOE_CFG, max_context=256)
    ex = gpu.model.executor
    fused = [op for op in ex.ops if K.op_name(op).startswith("moe_fused<")]
    assert len(fused) == args.num_hidden_layers
    assert_moe_gates(ref_eng, gpu)
    grid = fused[0].grid[0]
    assert int(ex.moe_bar.get()[0]) % grid == 0 and int(ex.moe_bar.get()[0]) > 0
    assert all(int(op.args[-8]) != 0 for op in fused) == bool(o)
    assert all(int(op.args[-1]) != 0 for op in fused) == bool(chunk)
    k = MOE_CFG["num_experts_per_tok"]
    logits = ex.rlog.get()[0]
    want_i, want_w = ref.moe_route(logits[:MOE_CFG["num_experts"]], k)
    assert sorted(ex.eidx.get()[0].tolist()) == sorted(np.asarray(want_i).tolist())
    assert abs(float(ex.ewts.get()[0][k]) - 1 / (1 + np.exp(-logits[MOE_CFG["num_experts"]]))) < 1e-6


def test_moe_fused_opts_give_the_same_logits(monkeypatch):
    """MOE_FUSED_OPTS (the norm's planes with x and w, the top-k on redux.sync, the light grid barriers, 32 their red
    form): each and all together give the tokens and logits of opts 0 bit for bit over a prefill and 24 steps."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    args, w, prompt = moe_inputs(14)
    monkeypatch.setattr(CudaQwen35, "MOE_FUSED", 1)
    out = {}
    for opts in (0, 1, 2, 8, 11, 43):
        monkeypatch.setattr(CudaQwen35, "MOE_FUSED_OPTS", opts)
        eng = build_engine(args, w, MOE_CFG, max_context=256, prefill_cols=1)
        assert any(getattr(op, "name", "").startswith("moe_fused<") for op in eng.model.executor.ops)
        out[opts] = greedy_then_logits(eng, prompt)
    for opts in (1, 2, 8, 11, 43):
        assert out[opts][0] == out[0][0]
        assert np.array_equal(out[opts][1], out[0][1])


def test_moe_route_fused_gives_the_same_logits(monkeypatch):
    """router_route (the bf16 router GEMV and the top-k routing in one launch, the last block routing) against
    gemv_bf16 + moe_route: tokens and logits bit-identical over 24 steps, the ticket left at zero."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    monkeypatch.setattr(CudaQwen35, "MOE_FUSED", 0)  # (the kernel-per-op MoE block; moe_fused: its own tests)
    args, w, _ = moe_inputs(0)
    out = {}
    for fused in (False, True):
        monkeypatch.setattr(CudaQwen35, "MOE_ROUTE_FUSED", fused)
        eng = build_engine(args, w, MOE_CFG, max_context=256)
        out[fused] = greedy_then_logits(eng, [5, 6, 7])
        if fused:
            assert int(eng.model.executor.route_ticket.get()[0]) == 0
    assert out[False][0] == out[True][0]
    assert np.array_equal(out[False][1], out[True][1])


def test_moe_route_kernel():
    import cupy as cp

    from engine.ops import kernels as K
    from engine.ops import ref

    rng = np.random.default_rng(11)
    for e_count, k in ((256, 8), (8, 2), (40, 5)):
        logits = rng.standard_normal(e_count + 1).astype(np.float32)
        idx, wts = cp.zeros(k, cp.int32), cp.zeros(k + 1, cp.float32)
        K.prepared("moe_route", (1,), (cp.asarray(logits[None]), e_count + 1, e_count, k, idx, wts, k + 1))()
        want_i, want_w = ref.moe_route(logits[:e_count], k)
        assert sorted(idx.get().tolist()) == sorted(np.asarray(want_i).tolist())
        got = dict(zip(idx.get().tolist(), wts.get()[:k].tolist()))
        for i, w in zip(np.asarray(want_i).tolist(), np.asarray(want_w).tolist()):
            assert abs(got[i] - w) < 1e-5
        assert abs(wts.get()[k] - 1 / (1 + np.exp(-logits[e_count]))) < 1e-6


def test_norm_mb2_gives_the_same_logits(monkeypatch):
    """NORM_MB2 (rows of at most 2,048 values: residual_rmsnorm_mb2, 8 partial planes a round): the MoE model's
    tokens and logits bit-identical to residual_rmsnorm_mb over a prefill and 24 steps; so with NORM_MB5
    (residual_rmsnorm_mb5, 4 planes a round) and with NORM_1R (mb5's _1r form: the planes in one round)."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    args, w, prompt = moe_inputs(10)
    monkeypatch.setattr(CudaQwen35, "NORM_CLUSTER", False)  # (the cluster form: test_norm_cluster_gives_the_same_tokens)
    out = {}
    forms = ((False, False, False), (True, False, False), (False, True, False), (True, False, True), (False, True, True))
    for mb2, mb5, one in forms:  # (one: NORM_1R, mb5's _1r form; mb2 has none)
        monkeypatch.setattr(CudaQwen35, "NORM_MB2", mb2)
        monkeypatch.setattr(CudaQwen35, "NORM_MB5", mb5)
        monkeypatch.setattr(CudaQwen35, "NORM_1R", one)
        eng = build_engine(args, w, MOE_CFG, max_context=256, prefill_cols=1)
        names = [getattr(op, "name", "") for op in eng.model.executor.ops]
        want = "residual_rmsnorm_mb2" if mb2 else "residual_rmsnorm_mb5" if mb5 else "residual_rmsnorm_mb"
        assert {n for n in names if n.startswith("residual_rmsnorm_mb")} == {want + ("_1r" if one and mb5 else "")}
        out[mb2, mb5, one] = greedy_then_logits(eng, prompt)
    for form in forms[1:]:
        assert out[forms[0]][0] == out[form][0]
        assert np.array_equal(out[forms[0]][1], out[form][1])


def test_norm_cluster_gives_the_same_tokens(monkeypatch):
    """NORM_CLUSTER (residual_rmsnorm_cl: the norms on a cluster of 8 blocks a row, the sum of squares in another
    order): the MoE model's greedy tokens over a prefill and 24 steps those of the mb forms, the last logits close."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    if not K.cluster_capable():
        pytest.skip("thread block clusters need sm_90")
    args, w, prompt = moe_inputs(10)
    out = {}
    for on in (False, True):
        monkeypatch.setattr(CudaQwen35, "NORM_CLUSTER", on)
        eng = build_engine(args, w, MOE_CFG, max_context=256, prefill_cols=1)
        names = {getattr(op, "name", "") for op in eng.model.executor.ops}
        assert ("residual_rmsnorm_cl" in names) == on
        out[on] = greedy_then_logits(eng, prompt)
    assert out[True][0] == out[False][0]
    assert np.allclose(out[True][1], out[False][1], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("flag,merged,second,seed", [("GDN_MERGE", "qkvz", "vz", 12), ("ATTN_MERGE", "qkgv", "gv", 13)])
def test_merged_projections_give_the_same_logits(monkeypatch, flag, merged, second, seed):
    """GDN_MERGE (q|k and v|z of one format as one GEMV over their shared object, the conv epilogue over all of q|k|v)
    and ATTN_MERGE (q|k and gate|v so): the MoE model (w8 projections) gives the same tokens over a prefill and 24
    steps, the logits within 1e-5 (ATTN_MERGE: bit for bit); the merged launch is in the step and the two separate
    ones are not."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    args, w, prompt = moe_inputs(seed)
    attn = flag == "ATTN_MERGE"
    out = {}
    for on in (False, True):
        monkeypatch.setattr(CudaQwen35, flag, on)
        eng = build_engine(args, w, MOE_CFG, max_context=256, prefill_cols=1)
        ex = eng.model.executor
        layers = [L for L in ex.layers if (L["kind"] == "full_attention") == attn]
        assert layers and all(merged in L for L in layers)
        ops = [o for op in ex.ops for o in (getattr(op, "main", []) + getattr(op, "side", []) or [op])]
        mats = [getattr(getattr(op, "__self__", None), "w", None) for op in ops]
        ns = [m.n for m in mats if m is not None and m.buf is layers[0][merged].buf]  # GEMVs over layer 0's object
        assert sorted(ns) == ([layers[0][merged].n] if on else sorted([layers[0]["qk"].n, layers[0][second].n]))
        out[on] = greedy_then_logits(eng, prompt)
    assert out[False][0] == out[True][0]
    # (numpy.testing is not imported: on a fresh device machine its files have read as NUL bytes)
    a, b = out[True][1], out[False][1]
    assert np.isfinite(a).all() and float(np.abs(a - b).max()) <= 1e-5 * (1.0 + float(np.abs(b).max()))
    assert not attn or np.array_equal(a, b)
