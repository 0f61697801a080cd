#!/usr/bin/env bash
# The device calls, every step under its own timeout, output streamed, JSON and logs under $OUT:
#   main: compile, every GPU test (tracebacks in gpu_tests.txt), the tensor-core prefill's op profile
#         (pp8192, chunk 8192, GDN rows 4/1/2), decode 27B + 35B with breakdown and depth 32K (the tuning table),
#         `ninfer bench` pp512/pp2000/pp8192 and pp131072 with the defaults (~5 min on a cold machine);
#   exp:  bench/experiments/*.patch applied to a copy, its tests and sweep beside main's on the same
#         machine (EXP="a b" picks patches). Copies made with cp -r on the device have read as NUL bytes
#         (bench/NOTES-decode.md, session 3): check its test output before trusting a sweep.
#   quick: compile, tests/gpu/test_kernels.py -k $TESTK, sweep, decode $GEOS with the sweep's table.
#   next: gdnc then moep in one call (session 6's first).
#   moep: MoE prefill on tensor cores (NINFER_MOE_PREFILL=1): tests, 35B bench.
#   gdnc: the chunked GDN prefill: tests, profiles against the token-by-token recurrence.
#   s6: all GPU tests, 27B decode with the MLP split and without (twice), prefill bench 27B + 35B.
#   moeprof: 35B-A3B decode breakdown and pp8192 op profile (MoE phases).
#   s6b: batched MoE prefill and the tensor-core chunked GDN: tests, profiles, 35B bench.
#   s6c: session 6's last call: every GPU test, decode (+ 35B MoE staging A/B), prefill benches and profiles.
#   s6d: the MoE prefill's device-side sort: MoE tests, 35B bench and profile, 35B decode.
#   s6e: GEMV weight loads with L1::no_allocate against plain __ldg: gemv tests, decode A/B.
#   final: all GPU tests, decode with breakdown and depth, prefill bench (the session-5 figures).
# (The one-off A/B parts of session 5, pre2 / s5 / pdl / br / s5b, are in git history: 4f9b3f1.)
# Usage (GPU machine, repo root): bash bench/gpu_all.sh main | final | next | quick | exp
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=$PWD/.cupy_cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log() { echo "== $(date +%T) $*"; }
PART=${1:-main}
log start; nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
# CuPy's own kernels (cp.full, ufuncs) compile through NVRTC with headers read from the image; on a fresh
# machine those reads have returned junk for a while (NOTES, session 3): retry until one compiles.
cupy_ready() {
  for i in $(seq 1 ${1:-12}); do
    python3 -c "import cupy as cp, numpy as np; a = cp.full((3, 2), np.nan, dtype=cp.float32); a.fill(1); (a * 2).sum().get()" \
      >/dev/null 2>&1 && { log "cupy ready ($i)"; return 0; }
    sleep 5
  done
  log "cupy still failing to compile its own kernels"
}
# compile the engine's module (cached for the later steps), then wait until CuPy compiles its own kernels
ready() {
  log compile
  timeout 240 python3 -c "from engine.ops import kernels as K; K.kernel('argmax_step')"
  cupy_ready
}
# pytest, then up to twice more for the tests that failed when a file read on a fresh machine saw junk
# (NOTES); $1: output file (the retries' output appended)
gpu_pytest() {
  local out=$1; shift
  timeout 300 python3 -m pytest -q -p no:cacheprovider --tb=short "$@" > "$out" 2>&1
  local src=$out
  for attempt in 1 2; do
    grep -q "null bytes\|unrecognized token" "$src" || break
    local ids
    ids=$(grep -E "^(FAILED|ERROR) tests/" "$src" | sed -E 's/^(FAILED|ERROR) ([^ ]+).*/\2/' | sort -u)
    src=$out.retry
    [ -n "$ids" ] || break
    log "a read saw junk; the $(echo "$ids" | wc -l) failed tests again"; sleep 5
    timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short $ids > "$out.retry" 2>&1
    { echo "== retry $attempt"; cat "$out.retry"; } >> "$out"
  done
}
# decode 27B + 35B with the per-kernel breakdown and the 27B at depth 32K (the tuning table)
decode_all() {
  log "decode"
  timeout 150 python3 bench/gpu_decode.py --synthetic qwen3.8-27b,qwen3.6-35b-a3b --depth 32768 --breakdown \
    --out "$OUT/decode.json" 2>&1 | grep -E "PDL|sum of|^  |rror" | head -30
}
# `ninfer bench` pp512/pp2000/pp8192 with the defaults (tensor-core prefill where memory allows)
bench_pp() {
  log "bench pp512,pp2000,pp8192"
  timeout 150 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 512,2000,8192 -n 0 -r 2 \
    -o json --out "$OUT/pp_default.json" 2>&1 | grep -E "^pp|rror" | head -6
}
if [ "$PART" = main ]; then
ready
log tests
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | head -24
log "prefill profile (pp8192, chunk 8192; then the GDN recurrence a row a warp, NINFER_GDN_ROWS=1 and 2)"
timeout 90 python3 bench/prefill_profile.py --tokens 8192 --chunk 8192 --out "$OUT/pp_profile.json" 2>&1 | head -22
for r in 1 2; do
  NINFER_GDN_ROWS=$r timeout 60 python3 bench/prefill_profile.py --tokens 8192 --chunk 8192 \
    --out "$OUT/pp_profile_gdnrows$r.json" 2>&1 | grep -E "tok/s|gdn_delta" | head -3
done
decode_all
bench_pp
log "bench pp131072 (issue 8: completes, tok/s reported)"
timeout ${LONG_S:-150} python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 131072 -n 0 \
  -r 1 --warmup 0 -o json --out "$OUT/pp131072_default.json" 2>&1 | grep -E "^pp|rror" | head -3
log "sampled decode through the generate loop (T 0.7, top-p 0.9)"
timeout 90 python3 bench/sampled_decode.py --tokens 64 2>&1 | tail -4
fi
# compile the engine's module, wait for CuPy, then tests/gpu/test_kernels.py -k "$1"
kernel_tests() {
  ready
  log "kernel tests (-k $1)"
  gpu_pytest "$OUT/gpu_tests.txt" tests/gpu/test_kernels.py -k "$1"
  grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | head -12
}
if [ "$PART" = quick ]; then  # kernel tests (-k $TESTK), sweep, 27B decode with the sweep's table + breakdown
kernel_tests "${TESTK:-gemv}"
log "sweep + decode"
timeout 300 python3 bench/gpu_decode.py --sweep --synthetic ${GEOS:-qwen3.8-27b} --breakdown --out "$OUT/quick.json" 2>&1 \
  | grep -E "best|PDL|sum of|^  gemv|^  resid|^  stage|tok/s|Error|error" | head -60
fi
if [ "$PART" = final ]; then  # every GPU test, decode, prefill bench
ready
log "all GPU tests"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | head -12
decode_all
bench_pp
fi
if [ "$PART" = gdnc ] || [ "$PART" = next ]; then  # the chunked GDN prefill etc. (written in session 5 without device time)
ready
log "tests: chunked GDN against the token-by-token kernel; prefill (padded pieces, MoE) with it"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu/test_kernels.py -k "gdn_chunk or gdn_delta"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | head -12
NINFER_GDN_CHUNKED=1 NINFER_GDN_TC=${GDN_TC:-0} gpu_pytest "$OUT/gpu_tests_prefill.txt" tests/gpu/test_prefill.py
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_prefill.txt" | head -8
log "prefill profile pp8192 chunk 8192: chunked on tensor cores (32 rows a block), on CUDA cores, token by token"
pp() { timeout 90 python3 bench/prefill_profile.py --tokens 8192 --chunk 8192 --out "$OUT/$1.json" 2>&1 \
  | grep -E "tok/s|gdn_|attention" | head -4; }
NINFER_GDN_CHUNKED=1 NINFER_GDN_TC=1 NINFER_GDN_SCAN_RB=32 pp pp_profile_chunked_tc32
NINFER_GDN_CHUNKED=1 NINFER_GDN_SCAN_RB=16 pp pp_profile_chunked16
pp pp_profile
log "padded last chunk (NINFER_PREFILL_PAD=1): pp512, pp2000, pp3000 (defaults 4,193 / 2,886 / -)"
NINFER_PREFILL_PAD=1 timeout 120 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 512,2000,3000 -n 0 -r 2 \
  -o json --out "$OUT/pp_pad.json" 2>&1 | grep -E "^pp|rror" | head -4
log "attention query blocks of 256 MiB of scores (default 1024)"
NINFER_PREFILL_SCORE_MIB=256 pp pp_profile_score256
log "more state-row splits"
NINFER_GDN_CHUNKED=1 NINFER_GDN_TC=1 NINFER_GDN_SCAN_RB=64 pp pp_profile_chunked_tc64
NINFER_GDN_CHUNKED=1 NINFER_GDN_SCAN_RB=32 pp pp_profile_chunked32
fi
if [ "$PART" = moep ] || [ "$PART" = next ]; then  # MoE models through the tensor-core prefill (written in session 5 without device time)
ready
log "tests: MoE prefill against NumPy and token by token"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu/test_prefill.py -k moe
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | head -8
log "bench 35B-A3B pp512, pp8192 with NINFER_MOE_PREFILL=1"
NINFER_MOE_PREFILL=1 timeout 240 python3 -m ninfer_cli.main bench --synthetic qwen3.6-35b-a3b -p 512,8192 -n 0 -r 1 \
  -o json --out "$OUT/pp_moe.json" 2>&1 | grep -E "^pp|rror" | head -4
fi
if [ "$PART" = s6 ]; then  # session 6: the MLP in two halves (NINFER_FFN_SPLIT), new prefill defaults
ready
log "all GPU tests"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | head -16
for fs in 0 1 0 1; do
  log "decode NINFER_FFN_SPLIT=$fs"
  NINFER_FFN_SPLIT=$fs timeout 100 python3 bench/gpu_decode.py --synthetic qwen3.8-27b${GEO35:-} --breakdown \
    --out "$OUT/decode_ffn$fs.json" 2>&1 | grep -E "tok/s|sum of|^  gemv q|^  concurrent|stage|rror" | head -16
done
bench_pp
log "bench 35B-A3B pp512, pp8192 (MoE prefill on by default)"
timeout 150 python3 -m ninfer_cli.main bench --synthetic qwen3.6-35b-a3b -p 512,8192 -n 0 -r 2 \
  -o json --out "$OUT/pp_moe.json" 2>&1 | grep -E "^pp|rror" | head -4
fi
if [ "$PART" = moeprof ]; then  # where the 35B-A3B spends its time: decode breakdown, pp8192 profile
ready
log "decode 35B-A3B with breakdown"
timeout 100 python3 bench/gpu_decode.py --synthetic qwen3.6-35b-a3b --breakdown --out "$OUT/decode_35b.json" 2>&1 \
  | grep -E "tok/s|sum of|^  |rror" | head -30
log "prefill profile 35B-A3B pp8192 chunk 8192"
timeout 150 python3 bench/prefill_profile.py --geometry qwen3.6-35b-a3b --tokens 8192 --chunk 8192 \
  --out "$OUT/pp_profile_35b.json" 2>&1 | head -30
fi
if [ "$PART" = s6b ]; then  # batched MoE prefill; the chunked GDN on tensor cores (inline PTX)
ready
log "tests: chunked GDN kernels; prefill with chunked GDN on tensor cores; MoE prefill"
gpu_pytest "$OUT/gpu_tests_gdn.txt" tests/gpu/test_kernels.py -k "gdn_chunk or gdn_delta"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_gdn.txt" | head -10
NINFER_GDN_CHUNKED=1 NINFER_GDN_TC=1 gpu_pytest "$OUT/gpu_tests_prefill.txt" tests/gpu/test_prefill.py
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_prefill.txt" | head -10
log "tests: flash-attention prefill"
gpu_pytest "$OUT/gpu_tests_flash.txt" tests/gpu/test_attn_prefill.py
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_flash.txt" | head -10
log "prefill profile 27B pp8192: chunked GDN on tensor cores (RB 64)"
NINFER_GDN_CHUNKED=1 NINFER_GDN_TC=1 timeout 90 python3 bench/prefill_profile.py --tokens 8192 --chunk 8192 \
  --out "$OUT/pp_profile_tc64.json" 2>&1 | grep -E "tok/s|gdn_|attention|gemm" | head -8
for w in 4 8; do
  log "prefill profile 27B pp8192: + flash attention ($w warps)"
  NINFER_GDN_CHUNKED=1 NINFER_GDN_TC=1 NINFER_FLASH_PREFILL=1 NINFER_FLASH_WARPS=$w timeout 90 python3 \
    bench/prefill_profile.py --tokens 8192 --chunk 8192 --out "$OUT/pp_profile_flash$w.json" 2>&1 \
    | grep -E "tok/s|gdn_|attn|attention" | head -5
done
log "prefill profile 35B-A3B pp8192 (batched MoE)"
timeout 150 python3 bench/prefill_profile.py --geometry qwen3.6-35b-a3b --tokens 8192 --chunk 8192 \
  --out "$OUT/pp_profile_35b.json" 2>&1 | head -14
log "bench 35B-A3B pp512, pp8192"
timeout 150 python3 -m ninfer_cli.main bench --synthetic qwen3.6-35b-a3b -p 512,8192 -n 0 -r 2 \
  -o json --out "$OUT/pp_moe.json" 2>&1 | grep -E "^pp|rror" | head -4
fi
if [ "$PART" = s6c ]; then  # session 6 final: every GPU test, decode (MoE staging A/B), prefill benches
ready
log "all GPU tests"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | head -16
log "decode 27B + 35B with breakdown, 27B at depth 32768"
decode_all
for st in 0 1 0; do
  log "decode 35B NINFER_MOE_STAGE=$st"
  NINFER_MOE_STAGE=$st timeout 60 python3 bench/gpu_decode.py --synthetic qwen3.6-35b-a3b \
    --out "$OUT/decode_35b_stage$st.json" 2>&1 | grep -E "tok/s|rror" | head -3
done
bench_pp
log "bench 35B-A3B pp512, pp8192"
timeout 150 python3 -m ninfer_cli.main bench --synthetic qwen3.6-35b-a3b -p 512,8192 -n 0 -r 2 \
  -o json --out "$OUT/pp_moe.json" 2>&1 | grep -E "^pp|rror" | head -4
log "prefill profiles pp8192: 35B-A3B (MoE phases), 27B"
timeout 100 python3 bench/prefill_profile.py --geometry qwen3.6-35b-a3b --tokens 8192 --chunk 8192 \
  --out "$OUT/pp_profile_35b.json" 2>&1 | head -12
timeout 90 python3 bench/prefill_profile.py --tokens 8192 --chunk 8192 --out "$OUT/pp_profile.json" 2>&1 | head -8
log "bench pp131072 (issue 8: completes, tok/s reported)"
timeout ${LONG_S:-150} python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 131072 -n 0 \
  -r 1 --warmup 0 -o json --out "$OUT/pp131072_default.json" 2>&1 | grep -E "^pp|rror" | head -3
fi
if [ "$PART" = s6d ]; then  # the MoE prefill's device-side sort: tests, 35B bench and profile, 35B decode
ready
log "tests: MoE prefill and decode"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu/test_prefill.py tests/gpu/test_gpu_engine.py -k moe
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | head -10
log "bench 35B-A3B pp512, pp8192"
timeout 150 python3 -m ninfer_cli.main bench --synthetic qwen3.6-35b-a3b -p 512,8192 -n 0 -r 2 \
  -o json --out "$OUT/pp_moe.json" 2>&1 | grep -E "^pp|rror" | head -4
timeout 100 python3 bench/prefill_profile.py --geometry qwen3.6-35b-a3b --tokens 8192 --chunk 8192 \
  --out "$OUT/pp_profile_35b.json" 2>&1 | head -9
log "decode 35B-A3B (MoE staging in the down-projection, the default now) with breakdown"
timeout 60 python3 bench/gpu_decode.py --synthetic qwen3.6-35b-a3b --breakdown --out "$OUT/decode_35b.json" 2>&1 \
  | grep -E "tok/s|sum of|rror" | head -4
fi
if [ "$PART" = s6e ]; then  # GEMV weight loads with L1::no_allocate (default) against plain __ldg
ready
log "kernel tests (gemv)"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu/test_kernels.py -k "gemv and not mma"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | head -6
for na in 1 0 1; do
  log "decode NINFER_W_NOALLOC=$na (27B with breakdown, 35B)"
  NINFER_W_NOALLOC=$na timeout 150 python3 bench/gpu_decode.py --synthetic qwen3.8-27b,qwen3.6-35b-a3b --breakdown \
    --out "$OUT/decode_na$na.json" 2>&1 | grep -E "tok/s|sum of|^  gemv q|rror" | head -12
done
fi
if [ "$PART" = probe ]; then  # bench/mma_probe.py (L2-resident vs DRAM-streamed GEMV variants)
log compile
timeout 240 python3 -c "from engine.ops import kernels as K; K.kernel('argmax_step')"
timeout 120 python3 bench/mma_probe.py 2>&1 | tail -20
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
if [ "$PART" = ncu_mma ]; then  # Nsight Compute: gemv_mma against the register kernel on gate|up
  timeout 240 python3 -c "from engine.ops import kernels as K; K.kernel('argmax_step')"
  NCU_SHAPES="mlp gate|up" NCU_KERNEL=gemv_ bash bench/gpu_profile.sh; cp "$OUT/ncu.txt" "$OUT/ncu_reg.txt"
  NCU_SHAPES="mlp gate|up" NCU_MMA=2,4,2 NCU_KERNEL=gemv_ bash bench/gpu_profile.sh
  grep -E "Stall|stall|Warp Cycles|Issue Slot|Executed Ipc|L1/TEX Hit|Mem Busy|Max Bandwidth|DRAM Through|Registers Per|Achieved Occ|Theoretical Occ|Duration" "$OUT/ncu.txt" | head -50
fi
if [ "$PART" = ppchunk ]; then  # pp8192 with larger tensor-core prefill chunks (dequantized weights amortized)
  timeout 240 python3 -c "from engine.ops import kernels as K; K.kernel('argmax_step')"
  for T in ${CHUNKS:-2048 4096 8192}; do
    log "pp8192 NINFER_PREFILL_GEMM=$T"
    NINFER_PREFILL_GEMM=$T timeout 100 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 8192 -n 0 -r 2 \
      -o json --out "$OUT/pp8192_gemm$T.json" 2>&1 | grep -E "^pp|rror|GiB" | head -4
  done
fi
