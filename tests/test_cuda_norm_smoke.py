"""The residual norms' launch plans on the fake CuPy (tests/fake_cupy.py, kernels are no-ops): which form the plan of a
GPU class picks (the cluster form on sm_90, residual_rmsnorm_mb2 / _mb5_1r / _mb by the row's width elsewhere) and
the executor's launch of it. Their numbers are checked by tests/gpu (test_kernels.py, test_gpu_engine_moe.py)."""
import pytest

from cuda_smoke import CFG, cp, flat as _flat, on_gpu, weights as _weights  # noqa: F401


@pytest.mark.parametrize("gpu,hidden,want", [("sm_90", 5120, "residual_rmsnorm_cl"),
                                             ("sm_90", 2048, "residual_rmsnorm_cl"),
                                             ("sm_90", 8192, "residual_rmsnorm_cl"),
                                             ("sm_86", 2048, "residual_rmsnorm_mb2"),
                                             ("sm_86", 5120, "residual_rmsnorm_mb5_1r"),
                                             ("sm_80", 6144, "residual_rmsnorm_mb")])
def test_norm_form_by_gpu_and_width(gpu, hidden, want):
    from engine.gpu.plan import DEVICES, norm_form

    assert norm_form(hidden, DEVICES[gpu]) == want


@pytest.mark.parametrize("gpu", ["sm_90", "sm_86"])
def test_norm_launch_plumbing(cp, monkeypatch, gpu):
    """Every residual norm of the step is the plan's: a cluster of 8 blocks a token row (256 threads) or 16 blocks of
    1,024 threads, the same arguments (the partial planes each sums, their stride)."""
    from engine.gpu_engine import build_engine

    on_gpu(monkeypatch, gpu)
    args, w = _weights(CFG)
    ex = build_engine(args, w, CFG, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor
    norms = [op for op in _flat(ex.ops) if getattr(op, "name", "").startswith("residual_rmsnorm")]
    assert len(norms) == 2 * args.num_hidden_layers + 1 - sum(
        1 for op in _flat(ex.ops) if getattr(op, "name", "").startswith("mlp_fused"))
    assert {op.name for op in norms} == {ex.plan.norm}
    grid, block = ((8, 1), 256) if gpu == "sm_90" else ((16, 1), 1024)
    assert all(op.grid == grid and op.block == block and len(op.args) == 14 for op in norms)
