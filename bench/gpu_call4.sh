#!/usr/bin/env bash
# One device call after the prefill rework and the merged GEMV experiment: every GPU test, the prefill
# profile (pp8192, chunk 1024), decode with breakdown (27B at depth 0 and 32K, 35B), `ninfer bench`
# pp512/pp8192 and pp131072 with the tensor-core prefill. ~9 min. JSON and logs under $OUT.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=$PWD/.cupy_cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log() { echo "== $(date +%T) $*"; }
log start; nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
log compile
timeout 240 python3 -c "from engine.ops import kernels as K; K.kernel('argmax_step')"
log tests
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu > "$OUT/gpu_tests.txt" 2>&1
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | head -24
log "prefill profile"
NINFER_PREFILL_GEMM=1024 timeout 90 python3 bench/prefill_profile.py --tokens 8192 --chunk 1024 \
  --out "$OUT/pp_profile.json" 2>&1 | head -22
log decode
timeout 120 python3 bench/gpu_decode.py --synthetic qwen3.8-27b,qwen3.6-35b-a3b --depth 32768 --breakdown \
  --out "$OUT/decode.json" 2>&1 | grep -E "PDL|sum of|copy|^  gemv|^  resid|^  stage" | head -22
log "bench pp512,pp8192 (NINFER_PREFILL_GEMM=1024)"
NINFER_PREFILL_GEMM=1024 timeout 100 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 512,8192 -n 0 -r 2 \
  -o json --out "$OUT/pp_gemm1024.json" 2>&1 | grep -E "^pp|rror" | head -4
log "bench pp131072"
NINFER_PREFILL_GEMM=1024 timeout ${LONG_S:-150} python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 131072 -n 0 \
  -r 1 --warmup 0 -o json --out "$OUT/pp131072_gemm1024.json" 2>&1 | grep -E "^pp|rror" | head -3
log done
