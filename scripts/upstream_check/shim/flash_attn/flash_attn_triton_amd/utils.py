"""Test-only stub of flash_attn.flash_attn_triton_amd.utils: upstream's tests read USE_TRITON_ROCM (a
bool) and call is_rdna() only to skip configs that are flaky on AMD GPUs; on CUDA both are False."""
USE_TRITON_ROCM = False


def is_rdna():
    return False
