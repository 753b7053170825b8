#!/usr/bin/env bash
# One call on the GPU machine: install the CuTe headers, build, run the GPU tests and the benchmark.
# Logs go under $OUT (the device tool brings that folder back, at most 8 files): build.log, tests.log,
# errors.log (every benchmark's stderr), bench.md / decode.md / features.md, and extra.tar.gz (the
# benchmarks' json and charts, the built extension, ninja's log of per-file compile times).
#   usage: bash scripts/gpu_check.sh [pytest args...]
#   env:   FLASH_ATTN_CUTE_{HDIMS,DTYPES,ARCHS,PASSES} (default arch 90), BENCH_ARGS, SKIP_BENCH=1,
#          SKIP_TESTS=1, SKIP_BUILD=1 (reuse the installed build), EXAMPLE=1 (run examples/train_gpt.py),
#          DECODE_BENCH=1 (benchmarks/bench_decode.py with DECODE_ARGS), FEATURES_BENCH=1
#          (benchmarks/bench_features.py with FEATURES_ARGS), SMOKE=1 (scripts/smoke.py first: one call
#          per kernel path under a watchdog), TEST_TIMEOUT / BENCH_TIMEOUT (seconds, default 1800 / 600)
#          DEV_BUILD_TIMING=1 (also time a one-head-dim, one-dtype build from scratch),
#          BUILD_TIMEOUT (seconds; the build is stopped then and ninja's log still saved; default none)
#   Kernel objects in .prebuilt/ (scripts/prebuild_kernels.py, carried along) are linked, not compiled.
source "$(dirname "$0")/gpu_env.sh"
export FLASH_ATTN_CUTE_ARCHS=${FLASH_ATTN_CUTE_ARCHS:-90}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export FLASH_ATTN_CUTE_PTXAS_VERBOSE=${FLASH_ATTN_CUTE_PTXAS_VERBOSE:-1}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/build.log"

# The README's install command (builds the kernels with ninja, MAX_JOBS in parallel).
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  [ -d .prebuilt ] && export FLASH_ATTN_CUTE_PREBUILT=$PWD/.prebuilt
  start=$(date +%s)
  timeout -k 5 -s INT "${BUILD_TIMEOUT:-0}" python3 -m pip install -v --no-build-isolation --no-deps . >> "$OUT/build.log" 2>&1
  status=$?
  echo "build: exit $status in $(( $(date +%s) - start )) s (archs $FLASH_ATTN_CUTE_ARCHS, ${MAX_JOBS} jobs)" | tee -a "$OUT/build.log"
  find build -name .ninja_log -exec cp {} "$OUT/extra/ninja_log.txt" \; 2>/dev/null  # per-file compile times
  grep -E "prebuilt kernel objects| error|bytes spill" "$OUT/build.log" | sort | uniq -c | sort -rn | head -20
  [ $status -eq 0 ] || exit $status
  so=$(cd /tmp && python3 -c "import flash_attn_cute._C as c; print(c.__file__)") && gzip -c "$so" > "$OUT/extra/$(basename "$so").gz"
fi

if [ "${SMOKE:-0}" = 1 ]; then
  (cd /tmp && timeout -k 5 120 python3 "$OLDPWD/scripts/smoke.py" 20 2>&1 | tail -12)
fi
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  # The README's test command. Plain `pytest`, not `python -m pytest`: the latter would put the
  # source tree (which has no built _C) ahead of the installed package.
  pytest=$(command -v pytest || echo "$(dirname "$(command -v python3)")/pytest")
  timeout -k 5 -s INT "${TEST_TIMEOUT:-1800}" "$pytest" -q -rf --durations=5 "${@:-tests}" 2>&1 |
    tee "$OUT/tests.log" | tail -40
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout -k 5 -s INT "${BENCH_TIMEOUT:-600}" python3 benchmarks/bench_attention.py --out "$OUT/extra/bench" \
    ${BENCH_ARGS:-} 2>>"$OUT/errors.log" | tail -60
fi
if [ "${DECODE_BENCH:-0}" = 1 ]; then
  timeout -k 5 -s INT "${BENCH_TIMEOUT:-600}" python3 benchmarks/bench_decode.py --out "$OUT/extra/decode" \
    ${DECODE_ARGS:-} 2>>"$OUT/errors.log" | tail -45
fi
if [ "${FEATURES_BENCH:-0}" = 1 ]; then
  timeout -k 5 -s INT "${BENCH_TIMEOUT:-600}" python3 benchmarks/bench_features.py --out "$OUT/extra/features" \
    ${FEATURES_ARGS:-} 2>>"$OUT/errors.log" | tail -30
fi
if [ "${EXAMPLE:-0}" = 1 ]; then
  python3 examples/train_gpt.py --out "$OUT/extra/train_gpt" 2>&1 | tee "$OUT/extra/train_gpt.log" | tail -16
fi
if [ "${DEV_BUILD_TIMING:-0}" = 1 ]; then
  rm -rf /tmp/devbuild && start=$(date +%s)
  FLASH_ATTN_CUTE_HDIMS=128 FLASH_ATTN_CUTE_DTYPES=bf16 python3 setup.py build_ext -b /tmp/devbuild/lib \
    -t /tmp/devbuild/tmp > "$OUT/extra/dev_build.log" 2>&1
  echo "dev build (hdim 128, bf16, sm_$FLASH_ATTN_CUTE_ARCHS): exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/build.log"
  python3 csrc/features.py  # restore csrc/generated/ for the full selection
fi
cp "$OUT"/extra/*.md "$OUT"/ 2>/dev/null
tar czf "$OUT/extra.tar.gz" -C "$OUT" extra && rm -rf "$OUT/extra"
