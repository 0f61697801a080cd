"""What the GPU kernel tests share (test_gemv.py, test_kernels.py, test_attn_prefill.py): the composite pass
rule of spec/testing.md §5.1 with its named presets, poisoned outputs, the staged GEMV input, one random
stream. (The `cp` fixture is tests/gpu/conftest.py's.)
"""
import numpy as np

from engine.artifact import formats

RNG = np.random.default_rng(1234)
QFMTS = ["q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16"]


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def check(name, got, want, atol, rtol, tail_frac, worst_ratio, rel):
    """The composite pass rule of spec/testing.md §5.1."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.isfinite(got).all(), f"{name}: NaN/Inf"
    err = np.abs(got - want)
    lim = atol + rtol * np.abs(want)
    if (err <= lim).all():
        return
    frac = float((err > lim).mean())
    worst = float((err / lim).max())
    r = rel_l2(got, want)
    assert frac <= tail_frac and worst <= worst_ratio and r <= rel, \
        f"{name}: violating {frac:.2e}, worst ratio {worst:.2f}, rel-L2 {r:.2e}"


def poisoned(cp, shape, dtype=np.float32):
    """An output array full of NaN, copied from the host (no CuPy kernel: on a fresh device machine CuPy's
    own kernels can fail to compile for a while)."""
    return cp.asarray(np.full(shape, np.nan, dtype))


def staged_case(cp, fmt, n, k, m, xscale=3.0):
    """A random [n, k] matrix uploaded in `fmt` (unit-scale outputs), its exact decode, m rows of x, and x staged
    by stage_x_mb as the producer kernels stage it: (dm, wq, x, x on the device, pairs, inverse scales)."""
    from engine.gpu.weights import upload_matrix
    from engine.gpu import launch as K
    from engine.gpu.norm import stage_rows

    w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    dm = upload_matrix(cp, fmt, w)
    wq = formats.decode(fmt, "row_split_k128_v1", (n, k), cp.asnumpy(dm.buf))
    x = (RNG.standard_normal((m, k)) * xscale).astype(np.float32)
    xd = cp.asarray(x)
    kpad = -(-k // K.XPAD) * K.XPAD
    xh, xinv = cp.zeros((m, kpad // 2), dtype=cp.uint32), cp.zeros(m, dtype=cp.float32)
    stage_rows(x=xd, ld=k, k=k, kpad=kpad, xh=xh, ldh=kpad // 2, xinv=xinv, rows=m, blocks=3)()
    return dm, wq, x, xd, xh, xinv


LINEAR = dict(atol=2e-3, rtol=1.6e-2, tail_frac=2e-3, worst_ratio=5, rel=8e-3)
ELEM = dict(atol=1e-3, rtol=8e-3, tail_frac=1e-3, worst_ratio=4, rel=4e-3)
GDN_STATE = dict(atol=5e-4, rtol=5e-3, tail_frac=2e-2, worst_ratio=5, rel=5e-3)


def use_plan(monkeypatch, gpu=None, **override):
    """The engines built next take the plan of GPU class `gpu` (engine.gpu.plan.DEVICES; default: this GPU's) with
    `override`'s fields, as NINFER_PLAN gives them: the generic sm_86 kernels run on an H200 too."""
    import json

    from engine.gpu import plan as gpu_plan

    if gpu is not None:
        monkeypatch.setattr(gpu_plan, "current_device", lambda: gpu_plan.DEVICES[gpu])
    if override:
        monkeypatch.setenv("NINFER_PLAN", json.dumps(override))
    else:
        monkeypatch.delenv("NINFER_PLAN", raising=False)


def tuned_gpu() -> bool:
    """This GPU takes the sm_90 plan (clusters, PDL)."""
    from engine.gpu import launch as K

    return K.compute_capability() >= 90
