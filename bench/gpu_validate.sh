#!/usr/bin/env bash
# One device call: all GPU tests, the 24 GiB plan run (issue 11), columns prefill vs token-by-token.
# Usage (GPU machine, repo root): bash bench/gpu_validate.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=$PWD/.cupy_cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
python3 -m pytest -q --maxfail=20 tests/gpu -p no:cacheprovider -k "${TESTS_K:-not nothing}" 2>&1 | tail -30
N="python3 -m ninfer_cli.main"
$N bench --synthetic qwen3.8-27b --vram-limit 24GiB --ctx auto --kv int8 -p 0 -n 128 -d 32768 -r 3 \
  -o json --out "$OUT/qwen38-27b_vram24_ctxauto_int8_d32768.json" 2>&1 | tail -15
for cols in 1 8; do
  NINFER_PREFILL_COLS=$cols $N bench --synthetic qwen3.8-27b -p 512 -n 0 -r 2 2>&1 | tail -4
done
