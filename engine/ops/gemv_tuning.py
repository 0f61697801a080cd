"""Measured GEMV launch choices for the shapes of the published geometries (rows per warp, 16-byte
loads in flight per lane, split-K slices), keyed by (format, N, K).

From `python bench/gpu_decode.py --sweep` on the H200 (bench/results/gemv_sweep_h200_20261129c.json,
the kernels of this commit). Shapes not listed take GemvPlan's defaults (2 rows, unroll 2) and the
executor's split-K rule. `gemv_cfg=` on the executor overrides the table (the sweep passes its own).
"""
from __future__ import annotations

from engine.ops import kernels

# qwen3.6/3.8-27b (dense, hidden 5120): attention q|k and gate|v, GDN q|k and v|z, out-projections,
# MLP gate|up (SwiGLU) and down, W8 head
# pre2: gemv_rs_pre (x through the read-only path, row pointers advanced by constants), faster on these
# four shapes in two sweeps of session 5 (bench/results/gemv_sweep_pre2_h200_20261129f.json,
# gemv_sweep_flat_h200_20261129f.json): q|k 7.6 -> 7.4 us, GDN q|k 5.2 -> 5.0, GDN out 9.8 -> 8.9,
# gate|up 32.1 -> 30.5; slower on v|z, gate|v and down, which keep gemv_rs.
# The fp16-pair decode (NINFER_XI16=0): the table above as measured through session 10.
H200_F16 = {
    ("q4_g64_fp16", 7168, 5120): dict(rows=2, unroll=2, splits=1, pre2=True),
    ("q5_g64_fp16", 7168, 5120): dict(rows=1, unroll=2, splits=1),
    ("q4_g64_fp16", 4096, 5120): dict(rows=1, unroll=2, splits=1, pre2=True),
    ("q5_g64_fp16", 12288, 5120): dict(rows=1, unroll=2, splits=1),
    ("q5_g64_fp16", 5120, 6144): dict(rows=1, unroll=2, splits=1, pre2=True),
    ("q4_g64_fp16", 34816, 5120): dict(rows=2, unroll=2, splits=1, pre2=True),
    ("q5_g64_fp16", 5120, 17408): dict(rows=1, unroll=2, splits=2),
    ("q8_g32_fp16", 248320, 5120): dict(rows=2, unroll=2, splits=1),
}

# The int16-pair dp2a decode (NINFER_XI16=1, the default), from session 11's sweep on the H200
# (bench/results/sweep_xi16_h200_20261130k.json): gemv_rs_pre now wins on v|z (14.3 against 15.1 us), down
# (17.9 against 19.5), gate|v (rows 2: 10.2 against 11.0) and GDN q|k (rows 2: 4.75 against 5.07); gate|up
# 25.9 us (85% of the copy bandwidth); the W8 head takes unroll 4 (340 against 343 us).
H200_I16 = {
    ("q4_g64_fp16", 7168, 5120): dict(rows=2, unroll=2, splits=1, pre2=True),
    ("q5_g64_fp16", 7168, 5120): dict(rows=2, unroll=2, splits=1, pre2=True),
    ("q4_g64_fp16", 4096, 5120): dict(rows=2, unroll=2, splits=1, pre2=True),
    ("q5_g64_fp16", 12288, 5120): dict(rows=1, unroll=2, splits=1, pre2=True),
    ("q5_g64_fp16", 5120, 6144): dict(rows=1, unroll=2, splits=1, pre2=True),
    ("q4_g64_fp16", 34816, 5120): dict(rows=2, unroll=2, splits=1, pre2=True),
    ("q5_g64_fp16", 5120, 17408): dict(rows=1, unroll=2, splits=2, pre2=True),
    ("q8_g32_fp16", 248320, 5120): dict(rows=2, unroll=4, splits=1),  # (pre-staged w8, W8_PRE: rows 2, unroll 2)
}
H200 = H200_I16 if kernels.XI16 else H200_F16


def default_cfg() -> dict:
    """The table the executor starts from (a copy: callers may add to it)."""
    return {k: dict(v) for k, v in H200.items()}
