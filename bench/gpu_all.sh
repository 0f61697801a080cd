#!/usr/bin/env bash
# The device calls, every step under its own timeout, output streamed, JSON and logs under $OUT:
#   main: compile, every GPU test (tracebacks in gpu_tests.txt), the tensor-core prefill's op profile
#         (pp8192, chunk 8192, GDN rows 4/1/2), decode 27B + 35B with breakdown and depth 32K (the tuning table),
#         `ninfer bench` pp512/pp2000/pp8192 and pp131072 with the defaults (~5 min on a cold machine);
#   exp:  bench/experiments/*.patch applied to a copy, its tests and sweep beside main's on the same
#         machine (EXP="a b" picks patches). Copies made with cp -r on the device have read as NUL bytes
#         (bench/NOTES-decode.md, session 3): check its test output before trusting a sweep.
#   quick: compile, tests/gpu/test_kernels.py -k $TESTK, sweep, decode $GEOS with the sweep's table.
#   final: every GPU test, decode with breakdown and depth, prefill benches 27B + 35B, pp131072 and the
#          pp8192 op profiles (the session-6 figures).
#   ab:   GPU tests -k $TESTK, then decode with in-process A/B variants (ATTR, LDG; DEPTH, GEOS, BREAKDOWN).
#   fin7: every GPU test, decode 27B + 35B with the defaults (session 7's closing call).
#   s8:   session 7's unmeasured kernels (written after its device time ran out): tests, in-step A/B at
#         depth 0 (~8 min on a cold machine); s8d: the attention A/B at depth 32768 (~5 min).
# (The one-off A/B parts of session 5, pre2 / s5 / pdl / br / s5b, are in git history at 4f9b3f1; those of
# session 6, next / gdnc / moep / s6 / moeprof / s6b / s6c / s6d / s6e, at c858397; session 7's l2pf, with
# the L2 warm-up it measured, at 741ff0c.)
#   next: attn_decode_mma's forms for smaller shared memory (A100-class: 4 warps, 2 stages; 99 KB: 3 warps or
#         4 (bf16), 1 stage), forced on the H200 (NINFER_ATTN_MMA_FORM): tests, A/B at depth 32768 (next session).
#   s10e: the 27B's tg128 at depth 32768 beside transformers. s10d: the baseline beside the 35B's pp8192 and the
#         27B's pp131072. s10c: decode through `ninfer bench` beside transformers. s10b: all GPU tests on the
#         defaults, the pp8192 baseline, the breakdown. s10a: attn_decode_mma with loads ahead (tests, A/B).
#   mma:  decode attention on tensor cores (attn_decode_mma): its tests, A/B at depth 32768 and 0.
#   base: the transformers baseline beside the 27B's pp8192 (its imports retried first).
#   fin10: prefill benches (27B, 35B-A3B, pp131072), GDN/columns/prefill tests, transformers baseline pp8192.
#   s16:  the dequantization window gated by an event (GPU time); 3 / 5 / 2 buffers (A/B), benches, tests.
#   s15:  GDN o-projection weights in the window too; 3 / 5 / 2 fp16 buffers (A/B), pp benches, prefill tests.
#   s14:  dequantization window before the GDN recurrence (A/B), prep_cols prefetch, prefill tests.
#   s13:  TF32 splits by integer ops, 3 fp16 weight buffers (A/B), profiles, pp benches, all GPU tests.
#   s12:  prefill GDN: the solve by blocks, the scan's output in 1xTF32 (A/B), tests, profiles, pp benches.
#   gsplit: decode attention's query group over 2 or 4 blocks (ATTN_GSPLIT), tests + A/B at depth 32768.
#   prep: gdn_chunk_prep timed with stages left out (bench/gdn_prep_probe.py), for the next session.
#   s11:  prefill residual in the GEMMs, weights dequantized ahead (A/B), prefill tests and benches; fin8: all
#         GPU tests, decode 27B + 35B with breakdown and depth 32768.
#   s10:  prefill gate|up in fp16, RB by head count, one partial after MoE (A/B); decode STAGE_DOWN A/B.
#   s9:   PDL overlap probe, prefill tests, prefill profiles with the norms writing the GEMMs' fp16 input (A/B).
# Usage (GPU machine, repo root): bash bench/gpu_all.sh main | final | quick | exp | ab | fin7 | s8 | s8d | s9 | s10 | s11 | fin8 | fin9 | prep | gsplit | s12 | s13 | s14 | s15 | s16 | fin10 | base | mma | s10a | s10b | s10c | s10d | s10e | next
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
# torch + transformers import the 27B geometry's model classes (a fresh machine's junk reads, as cupy_ready;
# session 9's baseline failed on "source code string cannot contain null bytes" twice), retried until they do
transformers_ready() {
  local snippet='import torch, transformers
from engine.bench_baseline import baseline_config
from engine.bench_models import hf_config_of
config, _ = baseline_config(hf_config_of(None, "qwen3.8-27b"))
with torch.device("meta"): transformers.AutoModelForCausalLM.from_config(config)'
  for i in $(seq 1 ${1:-12}); do
    python3 -c "$snippet" > "$OUT/transformers_ready.txt" 2>&1 && { log "transformers ready ($i)"; return 0; }
    sleep 10
  done
  log "transformers still failing to import: $(tail -1 "$OUT/transformers_ready.txt")"
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
    log "a read saw junk; the $(echo "$ids" | wc -l) failed tests again"; sleep 20
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
# the 35B-A3B's pp512/pp8192 (MoE prefill on tensor cores)
bench_moe() {
  log "bench 35B-A3B pp512, pp8192"
  timeout 150 python3 -m ninfer_cli.main bench --synthetic qwen3.6-35b-a3b -p 512,8192 -n 0 -r 2 \
    -o json --out "$OUT/pp_moe.json" 2>&1 | grep -E "^pp|rror" | head -4
}
# the 27B's 131,072-token prompt (issue 8: completes, tok/s reported)
bench_long() {
  log "bench pp131072"
  timeout ${LONG_S:-150} python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 131072 -n 0 \
    -r 1 --warmup 0 -o json --out "$OUT/pp131072_default.json" 2>&1 | grep -E "^pp|rror" | head -3
}
# the 27B's pp512/pp8192 and the 35B-A3B's pp8192
bench_pp_both() {
  log "bench 27B pp512,pp8192; 35B-A3B pp8192"
  timeout 150 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 512,8192 -n 0 -r 2 \
    -o json --out "$OUT/pp_default.json" 2>&1 | grep -E "^pp|rror" | head -4
  timeout 150 python3 -m ninfer_cli.main bench --synthetic qwen3.6-35b-a3b -p 8192 -n 0 -r 2 \
    -o json --out "$OUT/pp_moe.json" 2>&1 | grep -E "^pp|rror" | head -4
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
bench_long
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
if [ "$PART" = final ]; then  # every GPU test, decode, prefill benches and profiles
ready
log "all GPU tests"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | head -12
decode_all
bench_pp
bench_moe
log "prefill profiles pp8192: 35B-A3B (MoE phases), 27B"
timeout 100 python3 bench/prefill_profile.py --geometry qwen3.6-35b-a3b --tokens 8192 --chunk 8192 \
  --out "$OUT/pp_profile_35b.json" 2>&1 | head -12
timeout 90 python3 bench/prefill_profile.py --tokens 8192 --chunk 8192 --out "$OUT/pp_profile.json" 2>&1 | head -10
bench_long
fi
if [ "$PART" = ab ]; then  # GPU tests -k $TESTK, then decode with in-process A/B variants ($ATTR, $LDG)
ready
log "tests (-k ${TESTK:-gdn_fused or ldg})"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu -k "${TESTK:-gdn_fused or ldg}"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | head -16
log "decode A/B (attr: ${ATTR:-}; ldg: ${LDG:-})"
timeout ${AB_S:-400} python3 bench/gpu_decode.py --synthetic ${GEOS:-qwen3.8-27b,qwen3.6-35b-a3b} \
  --attr="${ATTR:-}" --ldg="${LDG:-}" ${BREAKDOWN:+--breakdown} --depth ${DEPTH:-0} --out "$OUT/decode_ab.json" 2>&1 \
  | grep -E "PDL|attr|ldg |sum of|^  [a-z]|rror" | head -70
fi
if [ "$PART" = s8 ]; then  # session 7's unmeasured kernels in one call: their tests, then the in-step A/B
ready
log "tests of the fused tails, fused staging, ldg, routing, attention decode"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu -k "fused or prestaged or ldg or route or attention_decode"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | tail -12
log "decode A/B at depth 0: fused tails, router + top-k, gate|up staging"
timeout 270 python3 bench/gpu_decode.py --synthetic qwen3.8-27b,qwen3.6-35b-a3b --breakdown \
  --attr="base,GDN_FUSED=1,ATTN_FUSED=1,MOE_ROUTE_FUSED=1,GDN_FUSED=1;ATTN_FUSED=1;MOE_ROUTE_FUSED=1" \
  --ldg="base,fuse_stage@q4_g64_fp16:34816x5120" --out "$OUT/decode_s8.json" 2>&1 \
  | grep -E "PDL|attr|ldg |sum of|^  [a-z]|rror" | head -60
fi
if [ "$PART" = s8d ]; then  # the second call: decode attention 4 tokens a round, at depth 32768 (int8 KV)
ready
log "decode A/B at depth 32768: attention 4 tokens a round"
timeout 300 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --depth 32768 --attr="base,ATTN_TT=4" \
  --out "$OUT/decode_s8_depth.json" 2>&1 | grep -E "PDL|attr|rror" | head -20
fi
if [ "$PART" = s9 ]; then  # session 8: is PDL live in a graph; prefill norms straight to the GEMMs' fp16 input
ready
log "PDL overlap probe"
timeout 60 python3 bench/pdl_probe.py --overlap 2>&1 | grep -E "overlap|rror" | head -6
log "prefill tests"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu/test_prefill.py
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | tail -8
for n in 1 0; do
  log "27B prefill profile pp8192, NINFER_PREFILL_NORM16=$n"
  NINFER_PREFILL_NORM16=$n timeout 100 python3 bench/prefill_profile.py --tokens 8192 --chunk 8192 \
    --out "$OUT/pp_profile_norm16_$n.json" 2>&1 | head -12
done
log "35B-A3B prefill profile pp8192"
timeout 100 python3 bench/prefill_profile.py --geometry qwen3.6-35b-a3b --tokens 8192 --chunk 8192 \
  --out "$OUT/pp_profile_35b.json" 2>&1 | head -18
bench_pp_both
fi
if [ "$PART" = s10 ]; then  # prefill: gate|up product in fp16, the 35B's GDN scan at RB 32, one partial after MoE;
ready                         # decode: the down projection staging its own input (A/B)
log "prefill tests"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu/test_prefill.py
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | tail -8
log "decode A/B: STAGE_DOWN"
timeout 150 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --attr="base,STAGE_DOWN=0" \
  --out "$OUT/decode_s10.json" 2>&1 | grep -E "PDL|attr|rror" | head -8
for n in 1 0; do
  log "27B prefill profile pp8192, NINFER_PREFILL_GU16=$n"
  NINFER_PREFILL_GU16=$n timeout 100 python3 bench/prefill_profile.py --tokens 8192 --chunk 8192 \
    --out "$OUT/pp_profile_gu16_$n.json" 2>&1 | head -8
done
log "35B-A3B prefill profile pp8192"
timeout 100 python3 bench/prefill_profile.py --geometry qwen3.6-35b-a3b --tokens 8192 --chunk 8192 \
  --out "$OUT/pp_profile_35b.json" 2>&1 | head -14
bench_pp_both
fi
if [ "$PART" = s11 ]; then  # prefill: residual added by the GEMMs, next weights dequantized ahead (A/B); benches
ready
log "prefill tests"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu/test_prefill.py
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | tail -8
for v in "" NINFER_PREFILL_DQ_AHEAD=0 "NINFER_PREFILL_DQ_AHEAD=0 NINFER_PREFILL_RESIDUAL_GEMM=0"; do
  log "27B prefill profile pp8192 ${v:-(defaults)}"
  env $v timeout 100 python3 bench/prefill_profile.py --tokens 8192 --chunk 8192 2>&1 | head -9
done
log "35B-A3B prefill profile pp8192"
timeout 100 python3 bench/prefill_profile.py --geometry qwen3.6-35b-a3b --tokens 8192 --chunk 8192 2>&1 | head -9
bench_pp
bench_moe
bench_long
fi
if [ "$PART" = fin8 ]; then  # decode 27B + 35B (breakdown) and at depth 32768, the GDN prep A/B, prefill
ready                         # benches, every GPU test
decode_all
log "decode A/B: GDN prep in the projections' epilogue"
timeout 120 python3 bench/gpu_decode.py --synthetic qwen3.8-27b,qwen3.6-35b-a3b --attr="base,GDN_PREP_FUSED=0" \
  --out "$OUT/decode_ab.json" 2>&1 | grep -E "PDL|attr|rror" | head -12
bench_pp
log "all GPU tests"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | tail -12
fi
if [ "$PART" = fin9 ]; then  # the conv epilogue as a template flag (the other GEMVs' code as before it): engine and
ready                         # prefill tests, decode 27B + 35B with the GDN prep A/B
log "engine and prefill tests"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu/test_gpu_engine.py tests/gpu/test_prefill.py
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | tail -8
log "decode A/B: GDN prep in the projections' epilogue"
timeout 150 python3 bench/gpu_decode.py --synthetic qwen3.8-27b,qwen3.6-35b-a3b --attr="base,GDN_PREP_FUSED=0" \
  --breakdown --out "$OUT/decode.json" 2>&1 | grep -E "PDL|attr|sum of|^  [a-z]|rror" | head -40
fi
if [ "$PART" = gsplit ]; then  # next session: decode attention with the query group cut over blocks, at depth
ready                           # 32768 (int8 KV) and 0
log "tests of the cut"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu -k "attention_decode or query_group"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | tail -6
log "decode A/B at depth 32768: ATTN_GSPLIT"
timeout 300 python3 bench/gpu_decode.py --synthetic qwen3.8-27b,qwen3.6-35b-a3b --depth 32768 \
  --attr="base,ATTN_GSPLIT=2,ATTN_GSPLIT=4" --out "$OUT/decode_gsplit.json" 2>&1 | grep -E "PDL|attr|rror" | head -30
fi
if [ "$PART" = prep ]; then  # next session's first look at gdn_chunk_prep: the kernel with stages left out
ready
log "gdn_chunk_prep with stages left out (27B geometry, pp8192)"
timeout 200 python3 bench/gdn_prep_probe.py 2>&1 | grep -E "mask|rror" | head -10
fi
if [ "$PART" = s12 ]; then  # session 9: prep's solve by 16x16 blocks, the scan's output products in 1xTF32 (A/B)
ready
log "GDN + prefill tests"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu/test_kernels.py tests/gpu/test_prefill.py -k "gdn or prefill"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | tail -10
log "gdn_chunk_prep with stages left out (27B geometry, pp8192)"
timeout 200 python3 bench/gdn_prep_probe.py 2>&1 | grep -E "mask|rror" | head -10
for v in "" NINFER_GDN_SCAN_Q1=0; do
  log "27B prefill profile pp8192 ${v:-(defaults)}"
  env $v timeout 100 python3 bench/prefill_profile.py --tokens 8192 --chunk 8192 2>&1 | head -14
done
bench_pp
fi
if [ "$PART" = s13 ]; then  # session 9: TF32 splits by integer ops; 3 fp16 weight buffers (A/B); all tests last
ready
log "gdn_chunk_prep with stages left out (27B geometry, pp8192)"
timeout 200 python3 bench/gdn_prep_probe.py 2>&1 | grep -E "mask|rror" | head -10
for v in "" NINFER_PREFILL_DQ_BUFS=2; do
  log "27B prefill profile pp8192 ${v:-(defaults)}"
  env $v timeout 100 python3 bench/prefill_profile.py --tokens 8192 --chunk 8192 2>&1 | head -16
done
bench_pp
log "all GPU tests"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | tail -14
fi
if [ "$PART" = s14 ]; then  # session 9: dequantization windows before the GDN recurrence (A/B), prep_cols prefetch
ready
for v in "" NINFER_PREFILL_DQ_BUFS=2; do
  log "27B prefill profile pp8192 ${v:-(defaults)}"
  env $v timeout 100 python3 bench/prefill_profile.py --tokens 8192 --chunk 8192 2>&1 | head -16
done
bench_pp
log "prefill + GDN tests"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu/test_prefill.py tests/gpu/test_kernels.py -k "gdn or prefill"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | tail -8
fi
if [ "$PART" = s15 ]; then  # session 9: GDN o-projection weights wait for the window too; 3 / 5 / 2 buffers (A/B)
ready
for v in "" NINFER_PREFILL_DQ_BUFS=5 NINFER_PREFILL_DQ_BUFS=2; do
  log "27B prefill profile pp8192 ${v:-(defaults)}"
  env $v timeout 100 python3 bench/prefill_profile.py --tokens 8192 --chunk 8192 --out "$OUT/pp_profile_${v:-default}.json" 2>&1 | head -12
done
bench_pp
NINFER_PREFILL_DQ_BUFS=5 timeout 150 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 8192 -n 0 -r 2 \
  -o json --out "$OUT/pp_bufs5.json" 2>&1 | grep -E "^pp|rror" | head -3
log "prefill tests"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu/test_prefill.py
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | tail -8
fi
if [ "$PART" = s16 ]; then  # session 9: the window gated by an event in GPU time; 3 / 5 / 2 buffers (A/B)
ready
for v in "" NINFER_PREFILL_DQ_BUFS=5 NINFER_PREFILL_DQ_BUFS=2; do
  log "27B prefill profile pp8192 ${v:-(defaults)}"
  env $v timeout 100 python3 bench/prefill_profile.py --tokens 8192 --chunk 8192 --out "$OUT/pp_profile_${v:-default}.json" 2>&1 | head -12
done
bench_pp
NINFER_PREFILL_DQ_BUFS=5 timeout 150 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 8192 -n 0 -r 3 \
  -o json --out "$OUT/pp_bufs5.json" 2>&1 | grep -E "^pp|rror" | head -3
log "prefill tests"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu/test_prefill.py
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | tail -8
fi
if [ "$PART" = fin10 ]; then  # session 9's final figures: prefill benches (27B, 35B-A3B, 27B pp131072), the
ready                           # GDN / columns / prefill GPU tests, then the transformers baseline at pp8192
bench_pp
bench_moe
LONG_S=200 bench_long
log "GDN, columns and prefill GPU tests"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu -k "cols or prep or gdn or prefill or chunk or column"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | tail -8
log "27B pp8192 beside the transformers baseline"
timeout ${BASE_S:-170} python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 8192 -n 0 -r 1 \
  --baseline transformers -o json --out "$OUT/pp8192_baseline.json" 2>&1 | grep -E "^pp|transformers|rror" | head -6
fi
if [ "$PART" = mma ]; then  # next session: decode attention on tensor cores (attn_decode_mma, NINFER_ATTN_MMA)
ready
log "tests of the tensor-core decode attention"
gpu_pytest "$OUT/gpu_tests_mma.txt" tests/gpu -k "attention_decode or tensor_cores"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_mma.txt" | tail -8
log "decode A/B at depth 32768 (int8 KV) and 0: ATTN_MMA"
timeout 300 python3 bench/gpu_decode.py --synthetic qwen3.8-27b,qwen3.6-35b-a3b --depth 32768 \
  --attr="base,ATTN_MMA=1" --out "$OUT/decode_mma.json" 2>&1 | grep -E "PDL|attr|rror" | head -30
fi
if [ "$PART" = base ]; then  # next session: issue 8's transformers baseline beside pp8192, the prefill tests
ready
log "prefill tests (the weight ring's module moved after session 9's last call)"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu/test_prefill.py
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | tail -6
transformers_ready
timeout 250 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 8192 -n 0 -r 1 \
  --baseline transformers -o json --out "$OUT/pp8192_baseline.json" 2>&1 | grep -E "^\||baseline|rror" | head -8
fi
if [ "$PART" = fin7 ]; then  # every GPU test, then decode 27B + 35B with the defaults (no breakdown, no depth)
ready
log "all GPU tests"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | tail -12
log "decode"
timeout 120 python3 bench/gpu_decode.py --synthetic qwen3.8-27b,qwen3.6-35b-a3b --out "$OUT/decode.json" 2>&1 \
  | grep -E "PDL|rror" | head -6
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
if [ "$PART" = s10a ]; then  # session 10: pipelined attn_decode_mma (tests, A/B 27B + 35B), the baseline's failure
ready
log "tests of the decode attention (lengths to 1500: attn_decode_mma's stage ring)"
gpu_pytest "$OUT/gpu_tests_mma.txt" tests/gpu -k "attention_decode or tensor_cores"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_mma.txt" | tail -8
log "decode A/B at depth 32768 (int8 KV) and 0: ATTN_MMA (loads ahead)"
timeout 240 python3 bench/gpu_decode.py --synthetic qwen3.8-27b,qwen3.6-35b-a3b --depth 32768 \
  --attr="base,ATTN_MMA=1" --out "$OUT/decode_mma.json" 2>&1 | grep -E "PDL|attr|rror" | head -30
log "python files with NUL bytes under site-packages"
python3 - <<'PY' 2>&1 | head -20
import os, site, sys
roots = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
n = 0
for root in roots:
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                p = os.path.join(d, f)
                try:
                    data = open(p, "rb").read()
                except OSError:
                    continue
                n += 1
                if b"\0" in data:
                    print("NUL:", p, len(data))
print("scanned", n, "files under", roots)
PY
log "ninfer bench pp8192 --baseline transformers (NINFER_DEBUG: the traceback)"
NINFER_DEBUG=1 timeout 250 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 8192 -n 0 -r 1 \
  --baseline transformers -o json --out "$OUT/pp8192_baseline.json" > "$OUT/baseline_log.txt" 2>&1
grep -E "^\||baseline|rror|File " "$OUT/baseline_log.txt" | tail -30
fi
if [ "$PART" = s10b ]; then  # session 10: the defaults (attn_decode_mma on) through every GPU test; issue 8's baseline;
ready                        # the decode breakdown at depth 0 and 32768
log "ninfer bench pp8192 --baseline transformers (its imports now before our engine)"
NINFER_DEBUG=1 timeout 250 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 8192 -n 0 -r 1 \
  --baseline transformers -o json --out "$OUT/pp8192_baseline.json" > "$OUT/baseline_log.txt" 2>&1
grep -E "^\||baseline|rror|File " "$OUT/baseline_log.txt" | tail -12
log "all GPU tests"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | tail -12
decode_all
fi
if [ "$PART" = s10c ]; then  # session 10: issue 7's decode figures through `ninfer bench`, beside transformers
ready
gpu_pytest "$OUT/gpu_tests_gsplit.txt" tests/gpu/test_gpu_engine.py -k "query_group or tensor_cores"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_gsplit.txt" | tail -4
log "27B tg128 with the transformers baseline"
NINFER_DEBUG=1 timeout 200 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 0 -n 128 -r 2 \
  --baseline transformers -o json --out "$OUT/tg128_27b_baseline.json" > "$OUT/tg_27b_log.txt" 2>&1
grep -E "^\||baseline|rror" "$OUT/tg_27b_log.txt" | tail -8
log "27B tg128 at depth 32768, int8 and bf16 KV"
timeout 150 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 0 -n 128 -d 32768 --kv int8,bf16 -r 2 \
  -o json --out "$OUT/tg128_d32768_27b.json" 2>&1 | grep -E "^\||rror" | tail -6
log "35B-A3B tg128 with the transformers baseline"
NINFER_DEBUG=1 timeout 220 python3 -m ninfer_cli.main bench --synthetic qwen3.6-35b-a3b -p 0 -n 128 -r 2 \
  --baseline transformers -o json --out "$OUT/tg128_35b_baseline.json" > "$OUT/tg_35b_log.txt" 2>&1
grep -E "^\||baseline|rror" "$OUT/tg_35b_log.txt" | tail -8
fi
if [ "$PART" = s10d ]; then  # session 10: the transformers baseline beside the 35B-A3B's pp8192 and the 27B's pp131072
ready
log "35B-A3B pp8192 with the transformers baseline"
NINFER_DEBUG=1 timeout 200 python3 -m ninfer_cli.main bench --synthetic qwen3.6-35b-a3b -p 8192 -n 0 -r 1 \
  --baseline transformers -o json --out "$OUT/pp8192_35b_baseline.json" > "$OUT/pp_35b_log.txt" 2>&1
grep -E "^\||baseline|rror" "$OUT/pp_35b_log.txt" | tail -8
log "27B pp131072 with the transformers baseline (SIGINT at 320 s: the bench reports what finished)"
NINFER_DEBUG=1 timeout -s INT -k 20 320 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 131072 -n 0 \
  -r 1 --warmup 0 --baseline transformers -o json --out "$OUT/pp131072_baseline.json" > "$OUT/pp_long_log.txt" 2>&1
grep -E "^\||baseline|rror|interrupted" "$OUT/pp_long_log.txt" | tail -8
fi
if [ "$PART" = s10e ]; then  # session 10: the 27B's tg128 at depth 32768 (int8 KV) beside transformers (its bf16 cache)
ready
log "27B tg128 @ d32768 int8 with the transformers baseline"
NINFER_DEBUG=1 timeout -s INT -k 20 300 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 0 -n 128 -d 32768 \
  --kv int8 -r 1 --baseline transformers -o json --out "$OUT/tg128_d32768_baseline.json" > "$OUT/tg_d32768_log.txt" 2>&1
grep -E "^\||baseline|rror|interrupted" "$OUT/tg_d32768_log.txt" | tail -8
fi
if [ "$PART" = next ]; then  # next session's first call: attn_decode_mma's smaller forms (A100-class, 99 KB GPUs) on the H200
ready
log "tests of the decode attention (every attn_decode_mma form)"
gpu_pytest "$OUT/gpu_tests_mma.txt" tests/gpu -k "attention_decode or tensor_cores"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_mma.txt" | tail -8
log "decode at depth 32768, a process a form (nsplit follows its resident blocks): -1 auto (4 warps, 4 stages int8 /
  3 bf16), 1 (4, 2), 2 (int8 3 warps / bf16 4, 1 stage)"
for f in -1 1 2; do
  NINFER_ATTN_MMA_FORM=$f timeout 100 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --depth 32768 \
    --out "$OUT/decode_form$f.json" 2>&1 | grep -E "depth 32768|rror" | sed "s/^/form $f: /" | head -4
done
fi
