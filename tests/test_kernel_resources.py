"""ptxas's resource report of the Hopper forward and backward kernels, compiled by nvcc for sm_90a, and of
the SM80 backward's small tiles, for sm_80 (no GPU needed). A kernel that keeps arrays in local memory
(a stack frame of hundreds of bytes) computes the right values several times slower, which no output
test sees: session 43 found the hdim 64 score-mod backward with a 928-byte frame, forward + backward 6.6
times the plain one's time. Nor does one see ptxas serializing the warpgroup MMAs (warning C7515: a
register of an MMA's accumulator written between its issue and its wait, as a branch around an issue can
do), which takes away the MMAs' overlap with the softmax. Skipped when nvcc or the CuTe headers cannot
be found.
"""
import re

import pytest

from test_cpp_units import ROOT, _report, _run, nvcc_and_cute

# A few spilled registers take tens of bytes (the plain hdim 64 kernel: 48-72); arrays, hundreds.
MAX_STACK_BYTES = 128


# The dropout kernels at head dim 64: without softcap, 128 query rows a step, 120 / 216 bytes of
# spill stores / loads through a 128-byte frame (with the TMA loads; 64 rows, spilling none, measured
# 0-6 % slower, session 60); softcap's at 64 rows since session 60, none (at 128 rows it took a
# 216-232-byte frame). Softcap + ALiBi's score-mod kernel on 128 rows at head dim 32 since session 61
# (24-48 bytes) and at 64 since session 71 (causal 40 bytes: 36 / 100 bytes of spill stores / loads).
# Since session 69 that dropout kernel takes a 136-byte frame (132 / 244 bytes): the zeroing of a varlen
# sequence's last row block after its TMA loads (bwd_kernel_sm90.h, begin_step) holds two more
# registers in every form tried (element stores, 16-byte stores, the load's row offset recomputed;
# out of line, 192 bytes). Its budget: that frame.
BWD_MAX_STACK_BYTES = {(64, "kDropout"): 136}
BWD_CASES = [(32, "kScoreMods"), (64, "kPlain"), (64, "kScoreMods"), (64, "kDropout"),
             (128, "kPlain"), (128, "kScoreMods"), (128, "kDropout"), (192, "kDropout"), (256, "kScoreMods")]
# The forward's (the warp-specialized kernels and the three-CTA one; session 44: at most 32 bytes).
FWD_CASES = [(64, "kPlain"), (64, "kScoreMods"), (64, "kDropout"), (96, "kScoreMods"), (128, "kScoreMods"),
             (128, "kDropout")]


def stack_frames(pass_, head_dim, variant, tmp_path, features, causal=True):
    """(kernel, stack frame bytes) of each Hopper kernel of one bf16 instantiation."""
    nvcc, cute = nvcc_and_cute(features)
    source = tmp_path / f"{pass_}_sm90.cu"
    params = "FwdParams" if pass_ == "fwd" else "BwdParams"
    source.write_text(f'#include "flash_attn_cute/{pass_}_kernel_sm90.h"\n'
                      "namespace flash_attn_cute {\n"
                      f"template cudaError_t run_{pass_}_sm90<DType::kBFloat16, {head_dim}, {str(causal).lower()}, true, "
                      f"Variant::{variant}>(\n"
                      f"    {params} const&, cudaStream_t);\n"
                      "}\n")
    cmd = [nvcc, "-c", "-std=c++17", *features.nvcc_flags(["90"]), "-Xptxas", "-v", "-I", str(ROOT / "include"),
           "-I", cute, "-o", str(tmp_path / f"{pass_}_sm90.o"), str(source)]
    proc = _run(cmd, timeout=600)
    assert proc.returncode == 0, _report(proc)
    # ptxas: "Compiling entry function '<name>' for 'sm_90a'", then "<n> bytes stack frame, ...".
    frames = re.findall(rf"Compiling entry function '(\w*flash_{pass_}_sm90\w*)'.*?(\d+) bytes stack frame",
                        proc.stderr, re.S)
    assert frames, f"no flash_{pass_}_sm90 kernel in ptxas's report:\n" + _report(proc)
    serialized = re.findall(r"wgmma\.mma_async instructions are serialized.*?function '(\w+)'", proc.stderr)
    assert not serialized, f"ptxas serializes the warpgroup MMAs of {serialized}"
    return frames


@pytest.mark.parametrize("head_dim, variant", BWD_CASES)
def test_hopper_backward_keeps_its_arrays_in_registers(head_dim, variant, tmp_path, features):
    budget = BWD_MAX_STACK_BYTES.get((head_dim, variant), MAX_STACK_BYTES)
    for name, stack in stack_frames("bwd", head_dim, variant, tmp_path, features):
        assert int(stack) <= budget, f"{name}: {stack}-byte stack frame (local memory)"


@pytest.mark.parametrize("head_dim, variant", FWD_CASES)
def test_hopper_forward_keeps_its_arrays_in_registers(head_dim, variant, tmp_path, features):
    frames = stack_frames("fwd", head_dim, variant, tmp_path, features)
    assert any("ws_kernel" in name for name, _ in frames), "no warp-specialized kernel compiled"
    for name, stack in frames:
        assert int(stack) <= MAX_STACK_BYTES, f"{name}: {stack}-byte stack frame (local memory)"


# Head dim 256's warp-specialized forwards keep 96-216 bytes of spills outside the key loop (O alone
# takes 128 of a consumer's 224 registers). Until session 55 the non-causal checked softcap + ALiBi
# kernel (caps past 57.5) took ALiBi's side form there too: 784-816 bytes, some 2500 local loads and
# stores a key-loop trip.
def test_hopper_forward_head_dim_256_non_causal_score_mods_stay_in_registers(tmp_path, features):
    for name, stack in stack_frames("fwd", 256, "kScoreMods", tmp_path, features, causal=False):
        assert int(stack) <= 256, f"{name}: {stack}-byte stack frame (local memory)"


# The SM80 backward on small tiles (GPUs with less shared memory a block, tile_size.h), for sm_80:
# four warps at head dim 192 hold dK, dV and dQ of 64 x 192 each (session 50: 56-byte frame).
@pytest.mark.parametrize("head_dim, variant", [(128, "kDropout"), (192, "kPlain")])
def test_small_tile_backward_keeps_its_arrays_in_registers(head_dim, variant, tmp_path, features):
    nvcc, cute = nvcc_and_cute(features)
    source = tmp_path / "bwd_small.cu"
    source.write_text('#include "flash_attn_cute/bwd_launch.h"\n'
                      "namespace flash_attn_cute {\n"
                      f"template cudaError_t run_bwd_small<DType::kBFloat16, {head_dim}, true, true, Variant::{variant}>(\n"
                      "    BwdParams const&, cudaStream_t);\n"
                      "}\n")
    cmd = [nvcc, "-c", "-std=c++17", *features.nvcc_flags(["80"]), "-Xptxas", "-v", "-I", str(ROOT / "include"),
           "-I", cute, "-o", str(tmp_path / "bwd_small.o"), str(source)]
    proc = _run(cmd, timeout=600)
    assert proc.returncode == 0, _report(proc)
    frames = re.findall(r"Compiling entry function '(\w*flash_bwd_kernel\w*)'.*?(\d+) bytes stack frame", proc.stderr, re.S)
    assert len(frames) == 1, _report(proc)
    for name, stack in frames:
        assert int(stack) <= MAX_STACK_BYTES, f"{name}: {stack}-byte stack frame (local memory)"
