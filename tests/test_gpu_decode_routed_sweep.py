"""bench/gemv_sweep.py's routed_sweep builds the MoE decode's routed expert GEMVs (gate|up over the staged norm
row, down over each slot's own row, grid.z = the slots) for every variant it times: checked on the CuPy stand-in
with a stub timer, so a device call does not find an argument mistake."""
import sys
import types
from pathlib import Path

import fake_cupy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


def test_routed_sweep_plans_every_variant(monkeypatch):
    cp = fake_cupy.install(monkeypatch)
    import importlib

    import gemv_sweep
    from engine.gpu import weights as gpu_weights
    from engine.artifact import formats
    from engine.gpu import launch as K
    from engine.gpu.gemv import DevMatrix

    gd = importlib.reload(gemv_sweep)
    monkeypatch.setattr(cp, "random", types.SimpleNamespace(default_rng=lambda seed: None), raising=False)
    monkeypatch.setattr(gpu_weights, "random_matrix", lambda cp_, rng, fmt, n, k: DevMatrix.from_object(
        fmt, (n, k), cp.zeros(formats.rowsplit_geometry(fmt, (n, k)).bytes + 4, dtype=cp.uint8)))
    monkeypatch.setattr(gd, "time_graph", lambda fn, reps=20, iters=5: (fn(), 0.01)[1])
    try:
        res = gd.routed_sweep(4000.0, experts=16, slots=8)
    finally:
        K.reset_modules()
        for fn in (K.sm_count, K.blocks_per_sm, K.smem_optin):
            fn.cache_clear()
    assert [r["shape"] for r in res] == ["35b routed gate|up"] * 4 + ["35b routed down"] * 6
    assert {(r["unroll"], r["pre2"]) for r in res[:4]} == {(2, False), (4, False), (2, True), (4, True)}
    assert all(r["us"] == 5.0 and r["slots"] == 8 for r in res)
