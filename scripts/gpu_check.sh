#!/usr/bin/env bash
# One call on the GPU machine: install the CuTe headers, build, run the GPU tests and the benchmark.
# Logs go under $OUT (the device tool brings that folder back).
#   usage: bash scripts/gpu_check.sh [pytest args...]
#   env:   FLASH_ATTN_CUTE_{HDIMS,DTYPES,ARCHS} (default arch 90), BENCH_ARGS, SKIP_BENCH=1, SKIP_TESTS=1
set -uo pipefail
OUT=${OUT:-/tmp/flash_attn_cute_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export FLASH_ATTN_CUTE_ARCHS=${FLASH_ATTN_CUTE_ARCHS:-90}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"

start=$(date +%s)
python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1
status=$?
echo "build: exit $status in $(( $(date +%s) - start )) s (archs $FLASH_ATTN_CUTE_ARCHS, ${MAX_JOBS} jobs)" | tee -a "$OUT/build.log"
grep -E "error|registers|spill" "$OUT/build.log" | head -40
[ $status -eq 0 ] || exit $status
so=$(ls flash_attn_cute/_C*.so) && gzip -c "$so" > "$OUT/$(basename "$so").gz"

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  python3 -m pytest -q -rf --durations=5 "${@:-tests}" 2>&1 | tee "$OUT/tests.log" | tail -40
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  python3 benchmarks/bench_attention.py --out "$OUT/bench" ${BENCH_ARGS:-} 2>"$OUT/bench.err" | tail -60
fi
