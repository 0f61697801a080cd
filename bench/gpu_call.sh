#!/usr/bin/env bash
# One device call, every step bounded by its own timeout and streaming its output:
# compile, GPU tests, GEMV sweep, synthetic decode (PDL A/B, breakdown, depth), the 24 GiB plan run.
# Usage (GPU machine, repo root): bash bench/gpu_call.sh [geometries] [depth]
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=$PWD/.cupy_cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log() { echo "== $(date +%T) $*"; }
log start; nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
log compile
timeout 300 python3 -c "import time; t=time.time(); from engine.ops import kernels as K; K.kernel('argmax_step'); print('compiled in', round(time.time()-t,1), 's')"
log tests
timeout ${TEST_S:-240} python3 -m pytest -q -x tests/gpu/test_gemv.py tests/gpu/test_kernels.py tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_engine_moe.py -p no:cacheprovider 2>&1 | tail -${TEST_TAIL:-15}
log sweep
timeout ${SWEEP_S:-150} python3 bench/gpu_decode.py --sweep --out "$OUT/sweep.json" 2>&1 | tail -30
log decode
timeout ${DECODE_S:-330} python3 bench/gpu_decode.py --cfg "$OUT/sweep.json" --synthetic "${1:-qwen3.8-27b,qwen3.6-35b-a3b}" --depth "${2:-32768}" --breakdown --out "$OUT/decode.json" 2>&1 | tail -60
if [ -n "${PLAN_S:-}" ]; then
  log plan24
  timeout "$PLAN_S" python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b --vram-limit 24GiB --ctx auto --kv int8 -p 0 -n 128 -d 32768 -r 3 -o json --out "$OUT/qwen38-27b_vram24_ctxauto_int8_d32768.json"
fi
log done
