"""The CUDA decode engine against the NumPy engine on a tiny Qwen3.5 with the real head sizes.

Both engines get the same (dequantized) weights; the GPU keeps activations in fp16 pairs and the
KV cache in bf16, so logits agree to ~1e-2 relative (well inside the upstream logits parity gate of
spec/testing.md §5.3: relative RMSE <= 0.35) and the greedy choices agree.
"""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from engine.synthetic import TINY_CUDA as CFG  # noqa: E402
from kernel_checks import use_plan  # noqa: E402  (tests/gpu is on sys.path under pytest)


def quantized_weights(args, recipe="groupwise-int", seed=3):
    from engine.gpu import weights as gpu_weights
    from engine.models.qwen3_5 import random_weights

    return gpu_weights.as_stored(random_weights(args, seed=seed), recipe)


def test_cuda_engine_matches_numpy_engine():
    from engine import api
    from engine.gpu import weights as gpu_weights
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
    """Prompt chunks of 8 through the columns graph give the state token-by-token decode gives (the generic plan's
    multi-block norms and, mlp_fused off, the MLP with one scale for the down's input, as the columns graph stages
    it: the chunk scales and the cluster norm's sum order round the activations otherwise, a difference of the order
    of the quantization, not of the graphs). The columns' GEMVs (gemv_tc) take the same staged integers, exactly, but
    add a row's group sums in their own fp32 order (the one-token GEMV lane-strided by chunk; its w8 staging its own x
    multiplies fp16 pairs): a few 1e-4 after 21 tokens through the layers."""
    from engine.gpu import weights as gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine

    use_plan(monkeypatch, "sm_86", mlp_fused=False)
    args = ModelArgs.from_config(CFG)
    w = gpu_weights.from_logical(args, quantized_weights(args))
    cols = build_engine(args, w, CFG, max_context=256, prefill_cols=8)
    single = build_engine(args, w, CFG, max_context=256, prefill_cols=1)
    assert cols.model.cols is not None and single.model.cols is None
    prompt = [int(t) for t in np.random.default_rng(9).integers(0, CFG["vocab_size"], 21)]  # 2 chunks + 5
    a, b = cols.prefill(prompt), single.prefill(prompt)
    assert float(np.linalg.norm(a - b) / np.linalg.norm(b)) < 1e-3
    assert cols.position == single.position == 21
    first = int(np.argmax(a))
    assert cols.decode_greedy(first, 8) == single.decode_greedy(first, 8)


def test_seek_synthetic_moves_the_position_and_decodes_on():
    """bench -d on a synthetic model seeks: the position moves without computing, decode goes on from there."""
    from engine.gpu import weights as gpu_weights
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


def test_pdl_launches_give_the_same_logits_as_plain_launches(monkeypatch):
    """Programmatic dependent launch (the plan's pdl) only lets kernels overlap: the step's logits are bit-identical."""
    from engine.gpu import weights as gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine
    from engine.gpu import launch as K

    args = ModelArgs.from_config(CFG)
    w = gpu_weights.from_logical(args, quantized_weights(args))
    prompt = [int(t) for t in np.random.default_rng(4).integers(0, CFG["vocab_size"], 12)]
    saved = K.PDL
    try:
        out = {}
        for pdl in (True, False):
            use_plan(monkeypatch, pdl=pdl)
            eng = build_engine(args, w, CFG, max_context=256, prefill_cols=1)
            assert K.PDL == pdl
            first = int(np.argmax(eng.prefill(prompt)))
            out[pdl] = (eng.decode_greedy(first, 16), eng.decode_step(3))
        assert out[True][0] == out[False][0]
        assert np.array_equal(out[True][1], out[False][1])
    finally:
        K.PDL = saved


def test_attn_combine_stage_leaves_its_words_at_zero(monkeypatch):
    """attn_combine_stage (the combine whose last head of a row stages the o-projection's input) resets its row
    maximum and tickets for the next layer: they are zero after a prefill and 40 steps."""
    from engine.gpu import weights as gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine

    use_plan(monkeypatch)
    args = ModelArgs.from_config(CFG)
    w = gpu_weights.from_logical(args, quantized_weights(args))
    prompt = [int(t) for t in np.random.default_rng(8).integers(0, CFG["vocab_size"], 12)]
    eng = build_engine(args, w, CFG, max_context=256, prefill_cols=1)
    assert "attn_combine_stage" in {getattr(op, "name", "") for op in eng.model.executor.ops}
    first = int(np.argmax(eng.prefill(prompt)))
    eng.decode_greedy(first, 40)
    assert not eng.model.executor.attention.attn_tick.get().any()


def test_attention_query_group_cut_over_blocks_gives_the_same_tokens(monkeypatch):
    """The split kernel's cut (each KV head's 6 query heads over 2 blocks of 3, attn_decode_split<3,*,2>) on a model
    with the 27B's grouping: the same greedy tokens as the one-block kernel over a prefill and 40 steps, logits within
    fp32 rounding (each block's softmax runs over the same tokens in the same order). The plan overridden to each."""
    from engine.gpu import weights as gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine

    cfg = dict(CFG, num_attention_heads=12, num_key_value_heads=2)
    args = ModelArgs.from_config(cfg)
    w = gpu_weights.from_logical(args, quantized_weights(args))
    prompt = [int(t) for t in np.random.default_rng(10).integers(0, cfg["vocab_size"], 12)]
    out = {}
    for gs in (1, 2):
        use_plan(monkeypatch, attn="attn_decode_split<3,false,2>" if gs == 2 else "attn_decode_split<6,false>")
        eng = build_engine(args, w, cfg, max_context=256, prefill_cols=1)
        names = {getattr(op, "name", "") for op in eng.model.executor.ops}
        assert ("attn_decode_split<3,false,2>" in names) == (gs == 2)
        first = int(np.argmax(eng.prefill(prompt)))
        out[gs] = (eng.decode_greedy(first, 40), np.asarray(eng.decode_step(3)).copy())
    assert out[1][0] == out[2][0]
    assert np.allclose(out[2][1], out[1][1], rtol=1e-4, atol=1e-4)


def test_sparse_logits_step():
    """decode_step_sparse keeps exactly the ids within the margin of the top logit, with their values,
    and leaves the engine where decode_step would (the next full step agrees)."""
    from engine.gpu import weights as gpu_weights
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
