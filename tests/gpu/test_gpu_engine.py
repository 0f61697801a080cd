"""The CUDA decode engine against the NumPy engine on a tiny Qwen3.5 with the real head sizes.

Both engines get the same (dequantized) weights; the GPU keeps activations in fp16 pairs and the
KV cache in bf16, so logits agree to ~1e-2 relative (well inside the upstream logits parity gate of
spec/testing.md §5.3: relative RMSE <= 0.35) and the greedy choices agree.
"""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from engine.synthetic import TINY_CUDA as CFG  # noqa: E402


def quantized_weights(args, recipe="groupwise-int", seed=3):
    from engine import gpu_weights
    from engine.models.qwen3_5 import random_weights

    return gpu_weights.as_stored(random_weights(args, seed=seed), recipe)


def test_cuda_engine_matches_numpy_engine():
    from engine import api, gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine

    args = ModelArgs.from_config(CFG)
    w = quantized_weights(args)
    ref = api.load({"config": CFG, "weights": w}, device="cpu", gdn_mode="recurrent")
    gpu = build_engine(args, gpu_weights.from_logical(args, w), CFG, max_context=256)
    toks = np.random.default_rng(5).integers(0, CFG["vocab_size"], 64)
    worst, agree = 0.0, 0
    for t in toks:
        a, b = ref.decode_step(int(t)), gpu.decode_step(int(t))
        worst = max(worst, float(np.linalg.norm(a - b) / np.linalg.norm(a)))
        agree += int(np.argmax(a) == np.argmax(b))
    assert worst < 3e-2 and agree >= 60, (worst, agree)

    # int8-g64 KV: the same steps within the int8 attention error
    gpu8 = build_engine(args, gpu_weights.from_logical(args, w), CFG, max_context=256, kv="int8")
    ref.reset()
    errs = []
    for t in toks:
        a, b = ref.decode_step(int(t)), gpu8.decode_step(int(t))
        errs.append(float(np.linalg.norm(a - b) / np.linalg.norm(a)))
    assert np.median(errs) < 3e-2 and max(errs) < 0.1, (np.median(errs), max(errs))
    assert gpu8.info()["kv_bytes_per_token"] == 2 * 2 * (256 + 8) * 2  # 2 attention layers x 2 kv heads

    # the device-side greedy loop equals step-by-step argmax on the same engine
    gpu.reset()
    gpu.prefill([1, 2, 3])
    fast = gpu.decode_greedy(4, 12)
    gpu.reset()
    gpu.prefill([1, 2, 3])
    slow, t = [], 4
    for _ in range(12):
        t = int(np.argmax(gpu.decode_step(t)))
        slow.append(t)
    assert fast == slow


# the tiny MoE config (its engine tests: test_gpu_engine_moe.py; the MoE prefill: test_prefill.py)
MOE_CFG = dict(CFG, architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe_text", num_experts=8,
               num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=256)
MOE_CFG.pop("intermediate_size")


def test_load_artifact_on_gpu(tmp_path):
    """engine.load(path, device='gpu') on a v3 file takes the CUDA path with the packed planes as stored,
    and agrees with device='cpu' on the same file (which decodes the same codes)."""
    from engine import api
    from engine.artifact.writer import write_artifact
    from engine.gpu_engine import CudaEngine
    from engine.synthetic import artifact_tensors

    tensors = artifact_tensors(CFG, "groupwise-int", seed=4)
    path = write_artifact(tmp_path / "tiny.ninfer", {"text": {"config": CFG}}, tensors)
    gpu = api.load(path, device="gpu", max_context=256)
    cpu = api.load(path, device="cpu", max_context=256, gdn_mode="recurrent")
    assert isinstance(gpu, CudaEngine)
    ids = [5, 17, 900, 3, 3, 42, 7, 512]
    a, b = cpu.prefill(ids), gpu.prefill(ids)
    assert float(np.linalg.norm(a - b) / np.linalg.norm(a)) < 3e-2
    assert gpu.info()["backend"] == "cuda-graph"


def test_columns_prefill_equals_token_by_token(monkeypatch):
    """Prompt chunks of 8 through the columns graph give the state token-by-token decode gives (the decode step's
    MLP with one scale for the down's input and the GDN o-projection's, as the columns graph stages them: the chunk
    scales round the activations more finely, a difference of the order of the quantization, not of the graphs)."""
    from engine import gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    monkeypatch.setattr(CudaQwen35, "MLP_FUSED_CHUNK", 0)
    monkeypatch.setattr(CudaQwen35, "GATED_CHUNK", 0)
    # (the residual norms in one sum order both ways: the cluster form adds the blocks' sums of squares in another,
    # which moves the staged scales' rounding: 2.2e-4 here, s19e)
    monkeypatch.setattr(CudaQwen35, "NORM_CLUSTER", False)
    args = ModelArgs.from_config(CFG)
    w = gpu_weights.from_logical(args, quantized_weights(args))
    cols = build_engine(args, w, CFG, max_context=256, prefill_cols=8)
    single = build_engine(args, w, CFG, max_context=256, prefill_cols=1)
    assert cols.model.cols is not None and single.model.cols is None
    prompt = [int(t) for t in np.random.default_rng(9).integers(0, CFG["vocab_size"], 21)]  # 2 chunks + 5
    a, b = cols.prefill(prompt), single.prefill(prompt)
    assert float(np.linalg.norm(a - b) / np.linalg.norm(b)) < 1e-4
    assert cols.position == single.position == 21
    first = int(np.argmax(a))
    assert cols.decode_greedy(first, 8) == single.decode_greedy(first, 8)


def test_seek_synthetic_moves_the_position_and_decodes_on():
    """bench -d on a synthetic model seeks: the position moves without computing, decode goes on from there."""
    from engine import gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine

    args = ModelArgs.from_config(CFG)
    eng = build_engine(args, gpu_weights.from_logical(args, quantized_weights(args)), CFG, max_context=256,
                       prefill_cols=1)
    eng.seek_synthetic(100)
    assert eng.position == 100 and eng.model.executor.position == 100
    first = int(np.argmax(eng.prefill([5])))
    out = eng.decode_greedy(first, 4)
    assert len(out) == 4 and eng.position == 105 and eng.model.executor.position == 105
    with pytest.raises(RuntimeError):
        eng.seek_synthetic(3)


def test_pdl_launches_give_the_same_logits_as_plain_launches():
    """Programmatic dependent launch only lets kernels overlap: the step's logits are bit-identical."""
    from engine import gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine
    from engine.ops import kernels as K

    args = ModelArgs.from_config(CFG)
    w = gpu_weights.from_logical(args, quantized_weights(args))
    prompt = [int(t) for t in np.random.default_rng(4).integers(0, CFG["vocab_size"], 12)]
    saved = K.PDL
    try:
        out = {}
        for pdl in (True, False):
            K.PDL = pdl
            eng = build_engine(args, w, CFG, max_context=256, prefill_cols=1)
            first = int(np.argmax(eng.prefill(prompt)))
            out[pdl] = (eng.decode_greedy(first, 16), eng.decode_step(3))
        assert out[True][0] == out[False][0]
        assert np.array_equal(out[True][1], out[False][1])
    finally:
        K.PDL = saved


@pytest.mark.parametrize("flag,kernel,tick", [("GDN_FUSED", "gdn_delta_gated_stage", "gdn_tick"),
                                               ("ATTN_FUSED", "attn_combine_stage", "attn_tick")])
def test_fused_tails_give_the_same_logits(flag, kernel, tick, monkeypatch):
    """The fused tails (GDN: the delta rule, gated norm and staging in one launch; attention: the combine and
    staging), whose last blocks stage the row: tokens and logits bit-identical to the separate launches over
    a prefill and 40 steps, and every max and ticket word left at zero for the next layer."""
    from engine import gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    args = ModelArgs.from_config(CFG)
    w = gpu_weights.from_logical(args, quantized_weights(args))
    prompt = [int(t) for t in np.random.default_rng(8).integers(0, CFG["vocab_size"], 12)]
    out = {}
    monkeypatch.setattr(CudaQwen35, "GDN_PREP_FUSED", False)  # (the GDN tail fusion takes gdn_prep's outputs)
    monkeypatch.setattr(CudaQwen35, "ATTN_CHUNK", 0)  # (attn_combine_chunks in place of the fused tail: its own test)
    for fused in (False, True):
        monkeypatch.setattr(CudaQwen35, flag, fused)
        eng = build_engine(args, w, CFG, max_context=256, prefill_cols=1)
        names = {getattr(op, "name", "") for op in eng.model.executor.ops}
        assert (kernel in names) == fused
        first = int(np.argmax(eng.prefill(prompt)))
        out[fused] = (eng.decode_greedy(first, 40), eng.decode_step(3))
        assert not getattr(eng.model.executor, tick).get().any()  # the last blocks reset max and tickets
    assert out[False][0] == out[True][0]
    assert np.array_equal(out[False][1], out[True][1])


def test_stage_from_the_gate_up_amax_gives_the_same_logits(monkeypatch):
    """STAGE_AMAX (the default): with gemv_rs_pre on gate|up, its blocks fold the SwiGLU row's largest |value|
    into a slot and stage_x_amax stages the down projection's input from it (no max pass over the row):
    tokens and logits bit-identical to stage_x_mb over a prefill and 40 steps, the slot left at zero."""
    from engine import gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    monkeypatch.setattr(CudaQwen35, "MLP_FUSED", 0)  # (the four-kernel MLP)
    args = ModelArgs.from_config(CFG)
    w = gpu_weights.from_logical(args, quantized_weights(args))
    prompt = [int(t) for t in np.random.default_rng(9).integers(0, CFG["vocab_size"], 12)]
    probe = build_engine(args, w, CFG, max_context=256, prefill_cols=1).model.executor
    gu = next(L["gate_up"] for L in probe.layers if "gate_up" in L)
    cfg = {(gu.fmt, gu.n, gu.k): dict(rows=2, unroll=2, splits=1, pre2=True)}
    out = {}
    for on in (False, True):
        monkeypatch.setattr(CudaQwen35, "STAGE_AMAX", on)
        eng = build_engine(args, w, CFG, max_context=256, prefill_cols=1, gemv_cfg=dict(cfg))
        names = [getattr(op, "name", "") for op in eng.model.executor.ops]
        assert names.count("stage_x_amax") == (args.num_hidden_layers if on else 0)
        first = int(np.argmax(eng.prefill(prompt)))
        out[on] = (eng.decode_greedy(first, 40), eng.decode_step(3))
        assert not eng.model.executor.stage_slot.get().any()
    assert out[False][0] == out[True][0]
    assert np.array_equal(out[False][1], out[True][1])


def test_gdn_delta_rows_a_warp_give_the_same_tokens(monkeypatch):
    """NINFER_GDN_DELTA_RW=2 / 4 (gdn_delta_raw_rw: state rows a warp, the head's q/k norms and gates once a warp): the
    same greedy tokens as gdn_delta_raw over a prefill and 40 steps, logits and GDN state within fp32 rounding (the same
    operations a row; the compiler may contract them differently)."""
    from engine import gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    args = ModelArgs.from_config(CFG)
    w = gpu_weights.from_logical(args, quantized_weights(args))
    prompt = [int(t) for t in np.random.default_rng(19).integers(0, CFG["vocab_size"], 12)]
    monkeypatch.setattr(CudaQwen35, "GDN_FUSED", False)
    monkeypatch.setattr(CudaQwen35, "GDN_GATED_CL", 0)  # (gdn_delta_gated_cl runs RW 4's rows: its own tests)
    out = {}
    for rw in (1, 2, 4):
        monkeypatch.setattr(CudaQwen35, "GDN_DELTA_RW", rw)
        eng = build_engine(args, w, CFG, max_context=256, prefill_cols=1)
        names = {getattr(op, "name", "") for op in eng.model.executor.ops}
        assert ("gdn_delta_raw" if rw == 1 else f"gdn_delta_raw_rw<{rw}>") in names
        first = int(np.argmax(eng.prefill(prompt)))
        toks = eng.decode_greedy(first, 40)
        logits = np.asarray(eng.decode_step(3)).copy()
        states = [L["state"].get() for L in eng.model.executor.layers if "state" in L]
        out[rw] = (toks, logits, states)
    for rw in (2, 4):
        assert out[rw][0] == out[1][0]
        assert np.allclose(out[rw][1], out[1][1], rtol=1e-5, atol=1e-5)
        for a, b in zip(out[rw][2], out[1][2]):
            assert np.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_gdn_prep_in_the_projection_epilogue_gives_the_same_tokens(monkeypatch):
    """NINFER_GDN_PREP_FUSED: the conv + SiLU in the q|k and v|z GEMVs' epilogue and the q/k norms and gates
    in gdn_delta_raw, against gdn_prep + gdn_delta (the same operations; the compiler may contract them
    into FMAs differently): the same greedy tokens over a prefill and 40 steps, logits and GDN state
    within fp32 rounding."""
    from engine import gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    args = ModelArgs.from_config(CFG)
    w = gpu_weights.from_logical(args, quantized_weights(args))
    prompt = [int(t) for t in np.random.default_rng(9).integers(0, CFG["vocab_size"], 12)]
    monkeypatch.setattr(CudaQwen35, "GDN_AB_IN", 0)  # (the fused side takes gdn_delta_gated_cl: a|b by its GEMV both ways)
    out = {}
    for fused in (False, True):
        monkeypatch.setattr(CudaQwen35, "GDN_PREP_FUSED", fused)
        eng = build_engine(args, w, CFG, max_context=256, prefill_cols=1)
        names = {getattr(op, "name", "") for op in eng.model.executor.ops}
        assert ("gdn_prep" in names) != fused
        first = int(np.argmax(eng.prefill(prompt)))
        toks = eng.decode_greedy(first, 40)
        logits = np.asarray(eng.decode_step(3)).copy()
        states = [L["state"].get() for L in eng.model.executor.layers if "state" in L]
        convs = [L["conv_state"].get() for L in eng.model.executor.layers if "conv_state" in L]
        out[fused] = (toks, logits, states, convs)
    assert out[False][0] == out[True][0]
    assert np.allclose(out[True][1], out[False][1], rtol=1e-4, atol=1e-4)
    for a, b in zip(out[True][2] + out[True][3], out[False][2] + out[False][3]):
        assert np.allclose(a, b, rtol=1e-4, atol=1e-5)


def test_attention_query_group_cut_over_blocks_gives_the_same_tokens(monkeypatch):
    """NINFER_ATTN_GSPLIT=2: each KV head's 6 query heads over 2 blocks of 3 (attn_decode_split<3,*,2>) on a
    model with the 27B's grouping: the same greedy tokens over a prefill and 40 steps, logits within fp32
    rounding (each block's softmax runs over the same tokens in the same order)."""
    from engine import gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    monkeypatch.setattr(CudaQwen35, "ATTN_MMA", False)  # (the split kernels: attn_decode_mma is the default)
    cfg = dict(CFG, num_attention_heads=12, num_key_value_heads=2)
    args = ModelArgs.from_config(cfg)
    w = gpu_weights.from_logical(args, quantized_weights(args))
    prompt = [int(t) for t in np.random.default_rng(10).integers(0, cfg["vocab_size"], 12)]
    out = {}
    for gs in (1, 2):
        monkeypatch.setattr(CudaQwen35, "ATTN_GSPLIT", gs)
        eng = build_engine(args, w, cfg, max_context=256, prefill_cols=1)
        names = {getattr(op, "name", "") for op in eng.model.executor.ops}
        assert ("attn_decode_split<3,false,2>" in names) == (gs == 2)
        first = int(np.argmax(eng.prefill(prompt)))
        out[gs] = (eng.decode_greedy(first, 40), np.asarray(eng.decode_step(3)).copy())
    assert out[1][0] == out[2][0]
    assert np.allclose(out[2][1], out[1][1], rtol=1e-4, atol=1e-4)


def test_ldg_weight_loads_give_the_same_logits():
    """GEMV weight loads through L1 (`ldg` in a tuning entry: the module_ldg build) change only the cache
    path: tokens and logits bit-identical to the no_allocate loads, with every GEMV of the step on it."""
    from engine import gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine
    from engine.ops import kernels as K

    args = ModelArgs.from_config(CFG)
    w = gpu_weights.from_logical(args, quantized_weights(args))
    prompt = [int(t) for t in np.random.default_rng(7).integers(0, CFG["vocab_size"], 12)]
    out = {}
    for ldg in (False, True):
        eng = build_engine(args, w, CFG, max_context=256, prefill_cols=1)
        ex = eng.model.executor
        if ldg:
            ex.gemv_cfg = {(m.fmt, m.n, m.k): {"ldg": True} for m in ex._matrices() if m.fmt in K.FMT_IDS}
            ex.ops = ex._plan()
            ex.capture()
            eng.reset()
            names = [getattr(getattr(op, "__self__", None), "_go", None) for op in ex.ops]
            assert any(getattr(n, "name", "").startswith(K.LDG_PREFIX) for n in names)
        first = int(np.argmax(eng.prefill(prompt)))
        out[ldg] = (eng.decode_greedy(first, 16), eng.decode_step(3))
    assert out[False][0] == out[True][0]
    assert np.array_equal(out[False][1], out[True][1])


def test_sparse_logits_step():
    """decode_step_sparse keeps exactly the ids within the margin of the top logit, with their values,
    and leaves the engine where decode_step would (the next full step agrees)."""
    from engine import gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine

    args = ModelArgs.from_config(CFG)
    w = gpu_weights.from_logical(args, quantized_weights(args))
    a = build_engine(args, w, CFG, max_context=256, prefill_cols=1)
    b = build_engine(args, w, CFG, max_context=256, prefill_cols=1)
    a.prefill([3, 1, 4]), b.prefill([3, 1, 4])
    for tok, margin in ((5, 0.0), (9, 2.5), (26, 40.0)):
        full = b.decode_step(tok)[: a.domain]
        sp = a._decode_step_sparse(tok, margin)
        want = np.flatnonzero(full >= full.max() - np.float32(margin))
        assert np.array_equal(sp.ids, want) and np.allclose(sp.values, full[want])
        assert a.position == b.position
    assert np.array_equal(a.decode_step(7), b.decode_step(7))


def test_ffn_split_matches_numpy_engine(monkeypatch):
    """NINFER_FFN_SPLIT: an MLP of 3 x 1,024 values in two halves (row views of gate|up, column views of
    down, each half staged with its own scale) against the NumPy engine and against the unsplit MLP, one
    token row (decode graph) and eight (the columns step)."""
    from engine import api, gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    cfg = dict(CFG, intermediate_size=3072)
    args = ModelArgs.from_config(cfg)
    w = quantized_weights(args)
    ref = api.load({"config": cfg, "weights": w}, device="cpu", gdn_mode="recurrent")
    gw = gpu_weights.from_logical(args, w)
    monkeypatch.setattr(CudaQwen35, "FFN_SPLIT", True)
    split = build_engine(args, gw, cfg, max_context=256, prefill_cols=8, prefill_gemm=0)
    assert split.model.executor._ffn_split_at(split.model.executor.layers[0]["down"]) == 2048
    monkeypatch.setattr(CudaQwen35, "FFN_SPLIT", False)
    whole = build_engine(args, gw, cfg, max_context=256, prefill_cols=1, prefill_gemm=0)
    toks = np.random.default_rng(6).integers(0, cfg["vocab_size"], 32)
    worst, apart = 0.0, 0.0
    for t in toks:
        a, b, c = ref.decode_step(int(t)), split.decode_step(int(t)), whole.decode_step(int(t))
        worst = max(worst, float(np.linalg.norm(a - b) / np.linalg.norm(a)))
        apart = max(apart, float(np.linalg.norm(b - c) / np.linalg.norm(c)))
    assert worst < 3e-2 and apart < 1e-2, (worst, apart)
    split.reset()
    whole.reset()
    prompt = [int(t) for t in np.random.default_rng(7).integers(0, cfg["vocab_size"], 21)]  # 2 column chunks + 5
    a, b = split.prefill(prompt), whole.prefill(prompt)
    assert float(np.linalg.norm(a - b) / np.linalg.norm(b)) < 1e-2
