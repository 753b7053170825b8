"""ptxas's resource report of the Hopper backward kernels, compiled by nvcc for sm_90a (no GPU
needed). A kernel that keeps arrays in local memory (a stack frame of hundreds of bytes) computes
the right values several times slower, which no output test sees: session 43 found the hdim 64
score-mod backward with a 928-byte frame, forward + backward 6.6 times the plain one's time.
Skipped when nvcc or the CuTe headers cannot be found.
"""
import re

import pytest

from test_cpp_units import ROOT, _report, _run, nvcc_and_cute

# A few spilled registers take tens of bytes (the plain hdim 64 kernel: 48-72); arrays, hundreds.
MAX_STACK_BYTES = 128


# The dropout kernel at head dim 64 (128 query rows a step) spills 512 bytes through a 264-byte
# frame (session 43; forward + backward 0.70-0.73 of plain): known, and to be fixed.
CASES = [(64, "kPlain"), (64, "kScoreMods"),
         pytest.param(64, "kDropout", marks=pytest.mark.xfail(strict=True, reason="spills 512 bytes")),
         (128, "kPlain"), (128, "kScoreMods"), (128, "kDropout")]


@pytest.mark.parametrize("head_dim, variant", CASES)
def test_hopper_backward_keeps_its_arrays_in_registers(head_dim, variant, tmp_path, features):
    nvcc, cute = nvcc_and_cute(features)
    source = tmp_path / "bwd_sm90.cu"
    source.write_text('#include "flash_attn_cute/bwd_kernel_sm90.h"\n'
                      "namespace flash_attn_cute {\n"
                      f"template cudaError_t run_bwd_sm90<DType::kBFloat16, {head_dim}, true, true, Variant::{variant}>(\n"
                      "    BwdParams const&, cudaStream_t);\n"
                      "}\n")
    cmd = [nvcc, "-c", "-std=c++17", *features.nvcc_flags(["90"]), "-Xptxas", "-v", "-I", str(ROOT / "include"),
           "-I", cute, "-o", str(tmp_path / "bwd_sm90.o"), str(source)]
    proc = _run(cmd, timeout=600)
    assert proc.returncode == 0, _report(proc)
    # ptxas: "Compiling entry function '<name>' for 'sm_90a'", then "<n> bytes stack frame, ...".
    frames = re.findall(r"Compiling entry function '(\w*flash_bwd_sm90_kernel\w*)'.*?(\d+) bytes stack frame",
                        proc.stderr, re.S)
    assert frames, "no flash_bwd_sm90_kernel in ptxas's report:\n" + _report(proc)
    for name, stack in frames:
        assert int(stack) <= MAX_STACK_BYTES, f"{name}: {stack}-byte stack frame (local memory)"
