#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU and CuPy, from any directory:
#
#   bash bench/gpu_check.sh [coldstart] [tests] [bench] [breakdown] [spec]     (no part: the first four)
#
#   coldstart  `ninfer run --synthetic qwen3.8-27b` twice with a CuPy cache of its own: first empty (the first run's
#              compile of the plan's kernels), then warm; the start-to-first-token figures of both
#   tests      every GPU test: pytest -m gpu over tests/gpu, tests/model, tests/unit/test_cli_env.py, tests/test_*.py
#   bench      `ninfer bench` of the standard targets: 27B tg128 at depth 0 and at 32768 with int8 KV, 35B-A3B tg128
#              (streamed, greedy, with the burst beside it), the two tg128 with Qwen's recommended sampling, pp8192 of
#              both (BENCH_ARGS: more options for each)
#   breakdown  bench/gpu_decode.py --breakdown: the decode step's kernels one by one, 27B at depth 0 and at 32768
#              (int8 KV), 35B-A3B at depth 0
#   spec       bench/spec_round.py (MTP speculation, mtp:3, acceptance forced to 0.88/0.77/0.67): 27B at depth 0 and
#              at 32768 with int8 KV, 35B-A3B at depth 0 (with the rounds' breakdown at depth 0; SPEC_RUNS: a subset,
#              e.g. "35b"), then `ninfer bench -n 512 -r 3 --spec off,mtp:3` of both at depth 0
#
# Raw output goes to $OUT (default /tmp/gpu_check), named by what it measures and the GPU (GPU_TAG, else from
# nvidia-smi: h200): gpu_tests_h200.txt, tg128_qwen38-27b_h200.json, ..., breakdown_tg128_qwen38-27b_h200.json; the
# file names match bench/results/, so a run's files replace the ones there. A summary table comes last.
# The package runs from this tree (PYTHONPATH); wheels in .whl/ (for packages the machine lacks) are installed first.
# A COMMIT file at the tree's root names the commit the bench JSONs report (a copy of the tree has no .git).
# On a lent device machine a call runs at most 10 minutes and brings back 8 files: `coldstart tests` and `bench`
# are two calls, `breakdown` a third.
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$ROOT/.cupy_cache}
export NINFER_HOME=${NINFER_HOME:-/tmp/ninfer-home}  # (the store needs platformdirs only without it)

PARTS=()
for arg in "$@"; do
  case $arg in
    coldstart|tests|bench|breakdown|spec) PARTS+=("$arg") ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "error: unknown part '$arg'"; echo "-> use coldstart, tests, bench, breakdown or spec"; exit 2 ;;
  esac
done
[ ${#PARTS[@]} -eq 0 ] && PARTS=(coldstart tests bench breakdown)
want() { [[ " ${PARTS[*]} " == *" $1 "* ]]; }
log() { echo "== $(date +%T) $*"; }

if [ -d .whl ] && compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
[ -f COMMIT ] && NINFER_GIT_COMMIT=$(cat COMMIT) && export NINFER_GIT_COMMIT
GPU=${GPU_TAG:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 \
  | sed -E 's/^NVIDIA //; s/^GeForce //; s/^(RTX|GTX) /\1/' | awk '{print tolower($1)}' | cut -d- -f1 | tr -cd 'a-z0-9')}
GPU=${GPU:-gpu}
log "start: parts ${PARTS[*]}, GPU tag $GPU, output in $OUT"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
python3 -c "import cupy, numpy, engine, ninfer_cli.main; print('cupy', cupy.__version__, 'numpy', numpy.__version__)" \
  || { echo "error: the package does not import from $ROOT"; echo "-> carry the missing wheels in .whl/"; exit 1; }

if want coldstart; then
  # the first run of a user: an empty kernel cache, then the same run again (warm); a model file's upload is
  # replaced by making random weights in device memory
  C=$OUT/coldstart_qwen38-27b_$GPU.txt
  CS=$(mktemp -d)
  for state in cold warm; do
    log "ninfer run --synthetic qwen3.8-27b ($state kernel cache)"
    t0=$(date +%s.%N)
    CUPY_CACHE_DIR=$CS timeout 240 python3 -m ninfer_cli.main run --synthetic qwen3.8-27b "Hello there" -n 16 \
      --temperature 0 --json > "$OUT/run_$state.json" 2> "$OUT/run_$state.err"
    t1=$(date +%s.%N)
    python3 - "$state" "$t0" "$t1" "$OUT/run_$state.json" "$OUT/run_$state.err" <<'PY' | tee -a "$C"
import json, sys
state, t0, t1, out, err = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
notes = [s for s in open(err).read().splitlines() if "compil" in s]
try:
    d = json.load(open(out))
    t = d["timings"]
    print(f"{state}: process {t1 - t0:.1f} s; in the command, start to first token {t['start_to_first_token_s']:.1f} s, "
          f"{d['usage']['completion_tokens']} tokens on {d['backend']}; {' / '.join(notes) or 'no compile line'}")
except (ValueError, KeyError, OSError):
    print(f"{state}: failed after {t1 - t0:.1f} s: " + open(err).read()[-600:])
PY
    rm -f "$OUT/run_$state.json" "$OUT/run_$state.err"
  done
  rm -rf "$CS"
fi

# CuPy's own kernels compile through NVRTC with headers read from the machine's image; on a fresh machine those
# reads have returned junk for a while: wait until one compiles.
for i in $(seq 1 12); do
  python3 -c "import cupy as cp, numpy as np; a = cp.full((3, 2), np.nan, dtype=cp.float32); a.fill(1); (a * 2).sum().get()" \
    >/dev/null 2>&1 && break
  log "CuPy's own kernels do not compile yet ($i)"; sleep 5
done

if want tests; then
  log "every GPU test"
  T=$OUT/gpu_tests_$GPU.txt
  timeout 540 python3 -m pytest -q -p no:cacheprovider --tb=short -m gpu tests/gpu tests/model \
    tests/unit/test_cli_env.py tests/test_*.py > "$T" 2>&1
  # tests that failed because a file read on a fresh machine saw junk run once more in a fresh process
  if grep -q "null bytes\|unrecognized token" "$T"; then
    ids=$(grep -E "^(FAILED|ERROR) tests/" "$T" | sed -E 's/^(FAILED|ERROR) ([^ ]+).*/\2/' | sort -u)
    if [ -n "$ids" ]; then
      log "a file read saw junk: the $(echo "$ids" | wc -l) failed tests again"; sleep 10
      # shellcheck disable=SC2086
      { echo "== again in a fresh process"; timeout 240 python3 -m pytest -q -p no:cacheprovider --tb=short $ids 2>&1; } >> "$T"
    fi
  fi
  grep -E "^(FAILED|ERROR) |(passed|failed).* in [0-9.]+s" "$T" | tail -20
fi

if want bench; then
  # the standard targets; each JSON holds the command, commit, device, roofline and every sample
  nb() { local name=$1; shift; log "ninfer bench $*"
    # shellcheck disable=SC2086  # (BENCH_ARGS: extra options, split into words)
    timeout 200 python3 -m ninfer_cli.main bench "$@" ${BENCH_ARGS:-} -o json --out "$OUT/${name}_$GPU.json" 2>&1 \
      | grep -E "^\||rror" | tail -2; }
  QWEN=(--temp 0.7 --top-p 0.8 --top-k 20 --presence-penalty 1.5)  # Qwen3.6's recommended non-thinking sampling
  nb tg128_qwen38-27b --synthetic qwen3.8-27b -p 0 -n 128 -r 2 --burst
  nb tg128_sampled_qwen38-27b --synthetic qwen3.8-27b -p 0 -n 128 -r 2 "${QWEN[@]}"
  nb tg128_d32768_int8_qwen38-27b --synthetic qwen3.8-27b -p 0 -n 128 -r 2 -d 32768 --kv int8 --burst
  nb tg128_qwen36-35b-a3b --synthetic qwen3.6-35b-a3b -p 0 -n 128 -r 2 --burst
  nb tg128_sampled_qwen36-35b-a3b --synthetic qwen3.6-35b-a3b -p 0 -n 128 -r 2 "${QWEN[@]}"
  nb pp8192_qwen38-27b --synthetic qwen3.8-27b -p 8192 -n 0 -r 2
  nb pp8192_qwen36-35b-a3b --synthetic qwen3.6-35b-a3b -p 8192 -n 0 -r 2
fi

if want breakdown; then
  bd() { local name=$1; shift; log "bench/gpu_decode.py $* --breakdown"
    timeout 240 python3 bench/gpu_decode.py "$@" --breakdown --out "$OUT/${name}_$GPU.json" 2>&1 | grep -v "^{"; }
  bd breakdown_tg128_qwen38-27b --synthetic qwen3.8-27b
  bd breakdown_tg128_d32768_int8_qwen38-27b --synthetic qwen3.8-27b --depth 32768 --kv int8
  bd breakdown_tg128_qwen36-35b-a3b --synthetic qwen3.6-35b-a3b
fi

if want spec; then
  sr() { local name=$1; shift; log "bench/spec_round.py $*"
    timeout 300 python3 bench/spec_round.py "$@" --json "$OUT/${name}_$GPU.json" 2>&1 | grep -v "^{" | tail -4; }
  runs=${SPEC_RUNS:-"27b 27b-d32768 35b bench"}
  [[ " $runs " == *" 35b "* ]] && sr spec_round_qwen36-35b-a3b --geometry qwen3.6-35b-a3b -k 3 --breakdown
  [[ " $runs " == *" 27b "* ]] && sr spec_round_qwen38-27b --geometry qwen3.8-27b -k 3 --breakdown
  [[ " $runs " == *" 27b-d32768 "* ]] && sr spec_round_d32768_int8_qwen38-27b --geometry qwen3.8-27b -k 3 --depth 32768 \
    --kv int8
  for g in qwen3.8-27b qwen3.6-35b-a3b; do
    [[ " $runs " == *" bench "* ]] || break
    # (512 tokens 3 times: ~450 rounds, whose forced drafts stand near the asked rates; 128 tokens are ~37 rounds)
    log "ninfer bench --synthetic $g -n 512 -r 3 --spec off,mtp:3 --spec-accept 0.88,0.77,0.67"
    timeout 240 python3 -m ninfer_cli.main bench --synthetic $g -p 0 -n 512 -r 3 --spec off,mtp:3 \
      --spec-accept 0.88,0.77,0.67 -o json --out "$OUT/tg512_spec_mtp3_forced_${g//./}_$GPU.json" 2>&1 \
      | grep -E "^\||rror" | tail -3
  done
fi

log "summary"
python3 - "$OUT" "$GPU" <<'PY'
import json
import re
import sys
from pathlib import Path

out, gpu = Path(sys.argv[1]), sys.argv[2]
tests = out / f"gpu_tests_{gpu}.txt"
if tests.exists():
    lines = [s for s in tests.read_text(errors="replace").splitlines() if re.match(r"(=+ )?\d+ (passed|failed)", s)]
    print("tests:", " / then ".join(s.strip("= ") for s in lines) or "no pytest summary line (see the file)")
cold = out / f"coldstart_qwen38-27b_{gpu}.txt"
if cold.exists():
    print(cold.read_text().strip())
rows = []
for f in sorted(out.glob(f"*_{gpu}.json")):
    try:
        d = json.loads(f.read_text())
    except ValueError:
        rows.append((f.name, "unreadable", "", "", ""))
        continue
    for r in d.get("results", []):  # ninfer bench
        pct = f"{r['pct_copy_bw']:.1f}% copy" if r.get("pct_copy_bw") else (
            f"{r['pct_matmul']:.1f}% matmul" if r.get("pct_matmul") else "")
        ttft = f"TTFT {r['avg_ttft_ms'] / 1e3:.2f} s" if r.get("avg_ttft_ms") else ""
        burst = f"burst {r['burst_ts']:,.2f}" if r.get("burst_ts") else ""
        rows.append((f.name, r["test"] + (f" {r['kv']} KV" if r.get("kv") else ""),
                     f"{r['avg_ts']:,.2f} ± {r['stddev_ts']:.2f} tok/s", pct, ttft or burst))
    for r in (d.get("baseline") or {}).get("results", []):
        rows.append((f.name, f"{r.get('test')} (transformers)", f"{r.get('avg_ts', 0):,.2f} tok/s", "", ""))
    if "round_ms" in d:  # spec_round.py
        rows.append((f.name, f"mtp:{d['k']} d{d['depth']} {d['kv']} KV",
                     f"{d['spec_tok_s']:,.2f} tok/s forced ({d['speedup']:.2f}x of {d['plain_tok_s']:,.2f})",
                     f"round {d['round_ms']:.2f} ms = {d['round_over_step']:.2f}x step",
                     f"{d['stats']['tokens_per_round']:.2f} tok/round, identical {d['identical']}"))
    for r in d.get("decode", []):  # gpu_decode.py
        bd = r.get("breakdown_ms") or {}
        top = ", ".join(f"{k[:32]} {v[0]:.3f} ms" for k, v in list(bd.items())[:2])
        rows.append((f.name, f"{r['test']} {r['kv']} KV", f"{r['tok_s']:,.1f} tok/s",
                     f"kernels {r['breakdown_sum_ms']:.3f} of {r['ms_per_token']:.3f} ms" if bd else
                     f"{r['ms_per_token']:.3f} ms a step", top))
widths = [max(len(str(c)) for c in col) for col in zip(*rows)] if rows else []
for row in rows:
    print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
PY
