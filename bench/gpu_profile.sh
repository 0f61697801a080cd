#!/usr/bin/env bash
# Nsight Compute on the two biggest decode GEMVs (q4 gate|up with SwiGLU, q5 down), pre-staged x.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=$PWD/.cupy_cache
cat > /tmp/prof.py <<'PY'
import cupy as cp, numpy as np
from engine.ops import kernels as K
from engine.gpu_weights import random_matrix
rng = cp.random.default_rng(0)
for fmt, n, k, epi, rows in (("q4_g64_fp16", 34816, 5120, "swiglu", 2), ("q5_g64_fp16", 5120, 17408, "store", 1)):
    w = random_matrix(cp, rng, fmt, n, k)
    x = cp.asarray(np.random.default_rng(1).standard_normal((1, k)).astype(np.float32))
    kpad = -(-k // 128) * 128
    xh, xi = cp.zeros((1, kpad // 2), cp.uint32), cp.zeros(1, cp.float32)
    K.prepared("stage_x", (1,), (x, k, k, kpad, xh, xi), block=1024)()
    y = cp.zeros((1, n), cp.float32)
    p = K.GemvPlan(w, x, k, y, n // 2 if epi == "swiglu" else n, epi=epi, rows=rows, unroll=2, xpre=(xh, xi))
    for _ in range(3):
        p.launch()
    cp.cuda.Device().synchronize()
PY
ncu --clock-control none -k regex:gemv_rs --launch-skip 2 --launch-count 2 --section SpeedOfLight \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \
    --section WarpStateStats --section InstructionStats python3 /tmp/prof.py 2>&1 | grep -vE "^==PROF==|^\s*$" | cut -c1-110 | head -230
