#!/usr/bin/env bash
# The next session's first device call, every step under its own timeout, output streamed:
#   1. main: compile, GPU tests (kernels, engine, prefill, sparse logits), GEMV sweep, decode 27B + 35B
#      with breakdown and the PDL A/B, depth 32K;
#   2. the tensor-core prefill: pp512 / pp8192 with NINFER_PREFILL_GEMM = 256, 1024 (0 is the columns
#      step, measured: 271-291 tok/s at pp512);
#   3. bench/experiments/*.patch applied to a copy: its kernel tests and sweep on the same machine (A/B).
# Usage (GPU machine, repo root): bash bench/gpu_all.sh main   (parts 1-2, ~7 min)
#                                 bash bench/gpu_all.sh exp    (part 3, ~2.5 min a patch: with three patches
#                                 that is close to the limit; EXP="a b" picks patches by name)
# Each call must stay under the device's 10-minute command limit. JSON under $OUT.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=$PWD/.cupy_cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log() { echo "== $(date +%T) $*"; }
PART=${1:-main}
log start; nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
if [ "$PART" = main ]; then
log compile
timeout 300 python3 -c "from engine.ops import kernels as K; K.kernel('argmax_step')"
log tests
timeout 200 python3 -m pytest -q tests/gpu -p no:cacheprovider 2>&1 | tail -12
log sweep
timeout 100 python3 bench/gpu_decode.py --sweep --out "$OUT/sweep.json" 2>&1 | tail -10
log decode
timeout 150 python3 bench/gpu_decode.py --cfg "$OUT/sweep.json" --synthetic qwen3.8-27b,qwen3.6-35b-a3b --depth 32768 \
  --breakdown --out "$OUT/decode.json" 2>&1 | grep -E "PDL|sum of|^  gemv|^  resid|^  stage" | head -24
for g in 256 1024; do
  log "prefill NINFER_PREFILL_GEMM=$g"
  NINFER_PREFILL_GEMM=$g timeout 120 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 512,8192 -n 0 -r 1 \
    -o json --out "$OUT/pp_gemm$g.json" 2>&1 | grep -E "^pp|rror" | head -3
done
log "prefill pp131072 (issue 8: completes, tok/s reported)"
NINFER_PREFILL_GEMM=1024 timeout ${LONG_S:-120} python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 131072 -n 0 \
  -r 1 --warmup 0 -o json --out "$OUT/pp131072_gemm1024.json" 2>&1 | grep -E "^pp|rror" | head -3
fi
if [ "$PART" = exp ]; then  # main's sweep again, so that every number of this call is from one machine
  log "main sweep (reference)"
  timeout 300 python3 -c "from engine.ops import kernels as K; K.kernel('argmax_step')"
  timeout 100 python3 bench/gpu_decode.py --sweep --synthetic qwen3.8-27b,qwen3.6-35b-a3b --out "$OUT/exp_main.json" 2>&1 \
    | grep -E "best|PDL" | head -12
fi
[ "$PART" = exp ] && for p in bench/experiments/*.patch; do
  [ -f "$p" ] || continue
  name=$(basename "$p" .patch); dir=/tmp/exp_$name
  [ -n "${EXP:-}" ] && [[ " $EXP " != *" $name "* ]] && continue
  log "experiment $name"
  rm -rf "$dir" && mkdir -p "$dir" && cp -r . "$dir" && (cd "$dir" && patch -p1 -s < "$p") || continue
  (cd "$dir" && export PYTHONPATH=$dir CUPY_CACHE_DIR=$dir/.cupy_cache && \
   timeout 300 python3 -c "from engine.ops import kernels as K; K.kernel('argmax_step')" && \
   timeout 120 python3 -m pytest -q -x tests/gpu/test_kernels.py tests/gpu/test_gpu_engine.py -k "not memory_plan" \
     -p no:cacheprovider 2>&1 | tail -3 && \
   timeout 100 python3 bench/gpu_decode.py --sweep --synthetic qwen3.8-27b,qwen3.6-35b-a3b --out "$OUT/exp_$name.json" \
     2>&1 | grep -E "best|PDL" | head -12)
done
log done
