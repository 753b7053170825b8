#!/usr/bin/env bash
# Builds the whole extension on a machine without a GPU for the GPU machine (torch 2.11.0+cu130,
# Python 3.12): kernel objects via scripts/prebuild_kernels.py, the torch glue with g++ against a
# downloaded torch 2.11 wheel, linked into .offline/flash_attn_cute/_C.cpython-312-*.so next to a
# copy of the Python package. On the GPU machine, carry ".offline" and run the tests with nothing to
# build:  cd tests && PYTHONPATH=$PWD/../.offline pytest -q ...
#   usage: FLASH_ATTN_CUTE_HDIMS=128 FLASH_ATTN_CUTE_DTYPES=bf16 bash scripts/build_offline_ext.sh
#   env:   PY312 (a Python 3.12 interpreter), TORCH_VERSION (2.11.0), FLASH_ATTN_CUTE_{HDIMS,DTYPES,PASSES}
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PY312:-}" ]; then
  for candidate in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12; do
    if "$candidate" --version >/dev/null 2>&1; then PY312=$candidate; break; fi
  done
fi
[ -n "${PY312:-}" ] || { echo "no Python 3.12 found: set PY312" >&2; exit 1; }
TORCH_VERSION=${TORCH_VERSION:-2.11.0}
export FLASH_ATTN_CUTE_ARCHS=90
work=/tmp/flash_attn_cute_offline
mkdir -p "$work/wheel" "$work/obj"

# torch headers and libraries for cp312 (the wheel is only unpacked, never imported here).
if [ ! -d "$work/torch/torch/include" ]; then
  python3 -m pip download -q --no-deps --python-version 3.12 --platform manylinux_2_28_x86_64 \
    --only-binary=:all: "torch==$TORCH_VERSION" -d "$work/wheel"
  "$PY312" -m pip install -q --no-deps --target "$work/torch" "$work"/wheel/torch-"$TORCH_VERSION"-*.whl
fi
T=$work/torch/torch
PYINC=$("$PY312" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
CUTLASS=$(python3 -c "import sys; sys.path.insert(0, 'csrc'); import features; print(features.find_cutlass_include()[0])")

python3 scripts/prebuild_kernels.py --out .prebuilt -j "${JOBS:-2}"  # also writes csrc/generated/
objects=$(python3 -c "
import sys; sys.path.insert(0, 'csrc'); import features
print(' '.join(f'.prebuilt/{p.stem}.o' for p in features.generate()))")

glue="ops glue fwd_api bwd_api kvcache_api autograd dispatch"
pids=()
for f in $glue; do
  g++ -fPIC -O3 -DNDEBUG -std=c++20 -DTORCH_API_INCLUDE_EXTENSION_H -DTORCH_EXTENSION_NAME=_C \
    -D_GLIBCXX_USE_CXX11_ABI=1 -I include -I csrc -I "$CUTLASS" -I "$T/include" \
    -I "$T/include/torch/csrc/api/include" -I /usr/local/cuda/include -I "$PYINC" \
    -c "csrc/$f.cpp" -o "$work/obj/$f.o" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done  # set -e stops on a failed compile
rm -rf .offline && mkdir -p .offline && cp -r flash_attn_cute .offline/ && rm -rf .offline/flash_attn_cute/__pycache__
g++ -shared -o .offline/flash_attn_cute/_C.cpython-312-x86_64-linux-gnu.so $(printf "$work/obj/%s.o " $glue) $objects \
  -L"$T/lib" -L/usr/local/cuda/lib64 -lc10 -ltorch -ltorch_cpu -ltorch_python -lcudart -lc10_cuda -ltorch_cuda
echo "built .offline/flash_attn_cute ($(du -sh .offline | cut -f1)); carry \".offline\" to the GPU machine"
