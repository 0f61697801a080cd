#!/usr/bin/env bash
# The standard GPU matrix behind the README's performance table (issue 7's targets), one JSON per run.
# Usage on the GPU machine, from the repository root: bash bench/standard.sh [OUT_DIR] [REPS]
# Each run also prints its table; the JSON keeps the command, commit, device and every sample.
set -euo pipefail
out=${1:-bench/results}; reps=${2:-5}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
export NINFER_GIT_COMMIT=${NINFER_GIT_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
day=$(date -u +%Y%m%d)
bench() { python3 -m ninfer_cli.main bench "$@" -r "$reps" --warmup 1; }

bench --synthetic qwen3.8-27b -p 512 -n 128 --baseline transformers -o json --out "$out/qwen38-27b_pp512_tg128_$day.json"
bench --synthetic qwen3.8-27b -p 0 -n 128 -d 32768 --kv int8 -o json --out "$out/qwen38-27b_tg128_d32768_int8_$day.json"
bench --synthetic qwen3.6-35b-a3b -p 512 -n 128 --baseline transformers -o json --out "$out/qwen36-35b-a3b_pp512_tg128_$day.json"
