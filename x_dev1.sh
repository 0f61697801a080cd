#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD NINFER_HOME=/tmp/nh CUPY_CACHE_DIR=/tmp/cc NINFER_GIT_COMMIT=$(cat COMMIT) PYTHONUNBUFFERED=1
T0=$(date +%s)
timeout 260 python -m pytest -q -m gpu -x tests/gpu/test_gemv_packed.py tests/gpu/test_spec_gpu.py tests/gpu/test_kernels.py -p no:cacheprovider 2>&1 | tail -25 | tee $OUT/tests.txt
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout 150 python bench/spec_round.py --geometry qwen3.8-27b -k 3 --prompt 256 --json $OUT/round_new.json 2>&1 | tail -12 | tee $OUT/round_new.txt
echo "new done at $(( $(date +%s) - T0 )) s"
left=$(( 590 - ($(date +%s) - T0) ))
[ $left -gt 60 ] && (cd x_base && PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/cc_base timeout $((left - 10)) python bench/spec_round.py --geometry qwen3.8-27b -k 3 --prompt 256 2>&1 | tail -12 | tee $OUT/round_base.txt)
echo "all done at $(( $(date +%s) - T0 )) s"
