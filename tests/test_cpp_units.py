"""Runs the C++ host unit tests (tests/cpp/test_host_units.cu) of the torch-free headers.

The program is compiled once per session by nvcc as host code (CuTe headers only parse under nvcc);
no GPU is needed. Skipped when nvcc or the CuTe headers cannot be found.
"""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "cpp" / "test_host_units.cu"
CASES = ("tile_table", "mask", "mask_apply", "alibi_apply", "alibi_bias_at", "alibi_max_bias", "n_block_range", "key_block_walk", "consumer_walk", "diagonal_steps", "m_block_range", "bwd_tile_table", "dq_accum_offset",
         "dq_fragment", "dq_order", "split_heuristic", "split_range", "split_combine", "block_info", "tma_fits", "varlen_rows", "ws_tile_order", "dropout_rng", "dropout_layout",
         "exp2_fma", "bounded_scores", "softcap_loops")


def _find_nvcc():
    found = shutil.which("nvcc")
    if found:
        return found
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidate = Path(os.environ[var]) / "bin" / "nvcc"
            if candidate.exists():
                return str(candidate)
    candidate = Path("/usr/local/cuda/bin/nvcc")
    return str(candidate) if candidate.exists() else None


def _run(cmd, timeout):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _report(proc):
    return f"$ {' '.join(map(str, proc.args))}\n[exit {proc.returncode}]\n{proc.stdout}\n{proc.stderr}"


def nvcc_and_cute(features):
    """nvcc's path and the CuTe include folder; skips the test without either."""
    nvcc = _find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    cute, _ = features.find_cutlass_include()
    if cute is None:
        pytest.skip("CuTe headers not found: `pip install nvidia-cutlass==4.2.0.0` or set CUTLASS_PATH")
    return nvcc, cute


@pytest.fixture(scope="session")
def host_units(tmp_path_factory, features):
    nvcc, cute = nvcc_and_cute(features)
    exe = tmp_path_factory.mktemp("cpp_units") / "test_host_units"
    cmd = [nvcc, "-std=c++17", "-x", "cu", "-O1", "-gencode", "arch=compute_80,code=sm_80",
           "-I", str(ROOT / "include"), "-I", cute, "-o", str(exe), str(SOURCE)]
    proc = _run(cmd, timeout=600)
    assert proc.returncode == 0, "compiling the C++ unit tests failed:\n" + _report(proc)
    return exe


def test_case_list_matches(host_units):
    proc = _run([str(host_units), "--list"], timeout=60)
    assert proc.returncode == 0, _report(proc)
    assert tuple(proc.stdout.split()) == CASES, "tests/cpp/test_host_units.cu cases changed: update CASES"


@pytest.mark.parametrize("case", CASES)
def test_cpp_case(host_units, case):
    proc = _run([str(host_units), case], timeout=120)
    assert proc.returncode == 0, _report(proc)
    assert proc.stdout.strip().splitlines()[-1].endswith(" 0 failed"), _report(proc)


def test_head_dim_tables_agree(host_units, features):
    proc = _run([str(host_units), "--print-head-dims"], timeout=60)
    assert proc.returncode == 0, _report(proc)
    cpp = tuple(int(x) for x in proc.stdout.split())

    from flash_attn_cute import _ops

    assert tuple(features.KERNEL_HEAD_DIMS) == cpp, (
        f"csrc/features.py KERNEL_HEAD_DIMS {features.KERNEL_HEAD_DIMS} != kFwdHeadDims {cpp} (tile_size.h)")
    assert tuple(_ops._KERNEL_HEAD_DIMS) == cpp, (
        f"flash_attn_cute/_ops.py _KERNEL_HEAD_DIMS {_ops._KERNEL_HEAD_DIMS} != kFwdHeadDims {cpp} (tile_size.h)")


@pytest.mark.cuda
def test_device_softmax(tmp_path, features):
    """Softmax::softmax_rescale_o (first and later tiles, rows entirely -inf) and finalize on one
    warp, against a double-precision host model (tests/cpp/test_device_softmax.cu)."""
    import torch

    nvcc = _find_nvcc()
    cute, _ = features.find_cutlass_include()
    if nvcc is None or cute is None:
        pytest.skip("nvcc or the CuTe headers not found")
    arch = "".join(map(str, torch.cuda.get_device_capability()))
    exe = tmp_path / "test_device_softmax"
    build = _run([nvcc, "-std=c++17", "-O2", "--use_fast_math", "--expt-relaxed-constexpr",
                  f"-gencode=arch=compute_{arch},code=sm_{arch}", "-I", str(ROOT / "include"), "-I", cute,
                  "-o", str(exe), str(ROOT / "tests" / "cpp" / "test_device_softmax.cu")], timeout=600)
    assert build.returncode == 0, _report(build)
    result = _run([str(exe)], timeout=120)
    assert result.returncode == 0 and result.stdout.rstrip().endswith(" 0 failed"), _report(result)
