"""The CUDA executors' Python, on the CPU: op lists built and run against a NumPy stand-in for CuPy
(tests/fake_cupy.py, kernels are no-ops). Catches breakage of the GPU path's plumbing in CI; the
kernels' numbers are checked by tests/gpu on a device. This file: the decode step and the engine around
it; the attention forms' are in test_cuda_attention_smoke.py, the tensor-core prefill's in
test_cuda_prefill_smoke.py, the norms' in test_cuda_norm_smoke.py, the GDN layers' in test_cuda_gdn_smoke.py."""
import numpy as np
import pytest

from cuda_smoke import CFG, cp, flat as _flat, moe_cfg, on_gpu, weights as _weights  # noqa: F401


@pytest.mark.parametrize("gpu", ["sm_90", "sm_86"])
@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_dense_engine_builds_and_runs_every_path(cp, kv, gpu, monkeypatch):
    """The decode step, the columns step and the tensor-core prefill of the plan of each GPU class: the plan's norm,
    delta rule and attention in the op list; prefill, greedy decode, seek and the sparse step run."""
    from engine.gpu_engine import build_engine
    from engine.gpu import launch as K

    on_gpu(monkeypatch, gpu)
    args, w = _weights(CFG)
    eng = build_engine(args, w, CFG, max_context=512, kv=kv, prefill_cols=8, prefill_gemm=64)
    m = eng.model
    assert m.cols is not None and m.gemm is not None
    plan = m.executor.plan
    assert plan.gpu == gpu and m.cols.plan is plan and m.gemm.plan is plan
    names = {getattr(op, "name", "gemv") for op in _flat(m.executor.ops)}
    gdn = {"gdn_delta_raw_rw<4>", "gated_rmsnorm_stage"}  # (no table entry: the o GEMV takes one scale a row)
    norm = "residual_rmsnorm_cl" if gpu == "sm_90" else "residual_rmsnorm_mb2"
    assert {norm, "argmax_step_mb", plan.attn} | gdn <= names
    assert plan.attn.startswith("attn_decode_split")  # (the tiny model's 2 query heads a KV head)
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


@pytest.mark.parametrize("shared,fused", [(256, True), (256, False), (128, False)])  # 128: a routed expert's width
def test_moe_engine_builds_and_runs(cp, shared, fused, monkeypatch):
    """The MoE block as the plan's persistent launch, or (moe_fused off) router + top-k, the routed gate|up by slot and
    every down-projection in one moe_down launch; the next norm sums the k slots' planes and the shared expert's."""
    from engine.gpu_engine import build_engine

    on_gpu(monkeypatch, "sm_90", **({} if fused else {"moe_fused": False}))
    cfg = moe_cfg(shared)
    args, w = _weights(cfg)
    eng = build_engine(args, w, cfg, max_context=256)
    assert eng.model.cols is None  # no columns step for MoE (the tensor-core prefill where memory allows)
    eng.prefill([1, 2, 3])
    assert eng.decode_greedy(4, 3) is not None and eng.position == 6
    ex = eng.model.executor
    assert ex.plan.moe_fused == fused
    names = [getattr(o, "name", "") for o in _flat(ex.ops)]
    k = args.num_experts_per_tok
    if fused:
        assert names.count("moe_fused<0,1,3,3,1,2>") == args.num_hidden_layers and "moe_route" not in names
    else:
        assert names.count("moe_route") == names.count("moe_down<1,3,3,false>") == args.num_hidden_layers
        norms = [o for o in _flat(ex.ops) if getattr(o, "name", "").startswith("residual_rmsnorm")]
        assert [int(o.args[3]) for o in norms[2::2]] == [k + 1] * args.num_hidden_layers
    assert np.isfinite(eng.info()["weight_bytes_per_token"])
