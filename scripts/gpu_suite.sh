#!/usr/bin/env bash
# One device-machine call: GPU tests, then the benchmarks named in $HTAM_BENCH (space-separated
# bench/*.py scripts). Logs land in $OUT (fetched back); a short summary prints last. Each bench
# script writes its run to bench/results/*.json; those files are copied to $OUT/results/: copy
# them into bench/results/ of the checkout, run python3 bench/render.py and commit both.
# Usage (device tool): bash scripts/gpu_suite.sh   with carry=[".whl"]
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export HTAM_CACHE_DIR=${HTAM_CACHE_DIR:-/tmp/htam_cache}
[ -f COMMIT ] && export HTAM_COMMIT=$(cat COMMIT)   # device copies carry no .git
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv,noheader
T0=$(date +%s)
timeout ${HTAM_TEST_TIMEOUT:-400} python3 -m pytest -m gpu -q -p no:cacheprovider ${HTAM_TESTS:-tests} \
  2>&1 | tee "$OUT/gpu_tests.log" | tail -n 40
echo "gpu tests: $(( $(date +%s) - T0 )) s"
for b in ${HTAM_BENCH:-}; do
  T0=$(date +%s)
  timeout ${HTAM_BENCH_TIMEOUT:-300} python3 "$b" 2>&1 | tee "$OUT/$(basename "$b" .py).log" | tail -n 30
  echo "$b: $(( $(date +%s) - T0 )) s"
done
mkdir -p "$OUT/results" && cp bench/results/*.json "$OUT/results/" 2>/dev/null || true
