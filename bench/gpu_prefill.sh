#!/usr/bin/env bash
# One device call for the tensor-core prefill (issue 8): its GPU tests, then pp512 / pp8192 on the 27B with
# the GEMM chunk at 256 and 1024, beside the columns step alone. Usage: bash bench/gpu_prefill.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=$PWD/.cupy_cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log() { echo "== $(date +%T) $*"; }
log compile
timeout 300 python3 -c "from engine.ops import kernels as K; K.kernel('argmax_step')"
log tests
timeout ${TEST_S:-240} python3 -m pytest -q -x tests/gpu/test_prefill.py tests/gpu/test_gpu_engine.py -p no:cacheprovider 2>&1 | tail -15
for g in 0 256 1024; do
  log "pp with NINFER_PREFILL_GEMM=$g"
  NINFER_PREFILL_GEMM=$g timeout ${BENCH_S:-150} python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 512,8192 -n 0 -r 2 \
    -o json --out "$OUT/qwen38-27b_pp_gemm$g.json" 2>&1 | grep -E "pp[0-9]|rror" | head -4
done
log done
