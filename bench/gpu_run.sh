#!/usr/bin/env bash
# One device call: kernel tests, GEMV sweep, tiny parity, full-size synthetic decode with breakdown.
# Usage (GPU machine): bash bench/gpu_run.sh [synthetic geometries] [depth]
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export CUPY_CACHE_DIR=$PWD/.cupy_cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)"
python3 -m pytest -q --maxfail=15 tests/gpu -p no:cacheprovider 2>&1 | tail -25
python3 bench/gpu_decode.py --tiny ${SWEEP:---sweep} --synthetic "${1:-qwen3.8-27b}" --depth "${2:-0}" --breakdown --out "$OUT/decode.json"
tar -C "$PWD" -czf "$OUT/cupy_cache.tgz" .cupy_cache 2>/dev/null; ls -la "$OUT"
