"""Measured GEMV launch choices for the shapes of the published geometries (rows per warp, 16-byte
loads in flight per lane, split-K slices), keyed by (format, N, K).

From sweeps of the GEMV forms on the H200 (the one-token table below; the columns' from
`python bench/gemv_columns.py`). Shapes not listed take GemvPlan's defaults (2 rows, unroll 2) and the
executor's split-K rule. `gemv_cfg=` on the executor overrides the table.
"""
from __future__ import annotations

# The int16-pair dp2a decode, from a sweep on the H200:
# gemv_rs_pre wins on v|z (14.3 against 15.1 us), down (17.9 against 19.5), gate|v (rows 2: 10.2 against
# 11.0) and GDN q|k (rows 2: 4.75 against 5.07); gate|up 25.9 us (85% of the copy bandwidth). The W8 head
# reads the pre-staged pairs too (gemv_rs_pre's w8 form).
H200 = {
    ("q4_g64_fp16", 7168, 5120): dict(rows=2, unroll=2, splits=1, pre2=True),
    ("q5_g64_fp16", 7168, 5120): dict(rows=2, unroll=2, splits=1, pre2=True),
    ("q4_g64_fp16", 4096, 5120): dict(rows=2, unroll=2, splits=1, pre2=True),
    ("q5_g64_fp16", 12288, 5120): dict(rows=1, unroll=2, splits=1, pre2=True),
    ("q5_g64_fp16", 5120, 6144): dict(rows=1, unroll=2, splits=1, pre2=True),
    ("q4_g64_fp16", 34816, 5120): dict(rows=2, unroll=2, splits=1, pre2=True),
    ("q5_g64_fp16", 5120, 17408): dict(rows=1, unroll=2, splits=2, pre2=True),
    ("q8_g32_fp16", 248320, 5120): dict(rows=2, unroll=2, splits=1, pre2=True),  # (w8 reads the pre-staged pairs)
    # the 27B's MTP layer (the drafts' one-row steps; `python bench/gemv_columns.py --mtp --one-rows 1,2 --one-splits
    # 1,2,3`, gemv_columns4_mtp_qwen38-27b_h200.json, in us against the default form): input projection 15.6 against
    # 20.6, o 8.4 against 13.3, down 24.3 against 32.9
    ("q8_g32_fp16", 5120, 10240): dict(rows=1, unroll=2, splits=1, pre2=True),
    ("q8_g32_fp16", 5120, 6144): dict(rows=2, unroll=2, splits=3, pre2=True),
    ("q8_g32_fp16", 5120, 17408): dict(rows=1, unroll=2, splits=1, pre2=True),
}

# gemv_tc (2..8 columns: the verified columns of speculative decoding): (groups a run, ring stages, warps a 16-row
# tile or None for gemv.tc_warps' rule[, split-K slices of the partial planes]) by (format, N, K), from `python
# bench/gemv_columns.py --cols 4 --warps 2,4,8 --gu 2,4 --stages 3,4` on the H200
# (bench/results/gemv_columns4_qwen38-27b_h200.json, in us at 4 columns: gate|up 33.7 with 4 warps a tile against
# 36.7 with 8 at 3 stages, the GDN v|z 15.7 against 17.3, the attention's gate|v 11.7 against 12.7 at 4 stages; the
# head 341.7 with 4 groups a run), and of the 35B-A3B's dense shapes (`--geometry qwen3.6-35b-a3b`,
# gemv_columns4_qwen36-35b-a3b_h200.json: its head, o and GDN query|key projection 4 groups a run, an attention
# projection 4,608 x 2,048 5.3 against 6.5 us with 4 groups, the shared expert's down 3.6 against 4.6 with 4 warps a
# tile). The 27B's down takes 4 warps a tile and 2 slices (`python dev/tc_splits.py`,
# gemv_tc_splits4_qwen38-27b_h200.json: 25.5 against 28.6-29.2 us with 8 warps; the mtp:3 round 9.76-9.81 against
# 9.83-9.88 ms). Other shapes take (kernel_names.GEMV_TC_GU, GEMV_TC_STAGES) and the rule.
H200_TC = {
    ("q8_g32_fp16", 248320, 5120): (4, 3, None),
    ("q4_g64_fp16", 34816, 5120): (4, 3, 4),
    ("q5_g64_fp16", 5120, 17408): (4, 3, 4, 2),
    ("q5_g64_fp16", 12288, 5120): (4, 3, 4),
    ("q4_g64_fp16", 4096, 5120): (4, 4, None),
    ("q5_g64_fp16", 5120, 6144): (4, 3, None),
    ("q5_g64_fp16", 7168, 5120): (4, 4, 4),
    ("q6_g64_fp16", 248320, 2048): (4, 3, None),
    ("q8_g32_fp16", 2048, 4096): (4, 4, None),
    ("q8_g32_fp16", 4096, 2048): (4, 4, None),
    ("q8_g32_fp16", 4608, 2048): (4, 3, None),
    ("q8_g32_fp16", 2048, 512): (2, 3, 4),
    # the 27B's MTP layer over the verified columns (the catch-up; `python bench/gemv_columns.py --mtp`,
    # gemv_columns4_mtp_qwen38-27b_h200.json, in us at 4 columns against the default form): input projection 20.5
    # against 28.8, o 12.1 against 17.2, gate|up 54.9 against 72.5 (4 warps a tile), down 30.9 against 46.4
    ("q8_g32_fp16", 5120, 10240): (4, 3, None),
    ("q8_g32_fp16", 5120, 6144): (4, 3, None),
    ("q8_g32_fp16", 34816, 5120): (4, 3, 4),
    ("q8_g32_fp16", 5120, 17408): (4, 3, None),
}


def default_cfg() -> dict:
    """The table the executor starts from (a copy: callers may add to it)."""
    return {k: dict(v) for k, v in H200.items()}
