# Sourced by the one-call GPU scripts (gpu_check.sh, gpu_trees.sh): $OUT (the folder the device tool
# brings back), unbuffered Python, and the wheels carried in .whl/ installed into /tmp/site.
set -uo pipefail
OUT=${OUT:-/tmp/flash_attn_cute_out}
mkdir -p "$OUT/extra"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
