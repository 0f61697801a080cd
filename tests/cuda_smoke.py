"""What the CPU smoke tests of the CUDA executors share (test_cuda_executor_smoke.py,
test_cuda_prefill_smoke.py): the CuPy stand-in as a fixture, tiny random weights, op lists opened."""
import pytest

import fake_cupy

from engine.synthetic import TINY_CUDA as CFG


@pytest.fixture
def cp(monkeypatch):
    cp = fake_cupy.install(monkeypatch)
    yield cp
    from engine.gpu import launch as K

    K.reset_modules()
    for fn in (K.sm_count, K.blocks_per_sm, K.smem_optin, K.compute_capability, K.cluster_capable, K.pdl_capable,
               K.device_name):
        getattr(fn, "cache_clear", lambda: None)()  # (a test may have patched it)


def moe_cfg(shared: int = 256) -> dict:
    """The tiny MoE config: 8 experts, 2 a token, 128-wide experts, a `shared`-wide shared expert."""
    cfg = dict(CFG, architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe_text", num_experts=8,
               num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=shared)
    cfg.pop("intermediate_size")
    return cfg


def weights(cfg):
    from engine.gpu import weights as gpu_weights
    from engine.config import ModelArgs
    from engine.models.qwen3_5 import random_weights

    args = ModelArgs.from_config(cfg)
    recipe = "groupwise-int-moe" if args.is_moe else "groupwise-int"
    w = gpu_weights.as_stored(random_weights(args, seed=1), recipe)
    return args, gpu_weights.from_logical(args, w, recipe=recipe)


def flat(ops):
    """The graph ops with Concurrent ones opened (main, then side)."""
    from engine.gpu import launch as K

    out = []
    for op in ops:
        out += flat(op.main + op.side) if isinstance(op, K.Concurrent) else [op]
    return out


def on_gpu(monkeypatch, gpu: str = "sm_90", **override):
    """The executors built next take the plan of GPU class `gpu` (engine.gpu.plan.DEVICES), with `override`'s
    fields (as NINFER_PLAN would give them)."""
    import json

    from engine.gpu import plan as gpu_plan

    monkeypatch.setattr(gpu_plan, "current_device", lambda: gpu_plan.DEVICES[gpu])
    if override:
        monkeypatch.setenv("NINFER_PLAN", json.dumps(override))
    else:
        monkeypatch.delenv("NINFER_PLAN", raising=False)
