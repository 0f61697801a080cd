#!/usr/bin/env bash
# Nsight Compute on the main decode GEMVs (bench/gemv_ncu.py: q4 gate|up with SwiGLU, q5 down, q5 v|z, as
# the engine's tuning table launches them, x pre-staged). Full report in $OUT/ncu.txt.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=$PWD/.cupy_cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
ncu --clock-control none -k regex:${NCU_KERNEL:-gemv_rs} --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section Occupancy --section SchedulerStats --section WarpStateStats \
    --section InstructionStats --section SourceCounters python3 bench/gemv_ncu.py > "$OUT/ncu.txt" 2>&1
grep -E "gemv_|Duration|DRAM Throughput|Issued Warp|Eligible Warps|Warp Cycles Per Issued|Achieved Occupancy|Block Limit Registers" \
  "$OUT/ncu.txt" | cut -c1-110 | head -60
