#!/usr/bin/env bash
# The device calls, every step under its own timeout, output streamed, JSON and logs under $OUT:
#   main: compile, every GPU test (tracebacks in gpu_tests.txt), the tensor-core prefill's op profile
#         (pp8192, chunk 8192, GDN rows 4/1/2), decode 27B + 35B with breakdown and depth 32K (the tuning table),
#         `ninfer bench` pp512/pp2000/pp8192 and pp131072 with the defaults (~5 min on a cold machine);
#   exp:  bench/experiments/*.patch applied to a copy, its tests and sweep beside main's on the same
#         machine (EXP="a b" picks patches). Copies made with cp -r on the device have read as NUL bytes
#         (bench/NOTES-decode.md, session 3): check its test output before trusting a sweep.
#   quick: compile, tests/gpu/test_gemv.py tests/gpu/test_kernels.py -k $TESTK, sweep, decode $GEOS with the sweep's table.
#   final: every GPU test, decode with breakdown and depth, prefill benches 27B + 35B, pp131072 and the
#          pp8192 op profiles (the session-6 figures).
#   ab:   GPU tests -k $TESTK, then decode with in-process A/B variants (ATTR, LDG; DEPTH, GEOS, BREAKDOWN).
#   fin7: every GPU test, decode 27B + 35B with the defaults (session 7's closing call).
# (The one-off A/B parts of session 5, pre2 / s5 / pdl / br / s5b, are in git history at 4f9b3f1; those of
# session 6, next / gdnc / moep / s6 / moeprof / s6b / s6c / s6d / s6e, at c858397; session 7's l2pf, with
# the L2 warm-up it measured, at 741ff0c; those of sessions 8-10, s8 / s8d / s9 / s10 / s11 / fin8 / fin9 /
# gsplit / prep / s12-s16 / fin10 / mma / base / s10a-s10e, which bench/NOTES-decode.md cites, at 56b24ea; session
# 11's `next` and session 12's s12a-s12g, which its "Session 12" section cites, at 018601e.)
#   (session 14's one-off parts fused / fused2 / fused3 / fused4 / fin14, which bench/NOTES-decode.md's "Session 14"
#   cites, are in git history at 6149588; their flags MLP_FUSED=2 and MLP_FUSED_PF were removed after them)
#   s22a: (next session's first call, written without device time) the transposed int8 attention (ATTN_TR)
#   fin21b: ATTN_VRAW 2 by default: the GPU tests of the paths it touches, `ninfer bench` of the three targets
#   s21d: ATTN_VRAW (V's codes into the attention's MMAs): tests, probe, A/B at 32K; `ninfer bench` again
#   fin21: the attention probe a process a probe, `ninfer bench` of the three targets, every GPU test
#   s21c: the attention probe at 32K; switches measured before PDL was real, again; both breakdowns
#   s21b: GEMV_PAIR and moe_fused's programmatic launch on by default; raw-K attention forms at 32K; the 35B's GDN GEMV
#   s21a: (next session's first call, written without device time) GEMV_PAIR under real PDL, COOP_PDL 1 / 2
#   fin20b: GDN_AB_IN on by default: the GPU tests of the paths it touches
#   fin20: GDN_AB_IN (its tests, then its A/B), `ninfer bench` with each model's best, every GPU test
#   (session 20's one-off parts s20b / s20c / s20d, which bench/NOTES-decode.md's "Session 20" cites, are in git
#   history at b243eba; GDN_PF_NEXT's code at 1e0c9a5)
#   s20a: Nsight Compute on the 35B-A3B step's small kernels (cluster norm, gdn_delta_gated_cl, qk_norm_rope_kv, the
#         attention and its combine): stall reasons for the next session's first decisions (written without device time)
#   s19f: both models' per-kernel breakdowns on the session's final defaults
#   fin19: the three GPU tests that s19e's run found comparing against the mb norms' bits, fixed
#   s19e: the session's final code: every GPU test, ATTN_MERGE's A/B (35B-A3B), `ninfer bench` of the three targets
#   (sessions 17-19's one-off parts, which bench/NOTES-decode.md's "Session 17" to "Session 19" sections cite, are in
#   git history at 8a0ab9c: s17b / s17d / s17e / s17f / fin17, s18a / s18b / s18c / s18f / fin18, s19a / s19b / s19c;
#   the parts of their lost experiments with those: s17a 104f851, s17c (K.COOP_PDL) session 17's third commit, s17g
#   a78e068, s18d a04bb53, s18e 495e9e6, s19d 76f3b06)
#   fin16: the defaults, no environment: `ninfer bench` 27B tg128 (depth 0; 32768 with int8 KV) and 35B-A3B tg128;
#          FULL=1 adds the mlp_fused probe, the 27B breakdown and every GPU test (session 16's s16f)
#   (session 16's s16a, which applied bench/experiments/gated_chunk.patch and mlp_fused_tail.patch together, and
#   the one-patch parts gated / tail, are in git history at 4ef8e19: GATED_CHUNK kept, the tail patch dropped; its
#   parts s16b-s16f, which bench/NOTES-decode.md's "Session 16" cites, at f1d76cb)
#   (gin, session 15: the GDN input norm and projections as one launch, GDN_IN_FUSED, removed after s15g/s15h: in git
#   history at 0e0d1ab)
#   fin15b: the columns test with one-scale staging pinned, the 27B's norm blocks A/B
#   fin15: session 15's defaults (mlp_fused chunk-scaled with help): tests, phases, A/B against help off, bench 27B
#          (depth 0, 32768 int8) and 35B-A3B (session 15's `chunk`, `pf`, `bar` and `help` calls are in git history
#          at 5ce38a8, 6f1b847, 9a291a1 and bd2e773; bench/NOTES-decode.md "Session 15")
#   fin14b: mlp_fused on by default (cooperative launch): tests, the A/B against MLP_FUSED=0, `ninfer bench` 27B tg128
#   ncu_tma: Nsight Compute on q5 down, gemv_rs_pre against gemv_tma (why the copy-engine GEMV is slower)
#   tma5: the down-projection alone on gemv_tma (MLP_TMA=2): A/B, the engine test
#   fin13: the engine tests on the final defaults, the 35B-A3B's norm blocks, the depth-32768 int8 bench
#   tma4: MLP_TMA with a gate|up group over 2-4 warps (finer stages) and down in 4 pieces: tests, A/B
#   tma3: MLP_TMA again with the prologues' loads batched, then `ninfer bench` 27B / 35B-A3B tg128
#   tma2: the dense MLP on gemv_tma with its norm / staging prologues (MLP_TMA): tests, A/B, breakdown, fast sweep
#   tma: gemv_tma's tests, the fast sweep against gemv_rs_pre, the 27B A/B by shape (session 13)
#   next: attn_decode_mma's raw-K int8 form (NINFER_ATTN_KRAW, off until measured): its tests, the 27B at depth 32768
#         (int8 KV) A/B in one process, then `ninfer bench` there with the better mode (next session's first call).
#   xi16: the int16-x GEMV decode (NINFER_XI16=1, dp2a) against the fp16 one: both modules compiled, the GEMV,
#         engine and prefill tests with int16 x, then decode 27B + 35B a process a mode (0 1 0 1; breakdown with
#         1), then the GEMV sweep with int16 x.
#   s11b: the int16-x defaults through every GPU test; decode 27B + 35B with the A/B of stage_x_amax (breakdown),
#         the 35B-A3B's breakdown, depth 32768; the 27B GEMV sweep (q5 two-row GEMVs now at 4 blocks an SM);
#         then (as run, at 0dda17d) session 10's `next`, attn_decode_mma's smaller forms.
#   s11c: w8 GEMVs on the pre-staged int16 pairs (NINFER_W8_PRE): GEMV, engine and prefill tests, decode a process
#         a mode (1 0 1 0), then the better mode through `ninfer bench` tg128 (27B, 35B-A3B beside transformers;
#         27B at depth 32768, int8 and bf16 KV).
#   s11d: the 35B-A3B's breakdown on the defaults (W8_PRE), then the GEMV sweep of its shapes and its decode with
#         the sweep's choices.
#   s11e: the kernel and engine tests on the session's last commit (the shared test setup, staged_case).
# Usage (GPU machine, repo root): bash bench/gpu_all.sh main | final | quick | exp | ab | fin7 | probe | ncu_mma | ppchunk | next | xi16 | s11b | s11c | s11d | s11e
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=$PWD/.cupy_cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log() { echo "== $(date +%T) $*"; }
PART=${1:-main}
# A snapshot made with `git archive` sits inside the device's copy of the checkout, whose .git is another commit's:
# the snapshot's commit, written to COMMIT beside it (git rev-parse --short=12 HEAD > SNAP/COMMIT), is what the bench
# files report (engine.bench_device.git_commit reads NINFER_GIT_COMMIT first). (Session 19's bench files say
# ba1604926c74+dirty: that is the device copy's commit, not theirs.)
[ -f COMMIT ] && export NINFER_GIT_COMMIT=$(cat COMMIT)
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
  timeout 240 python3 -c "from engine.gpu import launch as K; K.kernel('argmax_step')"
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
    log "a read saw junk; the $(echo "$ids" | wc -l) failed tests again"; sleep 20
    timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short $ids > "$out.retry" 2>&1
    { echo "== retry $attempt"; cat "$out.retry"; } >> "$out"
  done
}
# the best in-process A/B variant of a gpu_decode.py --attr report (its mean over the passes) as NINFER_ variables;
# $2: which of the report's decode entries (0: the first geometry at depth 0; with --depth, 1: int8 at that depth)
best_attr_env() {
  python3 - "$1" "${2:-0}" <<'PY'
import json, sys
try:
    v = json.load(open(sys.argv[1]))["decode"][int(sys.argv[2])]["attr_variants"]
    best = max(v, key=lambda k: sum(v[k]) / len(v[k]))
    print(" ".join(f"NINFER_{p.removeprefix('K.')}" for p in best.split(";")) if best != "base" else "")
except Exception:
    print("")
PY
}
# `ninfer bench` of the three targets: 35B-A3B tg128 (env $1), 27B tg128 and 27B tg128 at 32768 with int8 KV (env $2),
# JSON as $OUT/tg128_{35b,27b,27b_d32k}_$3.json
bench_targets() {
  log "35B-A3B tg128 (env: ${1:-defaults})"
  env $1 timeout 100 python3 -m ninfer_cli.main bench --synthetic qwen3.6-35b-a3b -p 0 -n 128 -r 2 \
    -o json --out "$OUT/tg128_35b_$3.json" 2>&1 | grep -E "^\||rror" | tail -1
  log "27B tg128 (env: ${2:-defaults})"
  env $2 timeout 100 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 0 -n 128 -r 2 \
    -o json --out "$OUT/tg128_27b_$3.json" 2>&1 | grep -E "^\||rror" | tail -1
  log "27B tg128 at 32768, int8 KV (env: ${2:-defaults})"
  env $2 timeout 150 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 0 -n 128 -r 2 -d 32768 --kv int8 \
    -o json --out "$OUT/tg128_27b_d32k_$3.json" 2>&1 | grep -E "^\||rror" | tail -1
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
# compile the engine's module, wait for CuPy, then tests/gpu/test_gemv.py tests/gpu/test_kernels.py -k "$1"
kernel_tests() {
  ready
  log "kernel tests (-k $1)"
  gpu_pytest "$OUT/gpu_tests.txt" tests/gpu/test_gemv.py tests/gpu/test_kernels.py -k "$1"
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
timeout 240 python3 -c "from engine.gpu import launch as K; K.kernel('argmax_step')"
timeout 120 python3 bench/mma_probe.py 2>&1 | tail -20
fi
if [ "$PART" = exp ]; then  # main's sweep again, so that every number of this call is from one machine
  log "main sweep (reference)"
  timeout 300 python3 -c "from engine.gpu import launch as K; K.kernel('argmax_step')"
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
   timeout 300 python3 -c "from engine.gpu import launch as K; K.kernel('argmax_step')" && \
   timeout 120 python3 -m pytest -q -x tests/gpu/test_gemv.py tests/gpu/test_kernels.py tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_engine_moe.py -k "not memory_plan" \
     -p no:cacheprovider 2>&1 | tail -3 && \
   timeout 100 python3 bench/gpu_decode.py --sweep --synthetic qwen3.8-27b,qwen3.6-35b-a3b --out "$OUT/exp_$name.json" \
     2>&1 | grep -E "best|PDL" | head -12)
done
log done
if [ "$PART" = ncu_mma ]; then  # Nsight Compute: gemv_mma against the register kernel on gate|up
  timeout 240 python3 -c "from engine.gpu import launch as K; K.kernel('argmax_step')"
  NCU_SHAPES="mlp gate|up" NCU_KERNEL=gemv_ bash bench/gpu_profile.sh; cp "$OUT/ncu.txt" "$OUT/ncu_reg.txt"
  NCU_SHAPES="mlp gate|up" NCU_MMA=2,4,2 NCU_KERNEL=gemv_ bash bench/gpu_profile.sh
  grep -E "Stall|stall|Warp Cycles|Issue Slot|Executed Ipc|L1/TEX Hit|Mem Busy|Max Bandwidth|DRAM Through|Registers Per|Achieved Occ|Theoretical Occ|Duration" "$OUT/ncu.txt" | head -50
fi
if [ "$PART" = ppchunk ]; then  # pp8192 with larger tensor-core prefill chunks (dequantized weights amortized)
  timeout 240 python3 -c "from engine.gpu import launch as K; K.kernel('argmax_step')"
  for T in ${CHUNKS:-2048 4096 8192}; do
    log "pp8192 NINFER_PREFILL_GEMM=$T"
    NINFER_PREFILL_GEMM=$T timeout 100 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 8192 -n 0 -r 2 \
      -o json --out "$OUT/pp8192_gemm$T.json" 2>&1 | grep -E "^pp|rror|GiB" | head -4
  done
fi
if [ "$PART" = s11e ]; then
ready
log "kernel and engine tests"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu/test_gemv.py tests/gpu/test_kernels.py tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_engine_moe.py
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | tail -8
fi
if [ "$PART" = s11d ]; then
ready
log "35B-A3B breakdown (defaults)"
timeout 60 python3 bench/gpu_decode.py --synthetic qwen3.6-35b-a3b --breakdown --out "$OUT/decode_35b.json" 2>&1 \
  | grep -E "PDL|sum of|^  [a-z]|rror" | head -30
log "35B-A3B GEMV sweep, then its decode with the sweep's choices"
timeout 300 python3 bench/gpu_decode.py --sweep --synthetic qwen3.6-35b-a3b --breakdown --out "$OUT/sweep_35b.json" 2>&1 \
  | grep -E "best|PDL|sum of|^  [a-z]|rror" | head -40
fi
if [ "$PART" = s11c ]; then
ready
log "tests: w8 on pre-staged pairs (GEMV, engine, MoE prefill)"
gpu_pytest "$OUT/gpu_tests_w8.txt" tests/gpu/test_gemv.py tests/gpu/test_kernels.py tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_engine_moe.py tests/gpu/test_prefill.py \
  tests/gpu/test_smollm2_gpu.py -k "w8 or prestaged or store or engine or moe or smollm or llama"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_w8.txt" | tail -8
for x in 1 0 1 0; do
  log "decode NINFER_W8_PRE=$x"
  NINFER_W8_PRE=$x timeout 90 python3 bench/gpu_decode.py --synthetic qwen3.8-27b,qwen3.6-35b-a3b \
    --out "$OUT/decode_w8pre_$x.json" 2>&1 | grep -E "PDL|rror" | head -4
done
W8=$(python3 - "$OUT" <<'PY'
import json, sys
t = {}
for x in (0, 1):
    try:
        d = json.load(open(f"{sys.argv[1]}/decode_w8pre_{x}.json"))
        t[x] = sum(r["tok_s"] for r in d["decode"])  # 27B + 35B-A3B (the last of each mode's two runs)
    except Exception:
        t[x] = 0
print(0 if t[0] > t[1] * 1.003 else 1)
PY
)
export NINFER_W8_PRE=$W8; log "bench with NINFER_W8_PRE=$W8"
log "27B tg128 with the transformers baseline"
timeout 150 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 0 -n 128 -r 2 \
  --baseline transformers -o json --out "$OUT/tg128_27b_baseline.json" > "$OUT/tg_27b_log.txt" 2>&1
grep -E "^\||baseline|rror" "$OUT/tg_27b_log.txt" | tail -6
log "35B-A3B tg128 with the transformers baseline"
timeout 150 python3 -m ninfer_cli.main bench --synthetic qwen3.6-35b-a3b -p 0 -n 128 -r 2 \
  --baseline transformers -o json --out "$OUT/tg128_35b_baseline.json" > "$OUT/tg_35b_log.txt" 2>&1
grep -E "^\||baseline|rror" "$OUT/tg_35b_log.txt" | tail -6
log "27B tg128 at depth 32768, int8 and bf16 KV"
timeout 120 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 0 -n 128 -d 32768 --kv int8,bf16 -r 2 \
  -o json --out "$OUT/tg128_d32768_27b.json" 2>&1 | grep -E "^\||rror" | tail -6
fi
if [ "$PART" = s11b ]; then
ready
log "all GPU tests"
gpu_pytest "$OUT/gpu_tests.txt" tests/gpu
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests.txt" | tail -12
log "decode A/B: stage_x_amax (base) against stage_x_mb (STAGE_AMAX=0)"
timeout 150 python3 bench/gpu_decode.py --synthetic qwen3.8-27b,qwen3.6-35b-a3b --attr="base,STAGE_AMAX=0" \
  --breakdown --out "$OUT/decode_ab.json" 2>&1 | grep -E "PDL|attr|sum of|^  [a-z]|rror" | head -40
log "35B-A3B breakdown"
timeout 60 python3 bench/gpu_decode.py --synthetic qwen3.6-35b-a3b --breakdown --out "$OUT/decode_35b.json" 2>&1 \
  | grep -E "PDL|sum of|^  [a-z]|rror" | head -30
log "27B depth 32768"
timeout 90 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --depth 32768 --out "$OUT/decode_d32768.json" 2>&1 \
  | grep -E "PDL|rror" | head -6
log "GEMV sweep (27B shapes)"
timeout 120 python3 bench/gpu_decode.py --sweep --out "$OUT/sweep.json" 2>&1 | grep -E "best|rror" | head -24
fi
if [ "$PART" = next ]; then  # next session's first call: attn_decode_mma's raw-K int8 form (written after session 12's device time)
ready
log "tests: decode attention int8 (every form, the raw-K one included), the engine with ATTN_KRAW"
gpu_pytest "$OUT/gpu_tests_kraw.txt" tests/gpu/test_kernels.py tests/gpu/test_gpu_engine.py -k "attention_decode and int8 or raw_k"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_kraw.txt" | tail -10
log "27B at depth 32768, int8 KV: ATTN_KRAW=1 A/B in one process"
timeout 240 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --depth 32768 --attr="base,ATTN_KRAW=1" \
  --out "$OUT/decode_kraw.json" 2>&1 | grep -E "PDL|attr|rror" | head -12
BEST=$(best_attr_env "$OUT/decode_kraw.json" 1)
log "27B tg128 at depth 32768, int8 KV (env: ${BEST:-defaults})"
env $BEST timeout 150 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 0 -n 128 -d 32768 --kv int8 -r 2 \
  -o json --out "$OUT/tg128_d32768_kraw.json" 2>&1 | grep -E "^\||rror" | tail -3
fi
if [ "$PART" = tma ]; then  # session 13: gemv_tma (bulk copies through shared-memory stages, one block an SM)
ready
log "tests: gemv_tma (compiles the experimental module)"
gpu_pytest "$OUT/gpu_tests_tma.txt" tests/gpu/test_gemv.py -k "tma"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_tma.txt" | tail -8
log "GEMV sweep (27B shapes): gemv_rs_pre as the table runs it against gemv_tma"
timeout 200 python3 bench/gpu_decode.py --sweep --sweep-fast --out "$OUT/sweep_tma.json" 2>&1 | grep -E "best|rror" | head -30
D=q5_g64_fp16:5120x17408; G=q4_g64_fp16:34816x5120; O=q5_g64_fp16:5120x6144
log "27B decode A/B in one process: gemv_tma on down / gate|up / both / + o-projection"
timeout 300 python3 bench/gpu_decode.py --synthetic qwen3.8-27b \
  --ldg="base,tma=16@$D,tma=16@$G,tma=16@$D+tma=16@$G,tma=16@$D+tma=16@$G+tma=16@$O,tma=8@$D+tma=8@$G" \
  --out "$OUT/decode_tma.json" 2>&1 | grep -E "PDL|ldg|rror" | head -20
fi
if [ "$PART" = tma2 ]; then  # session 13: the dense MLP on gemv_tma with the norm / staging prologues (NINFER_MLP_TMA)
ready
log "tests: gemv_tma (every form, the prologues), the engine with MLP_TMA"
gpu_pytest "$OUT/gpu_tests_tma2.txt" tests/gpu/test_gemv.py tests/gpu/test_gpu_engine.py -k "tma"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_tma2.txt" | tail -8
log "27B decode A/B in one process: MLP_TMA"
timeout 200 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --attr="base,MLP_TMA=1,MLP_TMA=1;MLP_TMA_NW=8" \
  --out "$OUT/decode_mlp_tma.json" 2>&1 | grep -E "PDL|attr|rror" | head -12
log "27B breakdown with MLP_TMA"
NINFER_MLP_TMA=1 timeout 120 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --breakdown \
  --out "$OUT/decode_mlp_tma_bd.json" 2>&1 | grep -E "PDL|sum of|^  [a-z]|rror" | head -24
log "GEMV sweep (27B shapes): gemv_rs_pre as the table runs it against gemv_tma"
timeout 200 python3 bench/gpu_decode.py --sweep --sweep-fast --out "$OUT/sweep_tma.json" 2>&1 | grep -E "best|rror" | head -30
fi
if [ "$PART" = tma3 ]; then  # session 13: MLP_TMA with its prologues' loads batched; then the final benches
ready
log "tests: gemv_tma (every form, the prologues), the engine with MLP_TMA"
gpu_pytest "$OUT/gpu_tests_tma3.txt" tests/gpu/test_gemv.py tests/gpu/test_gpu_engine.py -k "tma"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_tma3.txt" | tail -8
log "27B decode A/B in one process: MLP_TMA"
timeout 200 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --attr="base,MLP_TMA=1" --breakdown \
  --out "$OUT/decode_mlp_tma3.json" 2>&1 | grep -E "PDL|attr|sum of|^  [a-z]|rror" | head -30
BEST=$(best_attr_env "$OUT/decode_mlp_tma3.json" 0)
log "27B tg128 (env: ${BEST:-defaults}); 35B-A3B tg128"
env $BEST timeout 150 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 0 -n 128 -r 2 \
  -o json --out "$OUT/tg128_27b.json" 2>&1 | grep -E "^\||rror" | tail -3
timeout 150 python3 -m ninfer_cli.main bench --synthetic qwen3.6-35b-a3b -p 0 -n 128 -r 2 \
  -o json --out "$OUT/tg128_35b.json" 2>&1 | grep -E "^\||rror" | tail -1
fi
if [ "$PART" = tma4 ]; then  # session 13: MLP_TMA with a gate|up group over 2-4 warps, down in 4 pieces
ready
log "tests: gemv_tma (every form, the prologues, SwiGLU pieces), the engine with MLP_TMA"
gpu_pytest "$OUT/gpu_tests_tma4.txt" tests/gpu/test_gemv.py tests/gpu/test_gpu_engine.py -k "tma"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_tma4.txt" | tail -8
log "27B decode A/B in one process: MLP_TMA forms"
timeout 300 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --attr="base,MLP_TMA=1,MLP_TMA=1;MLP_TMA_GU_P=2,\
MLP_TMA=1;MLP_TMA_DOWN_P=4,MLP_TMA=1;MLP_TMA_GU_P=2;MLP_TMA_DOWN_P=4,MLP_TMA=1;MLP_TMA_GU_P=4" \
  --out "$OUT/decode_mlp_tma4.json" 2>&1 | grep -E "PDL|attr|rror" | head -16
BEST=$(best_attr_env "$OUT/decode_mlp_tma4.json" 0)
if [ -n "$BEST" ]; then
  log "27B tg128 (env: $BEST) and its breakdown"
  env $BEST timeout 150 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 0 -n 128 -r 2 \
    -o json --out "$OUT/tg128_27b_tma4.json" 2>&1 | grep -E "^\||rror" | tail -3
  env $BEST timeout 120 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --breakdown \
    --out "$OUT/decode_tma4_bd.json" 2>&1 | grep -E "PDL|sum of|^  [a-z]|rror" | head -16
fi
fi
if [ "$PART" = fin15 ]; then  # session 15: the defaults (chunk-scaled mlp_fused with help, the helpers' first loads
# during the last own reduction): the engine and kernel tests, the A/B against help off, `ninfer bench` 27B at depth 0
# and 32768 (int8 KV), 35B-A3B
ready
log "tests: mlp_fused, engines (dense, MoE)"
gpu_pytest "$OUT/gpu_tests_fin15.txt" tests/gpu/test_mlp_fused.py tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_engine_moe.py
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_fin15.txt" | tail -8
log "mlp_fused alone: launch time and phases"
timeout 120 python3 bench/mlp_fused_probe.py --out "$OUT/mlp_fused_probe_fin15.json" 2>&1 | grep -E "mlp_fused|rror" | head -5
log "27B decode A/B in one process (base: the defaults)"
timeout 200 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --attr="base,MLP_FUSED_HELP=0" \
  --out "$OUT/decode_fin15.json" 2>&1 | grep -E "PDL|attr|rror" | head -6
log "27B tg128 (defaults)"
timeout 100 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 0 -n 128 -r 2 \
  -o json --out "$OUT/tg128_27b_fin15.json" 2>&1 | grep -E "^\||rror" | tail -1
log "27B tg128 at depth 32768, int8 KV (defaults)"
timeout 150 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 0 -n 128 -d 32768 --kv int8 -r 2 \
  -o json --out "$OUT/tg128_d32768_fin15.json" 2>&1 | grep -E "^\||rror" | tail -1
log "35B-A3B tg128 (defaults)"
timeout 100 python3 -m ninfer_cli.main bench --synthetic qwen3.6-35b-a3b -p 0 -n 128 -r 2 \
  -o json --out "$OUT/tg128_35b_fin15.json" 2>&1 | grep -E "^\||rror" | tail -1
fi
if [ "$PART" = s22a ]; then  # next session's first call (written at the end of session 21 without device time): the
# transposed int8 attention (attn_decode_mma_t, NINFER_ATTN_TR, off): its tests, the probe, the A/B at 32K, the bench
ready
log "tests: the attention kernel's forms (transposed: gs -20..-24), the engine's raw-K/V logits (ATTN_TR 1 and 5)"
gpu_pytest "$OUT/gpu_tests_s22a.txt" tests/gpu/test_kernels.py tests/gpu/test_decode_paths.py -k "attention_decode or raw_k"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_s22a.txt" | tail -12
log "attention probe at 32768 tokens: VRAW (8, 2), then the transposed forms"
for i in 12 13 14 15 16 17; do timeout 60 python3 bench/attn_probe.py --only $i 2>&1 | grep -E "^  |rror" | head -3; done
VAR="base,ATTN_TR=1,ATTN_TR=2,ATTN_TR=3,ATTN_TR=4,ATTN_TR=5"
grep -q "failed\|error" "$OUT/gpu_tests_s22a.txt" && VAR="base"
log "27B at 32768 (int8 KV): $VAR in one process"
timeout 400 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --depth 32768 --attr="$VAR" \
  --out "$OUT/decode_s22a_27b_d32k.json" 2>&1 | grep -E "depth 32768|attr|rror" | tail -14
E27=$(best_attr_env "$OUT/decode_s22a_27b_d32k.json" 1)  # (entry 1: the depth-32768 int8 A/B)
bench_targets "" "$E27" s22a
fi
if [ "$PART" = fin21b ]; then  # session 21's last call: ATTN_VRAW 2 by default: the GPU tests of the paths it touches,
# `ninfer bench` of the three targets on the defaults (no environment)
ready
gpu_pytest "$OUT/gpu_tests_fin21b.txt" tests/gpu/test_decode_paths.py tests/gpu/test_gpu_engine.py \
  tests/gpu/test_gpu_engine_moe.py tests/gpu/test_smollm2_gpu.py tests/gpu/test_prefill.py tests/gpu/test_kernels.py
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_fin21b.txt" | tail -10
bench_targets "" "" fin21b
log "Nsight Compute: the attention alone at 32K, raw K and V (probe 12) against bf16 (probe 9): what bounds int8"
for i in 12 9; do
  timeout 120 ncu --clock-control none --cache-control none -k regex:attn_decode_mma --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \
    python3 bench/attn_probe.py --only $i > "$OUT/ncu_attn_fin21b_$i.txt" 2>&1
  grep -E "attn_decode_mma|Duration|Memory Throughput|DRAM Through|Compute \(SM\)|Warp Cycles Per Issued|Issued Warp|Eligible|No Eligible|Achieved Occ|Stall" \
    "$OUT/ncu_attn_fin21b_$i.txt" | cut -c1-110 | head -24
done
fi
if [ "$PART" = s21d ]; then  # session 21: V's codes into the attention's MMAs too (ATTN_VRAW, off): its tests, the
# probe, the A/B at 32K; `ninfer bench` of the three targets again (fin21's JSON files did not come back: too many files)
ready
log "tests: the attention kernel's forms (VRAW: gs -10, -11), the engine's raw-K/V logits"
gpu_pytest "$OUT/gpu_tests_s21d.txt" tests/gpu/test_kernels.py tests/gpu/test_decode_paths.py -k "attention_decode or raw_k"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_s21d.txt" | tail -10
log "attention probe at 32768 tokens: raw-K (8, 2), then the VRAW forms"
for i in 2 11 12; do timeout 60 python3 bench/attn_probe.py --only $i 2>&1 | grep -E "^  |rror" | head -3; done
VAR="base,ATTN_VRAW=1,ATTN_VRAW=2"
grep -q "failed\|error" "$OUT/gpu_tests_s21d.txt" && VAR="base"
log "27B at 32768 (int8 KV): $VAR in one process"
timeout 300 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --depth 32768 --attr="$VAR" \
  --out "$OUT/decode_s21d_27b_d32k.json" 2>&1 | grep -E "depth 32768|attr|rror" | tail -8
E27=$(best_attr_env "$OUT/decode_s21d_27b_d32k.json" 1)
bench_targets "" "$E27" s21d
fi
if [ "$PART" = fin21 ]; then  # session 21's last call: the attention probe a process a probe, every GPU test, `ninfer
# bench` of the three targets on the defaults
ready
log "attention probe at 32768 tokens, a process a probe"
for i in $(seq 0 $(( $(python3 bench/attn_probe.py --count) - 1 ))); do
  timeout 60 python3 bench/attn_probe.py --only $i --out "$OUT/attn_probe_fin21_$i.json" 2>&1 | grep -E "^  |rror" | head -3
done
bench_targets "" "" fin21
log "every GPU test"
gpu_pytest "$OUT/gpu_tests_fin21.txt" tests/gpu
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_fin21.txt" | tail -12
fi
if [ "$PART" = s21c ]; then  # session 21: the attention alone at 32K (forms, splits, layouts); switches measured before
# PDL was real, again; both models' breakdowns on the session's defaults
ready
log "attention probe at 32768 tokens"  # (as run, one process for all: an illegal address, its lines cut off)
timeout 120 python3 bench/attn_probe.py --out "$OUT/attn_probe_s21c.json" 2>&1 | tail -14
log "35B-A3B: switches again under real PDL"
timeout 200 python3 bench/gpu_decode.py --synthetic qwen3.6-35b-a3b \
  --attr="base,MOE_FUSED_O=0,NORM_CLUSTER=0,GDN_MERGE=0,ATTN_MERGE=0" \
  --out "$OUT/decode_s21c_35b.json" 2>&1 | grep -E "PDL|attr|rror" | head -14
log "27B: switches again under real PDL"
timeout 200 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --attr="base,MLP_FUSED_O=0,MLP_FUSED_O_ATTN=0,NORM_CLUSTER=0" \
  --out "$OUT/decode_s21c_27b.json" 2>&1 | grep -E "PDL|attr|rror" | head -12
log "breakdowns"
for g in qwen3.6-35b-a3b qwen3.8-27b; do
  timeout 200 python3 bench/gpu_decode.py --synthetic $g --breakdown --out "$OUT/decode_s21c_${g}_bd.json" 2>&1 \
    | grep -E "PDL|sum of|^  " | head -16
done
fi
if [ "$PART" = s21b ]; then  # session 21: GEMV_PAIR on, moe_fused programmatic (coop_pdl 2) by default; the raw-K
# attention's V-only tile and its wider forms (ATTN_KRAW_FORM 1-3) at 32K; the 35B-A3B's unlisted GDN GEMV shape
ready
log "tests: the attention kernel's forms, the decode paths the new defaults touch, the engines"
gpu_pytest "$OUT/gpu_tests_s21b.txt" tests/gpu/test_kernels.py -k "attention_decode" tests/gpu/test_decode_paths.py \
  tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_engine_moe.py
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_s21b.txt" | tail -10
log "27B at 32768 (int8 KV): raw-K forms in one process"
timeout 300 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --depth 32768 \
  --attr="base,ATTN_KRAW_FORM=1,ATTN_KRAW_FORM=2,ATTN_KRAW_FORM=3" \
  --out "$OUT/decode_s21b_27b_d32k.json" 2>&1 | grep -E "PDL|attr|rror" | head -14
log "35B-A3B: the new defaults against the old; the 12288x2048 GDN GEMV's choices"
S=q8_g32_fp16:12288x2048
timeout 200 python3 bench/gpu_decode.py --synthetic qwen3.6-35b-a3b --attr="base,GEMV_PAIR=0,K.COOP_PDL=0" \
  --ldg="base,unroll=4@$S,rows=4@$S,rows=1@$S,pre2@$S" \
  --out "$OUT/decode_s21b_35b.json" 2>&1 | grep -E "PDL|attr|ldg|rror" | head -20
log "27B depth 0: the new defaults against GEMV_PAIR=0"
timeout 200 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --attr="base,GEMV_PAIR=0" \
  --out "$OUT/decode_s21b_27b.json" 2>&1 | grep -E "PDL|attr|rror" | head -8
E27=$(best_attr_env "$OUT/decode_s21b_27b_d32k.json" 0)  # (as run: entry 0 is the depth-0 A/B, flat; it picked 3,
bench_targets "" "$E27" s21b                               # the depth A/B's worst: entry 1 was the one to read)
fi
if [ "$PART" = s21a ]; then  # next session's first call (written without device time): GEMV_PAIR again, now that PDL is
# real (s19d lost 0.6% with plain launches: the pair removes the 27B's remaining joins, so its successors launch early),
# and the persistent kernels' programmatic launch without the cooperative attribute (K.COOP_PDL=2)
ready
log "tests: the pair grid against the two launches (kernel, engine logits); the engines with COOP_PDL=2"
gpu_pytest "$OUT/gpu_tests_s21a.txt" tests/gpu/test_gemv.py tests/gpu/test_decode_paths.py -k "pair"
NINFER_COOP_PDL=2 gpu_pytest "$OUT/gpu_tests_s21a_coop.txt" tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_engine_moe.py \
  tests/gpu/test_mlp_fused.py
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_s21a.txt" "$OUT/gpu_tests_s21a_coop.txt" | tail -10
log "27B: GEMV_PAIR, COOP_PDL 1 / 2 in one process"
timeout 240 python3 bench/gpu_decode.py --synthetic qwen3.8-27b \
  --attr="base,GEMV_PAIR=1,K.COOP_PDL=1,K.COOP_PDL=2,GEMV_PAIR=1;K.COOP_PDL=2" \
  --out "$OUT/decode_s21a_27b.json" 2>&1 | grep -E "PDL|attr|rror" | head -14
log "35B-A3B: COOP_PDL 1 / 2 in one process"
timeout 200 python3 bench/gpu_decode.py --synthetic qwen3.6-35b-a3b --attr="base,K.COOP_PDL=1,K.COOP_PDL=2" \
  --out "$OUT/decode_s21a_35b.json" 2>&1 | grep -E "PDL|attr|rror" | head -10
log "27B breakdown at depth 32768, int8 KV (now replayed at that depth)"
timeout 300 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --depth 32768 --breakdown \
  --out "$OUT/decode_s21a_27b_d32k_bd.json" 2>&1 | grep -E "PDL|sum of|^  " | head -30
fi
if [ "$PART" = fin20b ]; then  # GDN_AB_IN on by default: the GPU tests of the paths it touches
ready
gpu_pytest "$OUT/gpu_tests_fin20b.txt" tests/gpu/test_decode_paths.py tests/gpu/test_gpu_engine.py \
  tests/gpu/test_gpu_engine_moe.py tests/gpu/test_gated_chunks.py tests/gpu/test_prefill.py tests/gpu/test_smollm2_gpu.py
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_fin20b.txt" | tail -10
fi
if [ "$PART" = fin20 ]; then  # session 20's last call: GDN_AB_IN (tests, then its A/B), `ninfer bench` with each model's
# best, every GPU test on the final code
ready
log "GDN_AB_IN: the kernel against gemv_bf16 + the kernel, the engine's logits on / off"
gpu_pytest "$OUT/gpu_tests_fin20_abin.txt" tests/gpu/test_gated_chunks.py tests/gpu/test_decode_paths.py -k "ab_in"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_fin20_abin.txt" | tail -6
VAR="base,GDN_AB_IN=1"
grep -q "failed\|error" "$OUT/gpu_tests_fin20_abin.txt" && VAR="base"
for M in qwen3.6-35b-a3b qwen3.8-27b; do
  log "$M: $VAR in one process"
  timeout 150 python3 bench/gpu_decode.py --synthetic $M --attr="$VAR" \
    --out "$OUT/decode_fin20_${M%%-*}_${M##*-}.json" 2>&1 | grep -E "PDL|attr|rror" | head -6
done
B35=$(best_attr_env "$OUT/decode_fin20_qwen3.6_a3b.json" 0)
B27=$(best_attr_env "$OUT/decode_fin20_qwen3.8_27b.json" 0)
bench_targets "$B35" "$B27" fin20
log "the MoE engine against NumPy with GDN_AB_IN=1; then every GPU test (defaults)"
NINFER_GDN_AB_IN=1 gpu_pytest "$OUT/gpu_tests_fin20_abin_moe.txt" tests/gpu/test_gpu_engine_moe.py
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_fin20_abin_moe.txt" | tail -4
gpu_pytest "$OUT/gpu_tests_fin20.txt" tests/gpu
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_fin20.txt" | tail -8
fi
if [ "$PART" = s20a ]; then  # next session: Nsight Compute on the 35B-A3B step's small kernels (why 3-7 us each)
# (written at the end of session 19 without device time: the ncu flags are those of bench/gpu_profile.sh; kernels inside
# the replayed graph are profiled node by node; --launch-skip counts matching launches, past the build's warm-up)
ready
timeout 420 ncu --clock-control none --cache-control none \
  -k regex:"residual_rmsnorm_cl|gdn_delta_gated_cl|qk_norm_rope_kv|attn_combine_chunks_b|attn_decode_mma" \
  --launch-skip 300 --launch-count 24 --section SpeedOfLight --section LaunchStats --section Occupancy \
  --section SchedulerStats --section WarpStateStats --section SourceCounters \
  python3 bench/gpu_decode.py --synthetic qwen3.6-35b-a3b > "$OUT/ncu_small_s20a.txt" 2>&1
grep -E "^  [a-z_<>0-9,]+|Duration|Warp Cycles Per Issued|Stall|Issued Warp|Eligible|Cluster|Achieved Occ" \
  "$OUT/ncu_small_s20a.txt" | cut -c1-120 | head -150
log "27B breakdowns at depth 0 and 32768 with int8 KV (where long context goes: 149.1 against 160.3 tok/s)"
timeout 300 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --depth 32768 --breakdown \
  --out "$OUT/decode_s20a_27b_d32k_bd.json" 2>&1 | grep -E "PDL|sum of|^  " | head -30
fi
if [ "$PART" = s19f ]; then  # session 19's final defaults: both models' per-kernel breakdowns (for the next list)
ready
timeout 150 python3 bench/gpu_decode.py --synthetic qwen3.6-35b-a3b --breakdown \
  --out "$OUT/decode_s19f_35b_bd.json" 2>&1 | grep -E "PDL|sum of|^  " | head -16
timeout 150 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --breakdown \
  --out "$OUT/decode_s19f_27b_bd.json" 2>&1 | grep -E "PDL|sum of|^  " | head -16
fi
if [ "$PART" = fin19 ]; then  # session 19's final code: the three GPU tests s19e's defaults broke, fixed (the mb sum order)
ready
gpu_pytest "$OUT/gpu_tests_fin19.txt" tests/gpu/test_decode_paths.py::test_mlp_fused_matches_the_four_kernels \
  tests/gpu/test_gpu_engine_moe.py::test_norm_mb2_gives_the_same_logits \
  tests/gpu/test_gpu_engine.py::test_columns_prefill_equals_token_by_token \
  tests/gpu/test_gpu_engine_moe.py::test_merged_projections_give_the_same_logits tests/gpu/test_gated_chunks.py
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_fin19.txt" | tail -10
fi
if [ "$PART" = s19e ]; then  # session 19's final code: every GPU test, ATTN_MERGE's A/B, `ninfer bench` of the targets
ready
log "all GPU tests (the defaults: NORM_CLUSTER, GDN_GATED_CL, ATTN_MERGE on)"
gpu_pytest "$OUT/gpu_tests_s19e.txt" tests/gpu
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_s19e.txt" | tail -12
log "35B-A3B decode A/B in one process: ATTN_MERGE (on by default) against off"
timeout 150 python3 bench/gpu_decode.py --synthetic qwen3.6-35b-a3b --attr="base,ATTN_MERGE=0" \
  --out "$OUT/decode_s19e_35b.json" 2>&1 | grep -E "PDL|attr|rror" | head -8
BEST=$(best_attr_env "$OUT/decode_s19e_35b.json" 0)
bench_targets "$BEST" "" s19e
fi
if [ "$PART" = fin16 ]; then  # the defaults (no environment): `ninfer bench` 27B tg128 at depth 0 and 32768 (int8 KV),
# 35B-A3B tg128; FULL=1: then the mlp_fused probe, the 27B breakdown and every GPU test
ready
log "27B tg128, depth 0 and 32768 int8; 35B-A3B tg128 (defaults)"
timeout 100 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 0 -n 128 -r 2 \
  -o json --out "$OUT/tg128_27b_fin16.json" 2>&1 | grep -E "^\||rror" | tail -1
timeout 150 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 0 -n 128 -r 2 -d 32768 --kv int8 \
  -o json --out "$OUT/tg128_d32768_fin16.json" 2>&1 | grep -E "^\||rror" | tail -1
timeout 100 python3 -m ninfer_cli.main bench --synthetic qwen3.6-35b-a3b -p 0 -n 128 -r 2 \
  -o json --out "$OUT/tg128_35b_fin16.json" 2>&1 | grep -E "^\||rror" | tail -1
if [ "${FULL:-0}" = 1 ]; then
  log "mlp_fused probe"
  timeout 120 python3 bench/mlp_fused_probe.py --out "$OUT/mlp_fused_probe_fin16.json" 2>&1 | tail -3
  log "27B breakdown"
  timeout 150 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --breakdown \
    --out "$OUT/decode_fin16_bd.json" 2>&1 | grep -E "PDL|sum of|^  " | head -16
  log "all GPU tests"
  gpu_pytest "$OUT/gpu_tests_fin16.txt" tests/gpu
  grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_fin16.txt" | tail -12
fi
fi
if [ "$PART" = fin15b ]; then  # session 15: the columns test with one-scale staging pinned; the 27B's norm blocks A/B
ready
log "tests: the columns prefill against token by token; mlp_fused engine tests"
gpu_pytest "$OUT/gpu_tests_fin15b.txt" tests/gpu/test_gpu_engine.py -k "columns_prefill or mlp_fused"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_fin15b.txt" | tail -6
log "27B decode A/B in one process: norm blocks"
timeout 200 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --attr="base,NORM_BLOCKS=8,NORM_BLOCKS=32" \
  --out "$OUT/decode_fin15b.json" 2>&1 | grep -E "PDL|attr|rror" | head -8
fi
if [ "$PART" = fin14b ]; then  # session 14: mlp_fused on by default, launched cooperatively: its tests, the numpy
# engine comparison, the A/B against the four kernels, `ninfer bench` 27B tg128 with the defaults
ready
log "tests: mlp_fused (kernel, engine), the CUDA engine against the NumPy one"
gpu_pytest "$OUT/gpu_tests_fin14b.txt" tests/gpu/test_mlp_fused.py tests/gpu/test_gpu_engine.py -k "mlp_fused or numpy_engine"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_fin14b.txt" | tail -6
log "27B decode A/B in one process (base: the defaults)"
timeout 100 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --attr="base,MLP_FUSED=0" \
  --out "$OUT/decode_fin14b.json" 2>&1 | grep -E "PDL|attr|rror" | head -6
log "27B tg128 (defaults)"
timeout 100 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 0 -n 128 -r 2 \
  -o json --out "$OUT/tg128_27b_fin14b.json" 2>&1 | grep -E "^\||rror" | tail -1
fi
if [ "$PART" = fin13 ]; then  # session 13's last call: the engine tests on the final defaults (raw-K int8 on),
# the 35B-A3B's norm blocks A/B, `ninfer bench` at depth 32768 int8 with the defaults (no env)
ready
log "tests: engines (dense, MoE), decode attention"
gpu_pytest "$OUT/gpu_tests_fin13.txt" tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_engine_moe.py
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_fin13.txt" | tail -8
gpu_pytest "$OUT/gpu_tests_fin13_attn.txt" tests/gpu/test_kernels.py -k "attention_decode"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_fin13_attn.txt" | tail -4
log "35B-A3B A/B in one process: norm blocks"
timeout 150 python3 bench/gpu_decode.py --synthetic qwen3.6-35b-a3b --attr="base,NORM_BLOCKS=8,NORM_BLOCKS=4" \
  --out "$OUT/decode_35b_normblocks.json" 2>&1 | grep -E "PDL|attr|rror" | head -10
log "27B tg128 at depth 32768, int8 KV (defaults)"
timeout 150 python3 -m ninfer_cli.main bench --synthetic qwen3.8-27b -p 0 -n 128 -d 32768 --kv int8 -r 2 \
  -o json --out "$OUT/tg128_d32768_fin13.json" 2>&1 | grep -E "^\||rror" | tail -1
fi
if [ "$PART" = tma5 ]; then  # session 13: the down-projection alone on gemv_tma (NINFER_MLP_TMA=2), A/B first
ready
log "27B decode A/B in one process: MLP_TMA=2"
timeout 150 python3 bench/gpu_decode.py --synthetic qwen3.8-27b --attr="base,MLP_TMA=2" \
  --out "$OUT/decode_mlp_tma5.json" 2>&1 | grep -E "PDL|attr|rror" | head -8
log "tests: the engine with MLP_TMA 0 / 1 / 2"
gpu_pytest "$OUT/gpu_tests_tma5.txt" tests/gpu/test_gpu_engine.py -k "mlp_tma"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_tma5.txt" | tail -4
fi
if [ "$PART" = ncu_tma ]; then  # next session's first call: Nsight Compute, gemv_rs_pre against gemv_tma on q5 down
  ready
  NCU_SHAPES="mlp down" NCU_KERNEL=gemv_ bash bench/gpu_profile.sh; cp "$OUT/ncu.txt" "$OUT/ncu_pre.txt"
  NCU_SHAPES="mlp down" NCU_TMA=16 NCU_KERNEL=gemv_tma bash bench/gpu_profile.sh; cp "$OUT/ncu.txt" "$OUT/ncu_tma.txt"
  for f in pre tma; do
    log "$f"
    grep -E "Stall|Warp Cycles|Issue Slot|Executed Ipc|Mem Busy|Max Bandwidth|DRAM Through|Registers Per|Achieved Occ|Duration" \
      "$OUT/ncu_$f.txt" | head -24
  done
fi
if [ "$PART" = xi16 ]; then
ready
log "compile with NINFER_XI16=1"
NINFER_XI16=1 timeout 240 python3 -c "from engine.gpu import launch as K; K.kernel('argmax_step')"
log "tests with int16 x (GEMV, MoE, norms, engine, prefill)"
NINFER_XI16=1 gpu_pytest "$OUT/gpu_tests_xi16.txt" tests/gpu/test_gemv.py tests/gpu/test_kernels.py tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_engine_moe.py \
  tests/gpu/test_prefill.py -k "gemv or moe or norm or stage or engine or prefill or column or greedy or smollm"
grep -E "^E  |FAILED|passed|failed" "$OUT/gpu_tests_xi16.txt" | tail -10
for run in 0 1b 0 1; do
  x=${run%b}; bd=; [ "$run" = 1b ] && bd=--breakdown
  log "decode NINFER_XI16=$x $bd"
  NINFER_XI16=$x timeout 120 python3 bench/gpu_decode.py --synthetic qwen3.8-27b,qwen3.6-35b-a3b \
    $bd --out "$OUT/decode_xi16_$run.json" 2>&1 | grep -E "PDL|sum of|^  [a-z]|rror" | head -40
done
log "GEMV sweep with int16 x"
NINFER_XI16=1 timeout 200 python3 bench/gpu_decode.py --sweep --synthetic qwen3.8-27b,qwen3.6-35b-a3b \
  --out "$OUT/sweep_xi16.json" 2>&1 | grep -E "best|rror" | head -30
fi
