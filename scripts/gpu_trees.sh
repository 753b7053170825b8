#!/usr/bin/env bash
# One GPU call over packages prebuilt on the CPU machine (scripts/build_offline_ext.sh, each packed
# from its .offline folder: tar -cJf .trees/NAME.tar.xz -C .offline flash_attn_cute): unpacks every
# tree, runs the tests (pytest arguments in TESTS, relative to tests/) on the trees named in
# TEST_TREES, then scripts/ab_fwd.py (AB_ARGS) over the trees named in AB_TREES (default: all of
# them), then, with DECODE_ARGS (argument sets of benchmarks/bench_decode.py separated by ';'), each
# set over the same trees one after the other. Logs under $OUT: tests_NAME.log, ab.md, decode.md.
# Carry ".trees" in the device call.
#   usage: TEST_TREES="A" TESTS="test_fwd_sm90.py -k 'not fp16'" AB_TREES="M A" AB_ARGS="--rounds 2" bash scripts/gpu_trees.sh
#          SKIP_AB=1 AB_TREES="M A" DECODE_ARGS="--hdim 64; --layouts paged --page-size 16" bash scripts/gpu_trees.sh
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
trees=()
names=()
for archive in .trees/*.tar.xz; do
  name=$(basename "$archive" .tar.xz)
  mkdir -p "/tmp/trees/$name" && tar -xJf "$archive" -C "/tmp/trees/$name" || exit 1
  if [ -z "${AB_TREES:-}" ] || [[ " $AB_TREES " == *" $name "* ]]; then
    trees+=("--tree" "$name=/tmp/trees/$name")
    names+=("$name")
  fi
done
root=$PWD
eval "test_args=(${TESTS:-.})"  # TESTS may quote: -k 'not fp16'
eval "ab_args=(${AB_ARGS:-})"    # as may AB_ARGS: --only 'h64 full 1k$,h64 causal 1k$'
for name in ${TEST_TREES:-}; do
  # The tests import the tree's package: run from tests/ so that the source tree (no _C) is not on the path.
  (cd tests && PYTHONPATH="/tmp/trees/$name${PYTHONPATH:+:$PYTHONPATH}" timeout -k 5 -s INT "${TEST_TIMEOUT:-900}" \
    python3 -m pytest -q -rf -p no:cacheprovider "${test_args[@]}" 2>&1 | tee "$OUT/tests_$name.log" | tail -15)
done
cd "$root"
if [ "${SKIP_AB:-0}" != 1 ]; then
  timeout -k 5 -s INT "${AB_TIMEOUT:-900}" python3 scripts/ab_fwd.py "${trees[@]}" "${ab_args[@]}" 2>"$OUT/ab.err" |
    tee "$OUT/ab.md"
  tail -3 "$OUT/ab.err"
fi
IFS=';' read -ra decode_sets <<< "${DECODE_ARGS:-}"
for set in "${decode_sets[@]}"; do
  for name in "${names[@]}"; do
    echo "== $name:$set" | tee -a "$OUT/decode.md"
    PYTHONPATH="/tmp/trees/$name" timeout -k 5 -s INT "${DECODE_TIMEOUT:-120}" python3 benchmarks/bench_decode.py $set \
      2>>"$OUT/decode.err" | grep -v '^#' | grep -v '^$' | grep -v '^|' | tee -a "$OUT/decode.md"
  done
done
