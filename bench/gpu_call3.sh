#!/usr/bin/env bash
# One device call: why the failing GPU tests fail, where the GEMVs lose bandwidth (Nsight Compute),
# where a tensor-core prefill chunk spends its time, and bench/experiments/$EXP.patch against main.
# Usage (GPU machine, repo root): EXP=combined bash bench/gpu_call3.sh   (~8 min). Files under $OUT.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=$PWD/.cupy_cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; EXP=${EXP:-combined}
log() { echo "== $(date +%T) $*"; }
NCU="ncu --clock-control none -k regex:gemv_rs --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis"
ncu_lines() { grep -E "gemv_rs|Duration|Memory Throughput|DRAM Throughput|L1/TEX Cache Throughput|Issue Slots Busy|Issued Warp Per|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Block Limit|Mem Busy|Max Bandwidth|Mem Pipes" "$1" | head -${2:-60}; }
log start; nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
log "NUL bytes in the tree"
python3 - <<'PY'
import pathlib
bad = [str(p) for p in pathlib.Path('.').rglob('*.py') if b'\0' in p.read_bytes()]
print('files with NUL bytes:', bad[:20] or 'none')
PY
log compile
timeout 240 python3 -c "from engine.ops import kernels as K; K.kernel('argmax_step')"
log "failing tests, tracebacks"
timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_prefill.py tests/gpu/test_gpu_engine.py \
  -k "dequant_rs or sparse_logits or matches_numpy_engine" > "$OUT/fail.txt" 2>&1
grep -E "^E |Error|passed|failed" "$OUT/fail.txt" | head -40
log "ncu main"
timeout 90 $NCU python3 bench/gemv_ncu.py > "$OUT/ncu_main.txt" 2>&1; ncu_lines "$OUT/ncu_main.txt" 40
log "prefill profile pp8192 chunk 1024"
timeout 100 python3 bench/prefill_profile.py --tokens 8192 --chunk 1024 --out "$OUT/pp_profile.json" 2>&1 | head -34
log "main decode 27B"
timeout 60 python3 bench/gpu_decode.py --synthetic qwen3.8-27b 2>&1 | grep -E "PDL" | head -3
log "experiment $EXP"
D=/dev/shm/exp_$EXP; rm -rf "$D"; mkdir -p "$D"; cp -r . "$D" && (cd "$D" && patch -p1 -s < "bench/experiments/$EXP.patch") || exit 1
cd "$D"; export PYTHONPATH=$D CUPY_CACHE_DIR=$D/.cupy_cache
timeout 240 python3 -c "from engine.ops import kernels as K; K.kernel('argmax_step')"
timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_kernels.py tests/gpu/test_gpu_engine.py \
  -k "not memory_plan" > "$OUT/exp_tests.txt" 2>&1; grep -E "^E |Error|passed|failed" "$OUT/exp_tests.txt" | head -30
timeout 90 python3 bench/gpu_decode.py --synthetic qwen3.8-27b,qwen3.6-35b-a3b --breakdown --out "$OUT/exp_decode.json" 2>&1 \
  | grep -E "PDL|sum of|^  gemv|^  resid|^  stage" | head -20
timeout 90 $NCU python3 bench/gemv_ncu.py > "$OUT/ncu_exp.txt" 2>&1; ncu_lines "$OUT/ncu_exp.txt" 40
log done
