"""The residual norms' launch plans on the fake CuPy (tests/fake_cupy.py, kernels are no-ops): which form the executor
picks (residual_rmsnorm_mb / _mb2 / _mb5 / _mb5_1r, the cluster form) and with which arguments. Their numbers are
checked by tests/gpu (test_kernels.py, test_gpu_engine_moe.py)."""
import pytest

from cuda_smoke import CFG, cp, flat as _flat, weights as _weights  # noqa: F401


@pytest.mark.parametrize("flag,other,name", [("NORM_MB2", "NORM_MB5", "residual_rmsnorm_mb2"),
                                              ("NORM_MB5", "NORM_MB2", "residual_rmsnorm_mb5")])
def test_norm_forms_plumbing(cp, monkeypatch, flag, other, name):
    """NINFER_NORM_MB2 (rows of at most 2,048 values: residual_rmsnorm_mb2) and NINFER_NORM_MB5 (rows of up to 5,120:
    residual_rmsnorm_mb5; mb2 first where both apply), both on by default: the small model's rows take the form with
    residual_rmsnorm_mb's arguments, grid and 1,024 threads (the other form's flag off); with the flag off,
    residual_rmsnorm_mb."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    assert CudaQwen35.NORM_MB2 and CudaQwen35.NORM_MB5
    args, w = _weights(CFG)
    assert args.hidden_size <= 2048
    monkeypatch.setattr(CudaQwen35, other, False)
    monkeypatch.setattr(CudaQwen35, "NORM_1R", False)  # (mb5's one-round form: its own test)
    monkeypatch.setattr(CudaQwen35, "NORM_CLUSTER", False)  # (the cluster form: its own test)

    def norms(on):
        monkeypatch.setattr(CudaQwen35, flag, on)
        ops = _flat(build_engine(args, w, CFG, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor.ops)
        return [op for op in ops if getattr(op, "name", "").startswith("residual_rmsnorm_mb")]

    on, off = norms(True), norms(False)
    assert {op.name for op in on} == {name} and {op.name for op in off} == {"residual_rmsnorm_mb"}
    assert all(op.block == 1024 for op in on)
    assert [(op.grid, [int(a) for a in op.args[3:5]]) for op in on] == \
        [(op.grid, [int(a) for a in op.args[3:5]]) for op in off]  # (the partial planes each sums, their stride)


def test_norm_one_round_plumbing(cp, monkeypatch):
    """NINFER_NORM_1R (on by default): every residual_rmsnorm_mb5 is its _1r form (the same grid, block and
    arguments), off it is not; residual_rmsnorm_mb2 (the MoE rows) and residual_rmsnorm_mb have none."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    assert CudaQwen35.NORM_1R
    monkeypatch.setattr(CudaQwen35, "NORM_CLUSTER", False)  # (the cluster form: its own test)
    args, w = _weights(CFG)

    def norms(**flags):
        for k, v in flags.items():
            monkeypatch.setattr(CudaQwen35, k, v)
        ex = build_engine(args, w, CFG, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor
        return [op for op in _flat(ex.ops) if getattr(op, "name", "").startswith("residual_rmsnorm")]

    off, on = norms(NORM_1R=False, NORM_MB2=False), norms(NORM_1R=True)
    assert off and {op.name for op in off} == {"residual_rmsnorm_mb5"}
    assert [op.name + "_1r" for op in off] == [op.name for op in on]
    assert all(a.grid == b.grid and a.block == b.block and len(a.args) == len(b.args) for a, b in zip(off, on))
    assert {op.name for op in norms(NORM_MB5=False)} == {"residual_rmsnorm_mb"}
    assert {op.name for op in norms(NORM_MB2=True, NORM_MB5=True)} <= {"residual_rmsnorm_mb2", "residual_rmsnorm_mb5_1r"}


def test_norm_cluster_plumbing(cp, monkeypatch):
    """NINFER_NORM_CLUSTER (on by default) on a cluster-capable GPU: every residual norm is residual_rmsnorm_cl, a cluster of
    NORM_CL blocks a token row (grid (8, M), 256 threads) with the mb forms' arguments; without clusters, the mb forms."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    assert CudaQwen35.NORM_CLUSTER
    args, w = _weights(CFG)

    def norms(on, capable):
        monkeypatch.setattr(CudaQwen35, "NORM_CLUSTER", on)
        monkeypatch.setattr(K, "cluster_capable", lambda: capable)
        ex = build_engine(args, w, CFG, max_context=256, prefill_cols=1, prefill_gemm=0).model.executor
        return [op for op in _flat(ex.ops) if getattr(op, "name", "").startswith("residual_rmsnorm")]

    base, cl = norms(False, True), norms(True, True)
    assert base and {op.name for op in cl} == {"residual_rmsnorm_cl"} and len(cl) == len(base)
    assert all(op.grid == (CudaQwen35.NORM_CL, b.grid[1]) and op.block == 256 and len(op.args) == len(b.args)
               and [int(x) for x in op.args[3:5]] == [int(x) for x in b.args[3:5]] for op, b in zip(cl, base))
    assert [op.name for op in norms(True, False)] == [op.name for op in base]
