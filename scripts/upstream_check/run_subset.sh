#!/usr/bin/env bash
# flash-attn 2.x's own tests against flash_attn_cute (an external check, GPU only): a deterministic
# subset of an upstream test file, imported through the `flash_attn` shim in ./shim (re-exports of
# flash_attn_cute's modules). Upstream's file is not in this repository (git-ignored here): put a
# copy beside this script, e.g. flash-attention's tests/test_flash_attn.py of 2.6 or later, or its
# ROCm form test_flash_attn_triton_amd.py (float16 cases, run as bfloat16; session 60 ran that one,
# saved as test_flash_attn_v26.py, with einops in ./deps), and carry it to the GPU machine.
#   FAC_FILE       the test file (default test_flash_attn_v26.py)
#   FAC_PATH       required: a directory on whose path `import flash_attn_cute` finds the BUILT package
#                  (e.g. /tmp/trees/NAME of scripts/gpu_trees.sh, or a site-packages / --target dir)
#   FAC_MAX_TESTS  cap (default 2400), FAC_DTYPE (default bfloat16), FAC_MAX_D (default 128), FAC_MIN_D,
#                  FAC_KERNEL_DIMS (e.g. 64,128), FAC_FUNCS, FAC_UNSKIP, FAC_BUILT_ONLY, FAC_RETARGET:
#                  see subset_select.py; selection reads each test's parameters, not its id
#   FAC_TIMEOUT    wall-clock limit for pytest in seconds (default 280)
#   OUT            if set, the log goes to $OUT/upstream.log and the kept node ids to
#                  $OUT/upstream_selected.txt
# Usage (device machine; session 60: about 100 s for 10,000 cases on an H100):
#   FAC_KERNEL_DIMS=64,128 FAC_MAX_TESTS=20000 FAC_PATH=/tmp/trees/m bash scripts/upstream_check/run_subset.sh
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${FAC_PATH:?set FAC_PATH to the directory holding the built flash_attn_cute package}"
FAC_PATH="$(cd "$FAC_PATH" && pwd)"
LOG=/dev/null
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  LOG="$OUT/upstream.log"
  export FAC_SELECTED="$OUT/upstream_selected.txt"
fi
# shim first (flash_attn -> flash_attn_cute), then the build, then einops (./deps) and the plugin dir.
export PYTHONPATH="$HERE/shim:$FAC_PATH:$HERE/deps:$HERE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONHASHSEED=0
export PYTHONDONTWRITEBYTECODE=1
cd "$HERE"
python3 -c "import flash_attn_cute._ops as o; assert o._C is not None, repr(o._IMPORT_ERROR); \
print('flash_attn_cute (built):', o.__file__)" 2>&1 | tee "$LOG" || true
timeout --signal=INT --kill-after=20 "${FAC_TIMEOUT:-280}" \
  python3 -m pytest -q -p no:cacheprovider -p subset_select --tb=line -rf \
    -o console_output_style=count "${FAC_FILE:-test_flash_attn_v26.py}" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "run_subset.sh: pytest exit $rc (124 = hit FAC_TIMEOUT)" | tee -a "$LOG"
exit "$rc"
