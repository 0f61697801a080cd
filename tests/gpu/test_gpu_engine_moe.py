"""The CUDA decode engine's MoE paths on the tiny Qwen3.5 MoE config (test_gpu_engine.py's MOE_CFG): against the
NumPy engine with each routed-expert form, and the fused or reshaped launches against the plain ones (the same
tokens and logits), the device top-k against its reference."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from kernel_checks import tuned_gpu, use_plan  # noqa: E402  (tests/gpu is on sys.path under pytest)
from test_gpu_engine import MOE_CFG, quantized_weights  # noqa: E402


def moe_inputs(seed):
    """The MoE config's args, its groupwise-int-moe weights on the device, and a 12-token prompt from `seed`."""
    from engine.gpu import weights as gpu_weights
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


@pytest.mark.parametrize("gpu", [None, "sm_86"])
def test_cuda_moe_engine_matches_numpy_engine(gpu, monkeypatch):
    """The kernel-per-op MoE block (the plan's moe_fused off): router GEMV and top-k, the routed gate|up by slot, the
    routed and shared down-projections in one moe_down launch (3 rows a half-warp): the logits against the NumPy
    engine within the MoE test's gates, on this GPU's plan and the generic class's."""
    from engine import api
    from engine.gpu import weights as gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine
    from engine.gpu import launch as K

    use_plan(monkeypatch, gpu, moe_fused=False)
    args = ModelArgs.from_config(MOE_CFG)
    w = quantized_weights(args, recipe="groupwise-int-moe")
    ref = api.load({"config": MOE_CFG, "weights": w}, device="cpu", gdn_mode="recurrent")
    gpu_eng = build_engine(args, gpu_weights.from_logical(args, w, recipe="groupwise-int-moe"), MOE_CFG,
                           max_context=256)
    assert_moe_gates(ref, gpu_eng)
    launched = [K.op_name(op) for op in gpu_eng.model.executor.ops]
    assert "moe_down<1,3,3,false>" in launched


@pytest.mark.parametrize("gpu", [None, "sm_86"])
def test_moe_fused_matches_numpy_engine(gpu, monkeypatch):
    """The plan's moe_fused (the w8 o-projection from chunk-scaled pairs, the norm and the whole MoE block in one
    persistent launch, the down's input staged by chunks): the logits against the NumPy engine within the MoE test's
    gates, the launch in the step, each launch's grid barriers complete (the counter a multiple of the grid), the
    routing block 0 leaves the top-k of the logits."""
    from engine import api
    from engine.gpu import weights as gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine
    from engine.gpu import launch as K
    from engine.ops import ref

    use_plan(monkeypatch, gpu)
    args = ModelArgs.from_config(MOE_CFG)
    w = quantized_weights(args, recipe="groupwise-int-moe")
    ref_eng = api.load({"config": MOE_CFG, "weights": w}, device="cpu", gdn_mode="recurrent")
    gpu_eng = build_engine(args, gpu_weights.from_logical(args, w, recipe="groupwise-int-moe"), MOE_CFG,
                           max_context=256)
    ex = gpu_eng.model.executor
    fused = [op for op in ex.ops if K.op_name(op).startswith("moe_fused<")]
    assert len(fused) == args.num_hidden_layers
    assert_moe_gates(ref_eng, gpu_eng)
    grid = fused[0].grid[0]
    assert int(ex.moe.bar.get()[0]) % grid == 0 and int(ex.moe.bar.get()[0]) > 0
    assert all(int(op.args[-8]) != 0 and int(op.args[-1]) != 0 for op in fused)  # (the o-projection, chunk scales)
    k = MOE_CFG["num_experts_per_tok"]
    logits = ex.moe.rlog.get()[0]
    want_i, want_w = ref.moe_route(logits[:MOE_CFG["num_experts"]], k)
    assert sorted(ex.moe.eidx.get()[0].tolist()) == sorted(np.asarray(want_i).tolist())
    assert abs(float(ex.moe.ewts.get()[0][k]) - 1 / (1 + np.exp(-logits[MOE_CFG["num_experts"]]))) < 1e-6


def test_moe_fused_opts_give_the_same_logits(monkeypatch):
    """moe_fused's option bits (kernel_names.MOE_FUSED_OPTS: the norm's planes with x and w, the top-k on redux.sync,
    the light grid barriers, 32 their red form): each and all together give the tokens and logits of opts 0 bit for
    bit over a prefill and 24 steps."""
    from engine.gpu_engine import build_engine
    from engine.gpu import launch as K

    use_plan(monkeypatch)
    args, w, prompt = moe_inputs(14)
    out = {}
    for opts in (0, 1, 2, 8, 11, 43):
        monkeypatch.setattr(K, "MOE_FUSED_OPTS", opts)
        eng = build_engine(args, w, MOE_CFG, max_context=256, prefill_cols=1)
        assert any(getattr(op, "name", "").startswith("moe_fused<") for op in eng.model.executor.ops)
        out[opts] = greedy_then_logits(eng, prompt)
    for opts in (1, 2, 8, 11, 43):
        assert out[opts][0] == out[0][0]
        assert np.array_equal(out[opts][1], out[0][1])


def test_moe_route_kernel():
    import cupy as cp

    from engine.gpu.moe import moe_route
    from engine.ops import ref

    rng = np.random.default_rng(11)
    for e_count, k in ((256, 8), (8, 2), (40, 5)):
        logits = rng.standard_normal(e_count + 1).astype(np.float32)
        idx, wts = cp.zeros(k, cp.int32), cp.zeros(k + 1, cp.float32)
        moe_route(logits=cp.asarray(logits[None]), ld=e_count + 1, experts=e_count, topk=k, eidx=idx, ewts=wts,
                  ld_w=k + 1, rows=1)()
        want_i, want_w = ref.moe_route(logits[:e_count], k)
        assert sorted(idx.get().tolist()) == sorted(np.asarray(want_i).tolist())
        got = dict(zip(idx.get().tolist(), wts.get()[:k].tolist()))
        for i, w in zip(np.asarray(want_i).tolist(), np.asarray(want_w).tolist()):
            assert abs(got[i] - w) < 1e-5
        assert abs(wts.get()[k] - 1 / (1 + np.exp(-logits[e_count]))) < 1e-6


def test_norm_forms_give_the_same_logits(monkeypatch):
    """The generic plan's norms (residual_rmsnorm_mb2: 8 partial planes a round; residual_rmsnorm_mb5_1r: 5 values a
    thread, the planes in one round) against residual_rmsnorm_mb (the plan's norm overridden): the MoE model's tokens
    and logits bit-identical over a prefill and 24 steps."""
    from engine.gpu_engine import build_engine

    args, w, prompt = moe_inputs(10)
    out = {}
    forms = ("residual_rmsnorm_mb", "residual_rmsnorm_mb2", "residual_rmsnorm_mb5_1r")
    for form in forms:
        use_plan(monkeypatch, "sm_86", norm=form)
        eng = build_engine(args, w, MOE_CFG, max_context=256, prefill_cols=1)
        names = [getattr(op, "name", "") for op in eng.model.executor.ops]
        assert {n for n in names if n.startswith("residual_rmsnorm")} == {form}
        out[form] = greedy_then_logits(eng, prompt)
    for form in forms[1:]:
        assert out[forms[0]][0] == out[form][0]
        assert np.array_equal(out[forms[0]][1], out[form][1])


def test_norm_cluster_gives_the_same_tokens(monkeypatch):
    """The sm_90 plan's residual_rmsnorm_cl (the norms on a cluster of 8 blocks a row, the sum of squares in another
    order): the MoE model's greedy tokens over a prefill and 24 steps those of the mb forms, the last logits close."""
    from engine.gpu_engine import build_engine

    if not tuned_gpu():
        pytest.skip("thread block clusters need sm_90")
    args, w, prompt = moe_inputs(10)
    out = {}
    for on in (False, True):
        use_plan(monkeypatch, **({} if on else {"norm": "residual_rmsnorm_mb2"}))
        eng = build_engine(args, w, MOE_CFG, max_context=256, prefill_cols=1)
        names = {getattr(op, "name", "") for op in eng.model.executor.ops}
        assert ("residual_rmsnorm_cl" in names) == on
        out[on] = greedy_then_logits(eng, prompt)
    assert out[True][0] == out[False][0]
    assert np.allclose(out[True][1], out[False][1], rtol=1e-3, atol=1e-3)
